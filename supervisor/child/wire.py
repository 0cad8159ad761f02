"""Length-prefixed JSON frames between the parent and its children over a socketpair.

A frame is a 4-byte big-endian length followed by that many bytes of JSON: orjson, with the exact
fallback of supervisor.exactjson, so integers of any size cross intact both ways (a job's payload to
the child, a result back to the parent, which receives it as the value the handler returned).

Parent side: `Channel` is non-blocking and resumable, so a slow or stuck child never
blocks the parent loop, and a payload of several MiB goes through in pieces.
Child side: `Inbox` reads (blocking for the next frame, or taking only what has arrived) and
`write_frame` / `write_frames` block, which is what a child wants.

Messages (`t` is the type):
  parent -> child: {"t": "job", "job": {...claimed job...}, "held"?: true, "start_by"?}, {"t": "drop", "id"},
                   {"t": "stop"}, {"t": "settled", "id", "as", "error", "operation"}
  child -> parent: {"t": "ready", "pid", "keeper", "about", "wants_settled"?: true}, {"t": "boot_error", "error"},
                   {"t": "done", "id", "ok": true, "result"}, {"t": "done", "id", "ok": false, "error"},
                   {"t": "dropped", "id"}, {"t": "started", "id", "at"}

A job sent to a busy child is *held* (`"held": true`): it waits in the child until the running job
ends. The child then starts it at once and says so in that job's `done` (`"next": id, "started":
time.monotonic()`), or, if it was idle by the time the job came, in a `started` frame; past its
`start_by` (time.monotonic(): its lease may have run out) it gives it back unstarted (`dropped`). `drop` asks
for a held job back: the child answers `dropped` if it had not started it (else the frame saying it
started has already gone out).

`settled` tells a child that said `wants_settled` (its SDK worker has hooks for those events) how a job it
ran settled: `as` completed, failed, lease_lost, or error (the API refused the report); `refused` (the API
refused the result, and the failure sent instead settles in a later frame) is not final. The child acts on
them between jobs (supervisor.child.hooks).
"""

from __future__ import annotations

import socket
import struct

from supervisor import exactjson

HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024
_READ_CHUNK = 65536  # under malloc's mmap threshold: a bigger recv buffer costs an mmap per call


def encode(msg: dict) -> bytes:
    body = exactjson.dumps(msg)
    return HEADER.pack(len(body)) + body


class Channel:
    """The parent's end of a child's socket: buffered non-blocking writes, incremental reads."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self._out = bytearray()
        self._in = bytearray()
        self._eof = False

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def send(self, msg) -> None:
        """Queue one message and write as much as the socket takes now; `flush` writes the rest."""
        self._out += encode(msg)
        self.flush()

    def flush(self) -> None:
        """Write queued bytes until the socket would block. Raises OSError if the child is gone."""
        while self._out:
            try:
                n = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            del self._out[:n]

    def receive(self) -> list:
        """Read what is available and return the complete messages. Raises EOFError at end of stream
        (after handing out, on the call before, any whole message that came in ahead of it)."""
        if self._eof:
            raise EOFError
        while True:
            try:
                chunk = self.sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self._eof = True
                break
            self._in += chunk
            if len(chunk) < _READ_CHUNK:
                break
        messages = list(self._take_frames())
        if self._eof and not messages:
            raise EOFError
        return messages

    def _take_frames(self):
        buf = self._in
        pos = 0
        while len(buf) - pos >= HEADER.size:
            (size,) = HEADER.unpack_from(buf, pos)
            if size > MAX_FRAME:
                raise EOFError(f"frame of {size} bytes is over the {MAX_FRAME} byte limit")
            end = pos + HEADER.size + size
            if len(buf) < end:
                break
            yield exactjson.loads(memoryview(buf)[pos + HEADER.size:end])
            pos = end
        del buf[:pos]

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError
        got += n
    return bytes(buf)


class Inbox:
    """The child's end of its socket (blocking): the next frame, or the frames that have arrived."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._in = bytearray()
        self._frames: list = []
        self._eof = False

    def arrived(self, wait: bool = False) -> list:
        """Every whole message sent so far (with `wait`, blocking until there is one); a frame begun is
        read to its end. EOFError when the parent has gone and nothing is left."""
        while not self._eof and (wait and not self._frames or self._in):
            self._receive(block=True)
        while not self._eof and self._receive(block=bool(self._in)):
            pass
        if self._eof and not self._frames:
            raise EOFError
        frames, self._frames = self._frames, []
        return frames

    def _receive(self, block: bool) -> bool:
        """Read once; False when nothing was there (not blocking) or the stream ended."""
        try:
            chunk = self.sock.recv(_READ_CHUNK, 0 if block else socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        if not chunk:
            self._eof = True
            return False
        self._in += chunk
        buf, pos = self._in, 0
        while len(buf) - pos >= HEADER.size:
            (size,) = HEADER.unpack_from(buf, pos)
            end = pos + HEADER.size + size
            if len(buf) < end:
                break
            self._frames.append(exactjson.loads(memoryview(buf)[pos + HEADER.size:end]))
            pos = end
        del buf[:pos]
        return True


def read_frame(sock: socket.socket):
    """Block until one whole message arrives; EOFError when the parent has gone."""
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return exactjson.loads(_recv_exact(sock, size))


def write_frame(sock: socket.socket, msg) -> None:
    sock.sendall(encode(msg))


def write_frames(sock: socket.socket, msgs: list) -> None:
    """Send several messages in one write."""
    sock.sendall(b"".join(encode(m) for m in msgs))
