"""The blocking transport of `SpooledAPI.execute`: `requests`, one Session per SpooledAPI.

Its contract (timeouts, which calls are retried, the bounded final deregister, trust, no key in any
error) is stated in supervisor.client.rest's docstring; this module is imported only on first use.

Framing is urllib3's and http.client's. They refuse a negative or differing Content-Length, an unknown
transfer coding and junk, but accept some forms llhttp refuses; `framing_problem` adds the checks that
matter after the fact: Content-Length digits only and once, not beside Transfer-Encoding, which must be
`chunked` alone and never in HTTP/1.0, and no interim (1xx) status as the answer. Such an answer fails
as Unavailable (BAD_FRAMING) and its connections are dropped, so nothing left over is read as the next
answer.
"""

from __future__ import annotations

import ssl
import threading
import time
from typing import Any

import requests
import requests.adapters

from supervisor.backoff import backoff
from supervisor.client.calls import ApiError, Call, Endpoint, Unavailable, decode
from supervisor.client.httpconn import Response

RETRY_STATUSES = (408, 502, 503, 504)


class _Adapter(requests.adapters.HTTPAdapter):
    """requests' adapter, trusting exactly `ssl_context` (the loop client's CAs), never retrying by itself."""

    def __init__(self, ssl_context: ssl.SSLContext | None):
        self._ssl_context = ssl_context
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        if self._ssl_context is not None:
            kwargs["ssl_context"] = self._ssl_context
        super().init_poolmanager(*args, **kwargs)

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        conn.cert_reqs = "CERT_REQUIRED"  # which CAs: the ssl_context's; never requests' own bundle


def framing_problem(status: int, version: int, headers: Any) -> str | None:
    """What is wrong with an answer's framing, from its status, HTTP version (10, 11) and raw headers."""
    if status < 200:
        return f"an interim answer ({status}) where the answer belongs"
    lengths = headers.getlist("content-length")
    codings = headers.getlist("transfer-encoding")
    if lengths and codings:
        return "Content-Length beside Transfer-Encoding"
    if len(lengths) > 1 or any(not (v.strip().isascii() and v.strip().isdigit()) for v in lengths):
        return f"bad Content-Length {', '.join(lengths)[:40]!r}"
    if codings and (version == 10 or [c.strip().lower() for c in codings] != ["chunked"]):
        return f"Transfer-Encoding {', '.join(codings)[:40]!r} in an HTTP/1.{version % 10} answer"
    return None


class BlockingTransport:
    def __init__(self, api: Endpoint, key: str):
        self.api = api
        self._key = key
        self._session: requests.Session | None = None

    def new_session(self) -> requests.Session:
        api = self.api
        session = requests.Session()
        session.trust_env = False
        session.headers.clear()
        session.headers.update(api.headers)
        adapter = _Adapter(ssl.create_default_context(cafile=api.ca_bundle) if api.https else None)
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        return session

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            self._session = self.new_session()
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def transport_error(self, exc: BaseException) -> Unavailable:
        """Our error for a failed exchange: its text only, never the exception (which holds the request)."""
        kind = "TIMEOUT" if isinstance(exc, requests.Timeout | TimeoutError) else "NETWORK_ERROR"
        detail = self.scrub(str(exc))[:300]
        return Unavailable(0, kind, f"{type(exc).__name__} talking to {self.api.base_url}: {detail}")

    def send(self, session: requests.Session, call: Call, timeout: float) -> object:
        """One attempt: the result, or the typed ApiError."""
        api = self.api
        started = time.monotonic()
        status, failure, response = 0, None, None
        try:
            r = session.request(call.method, api.origin + call.path, data=call.body or None,
                                timeout=(timeout, timeout), allow_redirects=False)
            status = r.status_code
            response = Response(status, {k.lower(): v for k, v in r.headers.items()}, r.content, False)
            problem = framing_problem(status, r.raw.version, r.raw.headers)
            if problem is not None:
                session.close()  # drop its connections: the rest of this one must never become an answer
                failure = Unavailable(0, "BAD_FRAMING", f"{problem} (from {api.base_url})")
        except Exception as exc:  # requests', urllib3's and http.client's errors alike: the call failed
            failure = self.transport_error(exc)
        finally:
            if api.on_request is not None:
                api.on_request(call.route, status, time.monotonic() - started)
        if failure is not None:
            raise failure  # outside the except block: no __context__ pointing at the request
        assert response is not None  # set whenever no failure was
        return decode(call, response)

    def execute(self, call: Call, timeout: float | None) -> object:
        if timeout is not None:
            return self.bounded(call, timeout)
        attempts = self.api.attempts if call.idempotent else 1
        for attempt in range(1, attempts + 1):
            try:
                return self.send(self.session, call, self.api.timeout)
            except Unavailable as exc:
                if attempt == attempts or (exc.status and exc.status not in RETRY_STATUSES):
                    raise
                time.sleep(exc.retry_after if exc.retry_after is not None and exc.retry_after <= 2
                           else backoff(attempt, 0.2, 1.0))
        raise AssertionError("unreachable")

    def bounded(self, call: Call, timeout: float) -> object:
        """One attempt on a fresh session, run on a helper thread: over within `timeout` whatever the server
        does (requests' own timeouts bound each read, not the whole answer)."""
        outcome: dict[str, Any] = {}
        session = self.new_session()

        def attempt() -> None:
            try:
                outcome["result"] = self.send(session, call, timeout)
            except ApiError as exc:
                outcome["error"] = exc
            except Exception as exc:  # e.g. an `answer` that cannot read the reply
                outcome["error"] = Unavailable(0, "BAD_ANSWER", f"{type(exc).__name__}: {self.scrub(str(exc))[:200]}")
            finally:
                session.close()

        worker = threading.Thread(target=attempt, name=f"api-{call.route}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            raise Unavailable(0, "TIMEOUT", f"no answer from {self.api.base_url} within {timeout:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("result")
