"""HttpError and the JSON error envelopes the Spooled API answers with.

Every error leaves the server as JSON with at least `code` and `message`;
validation errors add `details` (a list of {field, message, code}).
"""

from __future__ import annotations

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


def missing_field(field: str) -> HttpError:
    """422: a required field is absent (serde's `missing field`)."""
    msg = f"Field `{field}` is required"
    return HttpError(422, "VALIDATION_ERROR", msg,
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
    """The contract's status-to-code fallback (section 2); a 4xx it does not list is BAD_REQUEST."""
    return STATUS_CODES.get(status) or ("BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")


def http_error(status: int, message: str, headers: dict | None = None) -> HttpError:
    """A transport answer (malformed framing, a size cap, a timeout, the connection cap): code from the status."""
    return HttpError(status, code_for(status), message, headers=headers)


def body_too_large(limit: int) -> HttpError:
    """400 INVALID_JSON for a body over --max-body-bytes (the contract's over-limit answer)."""
    return invalid_json(f"Request body exceeds the limit of {limit} bytes", "body_too_large")
