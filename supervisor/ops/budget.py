"""The worst-case stop time: how long a stop may take from the first request to the exit, and so how
much time a supervisor (Kubernetes' terminationGracePeriodSeconds, systemd's TimeoutStopSec) must give.

    stop = [drain request] + drain timeout + kill grace + reap + deregister attempts x deregister timeout

- drain request: only where a preStop hook runs `python -m supervisor drain` first: the most that command
  spends failing to reach the daemon before the stop signal does the work instead;
- drain timeout: running jobs get this long to finish;
- kill grace: children still running at the deadline get SIGTERM, then SIGKILL after this;
- reap: the wait for a SIGKILLed child to be reaped;
- deregister: the daemon tells the API it is gone (which hands back every job it still holds), two attempts
  of at most min(--api-timeout, 5 s) each.

The part after the drain timeout (`after_drain`) is what the daemon adds when it asks systemd for more
time while draining. A grace period should cover the total with a margin of at least STOP_MARGIN_SECS or
STOP_MARGIN_RATIO of it, whichever is larger (`covers`): the margin also takes the process's own start
and exit.
"""

from __future__ import annotations

from dataclasses import dataclass

DEREGISTER_TIMEOUT = 5.0  # seconds, at most, one deregister attempt may take
DEREGISTER_ATTEMPTS = 2
REAP_AFTER_KILL = 2.0  # seconds the pool's shutdown waits for a SIGKILLed child
DRAIN_REQUEST_TIMEOUT = 3.0  # seconds the drain command waits for the daemon to take its request
STOP_MARGIN_SECS = 5.0
STOP_MARGIN_RATIO = 0.1


@dataclass(frozen=True)
class StopBudget:
    """The parts of the worst-case stop time, in seconds; `total` is their sum."""

    drain_request: float
    drain_timeout: float
    kill_grace: float
    deregister: float
    reap: float = REAP_AFTER_KILL

    @property
    def after_drain(self) -> float:
        """Stopping what still runs at the drain deadline, and deregistering."""
        return self.kill_grace + self.reap + self.deregister

    @property
    def total(self) -> float:
        return self.drain_request + self.drain_timeout + self.after_drain

    @property
    def wanted(self) -> float:
        """The least grace period that covers `total` with the margin."""
        return self.total + max(STOP_MARGIN_SECS, STOP_MARGIN_RATIO * self.total)

    def covers(self, grace: float) -> bool:
        return grace >= self.wanted

    def fields(self) -> dict:
        """For the start-up log line."""
        return {"stop_budget_secs": round(self.total, 1), "drain_timeout": self.drain_timeout,
                "kill_grace": self.kill_grace, "reap_secs": self.reap, "deregister_secs": self.deregister,
                "drain_request_secs": self.drain_request, "grace_wanted_secs": round(self.wanted, 1)}


def stop_budget(drain_timeout: float, kill_grace: float, api_timeout: float, drain_request: bool = False) -> StopBudget:
    """The worst case for these settings; `drain_request` when a preStop hook sends a drain request first."""
    return StopBudget(drain_request=DRAIN_REQUEST_TIMEOUT if drain_request else 0.0, drain_timeout=drain_timeout,
                      kill_grace=kill_grace, deregister=DEREGISTER_ATTEMPTS * min(api_timeout, DEREGISTER_TIMEOUT))
