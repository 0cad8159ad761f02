"""Handlers for the gRPC daemon tests (imported by the daemon's children as tests.support.handlers_grpc).

`types`: reports the Python type of every payload value, so a test sees that whole Struct doubles
reached the handler as int. `listy`: returns a list, which gRPC cannot carry as a result.
"""

from __future__ import annotations

import sys


def types(ctx):
    return {"types": {k: type(v).__name__ for k, v in (ctx.payload or {}).items()},
            "payload_is_none": ctx.payload is None, "grpc_imported": "grpc" in sys.modules}


def listy(ctx):
    return [1, 2, 3]
