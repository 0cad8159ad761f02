"""Length-prefixed JSON frames between the parent and its children over a socketpair.

A frame is a 4-byte big-endian word followed by JSON: orjson, with the exact fallback of
supervisor.exactjson, so integers of any size cross intact both ways (a job's payload to the child, a
result back to the parent, which receives it as the value the handler returned). The word's low 31 bits
are the JSON's length; its top bit (`WIDE`) says the JSON may hold an integer past 64 bits, which only
exactjson reads exactly. The writer knows: orjson wrote the frame (it writes no such integer) unless it
refused, or the frame carries a result the child encoded exactly (`WideJSON`). So the reader of a frame without the
bit hands it to orjson as it is, and skips exactjson's search for long digit runs.

Parent side: `Channel` is non-blocking and resumable, so a slow or stuck child never
blocks the parent loop, and a payload of several MiB goes through in pieces.
Child side: `Inbox` reads (blocking for the next frame, or taking only what has arrived) and
`write_frame` / `write_frames` block, which is what a child wants.

Each frame is a typed record defined here once and used by both sides (`JobFrame`, `Drop`, `Stop`, `Settled`
from the parent; `Ready`, `BootError`, `Done`, `Dropped`, `Started` from the child). On the wire it is the JSON object
it has always been (`t` is the type), built by its `wire()`:
  parent -> child: {"t": "job", "job": {...claimed job...}, "held"?: true, "start_by"?}, {"t": "drop", "id"},
                   {"t": "stop"}, {"t": "settled", "id", "as", "error", "operation"}
  child -> parent: {"t": "ready", "pid", "keeper", "about", "wants_settled"?: true}, {"t": "boot_error", "error"},
                   {"t": "done", "id", "ok": true, "result"}, {"t": "done", "id", "ok": false, "error"},
                   {"t": "dropped", "id"}, {"t": "started", "id", "at"}
and is read back into its record by `decode_down` (the child) or `decode_up` (the parent), which check
what they read: a frame of an unknown type, or without what it must carry, is None (ignored).

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
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from supervisor import exactjson
from supervisor.job import Job

HEADER = struct.Struct("!I")
WIDE = 1 << 31  # the header's top bit: the JSON may hold integers past 64 bits (read it with exactjson)
_SIZE = WIDE - 1
MAX_FRAME = 256 * 1024 * 1024
_READ_CHUNK = 65536  # under malloc's mmap threshold: a bigger recv buffer costs an mmap per call


_new = tuple.__new__  # a record made for every job skips its named tuple's __new__ (a Python function)
_NUMBERS = frozenset((int, float))


def _number(value: Any) -> float | None:
    return float(value) if type(value) in _NUMBERS else None  # (type(): a bool is no number)


# ------------------------------------------------------------------ parent -> child
class JobFrame(NamedTuple):
    """A job to run: at once (an idle child), or `held`, to start when the running one ends and before
    `start_by` (time.monotonic())."""

    job: Job
    held: bool = False
    start_by: float | None = None

    def wire(self) -> dict:
        if not self.held:
            return {"t": "job", "job": self.job.raw}
        return {"t": "job", "job": self.job.raw, "held": True, "start_by": self.start_by}


class Drop(NamedTuple):
    """Give back the held job `id` if it has not started."""

    id: str

    def wire(self) -> dict:
        return {"t": "drop", "id": self.id}


class Stop(NamedTuple):
    """Exit once the running job (if any) is done; held jobs are given back."""

    def wire(self) -> dict:
        return {"t": "stop"}


class Settled(NamedTuple):
    """How the job `id` this child ran settled (`settled_as`: completed, failed, lease_lost, error when the
    API refused its report, or refused, not final, when it refused the result and the failure sent instead
    settles in a later frame), with the error and the call (`operation`) it concerns."""

    id: str
    settled_as: str
    error: str = ""
    operation: str = ""

    def wire(self) -> dict:
        return {"t": "settled", "id": self.id, "as": self.settled_as, "error": self.error,
                "operation": self.operation}


# ------------------------------------------------------------------ child -> parent
class Ready(NamedTuple):
    """The handler is imported: the child's pid, its keeper's, what the handler's SDK worker says, and
    whether the child wants `settled` frames (its SDK worker has hooks for those events)."""

    pid: int | None
    keeper: int | None = None
    about: dict | None = None
    wants_settled: bool = False

    def wire(self) -> dict:
        out = {"t": "ready", "pid": self.pid, "keeper": self.keeper, "about": self.about}
        if self.wants_settled:
            out["wants_settled"] = True
        return out


class BootError(NamedTuple):
    """The handler could not be imported: `error` is the traceback."""

    error: str

    def wire(self) -> dict:
        return {"t": "boot_error", "error": self.error}


class WideJSON(NamedTuple):
    """A result's JSON, encoded already, that may hold an integer past 64 bits (exactjson wrote it)."""

    text: bytes


class Done(NamedTuple):
    """The job `id` ended: `ok` with `result` (the handler's value, or its JSON already encoded: an
    orjson.Fragment, or a `WideJSON`), else `error`; `next` is the held job started at once, at `started`
    (monotonic)."""

    id: str
    ok: bool
    result: Any = None
    error: str | None = None
    next: str | None = None
    started: float | None = None

    def wire(self) -> dict:
        result = self.result if type(self.result) is not WideJSON else orjson.Fragment(self.result.text)
        out: dict[str, Any] = {"t": "done", "id": self.id, "ok": True, "result": result} if self.ok else \
            {"t": "done", "id": self.id, "ok": False, "error": self.error}
        if self.next is not None:
            out["next"], out["started"] = self.next, self.started
        return out


class Dropped(NamedTuple):
    """The held job `id` given back unstarted."""

    id: str

    def wire(self) -> dict:
        return {"t": "dropped", "id": self.id}


class Started(NamedTuple):
    """A held job that reached the child once it was idle, started at `at` (monotonic)."""

    id: str
    at: float | None

    def wire(self) -> dict:
        return {"t": "started", "id": self.id, "at": self.at}


Down = JobFrame | Drop | Stop | Settled
Up = Ready | BootError | Done | Dropped | Started
Frame = Down | Up


def done_ok(job_id: str, result: Any) -> Done:
    """The `done` of a job that returned `result` (the cheap way to make the one made for every job)."""
    return _new(Done, (job_id, True, result, None, None, None))


def encode_job(job: Job) -> bytes:
    """`encode(JobFrame(job))`, the frame of a job for an idle child, without making the record: one is
    sent for every job."""
    try:
        body = orjson.dumps({"t": "job", "job": job.raw})
    except TypeError:
        return encode(_new(JobFrame, (job, False, None)))
    return HEADER.pack(len(body)) + body


def decode_down(msg: Any) -> Down | None:
    """The parent's frame `msg` (as JSON decoded it), or None if it is none the child knows."""
    kind = msg.get("t") if type(msg) is dict else None
    if kind == "job":
        job = Job.parse(msg.get("job"))
        if job is None:
            return None
        if not msg.get("held"):
            return _new(JobFrame, (job, False, None))
        return _new(JobFrame, (job, True, _number(msg.get("start_by"))))
    if kind == "drop":
        return Drop(msg["id"]) if type(msg.get("id")) is str else None
    if kind == "settled":
        job_id = msg.get("id")
        if type(job_id) is not str:
            return None
        return Settled(job_id, str(msg.get("as") or ""), str(msg.get("error") or ""), str(msg.get("operation") or ""))
    return Stop() if kind == "stop" else None


def decode_up(msg: Any) -> Up | None:
    """The child's frame `msg` (as JSON decoded it), or None if it is none the parent knows or lacks what it
    must carry (a child is not trusted to send well-formed frames)."""
    kind = msg.get("t") if type(msg) is dict else None
    if kind == "done":
        get = msg.get
        job_id, following = get("id"), get("next")
        if type(job_id) is not str:
            job_id = ""  # the child answered, for no job the parent knows: it is free, nothing settles
        if get("ok"):
            ok, result, error = True, get("result"), None
        else:
            error = get("error")  # (str(): a child is not trusted to send a string)
            ok, result, error = False, None, str(error) if error else "Job failed"
        if following is None:
            return _new(Done, (job_id, ok, result, error, None, None))
        return _new(Done, (job_id, ok, result, error, following if type(following) is str else None,
                           _number(get("started"))))
    if kind in ("started", "dropped"):
        job_id = msg.get("id")
        if type(job_id) is not str:
            return None
        return Started(job_id, _number(msg.get("at"))) if kind == "started" else Dropped(job_id)
    if kind == "ready":
        keeper, about = msg.get("keeper"), msg.get("about")
        return Ready(msg.get("pid"), keeper if type(keeper) is int else None,
                     about if type(about) is dict else None, msg.get("wants_settled") is True)
    if kind == "boot_error":
        return BootError(msg.get("error") or "")
    return None


def encode(frame: Frame) -> bytes:
    """The frame's bytes on the wire: its header word (length, and `WIDE` when the JSON may hold an integer
    past 64 bits), then its JSON object. Raises TypeError if the frame has no JSON form."""
    value = frame.wire()
    try:
        body = orjson.dumps(value)
    except TypeError:  # an integer past 64 bits (or nothing encodes it: exactjson raises TypeError again)
        body = exactjson.dumps(value)
        return HEADER.pack(len(body) | WIDE) + body
    if type(frame) is Done and type(frame.result) is WideJSON:
        return HEADER.pack(len(body) | WIDE) + body
    return HEADER.pack(len(body)) + body


class BadFrame(EOFError):
    """The other end sent what is no frame (a length over MAX_FRAME, or a body that is not JSON): nothing
    after it can be read."""


def unpack(buf: bytearray, limit: int = MAX_FRAME) -> list[Any]:
    """The JSON values of the whole frames at the start of `buf`, which are cut from it (a frame begun
    stays). Raises BadFrame at a frame over `limit` bytes or one that is not JSON."""
    have = len(buf)
    if have < HEADER.size:
        return []
    (word,) = HEADER.unpack_from(buf)
    if have == HEADER.size + (word & _SIZE) <= HEADER.size + limit:  # the usual read: one whole frame
        body = buf[HEADER.size:]  # (a copy: orjson reads a memoryview's slice at half the speed)
        buf.clear()
        return [_load(word, body)]
    out = []
    pos = 0
    while have - pos >= HEADER.size:
        (word,) = HEADER.unpack_from(buf, pos)
        size = word & _SIZE
        if size > limit:
            raise BadFrame(f"a frame of {size} bytes, over the {limit} byte limit")
        end = pos + HEADER.size + size
        if have < end:
            break
        out.append(_load(word, buf[pos + HEADER.size:end]))
        pos = end
    del buf[:pos]
    return out


def _load(word: int, body: bytes | bytearray) -> Any:
    """The JSON `body` of a frame whose header word is `word`; BadFrame if it is none."""
    try:
        return exactjson.loads(body) if word & WIDE else orjson.loads(body)
    except ValueError as exc:
        raise BadFrame(f"a frame that is not JSON ({str(exc)[:120]})") from None


class Channel:
    """The parent's end of a child's socket: buffered non-blocking writes, incremental reads."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME):
        """`max_frame`: the most a frame from the child may hold (a larger one is a BadFrame, refused from its
        header, before the parent buffers or parses it)."""
        sock.setblocking(False)
        self.sock = sock
        self.max_frame = max_frame
        self._out = bytearray()
        self._in = bytearray()
        self._eof = False

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    def send(self, frame: Down) -> None:
        """Queue one frame and write as much as the socket takes now; `flush` writes the rest."""
        self._out += encode(frame)
        self.flush()

    def send_job(self, job: Job) -> None:
        """`send(JobFrame(job))`: the job for an idle child."""
        self._out += encode_job(job)
        self.flush()

    def flush(self) -> None:
        """Write queued bytes until the socket would block. Raises OSError if the child is gone."""
        while self._out:
            try:
                n = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            del self._out[:n]

    def receive(self, budget: int | None = None) -> list[Up]:
        """Read what is available (at most about `budget` bytes, when given: the rest waits for the next
        call) and return the complete frames the parent knows (`decode_up`). Raises EOFError at end of
        stream (after handing out, on the call before, any whole frame that came in ahead of it), and
        BadFrame (an EOFError) at what is no frame, after which the stream has ended."""
        if self._eof:
            raise EOFError
        while budget is None or budget > 0:
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
            if budget is not None:
                budget -= len(chunk)
            if len(chunk) < _READ_CHUNK:
                break
        try:
            messages = unpack(self._in, self.max_frame)
        except BadFrame:
            self._eof = True
            self._in.clear()
            raise
        if self._eof and not messages:
            raise EOFError
        return [frame for msg in messages if (frame := decode_up(msg)) is not None]

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
        self._frames: list[Down] = []
        self._eof = False

    def arrived(self, wait: bool = False) -> list[Down]:
        """Every whole frame the child knows (`decode_down`) sent so far (with `wait`, blocking until there is
        one); a frame begun is read to its end. EOFError when the parent has gone and nothing is left."""
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
        self._frames += [frame for msg in unpack(self._in) if (frame := decode_down(msg)) is not None]
        return True


def read_frame(sock: socket.socket, decode: Callable[[Any], Frame | None] = decode_up) -> Frame | None:
    """Block until one whole frame arrives, read by `decode` (a child's frame by default; `decode_down` for
    the parent's); None if `decode` does not know it. EOFError when the other end has gone."""
    (word,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return decode(_load(word, _recv_exact(sock, word & _SIZE)))


def write_frame(sock: socket.socket, frame: Frame) -> None:
    sock.sendall(encode(frame))


def write_frames(sock: socket.socket, frames: list[Up]) -> None:
    """Send several frames in one write."""
    sock.sendall(b"".join(encode(f) for f in frames))
