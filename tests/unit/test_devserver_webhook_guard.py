"""A webhook's raw request is never forged: `webhooks.post` refuses a URL whose path, query or host holds a
space, CR, LF or another control character, or that is not http(s), before it opens any connection (a
stored URL from before validation, or one a future route forgets to check, still cannot smuggle a request)."""

from __future__ import annotations

import socket

import pytest

from supervisor.devserver import webhooks

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/x HTTP/1.1\r\nX-Injected: 1\r\n\r\n",
                                 "http://127.0.0.1:1/a?b=c\nd", "http://127.0.0.1:1/a b", "http://127.0.0.1:1/\x7f",
                                 "javascript:alert(1)", "ftp://127.0.0.1/x"])
def test_a_url_that_would_forge_the_request_is_refused_before_connecting(url, monkeypatch):
    def no_connection(*a, **k):
        raise AssertionError("connected")

    monkeypatch.setattr(socket, "create_connection", no_connection)
    with pytest.raises(ValueError):
        webhooks.post(url, b"{}", {}, 1.0)
