"""The dev server's HS256 tokens as decisions with a fake `now`: what is accepted, what is refused."""

from __future__ import annotations

import base64
import json

import pytest

from supervisor.devserver import tokens

pytestmark = pytest.mark.timeout(10)
SECRET = b"s" * 32
NOW = 1_900_000_000


def b64(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def test_a_token_round_trips_until_its_expiry_and_leeway():
    claims = {"sub": "org", "exp": NOW + 100, "jti": "j", "token_type": "access"}
    token = tokens.encode(claims, SECRET)
    assert token.startswith("eyJ") and token.count(".") == 2
    assert tokens.decode(token, SECRET, NOW) == claims
    assert tokens.decode(token, SECRET, NOW + 100 + tokens.LEEWAY) == claims
    with pytest.raises(tokens.InvalidToken):
        tokens.decode(token, SECRET, NOW + 101 + tokens.LEEWAY)


@pytest.mark.parametrize("mangle", [
    lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),  # the signature
    lambda t: b64({"alg": "none", "typ": "JWT"}) + "." + t.split(".")[1] + ".",  # no algorithm
    lambda t: t.split(".")[0] + "." + b64({"sub": "other", "exp": NOW + 100}) + "." + t.split(".")[2],  # claims
    lambda t: t + ".x", lambda t: "", lambda t: "eyJ!!.eyJ.x", lambda t: "a" * 9000,
])
def test_a_tampered_or_malformed_token_is_refused(mangle):
    token = tokens.encode({"sub": "org", "exp": NOW + 100}, SECRET)
    with pytest.raises(tokens.InvalidToken):
        tokens.decode(mangle(token), SECRET, NOW)
    with pytest.raises(tokens.InvalidToken):
        tokens.decode(token, b"another secret", NOW)


@pytest.mark.parametrize("exp", [None, "soon", 1.5, True])
def test_a_token_without_an_integer_exp_is_refused(exp):
    claims = {"sub": "org"} if exp is None else {"sub": "org", "exp": exp}
    with pytest.raises(tokens.InvalidToken):
        tokens.decode(tokens.encode(claims, SECRET), SECRET, NOW)
