"""The blocking client (requests): HTTP/1.0 servers, retries of idempotent calls only, a bounded deregister,
and no API key in any error it raises."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback

import pytest
from conftest import ROOT
from support.fake_http import MisbehavingServer, all_cases, read_request
from support.tls_proxy import self_signed_cert, tls_proxy

from supervisor import exactjson
from supervisor.client import rest as api

KEY = "sp_test_blocking_secret_0123456789"
CASES = all_cases()


class ScriptedServer:
    """A loopback server whose `answer(request_bytes, index)` returns the bytes to send (None: hang up at
    once, without answering); it closes every connection after one answer, as an HTTP/1.0 server does."""

    def __init__(self, answer):
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.thread.join(5)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                request = read_request(conn, bytearray())
                if request is None:
                    return
                self.requests.append(request)
                data = self.answer(request, len(self.requests) - 1, self.stop)
                if data is not None:
                    conn.sendall(data)
            except OSError:
                pass


def body_of(request: bytes):
    return json.loads(request.split(b"\r\n\r\n", 1)[1] or b"null")


def http10(payload) -> bytes:
    """An HTTP/1.0 answer framed by the connection's end (no Content-Length)."""
    return b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + json.dumps(payload).encode()


@pytest.mark.timeout(60)
def test_enqueue_400_jobs_against_an_http10_server_that_closes_after_each_answer():
    def bulk(request, index, stop):
        jobs = body_of(request)["jobs"]
        made = [{"index": i, "job_id": f"job-{index}-{i}", "created": True} for i in range(len(jobs))]
        return http10({"succeeded": made, "failed": [], "total": len(jobs)})

    with ScriptedServer(bulk) as server:
        env = dict(os.environ, SPOOLED_API_KEY=KEY)
        run = subprocess.run([sys.executable, "-m", "supervisor", "enqueue", "--api-url", server.url, "--queue", "q",
                              "--payload", '{"n": 1180591620717411303424}', "--count", "400"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=40)
        assert run.returncode == 0, run.stderr
        assert "enqueued 400 job(s) on q" in run.stderr and len(set(run.stdout.split())) == 400
        assert len(server.requests) == 4 and server.connections == 4
        for request in server.requests:
            assert request.startswith(b"POST /api/v1/jobs/bulk HTTP/1.1\r\n")
            assert f"Bearer {KEY}".encode() in request
            jobs = body_of(request)["jobs"]
            assert len(jobs) == 100 and all(j["payload"] == {"n": 2**70} for j in jobs)  # exact, not 1.18e21


def hang_up_first(payload):
    """Hang up on the first request without a word; answer the next ones with `payload` (HTTP/1.1)."""
    def answer(request, index, stop):
        if index == 0:
            return None
        body = json.dumps(payload).encode()
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    return answer


@pytest.mark.timeout(30)
def test_idempotent_calls_are_retried_after_a_network_error():
    with ScriptedServer(hang_up_first({"ok": True})) as server:
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=5, attempts=3)
        assert spooled.get("/api/v1/jobs/stats") == {"ok": True}
        assert len(server.requests) == 2
    with ScriptedServer(hang_up_first(None)) as server:
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=5, attempts=3)
        spooled.deregister("w-1")  # no timeout: the command-line path, retried (deregister is safe to repeat)
        assert len(server.requests) == 2 and server.requests[1].startswith(b"POST /api/v1/workers/w-1/deregister ")


@pytest.mark.timeout(30)
def test_a_bulk_create_without_an_idempotency_key_is_never_resent():
    with ScriptedServer(hang_up_first({"succeeded": [], "failed": []})) as server:
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=5, attempts=3)
        with pytest.raises(api.Unavailable) as caught:
            spooled.bulk_create("q", [{"a": 1}])
        assert len(server.requests) == 1 and caught.value.retryable
    with ScriptedServer(lambda request, index, stop: None) as server:  # hangs up on every request
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=5, attempts=3)
        with pytest.raises(api.Unavailable):
            spooled.claim("q", "w", 1, 30)
        assert len(server.requests) == 1  # nor is a claim
        with pytest.raises(api.Unavailable):
            spooled.get("/api/v1/jobs")
        assert len(server.requests) == 1 + 3  # a GET is, a bounded number of times
    with ScriptedServer(lambda request, index, stop: None) as server:
        once = api.SpooledAPI(server.url, api.Secret(KEY), timeout=5)  # the daemon's: attempts=1
        with pytest.raises(api.Unavailable):
            once.get("/api/v1/workers/w")
        assert len(server.requests) == 1


@pytest.mark.timeout(30)
def test_the_final_deregister_is_bounded_even_against_a_trickling_server():
    def trickle(request, index, stop):
        return None if stop.wait(20) else b""  # accepts, reads the request, says nothing until the test ends

    with ScriptedServer(trickle) as server:
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=30)
        started = time.monotonic()
        with pytest.raises(api.Unavailable) as caught:
            spooled.deregister("w", timeout=1.0)
        assert time.monotonic() - started < 3.0
        assert caught.value.code == "TIMEOUT" and len(server.requests) == 1


@pytest.mark.timeout(30)
def test_a_deregister_answer_dripped_slower_than_the_timeout_allows_is_cut_off():
    """Each byte comes within the per-read timeout, so only a whole-attempt deadline can stop it."""
    class Dripper(ScriptedServer):
        def _serve(self, conn):
            with conn:
                try:
                    read_request(conn, bytearray())
                    self.requests.append(b"")
                    for byte in b"HTTP/1.1 204 No Content\r\nX-Slow: " + b"a" * 1000:
                        conn.sendall(bytes([byte]))
                        if self.stop.wait(0.2):
                            return
                except OSError:
                    pass

    with Dripper(None) as server:
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=30)
        started = time.monotonic()
        with pytest.raises(api.Unavailable):
            spooled.deregister("w", timeout=1.0)
        assert time.monotonic() - started < 3.0


def chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


@pytest.mark.timeout(30)
def test_errors_from_the_blocking_client_never_carry_the_key():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}"
    garbage = ScriptedServer(lambda request, index, stop: b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{x")
    slow = ScriptedServer(lambda request, index, stop: None if stop.wait(20) else b"")
    with garbage, slow:
        for url, call in ((refused, lambda a: a.get("/x")), (garbage.url, lambda a: a.get("/x")),
                          (slow.url, lambda a: a.deregister("w", timeout=0.5)),
                          (slow.url, lambda a: a.bulk_create("q", [1]))):
            spooled = api.SpooledAPI(url, api.Secret(KEY), timeout=0.5)
            with pytest.raises(api.ApiError) as caught:
                call(spooled)
            for exc in chain(caught.value):
                assert isinstance(exc, api.ApiError), f"a {type(exc).__name__} is reachable from our error"
                text = "".join(traceback.format_exception(exc)) + repr(exc) + repr(vars(exc))
                assert KEY not in text


@pytest.mark.timeout(60)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_the_blocking_client_trusts_exactly_the_ca_bundle_as_the_loop_does(dev_server, tmp_path):
    cert, key = self_signed_cert(tmp_path)
    proxy, port = tls_proxy(cert, key, dev_server.url)
    url = f"https://127.0.0.1:{port}"
    try:
        untrusted = api.SpooledAPI(url, api.Secret(dev_server.api_key), timeout=5)
        with pytest.raises(api.Unavailable) as caught:
            untrusted.get("/api/v1/jobs/stats")
        assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value) and dev_server.api_key not in str(caught.value)
        trusted = api.SpooledAPI(url, api.Secret(dev_server.api_key), timeout=5, ca_bundle=cert)
        assert "pending" in trusted.get("/api/v1/jobs/stats")
        trusted.create_job("tls-q", {"n": 2**70}, idempotency_key="k-1")
        assert dev_server.stats()["pending"] == 1
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_blocking_client_never_takes_a_misframed_answer_for_a_result(case):
    """The same raw answers through requests: an expected answer comes back exactly (unless the case says
    `blocking-expect: unavailable`: http.client takes a 102/103 for the answer, which we refuse); any
    other case either fails as Unavailable or, where http.client is more lenient than llhttp (bare LF
    lines, a missing chunk CRLF), yields that answer's own body. Never another answer's bytes; the next
    call is served."""
    with MisbehavingServer(case) as server:
        spooled = api.SpooledAPI(server.url, api.Secret(KEY), timeout=1.5)  # the cases that hang wait it out
        try:
            try:
                result, error = spooled.execute(spooled.claim_call("q", "w", 1, 30)), None
            except api.ApiError as exc:
                result, error = None, exc
            if case.meta.get("blocking-expect", case.meta["expect"]) == "answered":
                assert error is None and result == exactjson.loads(case.meta["result"]), f"{case.name}: {error}"
            else:
                assert isinstance(error, api.Unavailable) or result == [], f"{case.name}: {result!r} {error!r}"
            if error is not None:
                assert KEY not in str(error) and error.retryable, f"{case.name}: {error!r}"
            assert spooled.execute(spooled.claim_call("q", "w", 1, 30)) == []
        finally:
            spooled.close()
