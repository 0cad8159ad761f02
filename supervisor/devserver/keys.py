"""The `api-keys` routes: list, create (the key's value is shown once), get, update and revoke, with the
queues a key may touch and when it expires. Only an unrestricted key manages keys (403 otherwise)."""

from __future__ import annotations

import time

from . import keys_store
from .errors import invalid_type, validation
from .handlers import body
from .keys_store import require_unrestricted
from .store import dumps
from .validate import check_queue_name


def _queues(b) -> list[str] | None:
    queues = b.list("queues", False, 100)
    if queues is None:
        return None
    if not all(isinstance(q, str) for q in queues):
        raise invalid_type("queues", "an array of strings")
    for q in queues:
        if q != "*":
            check_queue_name(q, "queues")
    return queues


def list_keys(app, req):
    require_unrestricted(req, "manage API keys")
    return 200, keys_store.list_keys(app.store, req.org), None


def create_key(app, req):
    require_unrestricted(req, "manage API keys")
    b = body(req)
    if "permissions" in b.d:
        raise validation("permissions", "permissions are not supported; scope a key with queues", "unsupported")
    name = b.str("name", True, 1, 100)
    queues = _queues(b) or []
    rate = b.int("rate_limit", False, 1, 10000)
    now = time.time()
    expires = b.time("expires_at")
    return 201, keys_store.create_key(app.store, req.org, name, queues, rate, expires, now), None


def get_key(app, req):
    require_unrestricted(req, "manage API keys")
    return 200, keys_store.get_key(app.store, req.org, req.params["id"]), None


def update_key(app, req):
    require_unrestricted(req, "manage API keys")
    b = body(req)
    fields: dict = {}
    name = b.str("name", False, 1, 100)
    if name is not None:
        fields["name"] = name
    queues = _queues(b)
    if queues is not None:
        fields["queues"] = dumps(queues)
    rate = b.int("rate_limit", False, 1, 10000)
    if rate is not None:
        fields["rate_limit"] = rate
    active = b.bool("is_active")
    if active is not None:
        fields["is_active"] = int(active)
    answer = keys_store.update_key(app.store, req.org, req.params["id"], fields)
    if active is False:
        app.events.drop_key(req.params["id"])
    return 200, answer, None


def revoke_key(app, req):
    require_unrestricted(req, "manage API keys")
    keys_store.revoke_key(app.store, req.org, req.params["id"])
    app.events.drop_key(req.params["id"])  # its open event streams end now
    return 204, None, None
