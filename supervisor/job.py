"""A claimed job as the daemon reads it: the fields the parent and the child use, parsed once, beside the
job exactly as the API sent it.

`Job.parse` takes one job of a claim's answer (the parent, where the answer arrives) or of a `job` frame
(the child); what it cannot use is refused there (None: no string id or no lease id) or left unset (a
field of the wrong type), so nothing downstream reads a key of a dict. `raw` is never changed: the child
is sent it as it came, so its payload (integers of any size, key order, anything the daemon does not
read) reaches the handler exact.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple

_NUMBERS = frozenset((int, float))
_FIELDS = itemgetter("id", "lease_id", "queue_name", "timeout_seconds", "retry_count", "max_retries",
                     "lease_expires_at")
_new = tuple.__new__  # a named tuple's own __new__ is a Python function: one call saved per record


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
        if type(raw) is not dict:  # JSON decodes to plain dicts: nothing else is a job
            return None
        try:
            fields = _FIELDS(raw)  # the usual job, every field there: one call reads them all
        except KeyError:
            get = raw.get
            fields = (get("id"), get("lease_id"), get("queue_name"), get("timeout_seconds"), get("retry_count"),
                      get("max_retries"), get("lease_expires_at"))
        job_id, lease_id, queue, timeout, retries, limit, expires = fields
        # type() rather than isinstance: a bool is no number here, and one is made for every job, so the
        # usual job (every field as the API sends it) is checked in one test
        if (type(job_id) is str and type(lease_id) is str and lease_id and type(queue) is str
                and type(timeout) in _NUMBERS and type(retries) is int and type(limit) is int and type(expires) is str):
            return _new(cls, (*fields, raw))
        if type(job_id) is not str or not lease_id:
            return None
        return _new(cls, (job_id, lease_id if type(lease_id) is str else str(lease_id),
                          queue if type(queue) is str else "", timeout if type(timeout) in _NUMBERS else None,
                          retries if type(retries) is int else None, limit if type(limit) is int else None,
                          expires if type(expires) is str else None, raw))

    @property
    def payload(self) -> Any:
        return self.raw.get("payload")
