"""A local HTTP receiver for outgoing webhook tests: records each POST; its answers can be scripted."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """`statuses` are answered in turn (then 200); `delay` seconds before each answer. `hold()` gives a
    port that accepts connections and never answers."""

    def __init__(self, statuses: list[int] | None = None, delay: float = 0.0):
        self.statuses = list(statuses or [])
        self.delay = delay
        self.got: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.got.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                      "body": body, "json": json.loads(body), "at": time.time()})
                    status = outer.statuses.pop(0) if outer.statuses else 200
                if outer.delay:
                    time.sleep(outer.delay)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                answer = b"ok\x00\x07 <b>fine</b>" if status < 300 else b"nope"
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requests(self, path: str | None = None) -> list[dict]:
        with self.lock:
            return [r for r in self.got if path is None or r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hold:
    """A port that accepts connections and never answers."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/slow"

    def close(self) -> None:
        self.sock.close()


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/dead"
