"""systemd's sd_notify protocol in pure stdlib: READY, RELOADING, STATUS, STOPPING, EXTEND_TIMEOUT and WATCHDOG.

Every send is a non-blocking datagram to `$NOTIFY_SOCKET` (a path, or an abstract socket when the
value starts with `@`). A send never raises: failures are logged at debug and dropped, so the
daemon's loop cannot be stalled or killed by systemd going away.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger(__name__)

ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _socket_address(value: str | None) -> str | None:
    """`NOTIFY_SOCKET` → an AF_UNIX address; None for unset or unsupported (e.g. vsock) values."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None


def _watchdog_usec(environ: Mapping[str, str], pid: int) -> int | None:
    """`WATCHDOG_USEC` when it is valid and meant for `pid` (per `WATCHDOG_PID`, if set)."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner:
        try:
            if int(owner) != pid:
                return None
        except ValueError:
            return None
    return usec


class Notifier:
    """Talks to the service manager; every method is a no-op when `enabled` is False."""

    def __init__(self, address: str | None = None, watchdog_usec: int | None = None):
        self.address = address
        self.watchdog_usec = watchdog_usec if address else None
        self._sock: socket.socket | None = None
        self._last_status: str | None = None
        self._last_watchdog: float | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, pid: int | None = None) -> Notifier:
        """Build from `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` (default: os.environ, os.getpid())."""
        env = os.environ if environ is None else environ
        pid = os.getpid() if pid is None else pid
        return cls(_socket_address(env.get("NOTIFY_SOCKET")), _watchdog_usec(env, pid))

    @staticmethod
    def unset_env(environ: dict | None = None) -> None:
        """Remove NOTIFY_SOCKET and WATCHDOG_* so children never notify or get watched by mistake."""
        env = os.environ if environ is None else environ
        for key in ENV_KEYS:
            env.pop(key, None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when no watchdog is set."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def ready(self, status: str | None = None) -> bool:
        """READY=1 (plus STATUS= when given): registered and the children are up."""
        return self._send("READY=1" + (f"\nSTATUS={status}" if status else ""), status)

    def status(self, text: str) -> bool:
        """STATUS=<text>; an unchanged text is not re-sent, so calling it every loop turn is cheap."""
        if text == self._last_status:
            return True
        return self._send(f"STATUS={text}", text)

    def reloading(self, now: float) -> bool:
        """RELOADING=1 with MONOTONIC_USEC=`now` (CLOCK_MONOTONIC seconds, as time.monotonic gives on Linux):
        a reload began; the unit shows `reloading` until the next READY=1."""
        return self._send(f"RELOADING=1\nMONOTONIC_USEC={int(now * 1e6)}")

    def extend_timeout(self, seconds: float) -> bool:
        """EXTEND_TIMEOUT_USEC=: the running start, reload or stop may take `seconds` more from now. systemd
        only ever moves its timeout later with it, never earlier."""
        return self._send(f"EXTEND_TIMEOUT_USEC={max(0, int(seconds * 1e6))}")

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1 (plus STATUS=): the drain has started."""
        return self._send("STOPPING=1" + (f"\nSTATUS={status}" if status else ""), status)

    def watchdog(self, now: float | None = None) -> bool:
        """WATCHDOG=1, only when the unit set WatchdogSec for this pid."""
        if not self.watchdog_usec:
            return False
        self._last_watchdog = time.monotonic() if now is None else now
        return self._send("WATCHDOG=1")

    def watchdog_if_due(self, now: float | None = None) -> bool:
        """WATCHDOG=1 when `watchdog_interval` has passed since the last ping; call it every loop turn."""
        interval = self.watchdog_interval
        if interval is None:
            return False
        now = time.monotonic() if now is None else now
        if self._last_watchdog is not None and now - self._last_watchdog < interval:
            return False
        return self.watchdog(now)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _send(self, message: str, status: str | None = None) -> bool:
        """One non-blocking datagram; True when it was sent. Never raises."""
        if self.address is None:
            return False
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)
            self._sock.sendto(message.encode("utf-8", "replace"), self.address)
        except OSError as exc:
            log.debug("sd_notify %r to %r failed: %s", message.split("\n", 1)[0], self.address, exc)
            return False
        if status is not None:
            self._last_status = status
        return True
