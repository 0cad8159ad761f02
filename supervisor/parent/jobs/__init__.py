"""The jobs wing: a job's whole life in the parent (supervisor.parent.jobs.wing)."""

from supervisor.parent.jobs.wing import Jobs, Turn

__all__ = ["Jobs", "Turn"]
