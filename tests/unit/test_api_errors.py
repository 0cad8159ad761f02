"""API errors are classified for the loop (retry, back off, fatal), and an unreachable API is a retryable error
whose text never carries the key."""

from __future__ import annotations

import socket

import pytest

from supervisor.client import rest as api


def test_api_errors_are_classified_for_the_loop():
    assert isinstance(api.classify(409, {"code": "LEASE_EXPIRED"}, job_route=True), api.LeaseLost)
    assert isinstance(api.classify(404, {"code": "NOT_FOUND"}, job_route=True), api.LeaseLost)
    assert isinstance(
        api.classify(409, {"code": "CONFLICT", "message": "Job is already completed"}, job_route=True),
        api.AlreadyFinished,
    )
    assert isinstance(api.classify(409, {"code": "CONFLICT"}), api.Conflict)
    assert isinstance(api.classify(429, {"code": "QUOTA_EXCEEDED"}), api.QuotaExceeded)
    limited = api.classify(429, {"code": "RATE_LIMIT_EXCEEDED"}, {"Retry-After": "7"})
    assert isinstance(limited, api.RateLimited) and limited.retry_after == 7.0
    assert isinstance(api.classify(503, {}), api.Unavailable) and api.classify(503, {}).retryable
    assert isinstance(api.classify(401, {"code": "UNAUTHORIZED"}), api.Unauthorized)
    assert isinstance(api.classify(400, {"code": "VALIDATION_ERROR"}), api.Rejected)
    secret = api.Secret("sp_test_supersecret")
    assert "supersecret" not in repr(secret) and "supersecret" not in str(secret)


@pytest.mark.timeout(20)
def test_unreachable_api_is_a_retryable_error_without_the_key():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = api.SpooledAPI(f"http://127.0.0.1:{port}", api.Secret("sp_test_neverprinted1"), timeout=1)
    with pytest.raises(api.Unavailable) as err:
        client.claim("q", "w", 1, 30)
    assert "neverprinted" not in str(err.value) and "neverprinted" not in repr(client)
