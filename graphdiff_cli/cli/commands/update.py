"""``graphdiff update``: apply one training step's outcomes to a STATE directory."""

from __future__ import annotations

from pathlib import Path

import typer

from ..common import NOT_CONVERGED, command, emit, progress, warn
from ..options import (DEFAULT_LOCK_TIMEOUT, DEFAULT_SUCCESS_THRESHOLD, IdFieldOption, LockTimeoutOption, StateOption,
                       SuccessThresholdOption)


@command("update")
def update(
    state: StateOption,
    step: int = typer.Option(..., "--step", help="The training step these outcomes come from: the current "
                             "step + 1 (the first update is step 1)."),
    outcomes: Path = typer.Option(..., "--outcomes", help="JSONL, CSV or Parquet rows 'id, n, s' or one row "
                                  "per rollout 'id, reward'."),
    success_threshold: SuccessThresholdOption = DEFAULT_SUCCESS_THRESHOLD,
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT,
    id_field: IdFieldOption = "id",
):
    """Apply exactly one step; a step already applied from other outcomes, a gap or bad outcomes change nothing
    (exit codes: docs/reference/handoff.md). Sending the last applied step's outcomes again is a no-op (exit 0)."""
    from ...state import State

    with progress(f"step {step}") as bar:
        res = State.open(state).update(step, outcomes, success_threshold=success_threshold,
                                       lock_timeout=lock_timeout, id_field=id_field, progress=bar)
    if res.get("noop"):
        emit(res, f"step {res['step']} was already applied from these outcomes ({res['outcomes_hash']}, "
                  f"{res['applied_at']}): nothing to do; the next update is step {res['step'] + 1}")
        return
    t = res["timings"]
    for line in res["warnings"]:
        warn(line)
    emit(res, f"step {res['step']}: {res['prompts']} prompts, {res['successes']}/{res['rollouts']} successes, "
              f"{res['iterations']} rounds ({'converged' if res['converged'] else NOT_CONVERGED}) in "
              f"{t['total_s']:.2f} s (load {t['load_s']:.2f}, inference {t['inference_s']:.2f}, "
              f"write {t['write_s']:.2f})"
              + (f"; pruned step(s) {', '.join(map(str, res['pruned']))}" if res["pruned"] else ""))
