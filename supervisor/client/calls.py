"""What every transport shares: a `Call` (one API request), the typed errors, and how an answer is classified.

The REST client (supervisor.client.rest) builds `Call`s; its blocking path (supervisor.client.blocking) and the
loop's client (supervisor.client.loophttp) send them and turn each reply into a result or an `ApiError` with
`decode`. The gRPC transport maps its status codes onto the same errors, so the parent acts on one set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from supervisor import exactjson
from supervisor.client.httpconn import Response


class ApiError(Exception):
    """An answer other than 2xx, or no answer at all (status 0)."""

    retryable = False

    def __init__(self, status: int, code: str, message: str, body: dict | None = None,
                 retry_after: float | None = None):
        super().__init__(f"{status} {code}: {message}" if status else f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.body = body or {}
        self.retry_after = retry_after


class Unavailable(ApiError):
    """Connection refused or reset, a timeout, a cut-off answer, 408 or 5xx: worth retrying."""

    retryable = True


class RateLimited(ApiError):
    """429 RATE_LIMIT_EXCEEDED: retry after `retry_after` seconds."""

    retryable = True


class QuotaExceeded(ApiError):
    """429 QUOTA_EXCEEDED: a plan limit (e.g. the worker cap)."""


class Unauthorized(ApiError):
    """401: the key is wrong, revoked or expired."""


class Conflict(ApiError):
    """409 on a worker route, e.g. a worker id owned by another organization."""


class LeaseLost(ApiError):
    """409 LEASE_EXPIRED or 404 on a job route: this worker no longer holds the job."""


class AlreadyFinished(ApiError):
    """409 CONFLICT 'Job is already <status>' on a job route."""


class Rejected(ApiError):
    """Another 4xx: the request itself was refused (400, 403, 413, 422 ...)."""


@dataclass(frozen=True)
class Secret:
    """A string that never shows itself in repr, str or a traceback."""

    value: str

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def scrub(self, text: str) -> str:
        """`text` with every form of this secret replaced by ***: call it before cutting a text."""
        return scrub_secret(text, self.value)


def secret_forms(secret: str) -> tuple[str, ...]:
    """The secret as it can appear in a line: itself, JSON-escaped and repr-escaped (inside a dict or a list).

    Longest first, so an escaped form is replaced before the plain one inside it could be."""
    if not secret:
        return ()
    forms = {secret, orjson.dumps(secret).decode()[1:-1], repr(secret)[1:-1], repr(secret.encode())[2:-1]}
    return tuple(sorted(forms, key=len, reverse=True))


def scrub_secret(text: str, secret: str) -> str:
    """`text` with every form of `secret` replaced by ***."""
    for form in secret_forms(secret):
        if form in text:
            text = text.replace(form, "***")
    return text


class _Headers(dict):
    """Lower-cased response headers that answer case-insensitive lookups."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = headers.get("Retry-After") if headers else None
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def classify(status: int, body: dict, headers: Mapping[str, str] | None = None, job_route: bool = False
             ) -> ApiError:
    """Turn a non-2xx answer into the typed error the parent acts on."""
    code = str(body.get("code") or body.get("error") or status)
    message = str(body.get("message") or body.get("error") or "")
    if status == 401:
        return Unauthorized(status, code, message, body)
    if status == 429:
        if code == "QUOTA_EXCEEDED" or body.get("error") == "limit_exceeded":
            return QuotaExceeded(status, code, message, body)
        return RateLimited(status, code, message, body, _retry_after(headers) or body.get("retry_after_secs"))
    if status == 408 or status >= 500:
        return Unavailable(status, code, message, body, _retry_after(headers))
    if job_route and (status == 404 or (status == 409 and code.upper() == "LEASE_EXPIRED")):
        return LeaseLost(status, code, message, body)
    if job_route and status == 409:
        return AlreadyFinished(status, code, message, body)
    if status == 409:
        return Conflict(status, code, message, body)
    return Rejected(status, code, message, body)


@dataclass
class Call:
    """One API request, ready to send on any connection; `answer` turns the reply into a result."""

    method: str
    path: str
    body: bytes
    route: str
    job_route: bool = False
    resend_on_stale: bool = True
    answer: Callable | None = None
    retry_safe: bool = False  # sending it twice does no harm: the blocking path may retry it

    @property
    def idempotent(self) -> bool:
        return self.method == "GET" or self.retry_safe


def network_error(exc: BaseException, base_url: str) -> Unavailable:
    """Our error for a connection that failed or timed out: its text only, never the exception."""
    kind = "TIMEOUT" if isinstance(exc, TimeoutError) else "NETWORK_ERROR"
    return Unavailable(0, kind, f"{type(exc).__name__} talking to {base_url}: {exc}")




def decode(call: Call, response: Response) -> Any:
    """The decoded answer of a 2xx reply (through `call.answer`), or raise the typed ApiError.
    Integers of any size in the answer come back exact."""
    payload = None
    if response.body:
        try:
            payload = exactjson.loads(response.body)
        except ValueError:
            payload = {"message": response.body[:200].decode("utf-8", "replace")}
    if 200 <= response.status < 300:
        return call.answer(payload) if call.answer else payload
    raise classify(response.status, payload if isinstance(payload, dict) else {}, _Headers(response.headers),
                   call.job_route)


class Endpoint(Protocol):
    """Where and how the HTTP transports send `Call`s (supervisor.client.rest.SpooledAPI is one)."""

    base_url: str  # for error messages: the URL as configured, without a trailing slash
    origin: str  # scheme://host[:port], what a Call's path is appended to
    host: str
    port: int
    https: bool
    ssl_context: Any  # ssl.SSLContext with https, else None
    ca_bundle: str | None
    headers: dict[str, str]  # sent with every request (the key in Authorization)
    timeout: float  # seconds for a call, connecting included
    attempts: int  # the blocking path's tries of an idempotent call
    on_request: Callable[[str, int, float], None] | None  # (route, status or 0, seconds) after each attempt
