"""Who a request is (API key or JWT) and the `auth/*` routes: login exchanges an API key for an access
and a refresh JWT, validate and me read one, refresh mints a new access token, logout revokes.

Contract (the server's): tokens are HS256 over a secret of this database (made on first use, kept in
meta); an access token lasts ACCESS_SECS, a refresh token 24x longer. A JWT is accepted on REST wherever
an API key is (never on gRPC), while its key is active and unexpired and it is not revoked. Failed
logins and refreshes are 401 {"error":"unauthorized","message":"Invalid credentials"}.
"""

from __future__ import annotations

import os
import time
import uuid
import weakref

from . import keys_store, tokens
from .errors import HttpError
from .handlers import body
from .keys_store import KeyContext, unauthorized
from .store import Store, ts

ACCESS_SECS = 24 * 3600  # JWT_EXPIRATION_HOURS=24
REFRESH_SECS = ACCESS_SECS * 24
_SECRETS: weakref.WeakKeyDictionary[Store, bytes] = weakref.WeakKeyDictionary()


def bad_credentials() -> HttpError:
    return HttpError(401, "UNAUTHORIZED", "Invalid credentials", extra={"error": "unauthorized"})


def secret(store: Store) -> bytes:
    """This database's signing secret (32 random bytes, made once)."""
    found = _SECRETS.get(store)
    if found is None:
        with store._tx() as db:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('jwt_secret', ?)", (os.urandom(32).hex(),))
            (hexed,) = db.execute("SELECT value FROM meta WHERE key='jwt_secret'").fetchone()
        found = _SECRETS[store] = bytes.fromhex(hexed)
    return found


def _claims(ctx: KeyContext, kind: str, now: float, lifetime: int) -> dict:
    t = int(now)
    return {"sub": ctx.org, "api_key_id": ctx.key_id, "org_id": ctx.org, "iat": t, "exp": t + lifetime, "nbf": t,
            "jti": str(uuid.uuid4()), "queues": list(ctx.queues), "token_type": kind}


def _revoked(store: Store, jti) -> bool:
    return bool(store._read("SELECT 1 FROM revoked_tokens WHERE jti=?", (str(jti),)))


def read_token(store: Store, token: str, now: float) -> dict:
    """The claims of one of our tokens, not revoked; else InvalidToken."""
    claims = tokens.decode(token, secret(store), now)
    if _revoked(store, claims.get("jti")):
        raise tokens.InvalidToken("revoked")
    return claims


def _expires(store: Store, key_id: str, claims: dict) -> float | None:
    """When a token stops being accepted: its `exp`, or its key's expiry when that comes first."""
    times = [t for t in (claims.get("exp"),) if isinstance(t, int | float)]
    rows = store._read("SELECT expires_at FROM api_keys WHERE id=?", (key_id,))
    if rows and rows[0][0] is not None:
        times.append(rows[0][0])
    return min(times) if times else None


def _why_not(store: Store, claims: dict, now: float) -> str | None:
    """Why a decoded token's key no longer stands behind it, or None."""
    state = keys_store.key_state(store, str(claims.get("api_key_id")), now)
    return None if state is None else {"inactive": "API key has been revoked", "expired": "API key has expired",
                                       "missing": "API key not found"}[state]


def jwt_context(store: Store, token: str, now: float) -> KeyContext:
    """Who an access JWT on a REST route is, or the 401 the server's middleware answers."""
    hit = store.keys.get(token, time.monotonic())
    if isinstance(hit, KeyContext) and hit.via == "jwt":
        if hit.expires_at is not None and hit.expires_at <= now:  # the token's (or its key's) time has come
            raise unauthorized("Invalid token")
        return hit
    try:
        claims = tokens.decode(token, secret(store), now)
    except tokens.InvalidToken:
        raise unauthorized("Invalid token") from None
    if claims.get("token_type") != "access":
        raise unauthorized("Invalid token type")
    if _revoked(store, claims.get("jti")):
        raise unauthorized("Token has been revoked")
    key_id = str(claims.get("api_key_id"))
    why = _why_not(store, claims, now)
    if why is not None:
        raise unauthorized(why)
    ctx = KeyContext(str(claims.get("org_id")), key_id, keys_store.scope_of(claims.get("queues")),
                     _expires(store, key_id, claims), "jwt")
    store.keys.put(token, ctx, time.monotonic())
    return ctx


def authenticate(store: Store, headers: dict, now: float) -> KeyContext:
    """The caller of a REST route: `Authorization: Bearer <API key or JWT>` (a JWT starts with eyJ)."""
    auth = headers.get("authorization")
    if not auth or not auth.startswith("Bearer "):
        raise unauthorized("Missing or invalid Authorization header")
    token = auth[7:].strip()
    if not token:
        raise unauthorized("Invalid API key")
    if token.startswith("eyJ"):
        return jwt_context(store, token, now)
    return keys_store.key_context(store, token, now)


def login(app, req):
    b = body(req)
    key = b.str("api_key", True, 0, 4096)
    if len(key) < 10:
        raise HttpError(400, "VALIDATION_ERROR", "api_key: API key must be at least 10 characters",
                        details=[{"field": "api_key", "message": "API key must be at least 10 characters",
                                  "code": "length"}], extra={"error": "Validation failed"})
    now = time.time()
    try:
        ctx = keys_store.key_context(app.store, key, now)
    except HttpError:
        raise bad_credentials() from None
    keys_store.touch(app.store, ctx.key_id, now)
    s = secret(app.store)
    return 200, {"access_token": tokens.encode(_claims(ctx, "access", now, ACCESS_SECS), s),
                 "refresh_token": tokens.encode(_claims(ctx, "refresh", now, REFRESH_SECS), s),
                 "token_type": "Bearer", "expires_in": ACCESS_SECS, "refresh_expires_in": REFRESH_SECS}, None


def refresh(app, req):
    b = body(req)
    token = b.str("refresh_token", True, 0, 8192)
    now = time.time()
    try:
        claims = read_token(app.store, token, now)
    except tokens.InvalidToken:
        raise bad_credentials() from None
    if claims.get("token_type") != "refresh":
        raise bad_credentials()
    key_id = str(claims.get("api_key_id"))
    if keys_store.key_state(app.store, key_id, now) is not None:
        raise bad_credentials()
    ctx = KeyContext(str(claims.get("org_id")), key_id, keys_store.scope_of(claims.get("queues")))
    access = tokens.encode(_claims(ctx, "access", now, ACCESS_SECS), secret(app.store))
    return 200, {"access_token": access, "token_type": "Bearer", "expires_in": ACCESS_SECS}, None


def validate_token(app, req):
    """`valid` and the claims, or `valid: false` with why; never an error for a bad token."""
    b = body(req)
    token = b.str("token", True, 0, 8192)
    try:
        claims = tokens.decode(token, secret(app.store), time.time())
    except tokens.InvalidToken:
        return 200, {"valid": False, "error": "Invalid token"}, None
    if _revoked(app.store, claims.get("jti")):
        return 200, {"valid": False, "error": "Token has been revoked"}, None
    why = _why_not(app.store, claims, time.time())
    if why is not None:  # a token outlives no revoked or expired key
        return 200, {"valid": False, "error": why}, None
    return 200, {"valid": True, "claims": claims}, None


def me(app, req):
    """The caller of an access JWT (an API key or a refresh token is not enough here) whose key still
    stands, with its organization."""
    auth = req.headers.get("authorization", "")
    if not auth.startswith("Bearer "):
        raise bad_credentials()
    now = time.time()
    try:
        claims = read_token(app.store, auth[7:].strip(), now)
    except tokens.InvalidToken:
        raise bad_credentials() from None
    if claims.get("token_type") != "access" or _why_not(app.store, claims, now) is not None:
        raise bad_credentials()
    org = str(claims.get("org_id"))
    rows = app.store._read("SELECT id, name, slug, plan_tier, billing_email FROM organizations WHERE id=?", (org,))
    organization = None
    if rows:
        oid, name, slug, plan, email = rows[0]
        organization = {"id": oid, "name": name, "slug": slug, "plan_tier": plan or "free", "billing_email": email}
    return 200, {"organization_id": org, "api_key_id": claims.get("api_key_id"),
                 "queues": list(keys_store.scope_of(claims.get("queues"))), "issued_at": ts(claims.get("iat", 0)),
                 "expires_at": ts(claims.get("exp", 0)), "organization": organization}, None


def logout(app, req):
    """Revoke the bearer JWT (204), and the refresh token in the body if one is sent."""
    token = req.headers.get("authorization", "")[7:].strip()
    now = time.time()
    try:
        claims = [tokens.decode(token, secret(app.store), now)]
    except tokens.InvalidToken:
        raise bad_credentials() from None
    if req.body.strip():
        sent = body(req).str("refresh_token", False, 0, 8192)
        if sent:
            try:
                claims.append(tokens.decode(sent, secret(app.store), now))
            except tokens.InvalidToken:
                pass
    with app.store._tx() as db:
        for c in claims:
            db.execute("INSERT OR IGNORE INTO revoked_tokens VALUES (?, ?)", (str(c.get("jti")), c.get("exp")))
    app.store.keys.forget()
    return 204, None, None
