"""``graphdiff status``: what a STATE directory holds."""

from __future__ import annotations

from pathlib import Path

import typer

from ..common import command, emit


def _human(res: dict) -> str:
    c = res["config"]
    mode = "cumulative" if c.get("window") is None else f"window {c['window']}"
    lines = [f"STATE {res['state']}: step {res['step']}, {res['n_prompts']} prompts, K = {res['states']}, "
             f"{res['edges']} edges",
             f"config: beta {c.get('beta')}, epsilon {c.get('epsilon')}, gamma {c.get('gamma')}, {mode}, "
             f"{c.get('schedule')} (max {c.get('max_iters')} rounds, tol {c.get('tol')}), device {c.get('device')}",
             f"retained states: {', '.join(map(str, res['retained']))} (keep {res['keep']} + step 0)"]
    for e in res["applied"]:
        if e.get("event") == "init":
            lines.append(f"  step 0: init from {e.get('graph')} + {e.get('clusters')} ({e.get('applied_at')})")
        else:
            lines.append(f"  step {e['step']}: {e.get('prompts')} prompts, {e.get('successes')}/{e.get('rollouts')} "
                         f"successes, outcomes {e.get('outcomes_hash')} ({e.get('applied_at')})")
    return "\n".join(lines)


@command("status")
def status(
    state: Path = typer.Option(..., "--state", help="STATE directory (from init)."),
    last: int = typer.Option(10, "--last", help="How many of the last applied steps to list."),
):
    """Current step, N, K, config, the last applied steps and the retained states."""
    from ...stages.handoff import status as run_status

    res = run_status(state, last=last)
    emit(res, _human(res))
