"""Background thread: expired-lease sweep, stale-worker reaper and the schedules' tick.

Every `lease_interval` seconds: processing jobs whose lease has expired go back
to `pending` with retry_count+1 (or are dead-lettered). Every `worker_interval`
seconds: workers with no heartbeat for `offline_after` seconds go `offline` and
their processing jobs are recovered (back to `pending`). Every `schedule_interval`
seconds: one indexed read for the earliest due schedule, and only when one is due
a transaction that fires them (supervisor.devserver.schedules_store.fire_due,
which announces each job it makes through Store.publish). Errors are logged,
never fatal.
"""

from __future__ import annotations

import sys
import threading
import time

from . import schedules_store


class Sweeper:
    def __init__(self, store, lease_interval: float = 1.0, offline_after: float = 120.0,
                 worker_interval: float | None = None, schedule_interval: float = 1.0):
        self.store = store
        self.schedule_interval = max(0.01, schedule_interval)
        self.lease_interval = max(0.01, lease_interval)
        self.offline_after = offline_after
        self.worker_interval = worker_interval or max(0.05, min(5.0, offline_after / 4))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="devserver-sweeps", daemon=True)

    def start(self) -> Sweeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        next_lease = next_worker = next_schedule = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_schedule:
                    next_schedule = now + self.schedule_interval
                    self.fire_schedules(time.time())
                if now >= next_lease:
                    next_lease = now + self.lease_interval
                    self.store.sweep_expired_leases()
                if now >= next_worker:
                    next_worker = now + self.worker_interval
                    self.store.reap_stale_workers(self.offline_after)
            except Exception as e:  # a busy DB or a closing store must not kill the thread
                if self.store.closed:
                    return
                print(f"warning: sweep failed: {e!r}", file=sys.stderr, flush=True)
            self._stop.wait(max(0.0, min(next_lease, next_worker, next_schedule) - time.monotonic()))

    def fire_schedules(self, now: float) -> int:
        """Fire the schedules due at `now`; how many jobs that made."""
        due = schedules_store.next_due(self.store)
        if due is None or due > now:
            return 0
        return len(schedules_store.fire_due(self.store, now))
