"""A remembered JWT is still checked against its time: a cache hit after the token's `exp` (or its key's
expiry, when that comes first) is 401, as the first use would be (fake clock)."""

from __future__ import annotations

import pytest

from supervisor.devserver import auth, keys_store, tokens
from supervisor.devserver.errors import HttpError
from supervisor.devserver.store import Store

pytestmark = pytest.mark.timeout(10)


def _token(store: Store, ctx: keys_store.KeyContext, now: float, lifetime: int) -> str:
    return tokens.encode(auth._claims(ctx, "access", now, lifetime), auth.secret(store))


@pytest.mark.parametrize("key_expires", [None, 1005.0])
def test_a_cached_token_is_refused_once_its_time_passes(tmp_path, key_expires):
    store = Store(str(tmp_path / "t.db"))
    try:
        made = keys_store.create_key(store, "org", "k", [], None, key_expires, 900.0)
        ctx = keys_store.KeyContext("org", made["id"])
        token = _token(store, ctx, 1000.0, 10)  # exp 1010
        end = 1010.0 if key_expires is None else key_expires
        assert auth.jwt_context(store, token, 1001.0).expires_at == end
        assert auth.jwt_context(store, token, end - 0.5).org == "org"  # a cache hit, still in time
        with pytest.raises(HttpError) as info:
            auth.jwt_context(store, token, end)  # the same hit, at its end
        assert info.value.status == 401
    finally:
        store.close()
