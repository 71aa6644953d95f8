"""``graphdiff rollback``: make an earlier step current again (a trainer resuming from a checkpoint), or undo
an extend or retire (``--to T.R``)."""

from __future__ import annotations

import typer

from ..common import command, emit, progress, warn
from ..options import DEFAULT_LOCK_TIMEOUT, LockTimeoutOption, StateOption


@command("rollback")
def rollback(
    state: StateOption,
    to: str = typer.Option(..., "--to", help="The step T to make current (its newest retained revision), or "
                           "T.R for revision R of it (T.0: as update T left it, before extends or retires after "
                           "it); later states are removed, so the next update is T + 1.", metavar="T[.R]"),
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT,
):
    """Roll the STATE back to step T (or revision T.R); refused if it was pruned or not applied yet."""
    from ...state import State

    with progress(f"rolling back to step {to}") as bar:
        res = State.open(state).rollback(to, lock_timeout=lock_timeout, progress=bar)
    for line in res["warnings"]:
        warn(line)
    removed = ", ".join(res.get("removed_versions") or map(str, res["removed"])) or "none"
    now = f"{res['step']}.{res['revision']}" if res["revision"] else str(res["step"])
    was = f"{res['previous_step']}.{res['previous_revision']}" if res["previous_revision"] else str(res["previous_step"])
    emit(res, f"step {now} is current (was {was}; removed step(s) {removed}); "
              f"the next update is step {res['next_step']}")
