"""HS256 JSON Web Tokens, as the server issues them for `auth/login` (stdlib hmac and hashlib only).

Contract: `encode(claims, secret)` signs a compact JWS with header {"alg":"HS256","typ":"JWT"};
`decode(token, secret, now)` returns the claims of a well-formed token whose signature matches, whose
`alg` is HS256 and whose integer `exp` has not passed by more than LEEWAY seconds (the server's JWT
library's default), else raises InvalidToken. Nothing else is accepted: no other algorithm (no "none"),
no token without an exp.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from supervisor import exactjson

HEADER = {"alg": "HS256", "typ": "JWT"}
LEEWAY = 60


class InvalidToken(ValueError):
    pass


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    if not text or any(c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in text):
        raise InvalidToken("bad base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        raise InvalidToken("bad base64url") from None


def encode(claims: dict, secret: bytes) -> str:
    signing = _b64(exactjson.dumps(HEADER)) + "." + _b64(exactjson.dumps(claims))
    return signing + "." + _b64(hmac.new(secret, signing.encode(), hashlib.sha256).digest())


def decode(token: str, secret: bytes, now: float) -> dict:
    parts = token.split(".")
    if len(parts) != 3 or len(token) > 8192:
        raise InvalidToken("not a compact JWS")
    signing = (parts[0] + "." + parts[1]).encode()
    expected = hmac.new(secret, signing, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, _unb64(parts[2])):
        raise InvalidToken("bad signature")
    try:
        header, claims = exactjson.loads(_unb64(parts[0])), exactjson.loads(_unb64(parts[1]))
    except ValueError:
        raise InvalidToken("not JSON") from None
    if not isinstance(header, dict) or header.get("alg") != "HS256" or not isinstance(claims, dict):
        raise InvalidToken("bad header")
    exp = claims.get("exp")
    if not isinstance(exp, int) or isinstance(exp, bool):
        raise InvalidToken("bad exp")
    if exp < now - LEEWAY:
        raise InvalidToken("expired")
    return claims
