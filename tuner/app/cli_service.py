"""The ``tuner`` subcommands that talk to a running service over HTTP (``submit``, ``status``,
``wait``, ``cancel``), through ``TunerClient``; argument parsing lives in ``tuner.app.cli``.

The service is ``--url``, else ``TUNER_URL``, else ``tuner serve``'s default address; the API
key is ``TUNER_API_KEY`` (as for ``TunerClient`` everywhere). Jobs are named by their id or a
unique prefix of it (the 8 characters the dashboard and these commands show). Exit status:
0 done (``wait``: the job succeeded), 1 the job failed or was cancelled, 2 bad input (a field
the service refused, a job id that names no job or several), 3 the service could not be
reached or failed, 4 ``--timeout`` passed first (the job goes on), 130 interrupted.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.app.cli_common import DEFAULT_URL, EXIT_BAD_INPUT, EXIT_NO_RESULT
from tuner.errors import InvalidRequest, InvalidShape
from tuner.lifecycle import TERMINAL, Status
from tuner.shapes import parse_shape, shape_label

if TYPE_CHECKING:
    from tuner.client import TunerClient, TunerClientError

#: the service could not be reached, or answered with a server error
EXIT_UNREACHABLE = 3
#: ``wait --timeout`` passed before the job finished
EXIT_TIMEOUT = 4
#: ``wait`` interrupted (Ctrl-C): the job goes on
EXIT_INTERRUPTED = 130
#: the short id shown in lists and progress lines (the dashboard's)
SHORT_ID = 8
#: seconds one request may take (a submission checks every shape against the workers)
REQUEST_TIMEOUT_S = 30.0

Handler = Callable[[argparse.Namespace], int]


def job_page(base_url: str, job_id: str) -> str:
    """The dashboard page of a job on the service at ``base_url``."""
    return f"{base_url.rstrip('/')}/jobs/{job_id}"


def service_url(args: argparse.Namespace) -> str:
    """``--url``, else ``TUNER_URL``, else ``tuner serve``'s default address."""
    from tuner.settings import ClientSettings

    return str(getattr(args, "url", None) or _client_settings(ClientSettings).url or DEFAULT_URL)


def _client_settings(kind: Any) -> Any:
    try:
        return kind()
    except ValueError as exc:  # pydantic names the variable
        raise InvalidRequest(f"the environment: {exc}".replace("\n", " ")) from None


def _client(args: argparse.Namespace) -> TunerClient:
    from tuner.client import TunerClient
    from tuner.settings import ClientSettings

    key = _client_settings(ClientSettings).api_key or None
    return TunerClient(service_url(args), api_key=key, timeout=REQUEST_TIMEOUT_S)


def _service_errors(handler: Handler) -> Handler:
    """One line on stderr and an exit status for each way a request can fail (see the module
    docstring), instead of a traceback."""
    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        from tuner.client import ServiceUnreachable, TunerClientError

        try:
            return handler(args)
        except ServiceUnreachable as exc:
            print(f"tuner: error: {exc}; is it running (tuner serve)? The service is --url, "
                  "else TUNER_URL", file=sys.stderr)
            return EXIT_UNREACHABLE
        except TunerClientError as exc:
            print(f"tuner: error: {_refusal(exc)}", file=sys.stderr)
            return EXIT_UNREACHABLE if exc.status is None or exc.status >= 500 else \
                EXIT_BAD_INPUT
    return run


def _refusal(exc: TunerClientError) -> str:
    """What the service refused, in one line naming the field it named."""
    if exc.status in (401, 403):
        return f"the service refused the request ({exc.status}): {exc.reason} (TUNER_API_KEY " \
               "holds the key)"
    if exc.status == 404 and exc.field is None:
        return f"{exc.reason} (tuner status lists the newest jobs)"
    if exc.status is not None and exc.status >= 500:
        return f"the service failed ({exc.status}): {exc.reason}"
    return f"{exc.field}: {exc.reason}" if exc.field else exc.reason


# -- submit ------------------------------------------------------------------------------------

@_service_errors
def submit(args: argparse.Namespace) -> int:
    shapes = _shapes(args.shape)
    with _client(args) as client:
        created = client.submit_job(
            args.kernel, shapes, args.dtype, trials=args.trials, seconds=args.seconds,
            strategy=args.strategy, force=args.force, device=args.device, seed=args.seed,
            backend=args.backend, timing=args.timing, future_device=args.future_device)
        page = job_page(client.base_url or "", created["id"])
        if args.json and not args.wait:
            print(json.dumps({**created, "dashboard_url": page}))
        elif not args.json:
            # while waiting, stdout is kept for the finished job
            _print_submitted(created, page, len(shapes), sys.stderr if args.wait else sys.stdout)
        return _wait_for(client, created["id"], args) if args.wait else 0


def _shapes(texts: list[str] | None) -> list[dict[str, int]]:
    if not texts:
        raise InvalidRequest("--shape is required, e.g. --shape M=4096,N=4096,K=4096 (repeat it "
                             "for more shapes)", field="shape")
    shapes = []
    for i, text in enumerate(texts):
        try:
            shapes.append(parse_shape(text))
        except InvalidShape as exc:
            where = f" (--shape number {i + 1})" if len(texts) > 1 else ""
            raise InvalidShape(f"{exc}{where}", field=exc.field) from None
    return shapes


def _print_submitted(created: dict[str, Any], page: str, shapes: int, out: Any) -> None:
    print(f"job {created['id']} {created['status']}", file=out)
    print(f"dashboard {page}", file=out)
    if created.get("deduplicated"):
        print("an identical job was already queued or running: this is that job", file=out)
    if created.get("answered_from_store"):
        print(f"{created['answered_from_store']} of {shapes} shape(s) were already tuned for "
              "the device: answered from the store (--force tunes them again)", file=out)


# -- status ------------------------------------------------------------------------------------

@_service_errors
def status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if args.job is None:
            _print(client.jobs(status=args.status, limit=args.limit), args, _print_jobs)
            return 0
        job = client.job(args.job)
        page = job_page(client.base_url or "", job["id"])
    _print({**job, "dashboard_url": page}, args, lambda j: _print_job(j, page))
    return 0


def _print_jobs(jobs: list[dict[str, Any]]) -> None:
    if not jobs:
        print("no jobs")
        return
    for job in jobs:
        done, budget = _trials(job)
        shapes = len(job["tasks"])
        print(f"{job['id'][:SHORT_ID]}  {job['status']:<9}  {job['kernel']} {job['dtype']}  "
              f"{shapes} shape{'s' if shapes != 1 else ''}  {done}/{budget} trials  "
              f"device {job.get('device') or 'any'}  {job['created_at']}")


def _print_job(job: dict[str, Any], page: str) -> None:
    done, budget = _trials(job)
    print(f"job       {job['id']} {job['status']}")
    print(f"kernel    {job['kernel']} ({job['kernel_version']}) {job['dtype']}, strategy "
          f"{job['strategy']}, {job['budget_trials']} trials per shape")
    print(f"device    {job.get('device') or 'any worker'}")
    print(f"progress  {done}/{budget} trials")
    print(f"dashboard {page}")
    for note in (job.get("waiting"), job.get("error")):
        if note:
            print(f"note      {note}")
    for task in job["tasks"]:
        best = f"best {task['best_ms']:.4f} ms {json.dumps(task['best_config'])}" \
            if task.get("best_ms") is not None else "no verified config yet"
        print(f"shape     {shape_label(task['shape']):<16} {task['status']:<9} "
              f"{task['trials_done']}/{task['budget_trials']} trials  {best}")
        if task.get("error"):
            print(f"          {task['error']}")


def _trials(job: dict[str, Any]) -> tuple[int, int]:
    """Trials done and budgeted over all of the job's shapes."""
    tasks = job["tasks"]
    return sum(t["trials_done"] for t in tasks), sum(t["budget_trials"] for t in tasks)


# -- wait --------------------------------------------------------------------------------------

@_service_errors
def wait(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return _wait_for(client, args.job, args)


def _wait_for(client: TunerClient, job_id: str, args: argparse.Namespace) -> int:
    """Follow the job until it finishes, showing its progress on stderr; print it as ``status``
    does. 0 when it succeeded, 1 when it failed or was cancelled."""
    from tuner.client import JobTimeout

    progress = _Progress(enabled=not args.quiet)
    try:
        job = client.wait(job_id, timeout=args.timeout, poll=args.poll, on_poll=progress.show)
    except JobTimeout as exc:
        progress.close()
        print(f"tuner: {exc}; it goes on (tuner wait {exc.job['id'][:SHORT_ID]} to follow it "
              "again)", file=sys.stderr)
        return EXIT_TIMEOUT
    except KeyboardInterrupt:
        progress.close()
        print(f"tuner: stopped waiting; the job goes on (tuner cancel {job_id} stops it)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    progress.close()
    page = job_page(client.base_url or "", job["id"])
    _print({**job, "dashboard_url": page}, args, lambda j: _print_job(j, page))
    return 0 if job["status"] == Status.SUCCEEDED else EXIT_NO_RESULT


class _Progress:
    """One line per change of a job's progress (trials done of the budget, best so far), on
    stderr; rewritten in place on a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self.last = ""
        self.note: str | None = None

    def show(self, job: dict[str, Any]) -> None:
        note = job.get("waiting")
        if note and note != self.note:  # why it has not started: shown even with --quiet
            if self.tty and self.last:
                sys.stderr.write("\n")
                self.last = ""
            sys.stderr.write(f"tuner: job {job['id'][:SHORT_ID]} is waiting: {note}\n")
            sys.stderr.flush()
        self.note = note
        line = progress_line(job)
        if not self.enabled or line == self.last:
            return
        self.last = line
        if self.tty:
            sys.stderr.write(f"\r\033[K{line}")
        else:
            sys.stderr.write(f"{line}\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.last:
            sys.stderr.write("\n")


def progress_line(job: dict[str, Any]) -> str:
    """``job 3f2b9c0e running: 12/48 trials, best 0.0123 ms`` (with several shapes: each
    shape's best)."""
    done, budget = _trials(job)
    tasks = job["tasks"]

    def ms(task: dict[str, Any]) -> str:
        return f"{task['best_ms']:.4f} ms" if task.get("best_ms") is not None else "-"

    if len(tasks) == 1:
        best = f"best {ms(tasks[0])}"
    else:
        best = "best " + ", ".join(f"{shape_label(t['shape'])} {ms(t)}" for t in tasks)
    return f"job {job['id'][:SHORT_ID]} {job['status']}: {done}/{budget} trials, {best}"


# -- cancel ------------------------------------------------------------------------------------

@_service_errors
def cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.job(args.job)
        finished = job["status"] in TERMINAL
        if not finished:
            job = client.cancel(job["id"])
    _print(job, args, lambda j: _print_cancelled(j, finished))
    return 0


def _print_cancelled(job: dict[str, Any], already: bool) -> None:
    if already:
        print(f"job {job['id']} already {job['status']}: nothing to cancel")
    else:
        print(f"job {job['id']} {job['status']}")


def _print(data: Any, args: argparse.Namespace, as_text: Callable[[Any], None]) -> None:
    """``data`` as one JSON document with ``--json``, else as ``as_text`` writes it."""
    if args.json:
        print(json.dumps(data))
    else:
        as_text(data)

