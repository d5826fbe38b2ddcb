"""What each ``tuner`` subcommand does (argument parsing lives in ``tuner.app.cli``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.app.cli_service import job_page, service_url
from tuner.app.tune_report import check_interpreter_timing, summary_of
from tuner.dtypes import check_dtype, check_interpreter_dtype
from tuner.errors import InvalidRequest, InvalidShape
from tuner.kernel import TunableKernel
from tuner.settings import Settings
from tuner.shapes import parse_shape, shape_label, validate_shape

if TYPE_CHECKING:  # imported where used, so that ``tuner --help`` stays quick
    from sqlalchemy.orm import Session

    from tuner.configs_file import ConfigsEntry


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings()
    if getattr(args, "db", None):
        settings.database_url = args.db
    return settings


def _session_factory(settings: Settings) -> Any:
    from db.engine import init_db

    return init_db(settings.resolved_database_url, bounds=settings.database_bounds)


def _read_errors(handler: Any) -> Any:
    """A reading command's service errors as ``tuner.app.cli_service``'s commands report them
    (one line, exit 3 when unreachable, 2 when refused)."""
    from tuner.app.cli_service import _service_errors

    return _service_errors(handler)


def check_strategy(name: str) -> None:
    from tuner.strategies import strategy_names

    if name not in strategy_names():
        raise InvalidRequest(f"--strategy {name!r} is not a strategy; choose one of "
                             f"{', '.join(strategy_names())}", field="strategy")


def _resolve_tune_input(args: argparse.Namespace) -> tuple[Any, dict[str, int], str, str, Any]:
    from search_spaces import get_kernel
    from tuner.backends import resolve_backend_kind
    from tuner.backends.replay import load_table

    kernel = get_kernel(args.kernel)
    check_strategy(args.strategy)
    if args.trials <= 0:
        raise InvalidRequest(f"--trials {args.trials}: the budget must be at least 1",
                             field="trials")
    table = None
    backend = "replay" if args.replay else args.backend
    if backend == "replay":
        if not args.replay:
            raise InvalidRequest("--backend replay needs --replay FILE", field="replay")
        table = load_table(args.replay)
        if table.kernel != kernel.name:
            raise InvalidRequest(f"replay table is for kernel {table.kernel!r}, not "
                                 f"{kernel.name!r}", field="replay")
    if args.shape is None and table is None:
        raise InvalidRequest("--shape is required, e.g. --shape M=4096,N=4096,K=4096",
                             field="shape")
    raw_shape = parse_shape(args.shape) if args.shape else table.shape  # type: ignore[union-attr]
    shape = validate_shape(kernel.dims, raw_shape)
    dtype = args.dtype or (table.dtype if table else "float16")
    if table is not None and (shape != table.shape or dtype != table.dtype):
        raise InvalidRequest(f"the replay table measured {shape_label(table.shape)} "
                             f"{table.dtype}; the run asks for {shape_label(shape)} {dtype}",
                             field="replay")
    backend = resolve_backend_kind(backend)
    check_dtype(kernel, dtype)
    if backend == "interpret":
        check_interpreter_dtype(kernel, dtype)
        check_interpreter_timing(args.timing)
        check_interpreter_shape(kernel, shape, dtype)
    return kernel, shape, dtype, backend, table


def check_interpreter_shape(kernel: TunableKernel, shape: dict[str, int], dtype: str) -> None:
    """The admission check the service's POST /jobs applies to a job only the interpreter can
    run (``api.validation.check_interpreter_size``): a shape whose one trial is estimated to
    take longer than ``TUNER_INTERPRETER_TRIAL_LIMIT_S`` (the override, as for the service)
    is refused before a job is created, instead of sitting at 0 trials."""
    from api.validation import interpreter_trial_seconds

    limit_s = Settings().interpreter_trial_limit_s
    estimate = interpreter_trial_seconds(kernel, shape, dtype)
    if estimate > limit_s:
        raise InvalidRequest(
            f"--shape {shape_label(shape)} is too large for the Triton CPU interpreter: one "
            f"trial would take at least {estimate:.0f} s (limit {limit_s:.0f} s, "
            "TUNER_INTERPRETER_TRIAL_LIMIT_S raises it); use a smaller shape or --backend "
            "cuda on a GPU", field="shape")


def _tune_sweep(args: argparse.Namespace) -> int:
    """``tuner tune KERNEL --sweep DIM=...``: ``tuner.app.sweep`` (one job, one GPU child)."""
    from tuner.app import sweep

    if args.replay:
        print("tuner: --sweep cannot be combined with --replay", file=sys.stderr)
        return 2
    argv = [args.kernel, "--sweep", args.sweep, "--dtype", args.dtype or "float16",
            "--trials", str(args.trials), "--strategy", args.strategy, "--seed",
            str(args.seed), "--backend", args.backend, "--timing", args.timing]
    if args.shape:
        argv += ["--shape", args.shape]
    if args.seconds is not None:
        argv += ["--seconds", str(args.seconds)]
    if getattr(args, "db", None):
        argv += ["--db", args.db]
    if args.json:
        argv.append("--json")
    return sweep.main(argv)


def tune(args: argparse.Namespace) -> int:
    from db import repo
    from tuner.app.worker import execute_task
    from tuner.job_spec import JobSpec

    if getattr(args, "sweep", None):
        return _tune_sweep(args)
    kernel, shape, dtype, backend, table = _resolve_tune_input(args)
    settings = _settings(args)
    factory = _session_factory(settings)
    with factory() as session:
        job = repo.create_job(session, JobSpec(
            kernel=kernel.name, kernel_version=kernel.version, dtype=dtype, shapes=[shape],
            budget_trials=args.trials, budget_seconds=args.seconds, strategy=args.strategy,
            force=True, seed=args.seed, backend=backend, device_key=None, timing=args.timing))
        job_id, task_id = job.id, job.tasks[0].id
        repo.start_task_locally(session, task_id, worker_id=CLI_WORKER)
        session.commit()
    page = job_page(service_url(args), job_id)
    progress = _Progress(args.trials, enabled=not (args.no_progress or args.json))
    if progress.bar is not None:
        print(f"tuner: job {job_id}: {page}", file=sys.stderr)
    started = time.monotonic()
    # SIGINT (also where a shell started us with it ignored) and SIGTERM end the run: the
    # search stops, its best verified config so far is stored and the job ends cancelled (a
    # second signal while that is written aborts it: cancelled, nothing stored)
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        outcome = execute_task(factory, task_id, backend_kind=backend, replay_table=table,
                               on_trial=progress.update, worker_id=CLI_WORKER)
    except KeyboardInterrupt:
        progress.close()
        print("tuner: interrupted before the search ran: the job is cancelled and nothing "
              "was stored", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    progress.close()
    wall = time.monotonic() - started
    summary = {**summary_of(kernel, shape, dtype, backend, outcome, wall), "job_id": job_id,
               "dashboard_url": page,
               "stored_config": _stored_config(factory, kernel, shape, dtype, outcome,
                                               args.timing)}
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary)
    if summary["stop_reason"] == "interrupted":
        stored = ("stored its best verified config" if summary["stored"] else
                  "no verified config was stored" if not summary["best_config"] else
                  summary["stored_note"] or "kept the stored config")
        print(f"tuner: interrupted after {summary['trials']} trial(s): the job is cancelled; "
              f"{stored}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0 if summary["best_config"] else 1


#: the lease owner of a task ``tuner tune`` runs in its own process
CLI_WORKER = "cli"
#: the exit status of an interrupted ``tuner tune`` (as a shell reports death by SIGINT)
EXIT_INTERRUPTED = 130


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        self.best: float | None = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="trial", file=sys.stderr, dynamic_ncols=True)

    def update(self, number: int, m: Any) -> None:
        if m.ok and (self.best is None or m.p50_ms < self.best):
            self.best = m.p50_ms
        if self.bar is not None:
            self.bar.n = number
            best = f"{self.best:.4f} ms" if self.best is not None else "-"
            self.bar.set_postfix_str(f"best {best}, last {m.outcome.value}")
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _stored_config(factory: Any, kernel: TunableKernel, shape: dict[str, int], dtype: str,
                   outcome: Any, timing: str) -> dict[str, int] | None:
    """The config the store now serves for the tuned identity (the search's best, the
    kernel's default where the search found nothing faster beyond noise, or an earlier best
    that was kept), read back after the run; None where nothing is stored."""
    from db import repo

    if outcome.device_key is None:
        return None
    with factory() as session:
        row = repo.get_best(session, device_key=outcome.device_key, kernel=kernel.name,
                            dtype=dtype, shape_key=repo.shape_key_of(shape),
                            kernel_version=kernel.version, timing=timing)
        return dict(row.config) if row is not None else None


def _print_summary(s: dict[str, Any]) -> None:
    print(f"job      {s['job_id']}  {s['dashboard_url']} (when tuner serve runs on this "
          "database)")
    print(f"kernel   {s['kernel']} ({s['kernel_version']})  {shape_label(s['shape'])} "
          f"{s['dtype']}")
    print(f"device   {s['device']}  [backend: {s['backend']}]")
    outcomes = ", ".join(f"{k} {v}" for k, v in s["outcomes"].items())
    print(f"trials   {s['trials']} ({outcomes}); {s['pruned']} pruned before compiling; "
          f"stopped: {s['stop_reason']}")
    if s["best_config"] is None:
        print(f"no verified config: {s['error']}")
        return
    print(f"best     {json.dumps(s['best_config'])}")
    note = "" if s["timings_meaningful"] else "  (CPU interpreter: timings are not GPU timings)"
    which = ("re-timed beside the other finalists" if s["best_measured"] == "retimed"
             else "trial timing, not re-timed")
    print(f"time     {s['best_ms']:.4f} ms ({which}), {s['tflops']:.2f} TFLOP/s, "
          f"{s['gbps']:.1f} GB/s{note}")
    if s["vs_baseline"]:
        print(f"baseline {s['vs_baseline']:.2f}x vs {s['baseline_name']} "
              f"({s['baseline_ms']:.4f} ms, timed interleaved with the finalists)")
    stored = "yes" if s["stored"] else "no"
    if s.get("stored_config") not in (None, s["best_config"]):
        print(f"serves   {json.dumps(s['stored_config'])}")
    print(f"stored   {stored}{': ' + s['stored_note'] if s['stored_note'] else ''}; "
          f"wall time {s['wall_s']:.1f} s")


def _read_url(args: argparse.Namespace) -> str | None:
    """The service a reading command (``configs``, ``export``) reads: ``--url``, else
    ``TUNER_URL`` where no ``--db`` or ``TUNER_DATABASE_URL`` names a database; None: the
    local database."""
    if getattr(args, "url", None):
        return str(args.url)
    if getattr(args, "db", None) or Settings().database_url:
        return None
    from tuner.app.cli_service import _client_settings
    from tuner.settings import ClientSettings

    return str(_client_settings(ClientSettings).url or "") or None


def _existing_database(settings: Settings) -> Any:
    """The session factory of a database that exists: a SQLite file that is missing is an
    error naming it (a reading command never creates a database)."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    url = settings.resolved_database_url
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database or "").expanduser().resolve()
        if not path.is_file():
            raise InvalidRequest(f"no database at {path}: give --db URL, or --url (or "
                                 "TUNER_URL) to read a running service", field="db")
    return _session_factory(settings)


def _stored_rows(args: argparse.Namespace) -> tuple[list[Any], bool]:
    """The stored bests that ``args``' filters select (rows with ``BestConfig``'s attributes)
    and whether they came from a service."""
    from types import SimpleNamespace

    url = _read_url(args)
    if url is not None:
        from tuner.app.cli_service import REQUEST_TIMEOUT_S, _client_settings
        from tuner.client import TunerClient
        from tuner.settings import ClientSettings

        key = _client_settings(ClientSettings).api_key or None
        with TunerClient(url, api_key=key, timeout=REQUEST_TIMEOUT_S) as client:
            data = client.stored_configs(kernel=args.kernel, dtype=args.dtype,
                                         device=args.device)
        return [SimpleNamespace(**row) for row in data], True
    from db import repo

    try:
        factory = _existing_database(_settings(args))
    except InvalidRequest:
        _check_kernel_filter(args.kernel)  # a typo is the first thing to say
        raise
    with factory() as session:
        rows = repo.list_best(session, kernel=args.kernel, device_key=args.device,
                              dtype=args.dtype)
        session.expunge_all()
    return list(rows), False


@_read_errors
def configs(args: argparse.Namespace) -> int:
    rows, remote = _stored_rows(args)
    data = [_config_row(r) for r in rows]
    if not data and not remote:
        _check_kernel_filter(args.kernel)
    if args.json:
        print(json.dumps(data))
        return 0
    if not data:
        print("no stored configs")
        return 0
    for d in data:
        print(f"{d['kernel']:<8} {d['dtype']:<9} {shape_label(d['shape']):<18} "
              f"{d['device_key']:<28} {d['p50_ms']:.4f} ms {d['timing']:<13} "
              f"{json.dumps(d['config'])}")
    return 0


def _check_kernel_filter(name: str | None) -> None:
    """UnknownKernel, listing the known kernels, for a ``--kernel`` that matched nothing
    because no kernel has that name here (a typo); configs of kernels stored by another
    installation are still listed by name."""
    if name:
        from search_spaces import get_kernel

        get_kernel(name)


def _config_row(r: Any) -> dict[str, Any]:
    return {"kernel": r.kernel, "kernel_version": r.kernel_version, "dtype": r.dtype,
            "shape": r.shape, "device_key": r.device_key, "triton_version": r.triton_version,
            "config": r.config, "p50_ms": r.p50_ms, "tflops": r.tflops, "timing": r.timing}


def kernels(args: argparse.Namespace) -> int:
    from search_spaces import get_kernel, is_builtin, kernel_names, plugin_errors

    # each plugin that did not load is listed below, once (not also as the registry's log line)
    registry_log = logging.getLogger("search_spaces.registry")
    registry_log.addFilter(_not_a_plugin_error)
    try:
        names = kernel_names()
    finally:
        registry_log.removeFilter(_not_a_plugin_error)
    if getattr(args, "json", False):
        print(json.dumps({"kernels": [_kernel_dict(get_kernel(n), is_builtin(n)) for n in names],
                          "not_loaded": [e.to_dict() for e in plugin_errors()]}))
        return 0
    for name in names:
        k = get_kernel(name)
        dims = ", ".join(f"{d.name} in [{d.lo}, {d.hi}]" for d in k.dims)
        origin = "" if is_builtin(name) else f" [plugin {k.ref}]"
        print(f"{name}: {dims}; dtypes {', '.join(k.dtypes)}{origin}")
    for e in plugin_errors():
        print(f"not loaded: {e.ref} ({e.source}): {e.error}", file=sys.stderr)
    return 0


def _not_a_plugin_error(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("kernel plugin ")


def _kernel_dict(kernel: Any, builtin: bool) -> dict[str, Any]:
    return {"name": kernel.name, "version": kernel.version,
            "dims": [{"name": d.name, "lo": d.lo, "hi": d.hi} for d in kernel.dims],
            "dtypes": list(kernel.dtypes), "plugin": None if builtin else kernel.ref}


def worker(args: argparse.Namespace) -> int:
    from tuner.app.service import run_worker
    from tuner.app.supervision import stop_with_serve

    if args.parent_pid is not None:  # started by tuner serve: never outlive it
        stop_with_serve(args.parent_pid)
    return run_worker(_settings(args), backend=args.backend, device_index=args.device_index,
                      parent_pid=args.parent_pid, workers_on_host=args.workers_on_host)


def serve(args: argparse.Namespace) -> int:
    from tuner.app.service import serve as serve_service

    return serve_service(_settings(args), host=args.host, port=args.port,
                         workers=args.workers, backend=args.backend,
                         api_workers=args.api_workers)


# -- export / import: configs files for use without the service (tuner.configs_file) -----------

@_read_errors
def export(args: argparse.Namespace) -> int:
    from tuner import configs_file

    where = _parse_where(args.where)
    rows, remote = _stored_rows(args)
    if args.format == "fla":
        return _export_fla([r for r in rows if _selected(r, where, args)], args)
    entries = [_entry_of(r) for r in rows if _selected(r, where, args)]
    if not rows and not remote:
        _check_kernel_filter(args.kernel)
    if not entries:
        print(f"tuner: {_nothing_matches(args)}", file=sys.stderr)
        return 1
    write = configs_file.write_vllm if args.format == "vllm" else configs_file.write_tuner
    out = configs_file.vllm_target(entries, args.out) if args.format == "vllm" else args.out
    count = write(entries, out)
    name = "vllm" if args.format == "vllm" else configs_file.FORMAT
    target = "standard output" if out == configs_file.STDOUT else out
    print(f"tuner: wrote {count} configs ({name}) to {target}", file=sys.stderr)
    return 0


def _export_fla(rows: list[Any], args: argparse.Namespace) -> int:
    """``--format fla``: flash-linear-attention's own config files (``tuner/export_fla.py``)
    into the folder ``--out``."""
    from tuner.export_fla import write_fla

    if args.out in (None, "-"):
        raise InvalidRequest("--format fla writes one file per kernel: give --out a folder "
                             "(fla reads FLA_CONFIG_DIR)", field="out")
    written, skipped = write_fla(rows, args.out)
    note = (f"; {skipped} stored configs carry no Triton key (only a model's process measuring "
            "with tuner.install() sends one) and were left out" if skipped else "")
    print(f"tuner: wrote {written} configs (fla) to {args.out}{note}", file=sys.stderr)
    return 0 if written else 1


def _parse_where(text: str | None) -> dict[str, int]:
    if text is None:
        return {}
    try:
        return parse_shape(text)
    except InvalidShape as exc:
        raise InvalidRequest(f"--where {text!r}: {exc}", field="where") from None


def _selected(row: Any, where: dict[str, int], args: argparse.Namespace) -> bool:
    from tuner.identity import same_triton_minor

    if any(row.shape.get(dim) != value for dim, value in where.items()):
        return False
    if args.kernel_version and row.kernel_version != args.kernel_version:
        return False
    if getattr(args, "timing", None) and row.timing != args.timing:
        return False
    return not args.triton or same_triton_minor(row.triton_version, args.triton)


def _nothing_matches(args: argparse.Namespace) -> str:
    filters = [f"{name}={getattr(args, name)}" for name in
               ("kernel", "dtype", "device", "where", "kernel_version", "triton", "timing")
               if getattr(args, name, None)]
    if not filters:
        return "no stored configs to export: the store is empty"
    return f"no stored configs match {', '.join(filters)} (tuner configs lists what is stored)"


def _entry_of(row: Any) -> ConfigsEntry:
    from tuner.config import KernelConfig
    from tuner.configs_file import ConfigsEntry

    return ConfigsEntry(kernel=row.kernel, kernel_version=row.kernel_version, dtype=row.dtype,
                        device=row.device_key, triton_version=row.triton_version,
                        shape=dict(row.shape), config=KernelConfig(row.config), ms=row.p50_ms,
                        tflops=row.tflops, gbps=row.gbps, torch_version=row.torch_version,
                        cuda_version=row.cuda_version, timing=row.timing)


def import_configs(args: argparse.Namespace) -> int:
    from db import repo
    from tuner.configs_file import ConfigsFile, device_fingerprint

    entries = ConfigsFile.load(args.file).entries
    times = _times(args.file, entries)
    factory = _session_factory(_settings(args))
    with factory() as session:
        # the dashboard lists configs by their device row; existing rows keep what they hold
        for key in sorted({e.device for e in entries}):
            if repo.get_device(session, key) is None:
                repo.upsert_device(session, device_fingerprint(key))
        written = sum(_store_entry(session, e, ms) for e, ms in zip(entries, times, strict=True))
        session.commit()  # one transaction: a failure part-way imports nothing
    print(f"imported {written}, kept {len(entries) - written} faster stored configs")
    return 0


def _times(path: str, entries: Sequence[ConfigsEntry]) -> list[float]:
    """Each entry's time; checked before anything is written (the store ranks by time)."""
    from tuner.errors import ConfigsFileError

    times = [e.ms for e in entries]
    for i, ms in enumerate(times):
        if ms is None:
            raise ConfigsFileError(f"configs file {path!r}: entry {i} has no \"ms\": the store "
                                   "keeps a config only with its time")
    return [ms for ms in times if ms is not None]


def _store_entry(session: Session, entry: ConfigsEntry, ms: float) -> bool:
    from db import repo

    # a file carries the median time only, so the stored spread (p20..p80) is that one value
    _, written = repo.store_best(
        session, device_key=entry.device, kernel=entry.kernel,
        kernel_version=entry.kernel_version, dtype=entry.dtype, shape=entry.shape,
        triton_version=entry.triton_version, config=entry.config.to_dict(), p20_ms=ms,
        p50_ms=ms, p80_ms=ms, tflops=entry.tflops, gbps=entry.gbps,
        torch_version=entry.torch_version, cuda_version=entry.cuda_version, task_id=None,
        timing=entry.timing)
    return bool(written)
