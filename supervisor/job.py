"""A claimed job as the daemon reads it: the fields the parent and the child use, parsed once, beside the
job exactly as the API sent it.

`Job.parse` takes one job of a claim's answer (the parent, where the answer arrives) or of a `job` frame
(the child); what it cannot use is refused there (None: no string id or no lease id) or left unset (a
field of the wrong type), so nothing downstream reads a key of a dict. `raw` is never changed: the child
is sent it as it came, so its payload (integers of any size, key order, anything the daemon does not
read) reaches the handler exact.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Job(NamedTuple):
    """One claimed job. `queue` is '' when the answer named none; `timeout_seconds` as the API gave it
    (None: no timeout, or not a number). A named tuple: one is made for every job, and a tuple is cheap."""

    id: str
    lease_id: str
    queue: str
    timeout_seconds: int | float | None
    retry_count: int | None
    max_retries: int | None
    lease_expires_at: str | None
    raw: dict  # the job as the API sent it, sent to the child unaltered

    @classmethod
    def parse(cls, raw: Any) -> Job | None:
        """The job `raw` describes, or None when it has no string id or no lease id."""
        if not isinstance(raw, dict):
            return None
        job_id, lease_id = raw.get("id"), raw.get("lease_id")
        if not isinstance(job_id, str) or not lease_id:
            return None
        queue, timeout = raw.get("queue_name"), raw.get("timeout_seconds")
        retries, limit, expires = raw.get("retry_count"), raw.get("max_retries"), raw.get("lease_expires_at")
        return tuple.__new__(cls, (  # the named tuple's own __new__ is a Python function: one call saved a job
            job_id, lease_id if isinstance(lease_id, str) else str(lease_id), queue if isinstance(queue, str) else "",
            timeout if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else None,
            retries if isinstance(retries, int) else None, limit if isinstance(limit, int) else None,
            expires if isinstance(expires, str) else None, raw))

    @property
    def payload(self) -> Any:
        return self.raw.get("payload")
