"""The CLI's constants every command module shares (exit statuses, where ``tuner serve``
listens): their own module, so that ``tuner.app.cli`` (the parser) and the command modules it
loads (``cli_commands``, ``cli_service``) do not import each other."""

from __future__ import annotations

#: the exit status of a refused input (a bad argument, a 4xx of the service)
EXIT_BAD_INPUT = 2
#: the exit status of a run that produced no result (no verified config, a failed job)
EXIT_NO_RESULT = 1
#: where ``tuner serve`` listens unless told otherwise, and so where the service commands look
#: for it without ``--url`` or ``TUNER_URL``
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
