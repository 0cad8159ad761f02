"""Raw HTTP cases as data files, one case per file (as gunicorn's tests/requests).

A case file is `requests/<valid|invalid>/<name>.http`:

    # what it is (free text)
    # status: 400 BAD_REQUEST       one line per expected answer, in order; the code is optional
    # connection: closed            or `open`; default closed for invalid cases, open for valid ones
    # jobs: 1                       jobs the bytes create; default 0
    POST /api/v1/jobs HTTP/1.1\\r\\n
    ...

After the `#` lines, real line breaks are layout only and are dropped; the bytes are written with
escapes: \\r \\n \\t \\0 \\\\ and \\xHH. Placeholders: {KEY} (the server's API key) and {PAD:N}
(N bytes of `a`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent / "requests"
_ESCAPE = re.compile(r"\\(r|n|t|0|\\|x[0-9a-fA-F]{2})")
_SIMPLE = {"r": "\r", "n": "\n", "t": "\t", "0": "\0", "\\": "\\"}
_PLACEHOLDER = re.compile(r"\{(KEY|PAD:(\d+))\}")


@dataclass
class Case:
    name: str
    text: str  # the request bytes, escapes decoded, placeholders still in (latin-1)
    statuses: list[tuple[int, str | None]] = field(default_factory=list)
    closed: bool = True
    jobs: int = 0

    def data(self, key: str) -> bytes:
        def fill(m: re.Match) -> str:
            return key if m.group(1) == "KEY" else "a" * int(m.group(2))

        return _PLACEHOLDER.sub(fill, self.text).encode("latin-1")


def _unescape(body: str) -> str:
    def one(m: re.Match) -> str:
        tok = m.group(1)
        return chr(int(tok[1:], 16)) if tok[0] == "x" else _SIMPLE[tok]

    return _ESCAPE.sub(one, body.replace("\n", ""))


def load(path: Path, valid: bool) -> Case:
    lines = path.read_text(encoding="latin-1").splitlines(keepends=True)
    case = Case(path.stem, "", closed=not valid)
    i = 0
    while i < len(lines) and lines[i].startswith("#"):
        key, _, value = lines[i][1:].strip().partition(":")
        value = value.strip()
        if key == "status":
            status, _, code = value.partition(" ")
            case.statuses.append((int(status), code or None))
        elif key == "connection":
            case.closed = value == "closed"
        elif key == "jobs":
            case.jobs = int(value)
        i += 1
    case.text = _unescape("".join(lines[i:]))
    return case


def cases(kind: str) -> list[Case]:
    """Every case of `kind` ("valid" or "invalid"), sorted by name."""
    return [load(p, kind == "valid") for p in sorted((HERE / kind).glob("*.http"))]
