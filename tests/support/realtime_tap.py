"""A test's listener on the dev server's realtime routes: an SSE stream read on its own thread."""

from __future__ import annotations

import http.client
import json
import threading
import time


class SseTap:
    """Opens `GET path` (with `headers`) and collects (event name, parsed data) and comments until closed."""

    def __init__(self, port: int, path: str, headers: dict | None = None, timeout: float = 30.0):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        self.conn.request("GET", path, headers=headers or {})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.events: list[tuple[str, dict]] = []
        self.comments: list[str] = []
        self.ended = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        if self.status == 200:
            self._thread.start()
        else:
            self.body = self.resp.read()
            self.ended.set()

    def _read(self) -> None:
        name, data = None, []
        try:
            while True:
                line = self.resp.readline()
                if not line:
                    return
                line = line.rstrip(b"\r\n").decode()
                if line.startswith(":"):
                    with self._lock:
                        self.comments.append(line[1:])
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif line == "" and data:
                    with self._lock:
                        self.events.append((name or "message", json.loads("\n".join(data))))
                    name, data = None, []
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            return
        finally:
            self.ended.set()

    def snapshot(self) -> list[tuple[str, dict]]:
        with self._lock:
            return list(self.events)

    def wait_for(self, predicate, timeout: float = 10.0, what: str = "events") -> list[tuple[str, dict]]:
        """Poll until `predicate(events)` is true; the events then."""
        deadline = time.monotonic() + timeout
        while True:
            events = self.snapshot()
            if predicate(events):
                return events
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; got {events}")
            time.sleep(0.02)

    def close(self) -> None:
        try:
            self.conn.sock and self.conn.sock.shutdown(2)
        except OSError:
            pass
        self.ended.wait(5)
        self.conn.close()
