"""A proxy in front of the dev server whose events stream misbehaves, for the daemon's tests: every other
request is forwarded as it came (and counted); `GET /api/v1/events` is answered 200 text/event-stream and then
`flood` (comment lines as fast as the socket takes them), `flap` (closed at once) or `comments` (a comment
line every 20 ms, far above a server's keepalive, and never an event). Served by threads on port 0."""

from __future__ import annotations

import http.server
import threading
import time
from collections import Counter

from support.tls_proxy import forward

MODES = ("flood", "flap", "comments")


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class HostileEvents:
    """`url` is the proxy's; `seen` counts requests by (method, route) with the time of each in `times`."""

    def __init__(self, upstream: str, mode: str):
        assert mode in MODES, mode
        self.mode, self.upstream = mode, upstream
        self.seen: Counter = Counter()
        self.times: list[tuple[float, str, str]] = []  # (time.time(), method, path without the query)
        self.stop = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _note(self) -> str:
                path = self.path.split("?", 1)[0]
                proxy.seen[(self.command, path)] += 1
                proxy.times.append((time.time(), self.command, path))
                return path

            def _forward(self):
                path = self._note()
                if self.command == "GET" and path.endswith("/api/v1/events"):
                    return proxy.events(self)
                forward(self, upstream)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        handler.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n")
        handler.wfile.flush()
        try:
            if self.mode == "flood":
                block = b":\n" * 32768
                while not self.stop.is_set():
                    handler.wfile.write(block)
            elif self.mode == "comments":
                while not self.stop.is_set():
                    handler.wfile.write(b": nothing to say\n")
                    handler.wfile.flush()
                    time.sleep(0.02)
        except OSError:
            pass  # the daemon closed it

    def count(self, since: float, until: float, skip: tuple[str, ...] = ("/heartbeat",)) -> list[tuple[str, str]]:
        """The requests between `since` and `until` (time.time()), heartbeats left out."""
        return [(m, p) for t, m, p in list(self.times) if since <= t < until and not p.endswith(skip)]

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()
