"""Loading the user's `module:function` handler, and the context object it is given.

`JobContext` carries the same names as the official SDK's context (`job_id`, `queue_name`,
`payload`, `retry_count`, `max_retries`, `signal`, `log`, `progress`) so SDK handlers move over
unchanged, plus `timeout_seconds`, `lease_id`, `lease_expires_at` and `worker_id`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class HandlerSpecError(ValueError):
    pass


def _ensure_child_logging() -> None:
    """A child comes from the forkserver, a fresh interpreter with no logging set up: give it the parent's
    default (JSON unless stderr is a terminal) the first time a handler logs, so ctx.log is never dropped."""
    if not logging.getLogger().handlers:
        from supervisor.ops.logs import setup_logging

        setup_logging("auto", "INFO")


def parse_spec(spec: str) -> tuple[str, str]:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise HandlerSpecError(f"--handler must look like package.module:function, got {spec!r}")
    return module, attr


def load_handler(spec: str) -> Callable[[JobContext], Any]:
    """Import `module:function` (dotted attributes allowed) and return the callable; raises on failure."""
    module_name, attr = parse_spec(spec)
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise HandlerSpecError(f"{spec} is not callable")
    return obj


def call_handler(fn: Callable, ctx: JobContext) -> Any:
    """Run the handler; a coroutine function is run to completion on a fresh event loop."""
    result = fn(ctx)
    if inspect.isawaitable(result):
        import asyncio

        async def _await():
            return await result

        result = asyncio.run(_await())
    return result


@dataclass
class JobContext:
    job_id: str
    queue_name: str
    payload: Any
    retry_count: int
    max_retries: int
    timeout_seconds: int | None
    lease_id: str | None
    lease_expires_at: str | None
    worker_id: str
    signal: threading.Event = field(default_factory=threading.Event)

    @property
    def id(self) -> str:
        return self.job_id

    def log(self, message: str, **fields) -> None:
        """One INFO line on the daemon's stderr with `job_id`, `queue` and the fields."""
        _ensure_child_logging()
        logging.getLogger(f"supervisor.job.{self.job_id}").info(
            message, extra={"job_id": self.job_id, "queue": self.queue_name, **fields})

    def progress(self, percent: float, message: str | None = None) -> None:
        self.log(f"progress {percent:.0f}%" + (f": {message}" if message else ""), progress=percent)

    @classmethod
    def from_claim(cls, job: dict, worker_id: str) -> JobContext:
        return cls(
            job_id=job["id"],
            queue_name=job.get("queue_name", ""),
            payload=job.get("payload"),
            retry_count=int(job.get("retry_count") or 0),
            max_retries=int(job.get("max_retries") or 0),
            timeout_seconds=job.get("timeout_seconds"),
            lease_id=job.get("lease_id"),
            lease_expires_at=job.get("lease_expires_at"),
            worker_id=worker_id,
        )
