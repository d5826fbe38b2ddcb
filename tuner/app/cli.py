"""The ``tuner`` command: tune kernels, list, export and import configs, run workers, serve,
and submit, follow and cancel jobs on a running service.

Bad input gets one clear line on stderr and exit status 2; a tuning run that finds no working
config exits 1 (the service commands' other statuses: ``tuner.app.cli_service``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from tuner.app.cli_common import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_URL,
    EXIT_BAD_INPUT,
)
from tuner.errors import InvalidRequest, TunerError
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS

#: ``tuner.strategies.strategy_names()``, spelled out so that ``--help`` need not import the
#: strategies (optuna); tests/test_cli.py checks that the two agree
STRATEGY_NAMES = ("auto", "exhaustive", "gp", "model", "model-tpe", "random", "tpe")


def _add_timing_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timing", default=DEFAULT_TIMING, choices=TIMING_METHODS,
                        help="how configs are timed: eager-flushed (eager launches, the L2 "
                             "cache flushed before each; the default), cuda-graph (replayed in "
                             "a CUDA graph, no flush: how serving engines run decode-time "
                             "kernels) or eager-hot (eager, no flush)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="SQLAlchemy database URL (default: TUNER_DATABASE_URL, "
                        "else sqlite:///data/tuner.db)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    tune = sub.add_parser("tune", help="tune one kernel for one shape and store the best config")
    tune.add_argument("kernel", help="registered kernel name (e.g. matmul)")
    tune.add_argument("--shape", help="e.g. M=4096,N=4096,K=4096 (default with --replay: the "
                      "table's shape)")
    tune.add_argument("--dtype", default=None, help="float16, bfloat16 or float32 "
                      "(default: float16, or the replay table's)")
    _add_budget_options(tune, "")
    tune.add_argument("--backend", default="auto",
                      choices=["auto", "cuda", "interpret", "replay"])
    _add_timing_option(tune)
    tune.add_argument("--replay", metavar="FILE", help="a replay-v1 table (implies --backend "
                      "replay)")
    tune.add_argument("--sweep", metavar="DIM=V1,V2,...", help="tune every value of one "
                      "dimension (e.g. M=1,2,4,...,4096 over --shape's other dimensions) as one "
                      "job on one GPU child, each shape seeded by its neighbours' bests")
    tune.add_argument("--json", action="store_true", help="print one JSON object")
    tune.add_argument("--no-progress", action="store_true", help="no progress bar")

    configs = sub.add_parser("configs", help="list stored best configs")
    configs.add_argument("--kernel")
    configs.add_argument("--dtype")
    configs.add_argument("--device", help="device key, e.g. 'cuda:NVIDIA H200:sm90'")
    configs.add_argument("--json", action="store_true")
    _add_read_options(configs)

    kernels = sub.add_parser("kernels", help="list the registered kernels")
    kernels.add_argument("--json", action="store_true", help="print one JSON object: the "
                         "kernels and the plugins that did not load")

    worker = sub.add_parser("worker", help="claim and run queued tasks on a local GPU")
    worker.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"])
    worker.add_argument("--device-index", type=int, default=0)
    worker.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    worker.add_argument("--workers-on-host", type=int, default=1, metavar="N",
                        help="GPU workers sharing this machine's cores: each compiles ahead on "
                             "its share (default 1; tuner serve passes its count)")

    serve = sub.add_parser("serve", help="start the API and one worker per local GPU")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"the address the API listens "
                       f"on (default {DEFAULT_HOST}: this machine only; 0.0.0.0: every "
                       "address, set TUNER_API_KEYS first)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the API's port "
                       f"(default {DEFAULT_PORT})")
    serve.add_argument("--workers", type=int, default=None,
                       help="worker processes (default: one per GPU, or one interpreter worker)")
    serve.add_argument("--backend", default=None, choices=["auto", "cuda", "interpret"])
    serve.add_argument("--api-workers", type=int, default=None, metavar="N",
                       help="API processes (default: TUNER_API_WORKERS, 2; 0: one per core)")
    _add_file_commands(sub)
    _add_service_commands(sub)
    return parser


def _add_budget_options(command: argparse.ArgumentParser, per: str) -> None:
    """The search's budget and strategy, alike for ``tune`` and ``submit``."""
    command.add_argument("--trials", type=int, default=48, help=f"trial budget{per} "
                         "(default 48)")
    command.add_argument("--seconds", type=float, default=None, help=f"time budget{per} in "
                         "seconds")
    command.add_argument("--strategy", default="auto", metavar="NAME",
                         help=f"search strategy: {', '.join(STRATEGY_NAMES)} (default: auto)")
    command.add_argument("--seed", type=int, default=0)


def _add_db_option(command: argparse.ArgumentParser) -> None:
    # also accepted after the subcommand (``tuner import FILE --db URL``); SUPPRESS keeps a
    # global ``--db`` given before it from being overwritten with None
    command.add_argument("--db", default=argparse.SUPPRESS, help="SQLAlchemy database URL "
                         "(as the global --db)")


def _add_read_options(command: argparse.ArgumentParser) -> None:
    """Where ``configs`` and ``export`` read stored configs: a running service (``--url``, else
    ``TUNER_URL`` when no ``--db`` or ``TUNER_DATABASE_URL`` names a database), else the local
    database, which must exist (reading never creates one)."""
    command.add_argument("--url", default=None, help="read a running service over HTTP "
                         "(default: TUNER_URL, unless --db or TUNER_DATABASE_URL names a "
                         "database; the API key is TUNER_API_KEY)")


def _add_file_commands(sub: Any) -> None:
    export = sub.add_parser("export", help="write stored best configs to a file for use "
                            "without the service (tuner-configs-v1, or vLLM's format)")
    export.add_argument("--kernel", help="only this kernel")
    export.add_argument("--dtype", help="only this dtype")
    export.add_argument("--device", help="only this device key, e.g. 'cuda:NVIDIA H200:sm90'")
    export.add_argument("--where", metavar="DIMS", help="only shapes with these dimensions, "
                        "e.g. N=4096,K=4096")
    export.add_argument("--kernel-version", help="only this kernel source version")
    export.add_argument("--triton", metavar="MAJOR.MINOR", help="only configs tuned with this "
                        "Triton minor version, e.g. 3.6")
    export.add_argument("--timing", choices=TIMING_METHODS, help="only configs timed this way")
    export.add_argument("--format", default="tuner", choices=["tuner", "vllm", "fla"],
                        help="tuner: tuner-configs-v1 (every identity field; the default); "
                        "vllm: {M: config} with vLLM's names, for one kernel, dtype and device "
                        "and shapes that differ only in M; fla: flash-linear-attention's own "
                        "config files (FLA_CONFIG_DIR/<kernel>.json, for FLA_CACHE_MODE), "
                        "for configs a model's process measured with tuner.install()")
    export.add_argument("--out", default="-", metavar="FILE", help="where to write "
                        "(default: - for standard output); replaced atomically; with "
                        "--format vllm, a directory gets the file vLLM looks for "
                        "(E=8,N=14336,device_name=NVIDIA_H200.json); with --format fla, the "
                        "folder fla reads (FLA_CONFIG_DIR)")
    _add_db_option(export)
    _add_read_options(export)

    load = sub.add_parser("import", help="load a tuner-configs-v1 file into the store (the "
                          "faster of a stored and an imported config is kept)")
    load.add_argument("file", metavar="FILE", help="a file written by tuner export "
                      "(- for standard input)")
    _add_db_option(load)


def _add_service_commands(sub: Any) -> None:
    """``submit``, ``status``, ``wait``, ``cancel``: a running service's jobs, over HTTP."""
    submit = sub.add_parser("submit", help="queue a tuning job on the service (prints its id "
                            "and dashboard page)")
    submit.add_argument("kernel", help="registered kernel name (e.g. matmul)")
    submit.add_argument("--shape", action="append", metavar="DIMS", help="e.g. "
                        "M=4096,N=4096,K=4096; repeat it for more shapes (one task each)")
    submit.add_argument("--dtype", default="float16", help="float16, bfloat16 or float32 "
                        "(default: float16)")
    _add_budget_options(submit, " per shape")
    submit.add_argument("--device", help="the device key that must run it, e.g. 'cuda:NVIDIA "
                        "H200:sm90' (default: any worker); a key no worker has registered "
                        "is refused unless --future-device")
    submit.add_argument("--future-device", action="store_true", help="--device is for a "
                        "worker that has not registered yet: queue the job for it")
    submit.add_argument("--backend", default="auto", choices=["auto", "cuda", "interpret"])
    _add_timing_option(submit)
    submit.add_argument("--force", action="store_true", help="tune shapes already tuned for "
                        "the device again")
    submit.add_argument("--wait", action="store_true", help="then wait for it as tuner wait "
                        "does (and exit as it does)")
    _add_wait_options(submit)
    _add_service_options(submit, "print the queued job as one JSON object (its id, status, "
                         "URL and dashboard_url; with --wait: the finished job)")

    status = sub.add_parser("status", help="a job's status, per shape: trials done, best so "
                            "far (without JOB: the newest jobs)")
    _add_job_argument(status, optional=True)
    status.add_argument("--status", dest="status", default=None, metavar="STATE",
                        help="without JOB: only jobs in this state (queued, running, "
                        "succeeded, failed, cancelled)")
    status.add_argument("--limit", type=int, default=20, help="without JOB: how many jobs "
                        "(default 20)")
    _add_service_options(status, "print one JSON object, the job as the service answers it "
                         "(without JOB: a list of jobs)")

    wait = sub.add_parser("wait", help="follow a job until it finishes: exit 0 if it "
                          "succeeded, 1 if it failed or was cancelled, 4 on --timeout")
    _add_job_argument(wait)
    _add_wait_options(wait)
    _add_service_options(wait, "print the finished job as one JSON object (as status --json "
                         "does); progress stays on stderr")

    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    _add_job_argument(cancel)
    _add_service_options(cancel, "print the job as one JSON object, as the service answered "
                         "the cancel")


def _add_job_argument(command: argparse.ArgumentParser, optional: bool = False) -> None:
    command.add_argument("job", metavar="JOB", nargs="?" if optional else None,
                         help="a job id, or its first characters (at least 4: the dashboard "
                         "shows 8)")


def _add_wait_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--timeout", type=float, default=24 * 3600.0, metavar="SECONDS",
                         help="stop waiting after this long, exit 4; the job goes on "
                         "(default: a day)")
    command.add_argument("--poll", type=float, default=1.0, metavar="SECONDS",
                         help="the longest one look at the job waits for it to change "
                              "(default 1; the service answers at once when it does)")
    command.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _add_service_options(command: argparse.ArgumentParser, json_help: str) -> None:
    command.add_argument("--url", default=None, help=f"the service (default: TUNER_URL, else "
                         f"{DEFAULT_URL}); the API key is TUNER_API_KEY")
    command.add_argument("--json", action="store_true", help=json_help)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from tuner.backends.child import stacks_on_sigusr1

    stacks_on_sigusr1()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return _dispatch(args)
    except InvalidRequest as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TunerError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from tuner.app import cli_commands, cli_service

    handler = {"tune": cli_commands.tune, "configs": cli_commands.configs,
               "kernels": cli_commands.kernels, "worker": cli_commands.worker,
               "serve": cli_commands.serve, "export": cli_commands.export,
               "import": cli_commands.import_configs, "submit": cli_service.submit,
               "status": cli_service.status, "wait": cli_service.wait,
               "cancel": cli_service.cancel}[args.command]
    result: Any = handler(args)
    return int(result)


if __name__ == "__main__":
    sys.exit(main())
