"""``graphdiff update``: apply one training step's outcomes to a STATE directory."""

from __future__ import annotations

from pathlib import Path

import typer

from ..common import command, emit, progress


@command("update")
def update(
    state: Path = typer.Option(..., "--state", help="STATE directory (from init)."),
    step: int = typer.Option(..., "--step", help="The training step these outcomes come from: the current "
                             "step + 1 (the first update is step 1)."),
    outcomes: Path = typer.Option(..., "--outcomes", help="JSONL, CSV or Parquet rows 'id, n, s' or one row "
                                  "per rollout 'id, reward'."),
    success_threshold: float = typer.Option(1.0, "--success-threshold", help="A rollout with reward >= this "
                                            "is a success (binary 0/1 rewards pass through)."),
    lock_timeout: float = typer.Option(600.0, "--lock-timeout", help="Seconds to wait for another update "
                                       "or rollback of this STATE to finish."),
):
    """Apply exactly one step; a step already applied, a gap or bad outcomes change nothing."""
    from ...stages.handoff import update_state

    with progress(f"step {step}") as bar:
        res = update_state(state, step, outcomes, success_threshold=success_threshold,
                           lock_timeout=lock_timeout, progress=bar)
    t = res["timings"]
    emit(res, f"step {res['step']}: {res['prompts']} prompts, {res['successes']}/{res['rollouts']} successes, "
              f"{res['iterations']} rounds ({'converged' if res['converged'] else 'not converged'}) in "
              f"{t['total_s']:.2f} s (load {t['load_s']:.2f}, inference {t['inference_s']:.2f}, "
              f"write {t['write_s']:.2f})"
              + (f"; pruned step(s) {', '.join(map(str, res['pruned']))}" if res["pruned"] else ""))
