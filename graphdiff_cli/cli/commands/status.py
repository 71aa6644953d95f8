"""``graphdiff status``: what a STATE directory holds (with ``--estimator``: what its estimator believes)."""

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


def _num(x, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _estimator_lines(e: dict) -> list[str]:
    """``status --estimator``'s text (``stages.beliefs.estimator_summary``)."""
    def dist(d):
        return (f"mean {_num(d['mean'])}; min {_num(d['min'])}, 5% {_num(d['p05'])}, 25% {_num(d['p25'])}, median "
                f"{_num(d['median'])}, 75% {_num(d['p75'])}, 95% {_num(d['p95'])}, max {_num(d['max'])}")

    src = e["sources"]
    parts = [f"states {_num(src['states'])}"]
    for name, label in SOURCE_LABELS.items():
        if src.get(name) is not None:
            parts.append(f"{label} {_num(src[name])}")
    parts.append(f"own outcomes {_num(src['history'])}" + (f" ({_num(src['history_seen'])} over the {e['seen']} "
                                                             "seen)" if src["history_seen"] is not None else ""))
    names = {"prior_strength": "prior strength kappa", "belief_strength": "belief strength nu",
             "label_propagation": "label propagation weight", "time_forgetting": "time forgetting",
             "readout": "read-out weight", "readout_ridge": "read-out ridge",
             "covariate_readout": "covariates' read-out weight", "live_readout": "live read-out weight"}
    choices = []
    for name, c in e["online_choices"].items():
        if c["value"] is None:  # off: unset, or the read-out of a STATE without embeddings
            if name == "readout" and c["setting"] is not None:
                choices.append("read-out of the embedding: off (this STATE has no embeddings)")
            continue
        how = "chosen online" if c["online"] else "set"
        inert = ", no effect under these settings" if c["inert"] else ""
        choices.append(f"{names[name]} {_num(c['value'])} ({how}{inert})")
    lines = [f"estimator at step {e['step']}: {e['candidates']} candidates ({e['retired']} retired), {e['seen']} "
             f"rolled out; {e['mixing']} mixing",
             f"  p over the candidates: {dist(e['p'])}",
             f"  the decision belief's mean: {dist(e['belief_mean'])}",
             f"  P(a group of {e['p_zero_variance']['group_size']} is all correct or all wrong) "
             f"{_num(e['p_zero_variance']['mean'])} on average",
             f"  weight of each source in p (mean over the candidates): {', '.join(parts)}",
             "  online choices:" + ("" if choices else " none")]
    lines += [f"    {c}" for c in choices]
    states = sorted(e["states"], key=lambda s: (-s["prompts"], -s["expected_prompts"], s["state"]))
    shown = states[:STATES_SHOWN]
    lines.append(f"  states (K = {len(states)}; rate = the mean of its Beta(a, b); prompts = candidates whose most "
                 "probable state it is, expected = their sum of q), largest first:")
    lines += [f"    state {s['state']}: rate {s['rate']:.3f} (a {s['a']:.1f}, b {s['b']:.1f}), {s['prompts']} prompts "
              f"({s['expected_prompts']:.1f} expected)" for s in shown]
    if len(states) > len(shown):
        lines.append(f"    ... and {len(states) - len(shown)} more (--json lists every state)")
    return lines


STATES_SHOWN = 12  # states listed in the text (--json has all)
# the blended sources' names in the text, in the mix's order (the states are the base; own outcomes come last)
SOURCE_LABELS = {"label_propagation": "label propagation", "readout": "read-out of the embedding",
                 "covariate_readout": "read-out of the covariates", "live_readout": "read-out of live features"}


@command("status")
def status(
    state: StateOption,
    last: int = typer.Option(10, "--last", help="How many of the last applied steps to list."),
    estimator: bool = typer.Option(False, "--estimator", help="Also say what the estimator believes: p over the "
                                   "candidates (quantiles), the states' rates and sizes, each source's weight in p "
                                   "and the online choices in use (reads the current state's arrays)."),
):
    """Current step, N, K, config, the last applied steps and the retained states; with --estimator, what the
    estimator believes."""
    from ...state import State

    st = State.open(state)
    res = st.status(last=last, estimator=estimator)
    emit(res, "\n".join([_human(res)] + (_estimator_lines(res["estimator"]) if estimator else [])), report=True)
