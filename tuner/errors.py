"""The engine's exception tree.

TunerError
 +-- InvalidRequest          bad user input; the message names the field and what to do
 |    +-- UnknownKernel      no kernel of that name (the message lists the known ones)
 |    +-- InvalidShape       malformed, missing, extra or out-of-bounds dimension
 |    +-- UnsupportedDtype   the kernel (or backend) does not take that dtype
 |    +-- InvalidConfig      a config outside the kernel's search space
 +-- ReplayTableError        a replay file that is missing, does not parse or does not fit
 +-- ConfigsFileError        an exported configs file that is missing, does not parse, is not
                             tuner-configs-v1, has a malformed entry or cannot be written
 +-- BackendUnavailable      the asked-for backend cannot run here (e.g. cuda without a GPU)
 +-- DatabaseUrlError        a database URL no retry can make work: it does not parse, or
                             names a driver not installed here
 +-- CannotListen            ``tuner serve``'s address is taken (the message names the process
                             holding it where it can be found) or cannot be listened on
 +-- WrongOutput             a kernel's outputs cannot be trusted (a reference that is NaN
                             where the inputs are finite, a user's configs that disagree):
                             the measured config is recorded as wrong_result
 +-- WorkerDied              the measuring child process died and could not be restarted
 +-- MeasuringStopped        a backend stopped the work in flight because the search must
                             stop (its task was cancelled or lost); the search ends cancelled
"""

from __future__ import annotations


class TunerError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequest(TunerError):
    """User input that cannot be served. ``field`` names the offending input."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.field))


class UnknownKernel(InvalidRequest):
    pass


class InvalidShape(InvalidRequest):
    pass


class UnsupportedDtype(InvalidRequest):
    pass


class InvalidConfig(InvalidRequest):
    pass


class ReplayTableError(TunerError):
    pass


class ConfigsFileError(TunerError):
    pass


class BackendUnavailable(TunerError):
    pass


class DatabaseUrlError(TunerError):
    pass


class CannotListen(TunerError):
    pass


class WrongOutput(TunerError):
    """Outputs that cannot be trusted, found while building what they are checked against."""

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self),))


class WorkerDied(TunerError):
    pass


class MeasuringStopped(TunerError):
    pass


def interrupted_by(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a KeyboardInterrupt (Ctrl-C, or ``tuner tune``'s SIGTERM) or was
    raised while one was being handled. A library the interrupt lands in may raise its own
    error from its cleanup instead: psycopg interrupted inside SQLAlchemy's connection check
    raises ``ProgrammingError: can't change 'autocommit' now``, the KeyboardInterrupt only in
    its context. Either way the run was interrupted, not broken."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
