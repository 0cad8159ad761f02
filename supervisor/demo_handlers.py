"""Handlers for the demo, tests and benchmarks: CPU-bound work and misbehaviour on demand.

`burn(ctx)`: payload {"ms": N} burns about N ms of CPU and returns a checksum, or
{"n": N} counts primes below N. `misbehave(ctx)` does what payload["do"] says.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any, NoReturn


def burn_cpu(ms: float) -> int:
    """Spin on pure-Python arithmetic for `ms` milliseconds of this *thread's* CPU time (so handlers
    on a thread pool, like the SDK worker's, each burn their own share; in a child it is the process's)."""
    end = time.thread_time() + ms / 1000.0
    acc = 0
    while time.thread_time() < end:
        for i in range(500):
            acc = (acc * 31 + i) % 1_000_003
    return acc


def count_primes(n: int) -> int:
    count = 0
    for k in range(2, n):
        if all(k % d for d in range(2, int(k**0.5) + 1)):
            count += 1
    return count


def burn(ctx):
    payload = ctx.payload or {}
    if "n" in payload:
        return {"primes": count_primes(int(payload["n"])), "pid": os.getpid()}
    ms = float(payload.get("ms", 50))
    return {"checksum": burn_cpu(ms), "ms": ms, "pid": os.getpid(), "echo": payload.get("echo")}


def noop(ctx):
    return None


def _raise(p: dict) -> NoReturn:
    raise ValueError(p.get("message", "boom"))


def _sleep(p: dict) -> dict:
    time.sleep(float(p.get("secs", 1)))
    return {"slept": p.get("secs", 1), "pid": os.getpid()}


def _cpu(p: dict) -> dict:
    t0 = time.time()
    checksum = burn_cpu(float(p.get("ms", 50)))
    return {"checksum": checksum, "pid": os.getpid(), "t0": t0, "t1": time.time()}


def _exit(p: dict) -> NoReturn:
    raise SystemExit(int(p.get("code", 1)))


def _os_exit(p: dict) -> NoReturn:
    os._exit(int(p.get("code", 7)))


def _segfault(p: dict) -> dict:
    import ctypes

    ctypes.string_at(0)
    return _echo(p)  # not reached: the read above kills the process


def _kill9(p: dict) -> dict:
    os.kill(os.getpid(), signal.SIGKILL)
    return _echo(p)  # not reached: SIGKILL cannot be caught


def _hang(p: dict) -> NoReturn:
    while True:
        time.sleep(0.05)


def _block_signals(p: dict) -> NoReturn:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(0.05)


def _unserialisable(p: dict) -> dict:
    return {"value": object()}


def _big_result(p: dict) -> dict:
    return {"blob": "x" * int(p.get("bytes", 3 * 2**20))}


def _grow(p: dict) -> dict:
    hog: list[bytearray] = []
    for _ in range(int(p.get("steps", 1000))):
        hog.append(bytearray(int(p.get("step_mb", 8)) * 2**20))
        time.sleep(float(p.get("pause", 0.05)))
    return {"grew": len(hog)}


def _env(p: dict) -> dict:
    return {"env": dict(os.environ)}


def _size(p: dict) -> dict:
    return {"payload_len": len(p.get("blob", "")), "pid": os.getpid()}


def _echo(p: dict) -> dict:
    return {"echo": p, "pid": os.getpid()}


_ACTIONS: dict[str, Callable[[dict], Any]] = {
    "raise": _raise,
    "sleep": _sleep,
    "cpu": _cpu,
    "exit": _exit,
    "os_exit": _os_exit,
    "segfault": _segfault,
    "kill9": _kill9,
    "hang": _hang,
    "block_signals": _block_signals,
    "unserialisable": _unserialisable,
    "big_result": _big_result,
    "grow": _grow,
    "env": _env,
    "size": _size,
}


def misbehave(ctx):
    """payload {"do": ...}: raise, sleep, cpu, exit, os_exit, segfault, kill9, hang, block_signals,
    unserialisable, big_result, grow, env, size; anything else (default "echo") echoes the payload."""
    p = ctx.payload or {}
    action = p.get("do", "echo")
    do = _ACTIONS.get(action, _echo) if isinstance(action, str) else _echo
    return do(p)
