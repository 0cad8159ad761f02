"""The official SDK's worker objects (`SpooledWorker`, `AsyncSpooledWorker`) as the daemon reads them.

A module written for the SDK builds a worker and registers its handler with `@worker.process`. The daemon
runs that handler in its own children and never calls the worker's `start()`. This module finds such a
worker, reads the facts the daemon takes from it (its handler, queue, settings and event hooks) as plain
data, and words the one start-up report about them. It never imports the SDK: an object is an SDK
worker only if the user's module already imported the SDK to build it.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

WORKER_CLASSES = ("SpooledWorker", "AsyncSpooledWorker")

# What each SDK worker setting becomes under the daemon (the queue is handled on its own).
SETTING_HOMES = {
    "concurrency": "--procs (processes, not threads)",
    "poll_interval": "--poll-interval",
    "lease_duration": "--lease",
    "heartbeat_fraction": "--lease (renewed every third of it)",
    "shutdown_timeout": "--drain-timeout",
    "hostname": "--worker-id",
    "worker_id": "--worker-id",
    "worker_type": "the daemon's own worker row",
    "version": "the daemon's own worker row",
    "metadata": "the daemon's own worker row",
    "auto_start": "never: the daemon runs the handler",
}


def worker_kind(obj: Any) -> str | None:
    """`SpooledWorker` or `AsyncSpooledWorker` if `obj` is one (or a subclass's instance), else None."""
    if "spooled" not in sys.modules:
        return None
    for cls in type(obj).__mro__:
        if cls.__name__ in WORKER_CLASSES and cls.__module__.startswith("spooled."):
            return cls.__name__
    return None


def registered_handler(worker: Any) -> Any:
    """The function registered with `@worker.process`, or None."""
    return getattr(worker, "_handler", None)


def worker_facts(worker: Any, kind: str) -> dict:
    """What the daemon reports about an SDK worker: its kind, queue, settings that differ from the SDK's
    defaults (as text), and the events with hooks registered through `worker.on(...)`."""
    options = getattr(worker, "_options", None)
    queue = getattr(options, "queue_name", None)
    settings: dict[str, str] = {}
    if options is not None:
        try:
            defaults = type(options)(queue_name=queue).model_dump()
        except Exception:  # an SDK whose options we cannot rebuild: report every setting
            defaults = {}
        for name, value in options.model_dump().items():
            if name == "queue_name" or defaults.get(name, object()) == value:
                continue
            if name == "hostname" and value == socket.gethostname():
                continue
            settings[name] = repr(value)[:200]
    hooks = getattr(worker, "_event_handlers", None) or {}
    return {"worker": kind, "queue_name": queue, "settings": settings,
            "hooks": sorted(str(event) for event, fns in hooks.items() if fns)}


def find_owner(module: Any, fn: Any) -> tuple[str, Any] | None:
    """(attribute name, worker) of the SDK worker in `module` whose registered handler is `fn`, if any."""
    for name, value in vars(module).items():
        if worker_kind(value) and registered_handler(value) is fn:
            return name, value
    return None


def report(spec: str, facts: dict, given_queues: tuple[str, ...] | None) -> list[tuple[str, dict]]:
    """The start-up report on the handler's SDK worker as (message, fields) lines: what was taken, what was
    ignored (and what sets it here), and a start() the module called. Its event hooks run in the children
    (supervisor.child.hooks): nothing to report about them.
    `given_queues` is what --queue named, or None when the queue was taken from the worker."""
    lines: list[tuple[str, dict]] = []
    kind, queue = facts.get("worker"), facts.get("queue_name")
    if kind:
        ignored = {name: f"{value} -> {SETTING_HOMES.get(name, 'not used')}"
                   for name, value in (facts.get("settings") or {}).items()}
        if given_queues is not None and queue and queue not in given_queues:
            ignored["queue_name"] = f"{queue!r} -> --queue"
        taken = {"queue_name": queue} if given_queues is None and queue else {}
        lines.append((f"handler {spec}: the {kind}'s @process function runs in the daemon's children; its "
                      "start() is never called", {"taken": taken, "ignored": ignored}))
    for called in facts.get("start_called") or []:
        lines.append((f"the handler's module called {called}.start(); it did nothing: the daemon runs the "
                      "@process function itself", {"worker": called}))
    return lines
