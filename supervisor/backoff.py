"""Back-off for everything the parent retries: API calls, registration, respawning children."""

from __future__ import annotations

import random


def backoff(attempt: int, base: float, cap: float) -> float:
    """Exponential back-off with jitter: a delay in [d/2, d] where d = min(cap, base * 2**(attempt-1))."""
    delay = min(cap, base * (2 ** min(max(0, attempt - 1), 64)))  # 2**64: past any cap, and no float overflow
    return random.uniform(delay / 2, delay)
