"""The lifecycle of jobs and tasks, the one list of their states: the store (``db/models.py``),
the API and ``TunerClient`` all read it. Importing this module imports nothing else but the
standard library's ``enum`` (a model process using the client must not load the database layer).

queued -> running -> succeeded | failed | cancelled

The states are ``Status`` members, a ``StrEnum``: each is the ``str`` it names (``Status.QUEUED
== "queued"``, the same hash, JSON and database text), so stored rows and the API's answers keep
their strings.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A job's or task's state, as stored and as the API answers it."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Handback(StrEnum):
    """How a worker gives a task back without finishing it (never stored as a state): ``LOST``,
    the task is no longer this worker's (change nothing); ``REQUEUED``, it went back to the
    queue for another attempt."""

    LOST = "lost"
    REQUEUED = "requeued"


#: a job or task that is waiting for a worker or being run
ACTIVE = (Status.QUEUED, Status.RUNNING)
#: a job or task that will not change any more
TERMINAL = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
#: every state, in lifecycle order
STATUSES = (*ACTIVE, *TERMINAL)
