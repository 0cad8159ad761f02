"""API keys: who a bearer key is (`KeyContext`), and the SQL of the `api-keys` routes.

Contract: a key is found by its sha256; an inactive (revoked) key is 401 "API key is inactive", an expired
one 401 "API key has expired", an unknown one 401 "Invalid API key". A verified key is remembered for at
most RECHECK seconds (and its expiry is checked on every use), and every change to a key forgets them all,
so a revoked or expired key is refused at once in this process and within RECHECK in another process
sharing the database.
"""

from __future__ import annotations

import base64
import os
import time
import uuid
from dataclasses import dataclass

from supervisor import exactjson

from .errors import HttpError, not_found
from .store import KeyCache, Store, dumps, hash_key, ts

KEY_COLS = "id, organization_id, name, queues, rate_limit, is_active, created_at, expires_at, last_used"


@dataclass(frozen=True)
class KeyContext:
    """An authenticated caller: its organization, key and the queues the key may touch (empty = all)."""

    org: str
    key_id: str
    queues: tuple[str, ...] = ()
    expires_at: float | None = None
    via: str = "api_key"  # or "jwt"

    @property
    def unrestricted(self) -> bool:
        return not self.queues or "*" in self.queues

    def can_access(self, queue: str) -> bool:
        return self.unrestricted or queue in self.queues


def require_queue(req, queue: str | None) -> None:
    """403 when a queue-scoped key names a queue outside its scope (the server's words)."""
    key = req.key
    if queue is not None and isinstance(key, KeyContext) and not key.can_access(queue):
        raise HttpError(403, "ACCESS_DENIED", f"API key does not have permission for queue '{queue}'")


def scope(key) -> frozenset[str] | None:
    """The queues a caller may touch, or None for every queue (an unrestricted key, or no key at all)."""
    if isinstance(key, KeyContext) and not key.unrestricted:
        return frozenset(key.queues)
    return None


def job_in_scope(store: Store, key, org: str, job_id: str) -> bool:
    """Whether a queue-scoped key may see this job (a job it cannot see is answered as one that does not
    exist); True for an unknown job, which the route's own lookup answers."""
    allowed = scope(key)
    if allowed is None:
        return True
    rows = store._read("SELECT queue_name FROM jobs WHERE id=? AND organization_id=?", (job_id, org))
    return not rows or rows[0][0] in allowed


def require_job(store: Store, key, org: str, job_id: str, message: str = "Job not found") -> None:
    """404 `message` for a job outside a queue-scoped key's queues, as the server hides it."""
    if not job_in_scope(store, key, org, job_id):
        raise not_found(message)


def worker_queues(row_queue: str, queue_names: str | None) -> tuple[str, ...]:
    """All the queues a worker row serves: its `queue_name` and the `queue_names` list."""
    return tuple({row_queue, *scope_of(queue_names)})


def worker_in_scope(store: Store, key, org: str, worker_id: str) -> bool:
    """Whether a queue-scoped key may see this worker: all of its queues lie in the key's (True for an
    unknown worker, which the route's own lookup answers)."""
    allowed = scope(key)
    if allowed is None:
        return True
    rows = store._read("SELECT queue_name, queue_names FROM workers WHERE id=? AND organization_id=?",
                       (worker_id, org))
    return not rows or set(worker_queues(*rows[0])) <= allowed


def visible_workers(store: Store, key, org: str) -> set[str] | None:
    """The ids of the organization's workers a queue-scoped key may see; None for an unrestricted key."""
    allowed = scope(key)
    if allowed is None:
        return None
    rows = store._read("SELECT id, queue_name, queue_names FROM workers WHERE organization_id=?", (org,))
    return {wid for wid, q, names in rows if set(worker_queues(q, names)) <= allowed}


def require_unrestricted(req, capability: str) -> None:
    """403 for a queue-scoped key: organization settings, keys and webhooks need an unrestricted one."""
    key = req.key
    if isinstance(key, KeyContext) and not key.unrestricted:
        raise HttpError(403, "ACCESS_DENIED", f"Queue-scoped API keys cannot {capability}")


def unauthorized(message: str) -> HttpError:
    return HttpError(401, "UNAUTHORIZED", message)


def scope_of(value) -> tuple[str, ...]:
    """The queues of a key's `queues` column (JSON text) or a token's `queues` claim (a list): its strings,
    in order; () (every queue) for anything else."""
    if isinstance(value, str):
        try:
            value = exactjson.loads(value) if value else None
        except ValueError:
            return ()
    return tuple(q for q in value if isinstance(q, str)) if isinstance(value, list) else ()


def key_context(store: Store, key: str, now: float) -> KeyContext:
    """Who `key` is, or the 401 the server answers for it."""
    cache: KeyCache = store.keys
    mono = time.monotonic()
    hit = cache.get(key, mono)
    ctx = hit if isinstance(hit, KeyContext) and hit.via == "api_key" else None  # a JWT is no API key
    if ctx is None:
        rows = store._read("SELECT id, organization_id, queues, is_active, expires_at FROM api_keys WHERE "
                           "key_hash=?", (hash_key(key),))
        if not rows:
            raise unauthorized("Invalid API key")
        key_id, org, queues, active, expires = rows[0]
        if not active:
            raise unauthorized("API key is inactive")
        ctx = KeyContext(org, key_id, scope_of(queues), expires)
        cache.put(key, ctx, mono)
    if ctx.expires_at is not None and ctx.expires_at <= now:
        raise unauthorized("API key has expired")
    return ctx


def new_key() -> str:
    return "sk_test_" + base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()


def _summary(row) -> dict:
    kid, _org, name, queues, rate, active, created, expires, used = row
    return {"id": kid, "name": name, "queues": list(scope_of(queues)), "rate_limit": rate,
            "is_active": bool(active), "created_at": ts(created), "last_used": ts(used), "expires_at": ts(expires)}


def list_keys(store: Store, org: str) -> list[dict]:
    rows = store._read(f"SELECT {KEY_COLS} FROM api_keys WHERE organization_id=? ORDER BY created_at DESC "
                       "LIMIT 100", (org,))
    return [_summary(r) for r in rows]


def get_key(store: Store, org: str, key_id: str) -> dict:
    rows = store._read(f"SELECT {KEY_COLS} FROM api_keys WHERE id=? AND organization_id=?", (key_id, org))
    if not rows:
        raise not_found(f"API key {key_id} not found")
    return _summary(rows[0])


def create_key(store: Store, org: str, name: str, queues: list[str], rate_limit: int | None,
               expires_at: float | None, now: float) -> dict:
    """A new key; its value is in this answer only."""
    key_id, key = str(uuid.uuid4()), new_key()
    with store._tx() as db:
        db.execute("INSERT INTO api_keys (id, organization_id, key_hash, name, created_at, queues, rate_limit, "
                   "is_active, expires_at) VALUES (?,?,?,?,?,?,?,1,?)",
                   (key_id, org, hash_key(key), name, now, dumps(queues), rate_limit, expires_at))
    return {"id": key_id, "key": key, "name": name, "created_at": ts(now), "expires_at": ts(expires_at)}


def update_key(store: Store, org: str, key_id: str, fields: dict) -> dict:
    """Set name, queues, rate_limit or is_active; omitted fields keep their values."""
    with store._tx() as db:
        if not db.execute("SELECT 1 FROM api_keys WHERE id=? AND organization_id=?", (key_id, org)).fetchone():
            raise not_found(f"API key {key_id} not found")
        for col, val in fields.items():
            db.execute(f"UPDATE api_keys SET {col}=? WHERE id=?", (val, key_id))
    store.keys.forget()
    return get_key(store, org, key_id)


def revoke_key(store: Store, org: str, key_id: str) -> None:
    """Revoke (the row stays, inactive): from now on the key is 401 "API key is inactive"."""
    with store._tx() as db:
        if db.execute("UPDATE api_keys SET is_active=0 WHERE id=? AND organization_id=?",
                      (key_id, org)).rowcount == 0:
            raise not_found(f"API key {key_id} not found")
    store.keys.forget()


def key_state(store: Store, key_id: str, now: float) -> str | None:
    """Why a key (by id) can no longer be used: "inactive", "expired" or "missing"; None while it can."""
    rows = store._read("SELECT is_active, expires_at FROM api_keys WHERE id=?", (key_id,))
    if not rows:
        return "missing"
    active, expires = rows[0]
    if not active:
        return "inactive"
    return "expired" if expires is not None and expires <= now else None


def touch(store: Store, key_id: str, now: float) -> None:
    with store._tx() as db:
        db.execute("UPDATE api_keys SET last_used=? WHERE id=?", (now, key_id))
