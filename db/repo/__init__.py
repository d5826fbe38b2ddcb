"""Repository functions: every query the service makes, in one package.

Functions take a ``Session`` and leave committing to the caller unless they say otherwise.
Functions that return rows return them fresh from the database (reloaded where a guarded
UPDATE changed them), so callers can read them after commit.

Concurrency: every state change that two processes could race for is a guarded UPDATE (a
compare-and-set whose WHERE clause states the status it expects), so a row changes hands at
most once whatever the interleaving. On PostgreSQL, claims also pick candidates with
``SELECT ... FOR UPDATE SKIP LOCKED`` so that workers do not queue behind each other; SQLite
has one writer at a time and relies on the guard alone. Settling a job from its tasks' statuses
reads other rows, so on PostgreSQL it first locks the job row (``SELECT ... FOR UPDATE``): of
two transactions finishing a job's last tasks, the second waits for the first's commit and
then sees it (under READ COMMITTED neither would see the other's). Locks are taken tasks
first, then their job. A worker's writes to its task (trials, best, finish) name the worker and
change nothing once the lease went to another (``LeaseLost``). Identical submissions share one
job: a partial unique index allows one queued or running job per request key, and
``submit_job`` inserts in a SAVEPOINT and returns the other job when the index refuses. Best
configs and devices are written with ``INSERT ... ON CONFLICT DO NOTHING`` followed by a
guarded UPDATE, so two workers storing the same key at once never fail on the unique
constraint. Misses are written the same way, and a report holds its miss row's write lock
(SQLite: the database's) from its first statement to its commit, so reports of one miss take
turns and queue at most one job.

The modules, by concern (every name is re-exported here, so ``repo.X`` reads as before):
``db.repo._common``: errors and the guarded writes' helpers;
``db.repo.devices``: devices and workers;
``db.repo.jobs``: jobs, and the misses that follow them;
``db.repo.tasks``: tasks: claim, lease, finish;
``db.repo.trials``: trials;
``db.repo.bests``: best configs and the serving ladder;
``db.repo.misses``: misses;
``db.repo.reads``: the dashboard's reads;
``db.repo.upgrades``: Triton upgrades.
"""

from __future__ import annotations

from db.repo._common import (  # noqa: F401
    LeaseLost,
    NotFound,
    _changed,
    _changed_row,
    _insert_ignoring_conflicts,
    _is_postgres,
    _reloaded,
    _rowcount,
    _write_transaction,
)
from db.repo.bests import (  # noqa: F401
    LADDER,
    MATCH_RANK,
    BestTimes,
    Candidate,
    Members,
    Served,
    Step,
    _best_key,
    _best_query,
    _best_row,
    _best_values,
    _closest,
    _matching,
    all_serving_candidates,
    best_configs_version,
    climb,
    get_best,
    list_best,
    nearest_best,
    seconds_since,
    serve_best,
    serve_timed,
    serving_candidates,
    shape_key_of,
    store_best,
    write_best,
)
from db.repo.devices import (  # noqa: F401
    _DEVICE_FIELDS,
    _seen_since,
    beat_worker,
    get_device,
    list_devices,
    list_workers,
    live_device_keys,
    register_worker,
    set_calibration,
    single_gpu_device_key,
    stop_worker,
    touch_device,
    upsert_device,
    waiting_note,
)
from db.repo.jobs import (  # noqa: F401
    _AMBIGUOUS_LISTED,
    _HEX_DIGITS,
    _JOB_ID_LENGTH,
    _MISS_ACTIVE,
    _MISS_STATUS_OF_JOB,
    _SUBMIT_ATTEMPTS,
    JOB_ID_MIN_PREFIX,
    AmbiguousJobId,
    ShortJobId,
    _follow_job,
    _insert_job,
    _lock_job,
    _reloaded_job,
    _settle_job,
    answer_tuned_tasks,
    cancel_job,
    count_jobs_by_status,
    create_job,
    find_active_duplicate,
    get_job,
    get_job_by_prefix,
    list_jobs,
    request_key,
    resolve_job_id,
    submit_job,
    unshared_request_key,
)
from db.repo.misses import (  # noqa: F401
    MISS_RATE_WINDOW,
    MISS_RETRY_AFTER,
    MISS_STATUSES,
    MissLimits,
    _counted_miss,
    _miss_is,
    _queue_miss,
    _same_job,
    _unqueueable,
    count_misses_by_status,
    list_misses,
    report_miss,
)
from db.repo.reads import (  # noqa: F401
    TRIAL_COLUMNS,
    count_best_by_kernel,
    count_trials,
    jobs_for_progress,
    trial_columns,
)
from db.repo.tasks import (  # noqa: F401
    _MAX_INT_ID,
    _SQLITE_CLAIM_CANDIDATES,
    FINISH_STATUSES,
    MAX_REQUEUES,
    _claim_candidates,
    _lease,
    _mark_job_running,
    _owned,
    claim_task,
    count_tasks_by_status,
    finish_task,
    get_task,
    keep_best_of_given_up,
    reap_expired,
    record_retimed,
    release_task,
    renew_lease,
    running_tasks,
    set_task_best,
    set_task_device,
    start_task_locally,
    take_task,
)
from db.repo.trials import (  # noqa: F401
    GPU_STATE_FIELDS,
    MEASURED_FIELDS,
    TRIAL_FIELDS,
    TrialField,
    _counted_outcome,
    gpu_state_columns,
    has_trial,
    measurement_dict,
    record_trial,
    trials_for_task,
)
from db.repo.upgrades import (  # noqa: F401
    UPGRADE_REASON,
    _BestKey,
    _minor_of,
    queue_upgrade_retunes,
)
from tuner.shapes import shape_distance  # noqa: F401
