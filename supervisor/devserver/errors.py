"""HttpError and the JSON error envelopes the Spooled API answers with.

Every error leaves the server as JSON with at least `code` and `message`;
validation errors add `details` (a list of {field, message, code}).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

STATUS_CODES = {
    400: "BAD_REQUEST", 401: "UNAUTHORIZED", 403: "ACCESS_DENIED", 404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED", 408: "REQUEST_TIMEOUT", 409: "CONFLICT", 413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE", 422: "VALIDATION_ERROR", 429: "RATE_LIMIT_EXCEEDED",
    503: "SERVICE_UNAVAILABLE",
}


class HttpError(Exception):
    """An HTTP error answer: status, body (dict with code/message/...) and extra headers."""

    def __init__(self, status: int, code: str | None, message: str, details=None, extra: dict | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.body: dict = {}
        if extra:
            self.body.update(extra)
        self.body["code"] = code or STATUS_CODES.get(status, "INTERNAL_ERROR")
        self.body["message"] = message
        if details is not None:
            self.body["details"] = details
        self.headers = headers or {}


def not_found(message: str = "Resource not found") -> HttpError:
    return HttpError(404, "NOT_FOUND", message)


def conflict(message: str) -> HttpError:
    return HttpError(409, "CONFLICT", message)


def lease_expired(message: str) -> HttpError:
    return HttpError(409, "LEASE_EXPIRED", message)


def validation(field: str, message: str, code: str = "invalid") -> HttpError:
    """400: a value has the right type but breaks a rule (range, length, characters)."""
    return HttpError(400, "VALIDATION_ERROR", f"{field}: {message}",
                    details=[{"field": field, "message": message, "code": code}],
                    extra={"error": "Validation failed"})


# What a body shaped like the published worker examples sends in place of a required field: (missing, sent) ->
# what to send. Only a hint in the message; the answer's status and code are the real server's.
FIELD_HINTS = {
    ("queue_name", "queue_names"): "register once per queue with `queue_name` (there is no `queue_names`)",
    ("worker_id", "id"): "the worker's own id goes in `worker_id`",
    ("worker_id", "result"): "complete needs the `worker_id` and `lease_id` of the claim, beside `result`",
    ("worker_id", "reason"): "fail needs the `worker_id` and `lease_id` of the claim, and its text in `error`",
    ("worker_id", "extension_seconds"): "a lease is renewed with `worker_id`, `lease_id` and `lease_duration_secs`",
    ("lease_id", None): "send the `lease_id` the claim returned with the job",
    ("error", "reason"): "a failure's text goes in `error` (there is no `reason`)",
}
# Routes those examples name that the API does not have: path pattern -> what to use instead.
ROUTE_HINTS = {
    re.compile(r"^/api/v1/jobs/[^/]+/renew-lease$"): "renew a job's lease with POST /api/v1/jobs/{id}/heartbeat "
    '{"worker_id", "lease_id", "lease_duration_secs"}',
}


def field_hint(field: str, sent: Iterable[str]) -> str | None:
    """What to send instead, when the body holds a field the published examples use in place of `field`."""
    for name in sent:
        if (field, name) in FIELD_HINTS:
            return FIELD_HINTS[(field, name)]
    return FIELD_HINTS.get((field, None))


def no_route(path: str) -> HttpError:
    """404 for a path no route matches; a path the published examples name says which route to use."""
    hint = next((text for pattern, text in ROUTE_HINTS.items() if pattern.match(path)), None)
    return HttpError(404, "NOT_FOUND", "No route matches this path" + (f": {hint}" if hint else ""))


def missing_field(field: str, hint: str | None = None) -> HttpError:
    """422: a required field is absent (serde's `missing field`); `hint`, when known, says in the message what
    to send (the details keep the real server's text)."""
    msg = f"Field `{field}` is required"
    return HttpError(422, "VALIDATION_ERROR", msg + (f": {hint}" if hint else ""),
                    details=[{"field": field, "message": msg, "code": "missing_field"}],
                    extra={"error": "Validation failed"})


def invalid_type(field: str, expected: str) -> HttpError:
    """422: a field has the wrong JSON type."""
    msg = f"Field `{field}` has an invalid type: expected {expected}"
    return HttpError(422, "VALIDATION_ERROR", msg,
                    details=[{"field": field, "message": msg, "code": "invalid_type"}],
                    extra={"error": "Validation failed"})


def invalid_json(message: str, code: str = "invalid_json") -> HttpError:
    """400 INVALID_JSON: malformed, truncated, empty or over-size body, or wrong Content-Type."""
    return HttpError(400, "INVALID_JSON", message,
                    details=[{"field": "body", "message": message, "code": code}],
                    extra={"error": "Invalid JSON"})


def quota_exceeded(resource: str, current: int, limit: int, plan: str) -> HttpError:
    """429 QUOTA_EXCEEDED for a plan limit (the API's 429 envelope)."""
    upgrade = {"free": "starter", "starter": "pro", "pro": "enterprise"}.get(plan)
    extra = {"error": "limit_exceeded", "resource": resource, "current": current, "limit": limit, "plan": plan}
    msg = f"{resource} limit reached ({current}/{limit})."
    if upgrade:
        extra["upgrade_to"] = upgrade
        msg += f" Upgrade to {upgrade} for higher limits."
    return HttpError(429, "QUOTA_EXCEEDED", msg, extra=extra)


def code_for(status: int) -> str:
    """The real server's status-to-code fallback; a 4xx it does not list is BAD_REQUEST."""
    return STATUS_CODES.get(status) or ("BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")


def http_error(status: int, message: str, headers: dict | None = None) -> HttpError:
    """A transport answer (malformed framing, a size cap, a timeout, the connection cap): code from the status."""
    return HttpError(status, code_for(status), message, headers=headers)


def body_too_large(limit: int) -> HttpError:
    """400 INVALID_JSON for a body over --max-body-bytes (the real server's over-limit answer)."""
    return invalid_json(f"Request body exceeds the limit of {limit} bytes", "body_too_large")
