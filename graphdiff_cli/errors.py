"""The one exception hierarchy of graphdiff.

Library code raises these; the CLI turns each into a one-line message, its class's ``exit_code`` and, with
``--json``, its ``kind`` in one place (``run_guarded`` in ``graphdiff_cli/cli/common.py``). Messages name what
was wrong and, where it helps, how to fix it. The exit codes and kinds are a contract a trainer's loop
branches on (docs/reference/handoff.md, "Exit codes"):

| exit | kind | class | a loop should |
|---|---|---|---|
| 0 | - | - | go on (an update of the last applied step with the same outcomes is a no-op, also 0) |
| 1 | bad-input | DataError | fix the file or rows, send the same step again |
| 2 | usage | InvalidArgumentError | fix the call |
| 3 | already-applied | AlreadyAppliedError | the step was applied with other outcomes: go on at status's step + 1, or rollback |
| 4 | gap | StepGapError | send the missing steps first (or rollback to where the trainer is) |
| 5 | locked | LockedError | another writer held the lock past --lock-timeout: try again |
| 6 | damaged | ArtifactError | a STATE or artifact missing or damaged: graphdiff verify, rollback to a retained step |
| 7 | conflict | StateError | the request conflicts with the STATE (a pruned step, an --out that exists, a link where graphdiff writes, ...) |
| 8 | backend | BackendError | a device, model or index that cannot be used |
| 1 | internal | (an unexpected exception) | report it (GRAPHDIFF_DEBUG=1 shows the traceback); the STATE is old or new, never torn |
| 130 | interrupted | (ctrl-C, SIGTERM) | send the same call again (a no-op if it had committed) |
"""

from __future__ import annotations

import contextlib
import contextvars


class GraphdiffError(Exception):
    """Base class of every error graphdiff raises on purpose."""

    exit_code = 1
    kind = "error"


class InvalidArgumentError(GraphdiffError, ValueError):
    """A parameter, shape or option that cannot be used (usage error)."""

    exit_code = 2
    kind = "usage"


class DataError(GraphdiffError, ValueError):
    """User data that breaks the contract: counts, ids, graphs, files."""

    exit_code = 1
    kind = "bad-input"


class ArtifactError(GraphdiffError):
    """An artifact or state directory that is missing, of the wrong kind or version, or damaged."""

    exit_code = 6
    kind = "damaged"


class StateError(GraphdiffError):
    """A step-handoff request that conflicts with the state (a pruned step, an existing --out, ...)."""

    exit_code = 7
    kind = "conflict"


class AlreadyAppliedError(StateError):
    """An update of a step the STATE already holds, from other outcomes than the ones it was applied with."""

    exit_code = 3
    kind = "already-applied"


class StepGapError(StateError):
    """An update that would skip steps: the STATE is at step T and the request is for a step > T + 1."""

    exit_code = 4
    kind = "gap"


class LockedError(StateError):
    """Another writer held the lock for longer than the caller was willing to wait."""

    exit_code = 5
    kind = "locked"


DISTRIBUTION = "graphdiff-rl"  # graphdiff's name on the package index (its import package is graphdiff_cli)


def install_extra(extra: str) -> str:
    """The command that installs an optional part of graphdiff (an extra of pyproject.toml), as messages name it."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class RewardWarning(UserWarning):
    """A step's rewards all fell on one side of a chosen success threshold (trainer integrations warn with it;
    the CLI and ``State.update`` put the same line in the result's ``warnings``)."""


class BackendError(GraphdiffError):
    """A device, model or index backend that cannot be used (no GPU, model not found, ...)."""

    exit_code = 8
    kind = "backend"


# ---------------------------------------------------------------------- messages in the caller's own terms

_COMMAND_LINE: contextvars.ContextVar[bool] = contextvars.ContextVar("graphdiff_command_line", default=False)


@contextlib.contextmanager
def command_line():
    """Within it, messages name options as flags (``--id-field``) and remedies as commands; outside it (the
    Python API) as keywords (``id_field``) and calls. The CLI's one error boundary enters it."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def option(flag: str, keyword: str | None = None) -> str:
    """The option ``flag`` (``"--id-field"``) as a message names it to its reader: the flag on the command line,
    the keyword argument in Python (``keyword``, by default the flag's name: ``id_field``)."""
    return flag if _COMMAND_LINE.get() else keyword or flag.lstrip("-").replace("-", "_")


def either(command_line: str, python: str) -> str:
    """A remedy as its reader would carry it out: ``command_line`` under the CLI, else ``python``."""
    return command_line if _COMMAND_LINE.get() else python
