"""``graphdiff rollback``: make an earlier step current again (a trainer resuming from a checkpoint)."""

from __future__ import annotations

from pathlib import Path

import typer

from ..common import command, emit, progress


@command("rollback")
def rollback(
    state: Path = typer.Option(..., "--state", help="STATE directory (from init)."),
    to: int = typer.Option(..., "--to", help="The step to make current; later states are removed, so the "
                           "next update is this step + 1."),
    lock_timeout: float = typer.Option(600.0, "--lock-timeout", help="Seconds to wait for a running update."),
):
    """Roll the STATE back to step T; refused if T was pruned or not applied yet."""
    from ...stages.handoff import rollback as run_rollback

    with progress(f"rolling back to step {to}") as bar:
        res = run_rollback(state, to, lock_timeout=lock_timeout, progress=bar)
    removed = ", ".join(map(str, res["removed"])) or "none"
    emit(res, f"step {res['step']} is current (was {res['previous_step']}; removed step(s) {removed}); "
              f"the next update is step {res['next_step']}")
