"""``graphdiff status``: what a STATE directory holds."""

from __future__ import annotations

import typer

from ..common import command, emit
from ..options import StateOption


def _human(res: dict) -> str:
    c = res["config"]
    mode = "cumulative" if c.get("window") is None else f"window {c['window']}"
    version = f"{res['step']}.{res['revision']}" if res.get("revision") else str(res["step"])
    joined = {t: c for t, c in res.get("joined", {}).items() if t != "0"}
    grown = (f" ({', '.join(f'{c} added at step {t}' for t, c in joined.items())})" if joined else "")
    retired = f", {res['retired']} retired" if res.get("retired") else ""
    lines = [f"STATE {res['state']}: step {version}, {res['n_prompts']} prompts{grown}{retired}, K = {res['states']}, "
             f"{res['edges']} edges",
             f"config: preset {res['preset']}" + ("" if not res["overrides"] else " with " + ", ".join(
                 f"{k} {v}" for k, v in res["overrides"].items())) + f"; beta {c.get('beta')}, epsilon "
             f"{c.get('epsilon')}, mixing {c.get('mixing')}" + ("" if "gamma" in res["inert"] else f" (gamma {c.get('gamma')})")
             + f", {mode}, {c.get('schedule')} schedule (max {c.get('max_iters')} rounds, "
             + (f"residual_tol {c.get('residual_tol')}" if "residual_tol" not in res["inert"] else f"tol {c.get('tol')}")
             + f"), device {c.get('device')}",
             f"retained states: {', '.join(res.get('retained_versions') or map(str, res['retained']))} "
             f"(the last {res['keep']}" + (f", every multiple of {res['keep_every']}" if res.get("keep_every") else "")
             + f", step 0 and what their deltas are composed from; q whole every {res['snapshot_every']} steps at "
               f"most; {res['disk_bytes']['total'] / 1e6:.1f} MB on disk)"]
    for e in res["applied"]:
        at = f"{e['step']}.{e['revision']}" if e.get("revision") else str(e["step"])
        if e.get("event") == "init":
            lines.append(f"  step 0: init from {e.get('graph')} + {e.get('clusters')} ({e.get('applied_at')})")
        elif e.get("event") == "extend":
            lines.append(f"  step {at}: extend, {e.get('added')} prompts from {e.get('prompts_file')} "
                         f"({e.get('n_prompts')} now; {e.get('applied_at')})")
        elif e.get("event") in ("retire", "restore"):
            lines.append(f"  step {at}: {e['event']} {e.get('prompts')} prompts from {e.get('ids_file')} "
                         f"({e.get('n_retired')} retired now; {e.get('applied_at')})")
        else:
            lines.append(f"  step {e['step']}: {e.get('prompts')} prompts, {e.get('successes')}/{e.get('rollouts')} "
                         f"successes, outcomes {e.get('outcomes_hash')} ({e.get('applied_at')})")
    return "\n".join(lines)


@command("status")
def status(
    state: StateOption,
    last: int = typer.Option(10, "--last", help="How many of the last applied steps to list."),
):
    """Current step, N, K, config, the last applied steps and the retained states."""
    from ...state import State

    res = State.open(state).status(last=last)
    emit(res, _human(res), report=True)
