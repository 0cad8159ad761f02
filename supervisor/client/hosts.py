"""What a host name says about the connection to it."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP literal (127.0.0.0/8, ::1): traffic that never leaves the machine, so
    plain http:// and gRPC without TLS are allowed there."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
