"""The lifecycle of jobs and tasks, the one list of their states: the store (``db/models.py``),
the API and ``TunerClient`` all read it. Importing this module imports nothing else (a model
process using the client must not load the database layer).

queued -> running -> succeeded | failed | cancelled
"""

from __future__ import annotations

#: a job or task that is waiting for a worker or being run
ACTIVE = ("queued", "running")
#: a job or task that will not change any more
TERMINAL = ("succeeded", "failed", "cancelled")
#: every state, in lifecycle order
STATUSES = (*ACTIVE, *TERMINAL)
