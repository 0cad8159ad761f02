"""A handler for the exact-JSON tests (imported by the daemon's children as tests.support.handlers_exact)."""

from __future__ import annotations


def inspect(ctx):
    """Report the type and value of payload["n"] as the handler saw it; return an integer over 64 bits."""
    n = ctx.payload["n"]
    return {"type": type(n).__name__, "n": n, "big": 2**80, "neg": -(2**70)}


def not_json(ctx):
    """Return what payload["kind"] names: a result JSON has no form for."""
    kind = ctx.payload["kind"]
    return {"nan": {"x": float("nan")}, "inf": {"deep": [1, {"v": float("inf")}]}, "set": {"s": {1, 2}}}[kind]
