"""Shared by the gRPC tests: the real dev server with --grpc-port 0, and the port it printed."""

from __future__ import annotations

import pytest
from conftest import DevServer

pytest.importorskip("grpc", reason="the grpc extra is not installed")


class GrpcDevServer(DevServer):
    """A DevServer that also serves gRPC; `grpc_address` is host:port of that listener."""

    def __init__(self, db: str, extra: list[str] | None = None):
        super().__init__(db, extra=["--grpc-port", "0", *(extra or [])])
        self.grpc_address = ""

    def start(self) -> GrpcDevServer:
        super().start()
        self.grpc_address = self.out.wait_for(r"gRPC listening on (\S+)").group(1)
        return self

    def faults(self, **values) -> None:
        r = self.request("POST", "/_dev/faults", json=values)
        assert r.status_code == 200, r.text


def start_server(tmp_path, *extra: str) -> GrpcDevServer:
    return GrpcDevServer(str(tmp_path / "grpc-dev.db"), extra=["--lease-sweep-interval", "0.2", *extra]).start()
