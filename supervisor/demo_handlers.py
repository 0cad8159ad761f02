"""Handlers for the demo, tests and benchmarks: CPU-bound work and misbehaviour on demand.

`burn(ctx)`: payload {"ms": N} burns about N ms of CPU and returns a checksum, or
{"n": N} counts primes below N. `misbehave(ctx)` does what payload["do"] says.
"""

from __future__ import annotations

import os
import signal
import time


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


def misbehave(ctx):
    """payload {"do": ...}: raise, sleep, exit, os_exit, segfault, kill9, hang, block_signals, unserialisable, big_result, grow, echo."""
    p = ctx.payload or {}
    action = p.get("do", "echo")
    if action == "raise":
        raise ValueError(p.get("message", "boom"))
    if action == "sleep":
        time.sleep(float(p.get("secs", 1)))
        return {"slept": p.get("secs", 1), "pid": os.getpid()}
    if action == "cpu":
        t0 = time.time()
        checksum = burn_cpu(float(p.get("ms", 50)))
        return {"checksum": checksum, "pid": os.getpid(), "t0": t0, "t1": time.time()}
    if action == "exit":
        raise SystemExit(int(p.get("code", 1)))
    if action == "os_exit":
        os._exit(int(p.get("code", 7)))
    if action == "segfault":
        import ctypes

        ctypes.string_at(0)
    if action == "kill9":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        while True:
            time.sleep(0.05)
    if action == "block_signals":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(0.05)
    if action == "unserialisable":
        return {"value": object()}
    if action == "big_result":
        return {"blob": "x" * int(p.get("bytes", 3 * 2**20))}
    if action == "grow":
        hog = []
        for _ in range(int(p.get("steps", 1000))):
            hog.append(bytearray(int(p.get("step_mb", 8)) * 2**20))
            time.sleep(float(p.get("pause", 0.05)))
        return {"grew": len(hog)}
    if action == "env":
        return {"env": dict(os.environ)}
    if action == "size":
        return {"payload_len": len(p.get("blob", "")), "pid": os.getpid()}
    return {"echo": p, "pid": os.getpid()}
