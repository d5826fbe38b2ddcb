"""One conformance suite for every dispatcher (``tuner.app.dispatch``): the embedded one on SQLite
and on PostgreSQL, procrastinate on PostgreSQL.

What each must do: every queued task runs exactly once, on a worker of its job's device (or
any, for a job bound to none); a repeated enqueue changes nothing; a cancel stops the running
task promptly and its queued ones never start; a worker that stops mid-task gives the task
back and another resumes it from its stored trials; a worker SIGKILLed mid-task loses no
trial and its task is finished by another, once.

Real workers throughout (``tuner.app.worker.Worker``), real databases, and for the kill a real
worker process: the tasks that must run to an end run the vector_add kernel on the Triton
CPU interpreter. The routing test's workers record the tasks they are handed and finish
them without measuring (``_Recording``: what is under test there is who gets which task).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from db import repo
from db.engine import init_db
from tests.conftest import POSTGRES_URL, _postgres_database
from tests.support_processes import ROOT, interpreter_env
from tuner.app.dispatch import Dispatcher, make_dispatcher
from tuner.app.worker import TaskOutcome, Worker
from tuner.settings import Settings

SETUPS = ["embedded-sqlite", "embedded-postgres", "procrastinate-postgres"]
#: seconds: a short lease (embedded) and stall timeout (procrastinate), so a dead worker's
#: task moves within seconds
LEASE_S, STALLED_S = 4.0, 3.0
#: trials of a task that must outlast a stop or a kill (a tiny matmul on the interpreter: a
#: few per second here), with the search's early stops off (``no_early_stop``)
TRIALS = 30
SHAPE = {"M": 16, "N": 16, "K": 16}
#: the search's early stops, off: a task runs its whole budget
NO_EARLY_STOP = {"TUNER_ROOFLINE_STOP": "0", "TUNER_STOP_CHANCE": "0", "TUNER_PATIENCE": "0"}


@pytest.fixture(autouse=True)
def no_early_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in NO_EARLY_STOP.items():
        monkeypatch.setenv(name, value)


class Setup:
    def __init__(self, name: str, url: str, data_dir: Any) -> None:
        self.name, self.url = name, url
        self.kind = name.split("-")[0]
        self.env = {**NO_EARLY_STOP, "TUNER_DATABASE_URL": url, "TUNER_DISPATCH": self.kind,
                    "TUNER_LEASE_SECONDS": str(LEASE_S), "TUNER_REAP_INTERVAL_SECONDS": "1",
                    "TUNER_STALLED_AFTER_S": str(STALLED_S)}
        self.settings = Settings(database_url=url, dispatch=self.kind, lease_seconds=LEASE_S,
                                 reap_interval_seconds=1, stalled_after_s=STALLED_S,
                                 data_dir=data_dir)
        self.factory = init_db(url)
        self.dispatchers: list[Dispatcher] = []

    def dispatcher(self) -> Dispatcher:
        d = make_dispatcher(self.settings, self.factory)
        self.dispatchers.append(d)
        return d


@pytest.fixture(params=SETUPS)
def setup(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Setup]:
    if request.param == "embedded-sqlite":
        url = f"sqlite:///{tmp_path / 'dispatch.db'}"
        s = Setup(request.param, url, tmp_path)
        yield s
    else:
        if not POSTGRES_URL:
            pytest.skip("TUNER_TEST_POSTGRES_URL is not set")
        for url in _postgres_database():
            s = Setup(request.param, url, tmp_path)
            try:
                yield s
            finally:
                for d in s.dispatchers:
                    d.close()
            return
    for d in s.dispatchers:
        d.close()


def _job(setup: Setup, shapes: list[dict[str, int]], *, device: str | None = None,
         trials: int = 4, kernel: str = "matmul", dtype: str = "float16") -> str:
    from search_spaces import get_kernel

    with setup.factory() as session:
        job = repo.create_job(session, kernel=kernel, kernel_version=get_kernel(kernel).version,
                              dtype=dtype, shapes=shapes, budget_trials=trials,
                              budget_seconds=None, strategy="random", force=True, seed=0,
                              backend="interpret", device_key=device)
        session.commit()
        job_id = job.id
    return job_id


def _tasks(setup: Setup, job_id: str) -> list[Any]:
    with setup.factory() as session:
        return list(repo.get_job(session, job_id).tasks)


def _until(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds:.0f} s: {what}")


class _Serving:
    """A worker serving on its dispatcher in a thread, as ``tuner worker`` does in a process."""

    def __init__(self, setup: Setup, worker: Worker) -> None:
        self.worker, self.dispatcher = worker, setup.dispatcher()
        self.thread = threading.Thread(target=self.dispatcher.serve, args=(worker,),
                                       daemon=True)
        self.thread.start()

    def stop(self, seconds: float = 60) -> None:
        self.worker.stopping.set()
        self.thread.join(seconds)
        assert not self.thread.is_alive(), "the worker did not stop"


class _Recording(Worker):
    """Finishes each task it is handed at once (succeeded), recording it."""

    def __init__(self, setup: Setup, device_key: str, name: str,
                 ran: list[tuple[str, int]]) -> None:
        super().__init__(setup.factory, backend_kind="interpret", device_key=device_key,
                         name=name, lease_seconds=LEASE_S, poll_seconds=0.1)
        self.ran = ran

    def run_claimed(self, task_id: int, abort: Callable[[], bool] | None = None) -> TaskOutcome:
        self.ran.append((self.id, task_id))
        with self.factory() as session:
            repo.finish_task(session, task_id, "succeeded", worker_id=self.id)
            session.commit()
        return TaskOutcome(task_id, "succeeded", None, None, False, None)


def test_every_task_runs_once_on_a_worker_of_its_device(setup):
    ran: list[tuple[str, int]] = []
    def shapes(n: int) -> list[dict[str, int]]:
        return [{"M": 16 * i, "N": 16, "K": 16} for i in range(1, n + 1)]

    jobs = {"dev-a": _job(setup, shapes(4), device="dev-a"),
            "dev-b": _job(setup, shapes(3), device="dev-b"), None: _job(setup, shapes(3))}
    api = setup.dispatcher()
    for job_id in jobs.values():
        api.enqueue_job(job_id)
        api.enqueue_job(job_id)  # twice: changes nothing
    workers = [_Serving(setup, _Recording(setup, "dev-a", "worker-a", ran)),
               _Serving(setup, _Recording(setup, "dev-b", "worker-b", ran))]
    try:
        _until(lambda: all(t.status == "succeeded" for j in jobs.values()
                           for t in _tasks(setup, j)), 60, "every task succeeded")
        time.sleep(1.0)  # a duplicate would run now
    finally:
        for w in workers:
            w.stop()
    by_task = {task_id: who for who, task_id in ran}
    assert len(ran) == len(by_task) == 10, f"a task ran twice: {ran}"
    for device, job_id in jobs.items():
        for task in _tasks(setup, job_id):
            assert task.attempts == 1
            if device == "dev-a":
                assert by_task[task.id] == "worker-a"
            elif device == "dev-b":
                assert by_task[task.id] == "worker-b"


def test_an_idle_worker_takes_a_queued_job_at_once(setup):
    """An idle worker polling every 30 s takes a job within a second of its enqueue: the
    embedded dispatcher rings its doorbell, procrastinate notifies."""
    ran: list[tuple[str, int]] = []
    worker = _Recording(setup, "interpret:cpu", "worker-idle", ran)
    worker.poll_seconds = 30.0
    serving = _Serving(setup, worker)
    try:
        time.sleep(1.5)  # it looked at the empty queue and waits
        job_id = _job(setup, [SHAPE])
        queued = time.monotonic()
        setup.dispatcher().enqueue_job(job_id)
        _until(lambda: ran, 10, "the task was taken")
        taken = time.monotonic() - queued
    finally:
        serving.stop(seconds=40)
    assert taken < 1.5, taken


def _worker(setup: Setup, name: str) -> Worker:
    return Worker(setup.factory, backend_kind="interpret", device_key="interpret:cpu",
                  name=name, lease_seconds=LEASE_S, poll_seconds=0.2)


def _trials(setup: Setup, task_id: int) -> list[int]:
    with setup.factory() as session:
        return [t.number for t in repo.trials_for_task(session, task_id)]


def test_a_cancel_stops_the_running_task_and_its_queued_ones_never_start(setup):
    job_id = _job(setup, [SHAPE, {"M": 32, "N": 16, "K": 16}], trials=400)
    api = setup.dispatcher()
    api.enqueue_job(job_id)
    serving = _Serving(setup, _worker(setup, "worker-c"))
    try:
        first = _tasks(setup, job_id)[0].id
        _until(lambda: len(_trials(setup, first)) >= 1, 120, "a trial was stored")
        with setup.factory() as session:
            repo.cancel_job(session, job_id)
            session.commit()
        cancelled_at = time.monotonic()
        api.cancel_job(job_id)
        _until(lambda: serving.worker.report is not None and _idle(setup, "worker-c"), 30,
               "the worker let go of the cancelled task")
        took = time.monotonic() - cancelled_at
        stored = len(_trials(setup, first))
        time.sleep(1.5)  # the cancelled task writes nothing more, the second never starts
        assert len(_trials(setup, first)) == stored
    finally:
        serving.stop()
    tasks = _tasks(setup, job_id)
    assert [t.status for t in tasks] == ["cancelled", "cancelled"]
    assert _trials(setup, tasks[1].id) == [] and tasks[1].attempts == 0
    assert took < 10, f"the running task took {took:.1f} s to stop"


def _idle(setup: Setup, worker_id: str) -> bool:
    """The worker holds no task (its lease owner column names it nowhere)."""
    with setup.factory() as session:
        return not any(t.lease_owner == worker_id and t.status == "running"
                       for t in repo.running_tasks(session))


def test_a_worker_stopping_mid_task_gives_it_back_and_another_resumes_it(setup):
    job_id = _job(setup, [SHAPE], trials=TRIALS)
    setup.dispatcher().enqueue_job(job_id)
    first = _Serving(setup, _worker(setup, "worker-first"))
    task_id = _tasks(setup, job_id)[0].id
    try:
        _until(lambda: len(_trials(setup, task_id)) >= 2, 120, "two trials were stored")
    finally:
        first.stop()
    kept = _trials(setup, task_id)
    assert _tasks(setup, job_id)[0].status == "queued"
    second = _Serving(setup, _worker(setup, "worker-second"))
    try:
        _until(lambda: _tasks(setup, job_id)[0].status == "succeeded", 180, "resumed and done")
    finally:
        second.stop()
    numbers = _trials(setup, task_id)
    assert numbers[:len(kept)] == kept and len(numbers) == len(set(numbers))
    task = _tasks(setup, job_id)[0]
    assert task.attempts == 1, "stopping the worker used one of the task's attempts"


_PROCESS_WORKER = """
import signal, sys
from db.engine import init_db
from tuner.app.dispatch import make_dispatcher
from tuner.settings import Settings
from tuner.app.worker import Worker

settings = Settings()
factory = init_db(settings.resolved_database_url)
worker = Worker(factory, backend_kind="interpret", device_key="interpret:cpu", name=sys.argv[1],
                lease_seconds=settings.lease_seconds, poll_seconds=0.2)
signal.signal(signal.SIGTERM, lambda *_: worker.stopping.set())
make_dispatcher(settings, factory).serve(worker)
"""


def test_a_worker_killed_mid_task_loses_no_trial_and_another_finishes_it_once(setup):
    job_id = _job(setup, [SHAPE], trials=TRIALS)
    setup.dispatcher().enqueue_job(job_id)
    task_id = _tasks(setup, job_id)[0].id
    env = interpreter_env(**setup.env)
    doomed = subprocess.Popen([sys.executable, "-c", _PROCESS_WORKER, "doomed"], cwd=ROOT,
                              env=env, start_new_session=True)
    survivor = None
    try:
        _until(lambda: len(_trials(setup, task_id)) >= 2, 120, "two trials were stored")
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
        killed_at = time.monotonic()
        kept = _trials(setup, task_id)
        survivor = subprocess.Popen([sys.executable, "-c", _PROCESS_WORKER, "survivor"],
                                    cwd=ROOT, env=env, start_new_session=True)
        _until(lambda: _tasks(setup, job_id)[0].lease_owner == "survivor", 90,
               "the survivor took the task")
        picked_up = time.monotonic() - killed_at
        _until(lambda: _tasks(setup, job_id)[0].status == "succeeded", 180, "finished")
    finally:
        for proc in (doomed, survivor):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    numbers = _trials(setup, task_id)
    assert numbers[:len(kept)] == kept and len(numbers) == len(set(numbers))
    task = _tasks(setup, job_id)[0]
    assert (task.attempts, task.requeues) == (1, 1)
    # the kill is noticed within the lease (embedded) or the stall timeout (procrastinate),
    # plus the survivor's start-up (imports: seconds on a loaded machine)
    assert picked_up < 60


def test_the_dispatcher_follows_the_database_unless_named(tmp_path):
    from tuner.app.dispatch import dispatch_name

    sqlite = f"sqlite:///{tmp_path / 'x.db'}"
    postgres = "postgresql://postgres@127.0.0.1:5432/test"
    assert dispatch_name(Settings(database_url=sqlite)) == "embedded"
    assert dispatch_name(Settings(database_url=postgres)) == "procrastinate"
    assert dispatch_name(Settings(database_url=postgres, dispatch="embedded")) == "embedded"
    with pytest.raises(ValueError, match="needs a PostgreSQL database"):
        dispatch_name(Settings(database_url=sqlite, dispatch="procrastinate"))
    with pytest.raises(ValueError, match="TUNER_DISPATCH must be"):
        Settings(dispatch="celery")
