"""The parent's non-blocking HTTP client outside the daemon: one made with its own selector and wake-up pipe,
and a minimal loop (the arbiter's shape) turned until it hands back a result."""

from __future__ import annotations

import os
import selectors
import time

from supervisor.client import loophttp
from supervisor.client import rest as api


def run_until_done(client: loophttp.LoopHTTP, sel: selectors.BaseSelector, wake_r: int, timeout: float = 10.0):
    """Turn a minimal loop (the arbiter's shape) until the client hands back a result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for key, mask in sel.select(0.05):
            if key.data[0] == "http":
                client.on_ready(key.data[1], mask, time.monotonic())
            else:
                os.read(wake_r, 4096)
        client.expire(time.monotonic())
        done = client.done()
        if done:
            return done
    raise AssertionError("no result in time")


def make_client(url: str, key: str, timeout: float = 5.0):
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    sel.register(wake_r, selectors.EVENT_READ, ("wake", None))
    spooled = api.SpooledAPI(url, api.Secret(key), timeout=timeout)
    return spooled, loophttp.LoopHTTP(spooled, sel, wake_w), sel, wake_r
