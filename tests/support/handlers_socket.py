"""A handler that writes on the child's socket to the daemon, for tests/integration/test_hostile_child_frames.py:
what a handler can do, since the socket is open in its own process."""

from __future__ import annotations

import gc
import socket
import struct


def handle(ctx):
    """`{"write": "garbage"}` writes a frame whose body is not JSON; `"huge"` a header that claims more than
    any frame may hold; `"large"` one of 16 MiB, more than a child's frame may hold beside its result (the
    result's cap, 1.9 MB by default); anything else returns normally."""
    what = ctx.payload.get("write")
    sizes = {"huge": (1 << 31) - 1, "large": 16 * 1024 * 1024}
    if what in ("garbage", "huge", "large"):
        data = struct.pack("!I", 9) + b"{not json" if what == "garbage" else struct.pack("!I", sizes[what]) + b"{"
        for sock in [o for o in gc.get_objects() if isinstance(o, socket.socket)]:
            if sock.family == socket.AF_UNIX and sock.fileno() >= 0:
                sock.sendall(data)
    return {"ok": True}
