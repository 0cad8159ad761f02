"""Shared by the gRPC tests: the real dev server with --grpc-port 0 and the port it printed, and a small loop
that drives the daemon's gRPC transport as the parent does."""

from __future__ import annotations

import os
import selectors
import time
from types import SimpleNamespace

import pytest
from conftest import DevServer

pytest.importorskip("grpc", reason="the grpc extra is not installed")

from supervisor.client.grpc_transport import make_transport  # noqa: E402
from supervisor.client.rest import Secret  # noqa: E402


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


class GrpcDriver:
    """The parent loop in miniature around the gRPC transport: select on the wake-up pipe and the
    transport's sockets, then expire() and done() every turn. `longest_turn` is the longest a turn held it
    outside select (a peer must never hold the loop)."""

    def __init__(self, address: str, key: str, timeout: float = 5.0, mode: str = "unary", rest_url: str | None = None,
                 client: str = "wire"):
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.r, selectors.EVENT_READ, ("wake", None))
        cfg = SimpleNamespace(grpc_url=address, api_key=Secret(key), api_timeout=timeout, ca_bundle=None,
                              api_url=rest_url, grpc_client=client)
        if mode == "unary-grpcio":  # unary calls through grpcio's channel instead of the loop's own connection
            mode, cfg.grpc_client = "unary", "grpcio"
        self.requests: list[tuple] = []
        self.api, self.client = make_transport(cfg, self.w, self.sel, on_request=lambda *a: self.requests.append(a),
                                               mode=mode)
        self.answers: dict = {}
        self.longest_turn = 0.0

    def turn(self) -> None:
        now = time.monotonic()
        deadline = self.client.next_deadline()
        wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - now))
        events = self.sel.select(wait)
        began = time.monotonic()
        for key, mask in events:
            kind, obj = key.data
            if kind == "http":  # the wire client's connection and the REST fallback's sockets
                self.client.on_ready(obj, mask, time.monotonic())
                continue
            try:
                while os.read(self.r, 4096):
                    pass
            except BlockingIOError:
                pass
        self.client.expire(time.monotonic())
        for tag, result, error in self.client.done():
            assert tag not in self.answers, f"two answers for {tag}"
            self.answers[tag] = (result, error)
        self.longest_turn = max(self.longest_turn, time.monotonic() - began)

    def run_until(self, predicate, timeout: float = 15.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.turn()

    def call(self, tag, call, timeout: float = 15.0):
        self.client.submit(tag, call)
        self.run_until(lambda: tag in self.answers, timeout, f"the answer to {tag}")
        return self.answers.pop(tag)

    def ok(self, tag, call):
        result, error = self.call(tag, call)
        assert error is None, error
        return result

    def close(self) -> None:
        self.client.close()
        self.sel.close()
        os.close(self.r)
        os.close(self.w)
