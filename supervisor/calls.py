"""API calls off the parent's loop: a few threads run them, results come back through a queue.

The loop calls `submit(tag, fn, *args)` and, whenever the wake-up fd is readable, `drain()`
to collect `(tag, result, error)` triples. A thread makes one attempt and never sleeps;
retry timing belongs to the loop.
"""

from __future__ import annotations

import os
import queue
from concurrent.futures import Future, ThreadPoolExecutor


class ApiCalls:
    def __init__(self, wake_fd: int, threads: int = 4):
        self._wake_fd = wake_fd
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="api")
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self.pending = 0

    def submit(self, tag, fn, *args) -> None:
        self.pending += 1
        future = self._pool.submit(fn, *args)
        future.add_done_callback(lambda f, tag=tag: self._done(tag, f))

    def _done(self, tag, future: Future) -> None:
        self._results.put((tag, future))
        try:
            os.write(self._wake_fd, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full, so the loop is already awake

    def drain(self) -> list[tuple]:
        out = []
        while True:
            try:
                tag, future = self._results.get_nowait()
            except queue.Empty:
                return out
            self.pending -= 1
            error = future.exception()
            out.append((tag, None if error else future.result(), error))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
