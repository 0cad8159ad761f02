"""Fault injection and per-organization rate limiting.

Faults apply only to /api/v1 routes (never /health* or /_dev/faults), per organization: those set at
start apply to all; those an organization sets through /_dev/faults apply to its own requests alone.
  delay_ms   -- sleep that long before handling (for a `delay_fraction` of requests; default all)
  fail_503   -- fraction of requests answered 503 SERVICE_UNAVAILABLE without being handled
  fail_status -- the status those answers carry instead of 503: 408 or another 5xx
  cut        -- fraction of requests handled (the write commits) whose response is cut off:
                the status line and headers are sent, then half the body, then the socket closes.
The rate limiter is a token bucket per organization (rps, burst); a refusal gives
429 RATE_LIMIT_EXCEEDED with Retry-After and the API's error body.
`RequestStats` counts /api/v1 requests per organization and route, and the 429s among them, for
`GET /_dev/stats` (benchmarks read the server's own figure of requests per job from it).
"""

from __future__ import annotations

import math
import random
import threading
import time

from .errors import HttpError

_FAULT_CODES = {408: "REQUEST_TIMEOUT", 502: "BAD_GATEWAY", 503: "SERVICE_UNAVAILABLE", 504: "GATEWAY_TIMEOUT"}


class _Settings:
    """One set of fault settings and the RNG that draws from them."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.fail_503, self.delay_ms, self.cut, self.delay_fraction = 0.0, 0, 0.0, 1.0
        self.fail_status = 503

    def snapshot(self) -> dict:
        return {"fail_503": self.fail_503, "delay_ms": self.delay_ms, "cut": self.cut,
                "delay_fraction": self.delay_fraction, "fail_status": self.fail_status}


class Faults:
    """Thread-safe, replaceable fault settings with a seeded RNG, per organization.

    The settings given at start (the command line's `--fault-*`) apply to every organization; an
    organization that sets its own (`POST /_dev/faults`, `org` given) gets its own from then on, so one
    organization's faults never reach another's requests. Every method takes the organization (None:
    the settings from start)."""

    def __init__(self, fail_503: float = 0.0, delay_ms: int = 0, cut: float = 0.0, delay_fraction: float = 1.0,
                 seed: int | None = None):
        self._lock = threading.Lock()
        self._seed = seed
        self._default = _Settings(random.Random(seed))
        self._orgs: dict[str, _Settings] = {}
        self.update({"fail_503": fail_503, "delay_ms": delay_ms, "cut": cut, "delay_fraction": delay_fraction})

    def _for(self, org: str | None) -> _Settings:
        return self._orgs.get(org, self._default) if org is not None else self._default

    def snapshot(self, org: str | None = None) -> dict:
        with self._lock:
            return self._for(org).snapshot()

    @staticmethod
    def check(values: dict) -> dict:
        """Validate a (partial) settings dict; raise ValueError naming the bad field."""
        out = {}
        for name in ("fail_503", "cut", "delay_fraction"):
            if name in values:
                v = values[name]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                    raise ValueError(f"{name} must be a number between 0 and 1")
                out[name] = float(v)
        if "delay_ms" in values:
            v = values["delay_ms"]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 600_000:
                raise ValueError("delay_ms must be a number of milliseconds between 0 and 600000")
            out["delay_ms"] = int(v)
        if "fail_status" in values:
            v = values["fail_status"]
            if isinstance(v, bool) or not isinstance(v, int) or not (v == 408 or 500 <= v <= 599):
                raise ValueError("fail_status must be 408 or a status from 500 to 599")
            out["fail_status"] = v
        return out

    def update(self, values: dict, org: str | None = None) -> dict:
        """Change `org`'s settings (None: the ones from start, which organizations without their own use)."""
        clean = self.check(values)
        with self._lock:
            if org is None:
                target = self._default
            elif org in self._orgs:
                target = self._orgs[org]
            else:
                target = self._orgs[org] = _Settings(random.Random(self._seed))
                for k, v in self._default.snapshot().items():
                    setattr(target, k, v)
            for k, v in clean.items():
                setattr(target, k, v)
            return target.snapshot()

    def active(self, org: str | None = None) -> bool:
        f = self._for(org)
        return bool(f.fail_503 or f.delay_ms or f.cut)

    def delays(self) -> bool:
        """Whether any organization's settings (or the ones from start) may delay a request."""
        with self._lock:
            return bool(self._default.delay_ms) or any(f.delay_ms for f in self._orgs.values())

    def draw_delay(self, org: str | None = None) -> float:
        """Seconds to delay one request of `org` (0: none), drawn as `before` draws it; for a server that
        waits out the delay itself and then calls `before(org, delayed=True)`."""
        with self._lock:
            f = self._for(org)
            return f.delay_ms / 1000.0 if (f.delay_ms and f.rng.random() < f.delay_fraction) else 0.0

    def before(self, org: str | None = None, delayed: bool = False) -> None:
        """Run before handling: maybe sleep (not when the delay was drawn and waited out: `delayed`), maybe
        raise the injected 503."""
        with self._lock:
            f = self._for(org)
            delay = f.delay_ms if (not delayed and f.delay_ms and f.rng.random() < f.delay_fraction) else 0
            fail = f.fail_503 and f.rng.random() < f.fail_503
            status = f.fail_status
        if delay:
            time.sleep(delay / 1000.0)
        if fail:
            message = "service unavailable" if status == 503 else f"status {status}"
            raise HttpError(status, _FAULT_CODES.get(status, "INTERNAL_ERROR"), f"Injected fault: {message}")

    def should_cut(self, org: str | None = None) -> bool:
        with self._lock:
            f = self._for(org)
            return bool(f.cut) and f.rng.random() < f.cut


class RateLimiter:
    """Token bucket per key (organization): `rps` tokens per second, bucket size `burst`."""

    def __init__(self, rps: float, burst: int | None = None):
        self.rps = float(rps)
        self.burst = float(burst if burst else max(1, math.ceil(rps * 2)))
        self._buckets: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> None:
        """Take one token or raise 429 RATE_LIMIT_EXCEEDED with Retry-After."""
        now = time.monotonic()
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                b = self._buckets[key] = [self.burst, now]
            tokens = min(self.burst, b[0] + (now - b[1]) * self.rps)
            b[1] = now
            if tokens >= 1.0:
                b[0] = tokens - 1.0
                return
            b[0] = tokens
            wait = (1.0 - tokens) / self.rps
        secs = max(1, math.ceil(wait))
        raise HttpError(429, "RATE_LIMIT_EXCEEDED", "Rate limit exceeded",
                       extra={"error": "Rate limit exceeded", "retry_after_secs": secs,
                              "limit": int(self.rps) if self.rps.is_integer() else self.rps, "remaining": 0,
                              "reset_at": int(time.time() + wait) + 1},
                       headers={"Retry-After": str(secs)})


class RequestStats:
    """Per-organization counts of /api/v1 requests (by route template) and of rate-limit refusals."""

    def __init__(self):
        self._lock = threading.Lock()
        self._orgs: dict[str, dict] = {}

    def count(self, org: str, route: str, rate_limited: bool = False) -> None:
        with self._lock:
            o = self._orgs.setdefault(org, {"requests": 0, "rate_limited": 0, "by_route": {}})
            o["requests"] += 1
            o["by_route"][route] = o["by_route"].get(route, 0) + 1
            if rate_limited:
                o["rate_limited"] += 1

    def snapshot(self, org: str) -> dict:
        with self._lock:
            o = self._orgs.get(org, {"requests": 0, "rate_limited": 0, "by_route": {}})
            return {"organization_id": org, "requests": o["requests"], "rate_limited": o["rate_limited"],
                    "by_route": dict(o["by_route"])}
