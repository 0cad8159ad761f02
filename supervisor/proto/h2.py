"""HTTP/2 pieces both ends of our gRPC speak: frame layout, HPACK literals, the gRPC message prefix, and a
header-block decoder that remembers blocks it has seen.

Sans-I/O and thread-free: the daemon's wire client (`supervisor.client.h2grpc`) and the dev server's gRPC
server (`supervisor.devserver.h2server`) build on it. Headers we send are encoded without the dynamic table
(every block of a kind is the same bytes, built once); what the peer sends is decoded with `hpack` (the
python-hyper project's HPACK: Huffman and the dynamic table, with a cap on a header list's size).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from typing import Any

import hpack

# hpack logs every header it decodes at DEBUG: a process run with DEBUG logging would print each call's
# headers several lines apiece, costing more than the call
logging.getLogger("hpack").setLevel(logging.WARNING)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY_FRAME, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT, S_INITIAL_WINDOW = 1, 2, 3, 4
S_MAX_FRAME, S_MAX_HEADER_LIST = 5, 6
# HTTP/2 error codes (RST_STREAM, GOAWAY)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR = 0x5, 0x6
REFUSED_STREAM, CANCEL, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x8, 0x9, 0xB
MAX_FRAME = 16384  # the default frame size, which we never raise
MAX_WINDOW = (1 << 31) - 1
LAST_STREAM_ID = (1 << 31) - 1

HEAD = struct.Struct(">BHBBI")  # a frame header: length (3 bytes), type, flags, stream id


class ProtocolError(Exception):
    """The peer broke HTTP/2 or gRPC framing: drop the connection."""


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with `prefix_bits` bits in the first byte, whose other bits are `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes | int, value: bytes, never_indexed: bool = False) -> bytes:
    """A literal header field without indexing (or never indexed), name by static index or as a string."""
    first = 0x10 if never_indexed else 0x00
    head = hpack_int(name, 4, first) if isinstance(name, int) else bytes((first,)) + hpack_int(len(name), 7, 0) + name
    return head + hpack_int(len(value), 7, 0) + value


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def grpc_message(body: bytes) -> bytes:
    """A serialized protobuf as one uncompressed gRPC length-prefixed message."""
    return b"\0" + struct.pack(">I", len(body)) + body


def unpad(flags: int, payload: bytes) -> bytes:
    """A DATA or HEADERS payload without its padding; ProtocolError when the padding does not fit."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolError("bad padding")
    return payload[1:len(payload) - payload[0]]


def split(buf: bytes, pos: int = 0) -> tuple[list[tuple[int, int, int, bytes]], int]:
    """The whole frames in `buf` from `pos` as (type, flags, stream id, payload), and where the first
    incomplete one starts. A frame over MAX_FRAME is a ProtocolError as soon as its header is in."""
    frames = []
    end, unpack = len(buf), HEAD.unpack_from
    while end - pos >= 9:
        high, low, kind, flags, sid = unpack(buf, pos)
        length = high << 16 | low
        if length > MAX_FRAME:
            raise ProtocolError(f"a frame of {length} bytes (we allow {MAX_FRAME})")
        if end - pos < 9 + length:
            break
        frames.append((kind, flags, sid & 0x7FFFFFFF, buf[pos + 9:pos + 9 + length]))
        pos += 9 + length
    return frames, pos


def settings(payload: bytes) -> list[tuple[int, int]]:
    """A SETTINGS frame's (identifier, value) pairs, the two every endpoint must bound checked
    (INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE); ProtocolError otherwise."""
    if len(payload) % 6:
        raise ProtocolError("a SETTINGS frame of the wrong size")
    pairs = [struct.unpack_from(">HI", payload, i) for i in range(0, len(payload), 6)]
    for key, value in pairs:
        if key == S_INITIAL_WINDOW and value > MAX_WINDOW:
            raise ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE past the largest window")
        if key == S_MAX_FRAME and not MAX_FRAME <= value < 1 << 24:
            raise ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {value} is out of range")
    return pairs


class BlockDecoder:
    """HPACK decoding of one connection's header blocks, in order (the dynamic table is the connection's),
    each block's fields (name, value bytes pairs) handed to the owner's `read`, whose result `decode` returns.

    A peer's blocks repeat byte for byte once its table is warm, and a block that left the dynamic table as
    it was decodes the same way until the table changes: its reading is remembered (at most 64; the memory
    is emptied whenever a block changes the table), so a repeated block is neither decoded nor read again.
    A block that does not decode, or a header list over `max_list` bytes, raises ProtocolError (the table
    is then out of step with the peer's: the connection must end)."""

    def __init__(self, max_list: int, read: Callable[[list], Any]):
        self.decoder = hpack.Decoder(max_header_list_size=max_list)
        self._read = read
        self._known: dict[bytes, Any] = {}

    def decode(self, block: bytes) -> Any:
        known = self._known.get(block)
        if known is not None:
            return known
        table = self.decoder.header_table
        entries = table.dynamic_entries
        before = (len(entries), table.maxsize, entries[0] if entries else None)
        try:
            headers = list(self.decoder.decode(block, raw=True))
        except Exception as exc:  # hpack's errors, and anything a hostile block provokes
            raise ProtocolError(f"a header block that does not decode: {type(exc).__name__}") from None
        reading = self._read(headers)
        after = (len(entries), table.maxsize, entries[0] if entries else None)
        if after[:2] != before[:2] or after[2] is not before[2]:
            self._known.clear()
        elif len(self._known) < 64:
            self._known[block] = reading
        return reading
