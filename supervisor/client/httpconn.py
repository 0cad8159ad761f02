"""HTTP/1.1 for the parent loop's client: requests built as one write, answers framed by llhttp.

Framing is httptools (llhttp, the parser of Node.js): incremental, strict, ~2 us an answer. A
`ResponseReader` belongs to one connection and is fed bytes as they arrive, however they are cut;
it hands back the final answer once it is whole:

- interim answers (1xx, any number of them) are skipped, in a loop, never by recursion;
- Content-Length together with Transfer-Encoding is an error, not framed by either. RFC 9112 6.3
  lets Transfer-Encoding override but says such a message "ought to be handled as an error" (it is
  how request smuggling and response splitting are done), and a correct server never sends it; an
  error closes the connection and the call is retried on a fresh one, so nothing is misframed;
- Content-Length must be digits only (no sign, `_`, list or duplicate); chunk sizes must be hex, every
  chunk and the trailers must end in CRLF; the only transfer coding is `chunked`, and never in HTTP/1.0;
- the heads of one call's answers (interim ones included) must fit in MAX_HEAD bytes, a body in MAX_BODY;
- an HTTP/1.0 answer, `Connection: close`, a body framed by the connection's end, or bytes after the
  answer end the connection once the answer is read (`Response.close`).

Anything malformed raises `FramingError` (a ValueError), an answer cut off by the connection's end
ConnectionResetError: either way the caller closes the connection and treats the call as a network error.
"""

from __future__ import annotations

import httptools

MAX_HEAD = 64 * 1024
MAX_BODY = 256 * 1024 * 1024


class FramingError(ValueError):
    """The bytes are not a well-framed HTTP/1.1 answer: close the connection, retry elsewhere."""


class Response:
    __slots__ = ("status", "headers", "body", "close")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, close: bool):
        self.status, self.headers, self.body, self.close = status, headers, body, close


def header_block(host_header: str, headers: dict[str, str]) -> bytes:
    """The headers every request repeats, encoded once; ends with the blank line."""
    lines = [f"Host: {host_header}\r\n", *(f"{k}: {v}\r\n" for k, v in headers.items()), "\r\n"]
    return "".join(lines).encode("latin-1")


def build_request(method: str, path: str, fixed_headers: bytes, body: bytes) -> bytes:
    """One request's bytes: `fixed_headers` comes from `header_block`."""
    return f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode("latin-1") + fixed_headers + body


class _AnswerAfterAnswer(Exception):
    """Raised inside the parser to stop it at bytes that follow the final answer."""


class ResponseReader:
    """Incremental answers on one connection. Call `expect()` before each request's answer, then `feed`
    each chunk read and `feed_eof` at the connection's end; both return the final Response once whole
    (else None) and raise FramingError on malformed framing. After an error or a closing answer the
    reader is spent, as is the connection."""

    __slots__ = ("_parser", "_status", "_headers", "_body", "_interim", "_head_done", "_keep_alive",
                 "_eof_framed", "_head_bytes", "_fed", "_final", "interim_count")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.expect()

    def expect(self) -> None:
        """Start waiting for the next request's answer."""
        self._final: Response | None = None
        self._head_bytes = self._fed = 0
        self.interim_count = 0
        self._new_message()

    @property
    def started(self) -> bool:
        """Some byte of this answer has arrived."""
        return self._fed > 0

    def _new_message(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._interim = self._head_done = self._keep_alive = self._eof_framed = False

    # --------------------------------------------------------------- feeding
    def feed(self, data: bytes) -> Response | None:
        self._fed += len(data)
        if not self._head_done:
            room = MAX_HEAD - self._head_bytes
            if len(data) > room:  # feed up to the cap: the head must be complete by then
                self._feed(memoryview(data)[:room])
                if not self._head_done and self._final is None:
                    raise FramingError(f"the answer's headers are over {MAX_HEAD} bytes")
                return self._feed(memoryview(data)[room:]) if self._final is None else self._done(extra=True)
            self._head_bytes += len(data)
        return self._feed(data)

    def feed_eof(self) -> Response | None:
        """The peer closed the connection. None if no byte of the answer had come (a stale connection);
        ConnectionResetError if the answer was cut off."""
        if self._final is not None:
            return self._final
        if not self._fed:
            return None
        if self._head_done and self._eof_framed:
            self._final = Response(self._status, self._headers, bytes(self._body), True)
            return self._final
        where = "body" if self._head_done else "headers"
        raise ConnectionResetError(f"connection closed in the middle of the answer's {where}")

    def _feed(self, data: bytes | memoryview) -> Response | None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise FramingError("the server switched protocols (101), which this client does not ask for") from None
        except httptools.HttpParserError as exc:
            if self._final is not None:  # whatever follows the answer only ends the connection
                return self._done(extra=True)
            cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
            if isinstance(cause, FramingError):
                raise cause from None
            raise FramingError(f"malformed answer: {cause}") from None
        return self._final

    def _done(self, extra: bool) -> Response | None:
        if self._final is not None and extra:
            self._final.close = True
        return self._final

    # ------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        if self._final is not None:
            raise _AnswerAfterAnswer
        self._new_message()

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._status = status
        if 100 <= status < 200:
            self._interim = True
            self.interim_count += 1
            return
        coding = self._headers.get("transfer-encoding")
        if coding is not None:
            if coding.strip().lower() != "chunked":
                raise FramingError(f"unsupported Transfer-Encoding {coding[:40]!r} (only chunked is)")
            if self._parser.get_http_version() == "1.0":
                raise FramingError("Transfer-Encoding in an HTTP/1.0 answer")
        self._head_done = True
        self._keep_alive = self._parser.should_keep_alive()
        self._eof_framed = coding is None and "content-length" not in self._headers and status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > MAX_BODY:
            raise FramingError(f"the answer's body is over {MAX_BODY} bytes")

    def on_message_complete(self) -> None:
        if self._interim:
            self._new_message()
            return
        self._final = Response(self._status, self._headers, bytes(self._body), not self._keep_alive)
        self._body = bytearray()  # a reader kept for its connection's life holds no old body
