"""The dev server's gRPC server: the servicers of `grpc_server` over its own HTTP/2 (`h2server`), no grpcio core.

grpcio's server cost the dev server 250-300 us of CPU per unary call (its completion queue, a poller thread,
a hand-off to a pool thread and back), two to three times its REST server's whole request; on a laptop the
server shares the cores with the workers it serves. This one reads and writes every connection on one I/O
thread, as the REST server does.

Contract:
- A unary call runs on the I/O thread as soon as its request is in (the store's calls are short). While a
  fault delay is set (`delays`), the call's delay is drawn when its request is in and the call runs on the
  I/O thread once it has passed (a timer: the delay holds nothing else, and costs no thread). A
  streaming call (StreamJobs, ProcessJobs) runs on a pool thread of its own for as long as it lasts; its
  answers reach the I/O thread through a queue, and its end (the client cancelling or going away, its
  deadline passing, the server stopping) is seen by the servicer through the context
  (`is_active()`, `add_callback`), as with grpcio.
- At most `max_streams` calls run on pool threads at once; more wait their turn (as grpcio's pool does).
- Status texts where grpcio's server has fixed ones keep its wording: "Method not found!",
  "Exception deserializing request!", "Exception calling application: ...".
- A connection that does not send the HTTP/2 preface within PREFACE_TIMEOUT, breaks the protocol, or
  leaves more than MAX_UNSENT of answers unread (not yet written, or on one stream waiting for windows it
  does not open) is closed (a GOAWAY first when it spoke HTTP/2); past `max_connections` a new connection
  is closed at once. A read takes at most READ_BUDGET bytes before the thread moves on to the next
  connection.
- `stop(grace)` sends GOAWAY, gives the calls running `grace` seconds, then ends them (streams see their
  context go inactive) and closes every connection; it returns an Event set once all is closed.
"""

from __future__ import annotations

import collections
import functools
import heapq
import queue
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from supervisor.proto import spooled_pb2 as pb
from supervisor.proto.h2 import PROTOCOL_ERROR

from .h2server import (
    INTERNAL,
    OK,
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    UNKNOWN,
    Cancelled,
    HalfClosed,
    Message,
    ServerSession,
    Started,
)

PREFACE_TIMEOUT = 10.0  # seconds a new connection has to start speaking HTTP/2
READ_BUDGET = 256 * 1024  # bytes read from one connection per turn of the I/O thread
MAX_UNSENT = 16 * 1024 * 1024  # answer bytes held for a client that stopped reading
MAX_QUEUED = 1000  # a stream's request messages waiting for its servicer
COALESCE = 64 * 1024  # answer bytes to one read's calls held for one write at its end
SWEEP_EVERY = 0.25  # seconds between deadline and preface sweeps
DEADLINE_EXCEEDED, CANCELLED_CODE, UNAVAILABLE = 4, 1, 14
_END = object()  # a bidi call's requests are over
_GONE = object()  # a bidi call ended before its requests did


class Delays(Protocol):
    """The injected delays (the dev server's fault switches), as the I/O thread applies them to unary calls."""

    def active(self) -> bool:
        """Whether any call may be delayed now."""

    def draw(self, metadata: tuple) -> float:
        """This call's delay in seconds (0: none), drawn once, for the caller its metadata names."""

    def drawn(self) -> AbstractContextManager:
        """Around the servicer's call once its delay has passed: it must not be delayed again."""


class Aborted(BaseException):
    """Raised by `context.abort`: ends the servicer's call with this status (a BaseException, so no
    servicer's `except Exception` can swallow it)."""

    def __init__(self, code: int, details: str):
        super().__init__(details)
        self.code, self.details = code, details


@dataclass
class Method:
    kind: str  # "unary", "server_stream", "bidi"
    request: Any  # the request message class
    handler: Callable  # the servicer's bound method: (request or request iterator, context)


def methods(services: dict[str, object]) -> dict[str, Method]:
    """`/package.Service/Method` -> Method, from the proto's descriptors and a servicer per service name."""
    out: dict[str, Method] = {}
    for name, servicer in services.items():
        service = pb.DESCRIPTOR.services_by_name[name]
        for m in service.methods:
            kind = "bidi" if m.client_streaming else "server_stream" if m.server_streaming else "unary"
            if m.client_streaming and not m.server_streaming:
                raise ValueError(f"{m.full_name}: client-streaming calls are not served")
            out[f"/{service.full_name}/{m.name}"] = Method(kind, getattr(pb, m.input_type.name),
                                                          getattr(servicer, m.name))
    return out


class Context:
    """What a servicer sees of its call: grpcio's ServicerContext, as far as the dev server's servicers use it."""

    def __init__(self, call: _Call):
        self._call = call

    def invocation_metadata(self) -> tuple:
        return self._call.metadata

    def abort(self, code, details: str):
        raise Aborted(code.value[0] if hasattr(code, "value") else int(code), details)

    def add_callback(self, fn: Callable[[], None]) -> bool:
        """Run `fn` once the call ends; False (and `fn` not kept) when it already has."""
        with self._call.lock:
            if self._call.ended:
                return False
            self._call.callbacks.append(fn)
            return True

    def is_active(self) -> bool:
        return not self._call.ended


@dataclass(eq=False)
class _Call:
    conn: _Conn
    sid: int
    method: Method
    metadata: tuple
    deadline: float | None
    messages: list = field(default_factory=list)  # unary and server-streaming: the request
    requests: Any = None  # bidi: a queue of request messages (_END, _GONE)
    ended: bool = False
    callbacks: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def end(self) -> None:
        """The call is over (answered, cancelled, timed out, its connection gone): run its callbacks once."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            callbacks, self.callbacks = self.callbacks, []
        if self.requests is not None:
            self.requests.put(_GONE)
        for fn in callbacks:
            try:
                fn()
            except Exception as e:  # a servicer's callback never takes the I/O thread down
                print(f"warning: a gRPC call's end callback failed: {e!r}", file=sys.stderr, flush=True)


class _Conn:
    __slots__ = ("sock", "session", "calls", "opened", "events", "closed")

    def __init__(self, sock: socket.socket, now: float):
        self.sock, self.session = sock, ServerSession()
        self.calls: dict[int, _Call] = {}
        self.opened = now
        self.events = 0
        self.closed = False


class WireGrpcServer:
    """The servicers served over our HTTP/2 on one I/O thread (see the module docstring)."""

    def __init__(self, services: dict[str, object], delays: Delays | None = None, max_streams: int = 256,
                 max_connections: int = 1024):
        self.methods = methods(services)
        self.delays = delays
        self._timers: list[tuple[float, int, _Call]] = []  # (due, sequence, call): delayed unary calls
        self._timer_seq = 0
        self._reading: _Conn | None = None  # the connection whose events are being handled
        self._accept_paused = False  # the listener is left unwatched until the next sweep (no descriptors)
        self.pool = ThreadPoolExecutor(max_workers=max_streams, thread_name_prefix="devserver-grpc")
        self.max_connections = max_connections
        self.sel = selectors.DefaultSelector()
        self.conns: set[_Conn] = set()
        self._posted: collections.deque[tuple[_Call | None, Callable[[], None]]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._woken = False
        self._stopping = False
        self._accepting = True
        self._grace_until = 0.0
        self.stopped = threading.Event()
        self.listener: socket.socket | None = None
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------ life
    def listen(self, host: str, port: int) -> int:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
        self.listener = sock
        return sock.getsockname()[1]

    def start(self) -> None:
        assert self.listener is not None
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._run, name="devserver-grpc-io", daemon=True)
        self.thread.start()

    def stop(self, grace: float | None = None) -> threading.Event:
        """GOAWAY to every client, `grace` seconds for the calls running, then everything closed."""
        def begin() -> None:
            self._accepting = False
            self._grace_until = time.monotonic() + (grace or 0.0)
            if self.listener is not None:
                if not self._accept_paused:
                    self.sel.unregister(self.listener)
                self.listener.close()
                self.listener = None
            for conn in list(self.conns):
                conn.session.goaway()
                self._flush(conn)
            self._stopping = True

        if self.thread is None or not self.thread.is_alive():
            self.stopped.set()
        else:
            self.post(begin)
        return self.stopped

    def post(self, fn: Callable[[], None], call: _Call | None = None) -> None:
        """Run `fn` on the I/O thread (from any thread); should it fail, `call`'s connection is closed."""
        self._posted.append((call, fn))
        if not self._woken:
            self._woken = True
            try:
                self._wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass

    # ------------------------------------------------------------ the I/O thread
    def _run(self) -> None:
        next_sweep = time.monotonic() + SWEEP_EVERY
        try:
            while True:
                wait = SWEEP_EVERY if not self._timers else max(0.0, min(SWEEP_EVERY,
                                                                          self._timers[0][0] - time.monotonic()))
                for key, mask in self.sel.select(wait):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._guarded(key.data, self._on_ready, key.data, mask)
                self._run_posted()
                now = time.monotonic()
                if self._timers:
                    self._run_timers(now)
                if now >= next_sweep:
                    next_sweep = now + SWEEP_EVERY
                    self._sweep(now)
                if self._stopping and (not any(c.calls or c.session.out for c in self.conns)
                                       or now >= self._grace_until):
                    break
        except Exception as e:  # noqa: BLE001  (never silently: the server stops answering gRPC)
            print(f"error: the gRPC server's I/O thread failed: {e!r}", file=sys.stderr, flush=True)
        finally:
            if self.listener is not None:
                self.listener.close()
                self.listener = None
            for conn in list(self.conns):
                self._flush(conn)  # what is answered goes out (as far as the socket takes it now)
                try:
                    conn.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self._close(conn, "the server stopped")
            self.sel.close()
            self._wake_r.close()
            self._wake_w.close()
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.stopped.set()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        # only now: a post() made while the bytes were read saw the flag set and sent none, and its function
        # runs in this turn's _run_posted; one made after this line sends its byte
        self._woken = False

    def _run_posted(self) -> None:
        while self._posted:
            call, fn = self._posted.popleft()
            self._guarded(None if call is None else call.conn, fn)

    def _guarded(self, conn: _Conn | None, fn: Callable, *args) -> None:
        """Run `fn` on the I/O thread; a failure ends `conn` (when there is one), never the thread."""
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  (a bug or a hostile peer must not stop every client's gRPC)
            print(f"warning: the gRPC server failed on a connection: {e!r}", file=sys.stderr, flush=True)
            if conn is not None:
                self._close(conn, f"the server failed: {type(e).__name__}")

    def _accept(self) -> None:
        assert self.listener is not None
        for _ in range(64):
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: the connection waits in the backlog, and the
                # listener is not watched until the next sweep (still readable, it would wake the thread at once)
                print(f"warning: gRPC accept failed: {e}", file=sys.stderr, flush=True)
                self.sel.unregister(self.listener)
                self._accept_paused = True
                return
            if len(self.conns) >= self.max_connections or not self._accepting:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, time.monotonic())
            self.conns.add(conn)
            self._flush(conn)  # our SETTINGS go first

    def _on_ready(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            budget = READ_BUDGET
            while budget > 0 and not conn.closed:
                try:
                    data = conn.sock.recv(min(budget, 65536))
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as e:
                    return self._close(conn, f"{type(e).__name__}: {e}")
                if not data:
                    return self._close(conn, "the client closed the connection")
                budget -= len(data)
                try:
                    events = conn.session.receive(data)
                except Exception as e:  # ProtocolError, and whatever else a hostile client provokes
                    conn.session.goaway(PROTOCOL_ERROR, str(e))
                    self._flush(conn)
                    return self._close(conn, f"protocol error: {e}")
                self._reading = conn  # answers made while its events are handled go out in one write, below
                try:
                    for event in events:
                        if conn.closed:  # by an answer before (its client does not read): no later call may start
                            break
                        self._event(conn, event)
                finally:
                    self._reading = None
                if len(data) < 65536:
                    break
        if not conn.closed:
            self._flush(conn)

    def _event(self, conn: _Conn, event) -> None:
        if isinstance(event, Started):
            return self._started(conn, event)
        call = conn.calls.get(event.stream_id)
        if call is None:
            return
        if isinstance(event, Message):
            if call.requests is not None:
                if call.requests.qsize() >= MAX_QUEUED:  # the client sends far faster than its answers come
                    return self._answer(call, RESOURCE_EXHAUSTED, f"over {MAX_QUEUED} messages waiting to be "
                                        "handled on this stream")
                call.requests.put(self._parse(call, event.body))
            elif call.messages:
                self._answer(call, INTERNAL, "more than one request message for a call that takes one")
            else:
                call.messages.append(event.body)
        elif isinstance(event, HalfClosed):
            self._half_closed(call)
        elif isinstance(event, Cancelled):
            conn.calls.pop(call.sid, None)
            call.end()

    def _started(self, conn: _Conn, event: Started) -> None:
        method = self.methods.get(event.path)
        if method is None or self._stopping:
            conn.session.finish(event.stream_id, UNIMPLEMENTED if method is None else UNAVAILABLE,
                                "Method not found!" if method is None else "the server is stopping")
            return
        deadline = None if event.timeout is None else time.monotonic() + event.timeout
        call = conn.calls[event.stream_id] = _Call(conn, event.stream_id, method, event.metadata, deadline)
        if method.kind == "bidi":
            call.requests = queue.SimpleQueue()
            self.pool.submit(self._bidi, call)

    def _half_closed(self, call: _Call) -> None:
        if call.requests is not None:
            call.requests.put(_END)
        elif len(call.messages) != 1:
            self._answer(call, INTERNAL, "the call ended without its request message")
        elif call.method.kind == "server_stream":
            self.pool.submit(self._server_stream, call)
        else:
            delay = self.delays.draw(call.metadata) if self.delays is not None and self.delays.active() else 0.0
            if delay > 0:
                self._timer_seq += 1
                heapq.heappush(self._timers, (time.monotonic() + delay, self._timer_seq, call))
            else:
                self._unary(call)

    # ------------------------------------------------------------ calls
    def _parse(self, call: _Call, body: bytes):
        try:
            return call.method.request.FromString(body)
        except (DecodeError, ValueError):
            return None

    def _run_unary(self, call: _Call) -> tuple[int, str, bytes | None]:
        request = self._parse(call, call.messages[0])
        if request is None:
            return INTERNAL, "Exception deserializing request!", None
        try:
            answer = call.method.handler(request, Context(call))
            return OK, "", answer.SerializeToString()
        except Aborted as a:
            return a.code, a.details, None
        except Exception as e:
            print(f"warning: internal error on a gRPC call: {e!r}", file=sys.stderr, flush=True)
            return UNKNOWN, f"Exception calling application: {e}", None

    def _unary(self, call: _Call) -> None:
        """Run a unary call whose delay (if any) is over: the servicer is never delayed again, even by a delay
        switched on since the call's was drawn."""
        if self.delays is not None:
            with self.delays.drawn():
                code, details, body = self._run_unary(call)
        else:
            code, details, body = self._run_unary(call)
        self._answer(call, code, details, body)

    def _run_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, call = heapq.heappop(self._timers)
            if not call.ended and call.conn.calls.get(call.sid) is call:  # not cancelled or timed out meanwhile
                self._guarded(call.conn, self._unary, call)

    def _server_stream(self, call: _Call) -> None:
        request = self._parse(call, call.messages[0])
        if request is None:
            self.post(lambda: self._answer(call, INTERNAL, "Exception deserializing request!"), call)
            return
        self._stream(call, call.method.handler(request, Context(call)))

    def _bidi(self, call: _Call) -> None:
        self._stream(call, call.method.handler(self._requests(call), Context(call)))

    def _requests(self, call: _Call) -> Iterator:
        while True:
            item = call.requests.get()
            if item is _END or item is _GONE or call.ended:  # (a call cancelled with requests still queued)
                return
            if item is None:  # a message that does not parse: the call ends, as grpcio's does
                self.post(lambda: self._answer(call, INTERNAL, "Exception deserializing request!"), call)
                call.end()
                return
            yield item

    def _stream(self, call: _Call, answers: Iterator) -> None:
        """Run a streaming servicer on this pool thread, posting each answer to the I/O thread."""
        code, details = OK, ""
        try:
            for answer in answers:
                if call.ended:
                    break
                body = answer.SerializeToString()
                self.post(functools.partial(self._send, call, body), call)
        except Aborted as a:
            code, details = a.code, a.details
        except Exception as e:
            print(f"warning: internal error on a gRPC stream: {e!r}", file=sys.stderr, flush=True)
            code, details = UNKNOWN, f"Exception iterating responses: {e}"
        finally:
            close = getattr(answers, "close", None)
            if close is not None:
                close()
        self.post(lambda: self._answer(call, code, details), call)

    def _send(self, call: _Call, body: bytes) -> None:
        if not call.ended and not call.conn.closed:
            call.conn.session.send_message(call.sid, body)
            if call.conn.session.held(call.sid) > MAX_UNSENT:  # a stream's answers, for a window never opened
                return self._close(call.conn, "the client does not read its answers")
            self._flush(call.conn)

    def _answer(self, call: _Call, code: int, details: str, body: bytes | None = None) -> None:
        """The call's last word, on the I/O thread."""
        conn = call.conn
        if conn.calls.pop(call.sid, None) is not None and not conn.closed:
            if body is not None:
                conn.session.send_message(call.sid, body)
            conn.session.finish(call.sid, code, details)
            if conn.session.held(call.sid) > MAX_UNSENT:  # an answer waiting for a window never opened
                self._close(conn, "the client does not read its answers")
            elif self._reading is not conn or len(conn.session.out) > COALESCE:
                self._flush(conn)  # (small answers to one read's calls go out together, after it)
        call.end()

    # ------------------------------------------------------------ sockets
    def _flush(self, conn: _Conn) -> None:
        if conn.closed:
            return
        out = conn.session.out  # written from the session's own buffer: what is not written stays first in line
        if out:
            try:
                sent = conn.sock.send(out)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as e:
                return self._close(conn, f"{type(e).__name__}: {e}")
            del out[:sent]
            if len(out) > MAX_UNSENT:
                return self._close(conn, "the client does not read its answers")
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.session.out else 0)
        if want != conn.events:
            if conn.events:
                self.sel.modify(conn.sock, want, conn)
            else:
                self.sel.register(conn.sock, want, conn)
            conn.events = want

    def _close(self, conn: _Conn, why: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.conns.discard(conn)
        if conn.events:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        try:
            conn.sock.close()
        except OSError:
            pass
        calls, conn.calls = list(conn.calls.values()), {}
        for call in calls:
            call.end()

    def _sweep(self, now: float) -> None:
        if self._accept_paused and self.listener is not None:
            self._accept_paused = False
            self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        for conn in list(self.conns):
            if not conn.session.preface and now - conn.opened > PREFACE_TIMEOUT:
                self._close(conn, "no HTTP/2 preface in time")
                continue
            for call in [c for c in conn.calls.values() if c.deadline is not None and c.deadline <= now]:
                self._answer(call, DEADLINE_EXCEEDED, "Deadline Exceeded")
            if self._stopping and now >= self._grace_until:
                for call in list(conn.calls.values()):
                    self._answer(call, UNAVAILABLE, "the server is stopping")

