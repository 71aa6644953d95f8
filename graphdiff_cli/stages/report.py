"""The evaluation report folder: report.md (the answer first: a headline with intervals, then tables
laid out like the paper's Table 2), report.html (the same page with the plots inline), PNG plots
(graphdiff and the best baseline highlighted) and metrics.json with every figure.

``write_report(folder, document)`` fills an existing (staging) folder; the evaluate stage renames it
into place. Plots use matplotlib's object API (``Figure``, Agg canvas): no pyplot global state. matplotlib is
optional (the ``plots`` extra): without it the report is written without its plots and says why.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..errors import install_extra
from ..evaluation.metrics import HIGHER_IS_BETTER, N_BINS, PHASES

HIGHLIGHT = {"graphdiff": ("tab:red", 2.4), "best": ("tab:blue", 1.8)}  # colour, line width

PHASE_TITLES = {"early": "Early", "middle": "Middle", "last": "Last", "full": "Full"}
METRIC_TITLES = {
    "mae": "MAE (sample-level, lower is better)",
    "batch_r": "Batch-level Pearson r (batch-mean prediction vs batch-mean observed rate, higher is better)",
    "within_r": "Within-batch Pearson r, averaged over batches (higher is better)",
    "within_spearman": "Within-batch Spearman rho, averaged over batches (higher is better)",
    "brier": "Brier score over rollouts (lower is better)",
    "ece": f"Expected calibration error, {N_BINS} equal-width bins (lower is better)",
    "auroc": "AUROC of the zero-variance score for all-correct / all-wrong groups (higher is better)",
    "zero_variance_ece": (f"Calibration of P(all-same group): ECE of the zero-variance score against the "
                          f"all-correct / all-wrong outcome, {N_BINS} equal-width bins (lower is better)"),
}
PLOTS = ("answer.png", "batch_mean.png", "mae_over_steps.png", "reliability.png")
HTML_STYLE = """body{font:15px/1.5 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 8px}
th{background:#f3f3f3}img{max-width:100%}code,pre{background:#f6f6f6}pre{padding:.6em;overflow-x:auto}
h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}"""


def to_jsonable(obj):
    """numpy -> Python, NaN / inf -> None (strict JSON), recursively."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _fmt(x, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}"


def _best(values: list, higher: bool):
    finite = [v for v in values if v is not None and isinstance(v, (int, float)) and math.isfinite(v)]
    if not finite:
        return None
    return max(finite) if higher else min(finite)


def _table(header: list[str], rows: list[list], bold_cols: dict[int, bool], eligible: list[bool],
           digits: list[int]) -> str:
    """Markdown table; in column c (a key of bold_cols, value = higher is better) the best value among
    eligible rows is bold (ties all bold)."""
    best = {c: _best([r[c] for r, ok in zip(rows, eligible) if ok], hi) for c, hi in bold_cols.items()}
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    for r, ok in zip(rows, eligible):
        cells = [str(r[0])]
        for c in range(1, len(r)):
            text = _fmt(r[c], digits[c])
            if ok and c in best and best[c] is not None and r[c] is not None and math.isfinite(r[c]) \
                    and round(r[c], digits[c]) == round(best[c], digits[c]):
                text = f"**{text}**"
            cells.append(text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _label(name: str, oracle: bool) -> str:
    return f"{name} †" if oracle else name


def _signed(x, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:+.{digits}f}".replace("-", "−")


MIN_UNITS = 20  # steps (or pools) below which an interval is shown but no verdict is drawn from it


def _count(n, unit: str) -> str:
    return f"{n:,} {unit}" + ("" if n == 1 else "s")


def _has_interval(diff: dict) -> bool:
    lo, hi = diff.get("lo"), diff.get("hi")
    return lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi)


def interval_gap(diff: dict, unit: str = "unit") -> str | None:
    """Why a difference has no bootstrap interval (``evaluation.metrics.ratio_bootstrap`` needs 2 units with
    weight), or None when it has one."""
    if _has_interval(diff):
        return None
    units, weighted = diff.get("units"), diff.get("weighted_units")
    if units is not None and units < 2:
        return f"{_count(units, unit)}: a bootstrap interval needs at least 2"
    if weighted is not None and weighted < 2:
        return f"{weighted} of {_count(units, unit)} can be scored: a bootstrap interval needs at least 2"
    return "the bootstrap gave no interval"


def judge(diff: dict, lower_is_better: bool, name: str, unit: str = "unit") -> tuple[str | None, str | None]:
    """The verdict of a difference (graphdiff minus baseline) from its interval, as (verdict, None), or
    (None, why there is none): "graphdiff better" only when the whole interval is on graphdiff's side,
    "<name> better" when it is on the other, else "no clear difference"; only over at least ``MIN_UNITS``
    units and with an interval."""
    units = diff.get("units")
    if units is not None and units < MIN_UNITS:
        return None, f"no verdict from {_count(units, unit)} (a verdict needs {MIN_UNITS})"
    if not _has_interval(diff):
        return None, "no verdict without an interval"
    lo, hi = diff["lo"], diff["hi"]
    good, bad = (hi < 0, lo > 0) if lower_is_better else (lo > 0, hi < 0)
    return ("graphdiff better" if good else f"{name} better" if bad else "no clear difference"), None


def _call(diff: dict, lower_is_better: bool, name: str, unit: str = "unit") -> str:
    """The verdict as the headline writes it: bold, or why there is none."""
    verdict, why = judge(diff, lower_is_better, name, unit)
    return f"**{verdict}**" if verdict else why


# each question of the headline: (its differences: key, lower is better, the key of its baseline's name), unit
QUESTIONS = {
    "estimate": ([("difference", True, "baseline")], "step"),
    "ranking": ([("difference", False, "baseline")], "step"),
    "selection": ([("difference", False, "baseline")], "pool"),
    "allocation": ([("vs_uniform_difference", False, None), ("difference", False, "baseline")], "step"),
}


def headline_gaps(h: dict, missing: dict[str, str]) -> list[dict]:
    """Every figure of the headline ``h`` that its log cannot give, as {"figure", "reason"}: a question not
    answered (``missing``: question -> reason), an interval or a verdict not drawn, the cost weighing
    without the MAE interval."""
    gaps = []
    for q, (diffs, unit) in QUESTIONS.items():
        if q not in h:
            gaps.append({"figure": q, "reason": missing.get(q, "not measured on this log")})
            continue
        for key, lower, name_key in diffs:
            d = h[q][key]
            suffix = "" if key == "difference" else " vs uniform"
            why = interval_gap(d, unit)
            if why:
                gaps.append({"figure": f"{q} interval{suffix}", "reason": why})
            name = h[q][name_key] if name_key else "uniform"
            verdict, why = judge(d, lower, name, unit)
            if verdict is None:
                gaps.append({"figure": f"{q} verdict{suffix}", "reason": why})
    why = _cost_gap(h["estimate"]["difference"]) if "estimate" in h else None
    if why:
        gaps.append({"figure": "cost verdict", "reason": why})
    return gaps


def _cost_gap(diff: dict) -> str | None:
    """Why the cost weighing draws no verdict (it weighs the estimate's MAE interval), or None."""
    if not _has_interval(diff):
        return "it weighs the MAE interval, not given on this log"
    units = diff.get("units")
    if units is not None and units < MIN_UNITS:
        return f"it weighs the MAE interval, which gives no verdict from {_count(units, 'step')}"
    return None


def _interval(d: dict, pct: int, digits: int = 3, scale: float = 1.0, unit: str = "unit") -> str:
    why = interval_gap(d, unit)
    if why:
        return f"no {pct}% interval ({why})"
    return f"{pct}% interval [{_signed(scale * d['lo'], digits)}, {_signed(scale * d['hi'], digits)}]"


def _cost_line(h: dict, metrics: dict) -> str | None:
    """Is graphdiff worth its cost? Against the cheapest real baseline whose MAE lies within the half-width of
    graphdiff's MAE interval (so no clearly worse estimate), ms per step each."""
    e = h.get("estimate")
    methods = metrics["methods"]
    cost = {n: methods[n]["phases"]["full"]["all"].get("seconds_per_step") for n in methods
            if not methods[n]["oracle"]}
    mae = {n: methods[n]["phases"]["full"]["all"].get("mae") for n in cost}
    if not e or cost.get("graphdiff") is None:
        return None
    ours = mae["graphdiff"]
    why = _cost_gap(e["difference"])
    if why:
        rivals = [n for n in cost if n != "graphdiff" and cost[n] is not None]
        cheap = f"; the cheapest real baseline, {min(rivals, key=lambda n: cost[n])}, " \
            f"{1000 * min(cost[n] for n in rivals):.1f} ms" if rivals else ""
        return (f"- **Is it worth its cost?** graphdiff takes {1000 * cost['graphdiff']:.1f} ms per step{cheap}; "
                f"no verdict on the better buy: {why}.")
    half = (e["difference"]["hi"] - e["difference"]["lo"]) / 2
    close = [n for n in cost if n != "graphdiff" and cost[n] is not None and mae[n] is not None
             and math.isfinite(mae[n]) and mae[n] <= ours + half]
    ms = 1000 * cost["graphdiff"]
    if not close:
        return (f"- **Is it worth its cost?** graphdiff takes {ms:.1f} ms per step, and every real baseline's MAE "
                f"is worse than graphdiff's by more than its interval's half-width ({half:.4f}): the cost buys "
                "accuracy.")
    cheap = min(close, key=lambda n: cost[n])
    ratio = cost["graphdiff"] / cost[cheap] if cost[cheap] > 0 else float("inf")
    if mae[cheap] <= ours - half:
        gain = f"a clearly better estimate (MAE {_fmt(mae[cheap], 4)} vs {_fmt(ours, 4)})"
    else:
        gain = f"an estimate within noise of graphdiff's (MAE {_fmt(mae[cheap], 4)} vs {_fmt(ours, 4)})"
    if cost[cheap] >= cost["graphdiff"]:
        return (f"- **Is it worth its cost?** graphdiff takes {ms:.1f} ms per step; {cheap}, the cheapest baseline "
                f"with {gain}, takes {1000 * cost[cheap]:.1f} ms: graphdiff is the cheaper of the two.")
    return (f"- **Is it worth its cost?** {cheap} gives {gain} for {1000 * cost[cheap]:.1f} ms per step against "
            f"graphdiff's {ms:.1f} ms ({ratio:.0f}x): on this log {cheap} is the better buy for the estimate "
            "alone.")


def _verdict(q: dict, key: str, lower_is_better: bool, name: str, unit: str) -> str:
    """A question's verdict as the headline writes it; from the document when it carries one (a report
    re-rendered from an older metrics.json is judged here)."""
    verdict = q.get("verdict" if key == "difference" else "vs_uniform_verdict")
    return f"**{verdict}**" if verdict else _call(q[key], lower_is_better, name, unit)


def _not_measured(h: dict, question: str) -> str:
    why = next((g["reason"] for g in h.get("not_given", []) if g["figure"] == question), None)
    return f"Not measured here: {why}." if why else (
        "Not measured here: the decision replay was turned off (`--no-counterfactual`) or this log cannot give "
        "it (see Decisions), or neither graphdiff nor a rival estimator was among the methods.")


def _headline_markdown(h: dict | None, run: dict, metrics: dict | None = None,
                       plots_missing: str | None = None) -> list[str]:
    """One sentence per question, each with its interval and every verdict computed; then the cost, and the
    one plot."""
    if not h:
        return []
    pct = int(round(100 * h["level"]))
    out = ["## The answer first", ""]
    e = h.get("estimate")
    if e:
        d = e["difference"]
        rel = d["estimate"] / e["baseline_value"] if e["baseline_value"] else float("nan")
        out.append(f"- **Is the estimate closer than what you use?** MAE {_fmt(e['graphdiff'], 4)} for graphdiff vs "
                   f"{_fmt(e['baseline_value'], 4)} for {e['baseline']} (the best real baseline here by MAE): "
                   f"{_signed(d['estimate'], 4)} ({_signed(100 * rel, 1)}%), {_interval(d, pct, 4, unit='step')} "
                   f"over {_count(d['units'], 'step')} → {_verdict(e, 'difference', True, e['baseline'], 'step')}.")
    else:
        out.append(f"- **Is the estimate closer than what you use?** {_not_measured(h, 'estimate')}")
    r = h.get("ranking")
    if r:
        d = r["difference"]
        out.append(f"- **Does it rank a batch's prompts better?** within-batch r {_fmt(r['graphdiff'])} vs "
                   f"{_fmt(r['baseline_value'])} for {r['baseline']} (the best real baseline here by within r): "
                   f"{_signed(d['estimate'])}, {_interval(d, pct, unit='step')} over {_count(d['units'], 'step')} → "
                   f"{_verdict(r, 'difference', False, r['baseline'], 'step')}.")
    else:
        out.append(f"- **Does it rank a batch's prompts better?** {_not_measured(h, 'ranking')}")
    s = h.get("selection")
    if s:
        d = s["difference"]
        out.append(f"- **Does it choose batches with more signal?** With the target rule, "
                   f"{_fmt(100 * s['graphdiff'], 1)}% of the groups graphdiff chose had both outcomes vs "
                   f"{_fmt(100 * s['baseline_value'], 1)}% for {s['baseline']} (the best other estimator) and "
                   f"{_fmt(100 * s['uniform'], 1)}% for uniform choice: {_signed(100 * d['estimate'], 1)} points, "
                   f"{_interval(d, pct, 1, 100, unit='pool')} over {_count(d['units'], 'pool')} → "
                   f"{_verdict(s, 'difference', False, s['baseline'], 'pool')}. Offline: the policy's response to "
                   "the choice is not simulated (see Decisions).")
    else:
        out.append(f"- **Does it choose batches with more signal?** {_not_measured(h, 'selection')}")
    a = h.get("allocation")
    if a:
        d, du = a["difference"], a["vs_uniform_difference"]
        out.append(f"- **Does it split a batch's rollouts better?** With the {a['strategy']} rule "
                   f"({a['budget_per_prompt']} rollouts per prompt on average), graphdiff's counts expect "
                   f"{_fmt(a['graphdiff'], 2)} groups with both outcomes per step vs {_fmt(a['uniform'], 2)} for "
                   f"uniform counts ({_fmt(a['vs_uniform'])}x uniform): {_signed(du['estimate'], 2)}, "
                   f"{_interval(du, pct, 2, unit='step')} over {_count(du['units'], 'step')} → "
                   f"{_verdict(a, 'vs_uniform_difference', False, 'uniform', 'step')}; vs "
                   f"{_fmt(a['baseline_value'], 2)} for {a['baseline']} (the best other estimator with that rule): "
                   f"{_signed(d['estimate'], 2)}, {_interval(d, pct, 2, unit='step')} → "
                   f"{_verdict(a, 'difference', False, a['baseline'], 'step')}. Offline: each prompt's recorded rate "
                   "is the truth (see Decisions).")
    elif "not_given" in h:  # a document from before the allocation question has no line for it
        out.append(f"- **Does it split a batch's rollouts better?** {_not_measured(h, 'allocation')}")
    cost = _cost_line(h, metrics) if metrics else None
    if cost:
        out.append(cost)
    if e and metrics and plots_missing:
        out += ["", f"The plot of this answer is not drawn: {plots_missing}."]
    elif e and metrics:
        out += ["", f"![Sample-level MAE over training: graphdiff vs {e['baseline']}, moving average with its 95% "
                    f"band](answer.png)"]
    out += ["", f"Intervals: {h['method']} of whole steps (pools), blocks of consecutive units so that neighbouring "
            "steps' correlation is kept; \"better\" only when the whole interval is on one side. The baseline of "
            "each question is the best on this log, chosen on the same data (so a \"baseline better\" verdict leans "
            "its way); baselines tuned in hindsight (discounted history) are flattered. A verdict needs at least "
            f"{MIN_UNITS} units; cost is each method's own predict + update wall time per step on this machine.", ""]
    return out


def render_markdown(doc: dict, plots_missing: str | None = None) -> str:
    """report.md's text; ``plots_missing``: why the plots were not drawn (None: they were, beside it)."""
    run, metrics = doc["run"], doc["metrics"]
    methods = metrics["methods"]
    names = list(methods)
    eligible = [not methods[n]["oracle"] for n in names]
    labels = [_label(n, methods[n]["oracle"]) for n in names]
    ph = metrics["phases"]
    out = ["# graphdiff evaluation report", ""]
    bmin, bmax = run["batch_size"]["min"], run["batch_size"]["max"]
    bs = f"{bmin}" if bmin == bmax else f"{bmin}–{bmax}"
    out += [f"Log `{run['log']}`: {run['rows']:,} rows, {run['steps']:,} steps (batch size "
            f"{bs}), {run['prompts_in_log']:,} of "
            f"{run['n_prompts']:,} graph prompts observed, {run['seen_rows']:,} rows on prompts seen at an "
            f"earlier step. Graph `{run['graph']}`, clusters `{run['clusters']}` (K = {run['n_states']}).", ""]
    skipped = run.get("skipped") or {}
    if skipped:
        out += ["Not compared on this log: " + "; ".join(f"{name} ({why})" for name, why in skipped.items()) + ".",
                ""]
    out += ["Every method predicts a step's batch before that step's outcomes are revealed, then all are "
            "updated. Phases split the distinct steps into thirds: " + ", ".join(
                f"{PHASE_TITLES[p].lower()} = steps {ph[p][0]}–{ph[p][1]}" for p in PHASES[:3]) + ".", ""]
    out += ["Bold: best value of a column among real estimators. † marks oracles, which are shown outcomes "
            "no estimator has (sample-before-RL: each prompt's first observation, frozen; sample-before-step: "
            "the batch's own outcome, probed " + ("by a binomial resample of n rollouts" if any(
                "resample" == doc["settings"].get(n, {}).get("probe") for n in names) else "exactly") +
            "); they are references, never bold.", ""]
    out[4:4] = _headline_markdown(doc.get("headline"), run, metrics, plots_missing)  # after the title and log line

    verdict = doc.get("verdict") or []
    if verdict:
        out += ["## Is graphdiff better than what you use now?", ""]
        out += ["Full log, all rows: graphdiff against each real baseline (in brackets graphdiff minus the "
                "baseline; the intervals are in the answer above).", ""]
        header = ["Baseline", "MAE", "batch r", "within r", "within ρ", "Brier", "ECE", "AUROC"]
        lines = ["| " + " | ".join(header) + " |", "|:---|" + "---:|" * (len(header) - 1)]
        for row in verdict:
            cells = [row["baseline"]]
            for key in ("mae", "batch_r", "within_r", "within_spearman", "brier", "ece", "auroc"):
                v = row.get(key)
                if v is None:
                    cells.append("–")
                else:
                    cells.append(f"{_fmt(v['graphdiff'])} vs {_fmt(v['baseline'])} "
                                 f"({_signed(v['graphdiff'] - v['baseline'])})")
            lines.append("| " + " | ".join(cells) + " |")
        out += lines + [""]

    # Table 2 of the paper: MAE and batch-level r per phase, plus time
    header = ["Method"]
    for p in PHASES:
        header += [f"{PHASE_TITLES[p]} MAE ↓", f"{PHASE_TITLES[p]} r ↑"]
    header.append("Time/step (ms) ↓")
    rows, bold, digits = [], {}, [0]
    for p_i, _ in enumerate(PHASES):
        bold[1 + 2 * p_i] = False
        bold[2 + 2 * p_i] = True
        digits += [3, 3]
    bold[len(header) - 1] = False
    digits.append(1)
    for name, lab in zip(names, labels):
        m = methods[name]["phases"]
        row = [lab]
        for p in PHASES:
            row += [m[p]["all"]["mae"], m[p]["all"]["batch_r"]]
        sec = m["full"]["all"].get("seconds_per_step")
        row.append(None if sec is None else 1000.0 * sec)
        rows.append(row)
    out += ["## Accuracy and overhead by training phase (layout of the paper's Table 2)", "",
            "MAE at the sample level, r = batch-level Pearson correlation across the phase's steps; time = "
            "each method's own predict + update wall time per step on this machine.", "",
            _table(header, rows, bold, eligible, digits), ""]

    for key in ("within_r", "within_spearman", "brier", "ece", "auroc", "zero_variance_ece"):
        header = ["Method"] + [PHASE_TITLES[p] for p in PHASES]
        rows = [[lab] + [methods[n]["phases"][p]["all"][key] for p in PHASES] for n, lab in zip(names, labels)]
        bold = {c: HIGHER_IS_BETTER[key] for c in range(1, len(header))}
        out += [f"## {METRIC_TITLES[key]}", ""]
        if key.startswith("within"):
            wb = methods[names[0]]["phases"]["full"]["all"].get("within_batches")
            out += [f"Batches whose observed rates are all equal are skipped for every method ({wb} of "
                    f"{run['steps']} batches scored over the full log); a method whose predictions within a "
                    "batch are all equal scores 0 there.", ""]
        if key in ("auroc", "zero_variance_ece"):
            srcs = ", ".join(f"{n}: {methods[n]['zero_variance_source']}" for n in names)
            out += ["Zero-variance score: the method's own P(s ∈ {0, n}) where it has one (native), else "
                    f"p^n + (1 − p)^n of its prediction (plug-in). Sources — {srcs}.", ""]
        out += [_table(header, rows, bold, eligible, [0] + [3] * (len(header) - 1)), ""]

    # seen vs unseen, full log
    keys = ("mae", "within_r", "brier", "auroc")
    header = ["Method"]
    for k_ in keys:
        header += [f"{k_} seen", f"{k_} unseen"]
    rows, bold = [], {}
    for i, k_ in enumerate(keys):
        bold[1 + 2 * i] = HIGHER_IS_BETTER[k_]
        bold[2 + 2 * i] = HIGHER_IS_BETTER[k_]
    for n, lab in zip(names, labels):
        f = methods[n]["phases"]["full"]
        row = [lab]
        for k_ in keys:
            row += [f["seen"][k_], f["unseen"][k_]]
        rows.append(row)
    f0 = methods[names[0]]["phases"]["full"]
    out += ["## Prompts seen before vs never seen (full log)", "",
            f"Seen: {f0['seen']['rows']:,} rows on prompts observed at an earlier step; unseen: "
            f"{f0['unseen']['rows']:,} first visits.", "",
            _table(header, rows, bold, eligible, [0] + [3] * (len(header) - 1)), ""]

    grid = doc.get("discounted_grid") or []
    if grid:
        best = doc["discounted_best"]
        out += ["## Discounted history: grid", "",
                f"Best on this log: λ = {best['lam']:g}, m = {best['m']:g} (MAE {_fmt(best['mae'])}). It is tuned "
                "in hindsight on the log it is scored on, which flatters it.", "",
                "| λ | m | MAE | within r |", "|---:|---:|---:|---:|"]
        out += [f"| {g['lam']:g} | {g['m']:g} | {_fmt(g['mae'])} | {_fmt(g['within_r'])} |" for g in grid]
        out.append("")

    truth = doc.get("ground_truth")
    if truth:
        out += ["## Against the true success probability (simulated log)", "",
                f"MAE of the observed rate s/n against the true p (the sampling-noise floor): "
                f"{_fmt(truth['observed_vs_true_mae'])}.", "", "| Method | MAE vs true p |", "|:---|---:|"]
        out += [f"| {_label(n, methods[n]['oracle'])} | {_fmt(v)} |" for n, v in truth["methods"].items()]
        out.append("")

    out += _counterfactual_markdown(doc.get("counterfactual"))
    if plots_missing:
        out += ["## Plots", "", f"Not drawn: {plots_missing}.", ""]
    else:
        out += ["## Plots", "", "![Batch-mean predicted vs observed](batch_mean.png)", "",
                "![MAE over steps](mae_over_steps.png)", "", "![Reliability diagram](reliability.png)", ""]
    out += ["## Settings", "", "```json", json.dumps(to_jsonable(doc["settings"]), indent=2), "```", ""]
    return "\n".join(out)


def _counterfactual_markdown(cf: dict | None) -> list[str]:
    """The decisions section (evaluate --counterfactual): selection and allocation tables, best first."""
    if not cf:
        return []
    if "skipped" in cf:
        return ["## Decisions driven by each estimator (offline counterfactual)", "",
                f"Not replayed on this log: {cf['skipped']}.", ""]
    out = ["## Decisions driven by each estimator (offline counterfactual)", "", cf["note"], ""]
    for key in ("selection", "allocation"):
        if f"{key}_skipped" in cf:
            out += [f"{key.capitalize()}: Not replayed on this log: {cf[key + '_skipped']}.", ""]
    sel = cf.get("selection")
    if sel:
        rows = sorted(sel["results"], key=lambda r: -(r["effective_rate"] if r["effective_rate"] is not None else -1))
        out += [f"Selection: each step offers a pool of {sel['pool_size']} prompts from the current round "
                f"({sel['pools']} pools over {sel['rounds']} rounds, seed {sel['seed']}); the strategy picks "
                f"{sel['batch_size']}, and only their recorded outcomes are revealed to its estimator. Effective-"
                "group rate = share of chosen groups with 0 < s < n (the groups that give GRPO a gradient). "
                f"`oracle` picks in hindsight the groups that had signal. `target` ranks by the distance to "
                f"{sel['target']:g} after {sel['target_explore'][0]:g} pseudo-rollouts there join each estimator's belief (select's "
                "--explore); `target (explore 0)`, for the estimators with a belief spread, by the bare estimate.", "",
                "| Strategy | Estimator | Effective-group rate ↑ | Round 0 | Later rounds | vs uniform |",
                "|:---|:---|---:|---:|---:|---:|"]
        out += [f"| {r['strategy']} | {r['estimator']} | {_fmt(r['effective_rate'])} | "
                f"{_fmt(r['effective_rate_round0'])} | {_fmt(r['effective_rate_later'])} | "
                f"{_fmt(r['vs_uniform'])} |" for r in rows]
        out.append("")
    alloc = cf.get("allocation")
    if alloc:
        rows = sorted(alloc["results"], key=lambda r: -r["expected_nondegenerate_per_step"])
        out += [f"Allocation: every step's batch gets {alloc['budget_per_prompt']} rollouts per prompt on average "
                f"(each count in [{alloc['min']}, {alloc['max']}]); the expected number of non-degenerate groups "
                f"per step, with {alloc['truth']} as the truth.", "",
                "| Strategy | Estimator | Non-degenerate groups per step ↑ | vs uniform |", "|:---|:---|---:|---:|"]
        out += [f"| {r['strategy']} | {r['estimator']} | {_fmt(r['expected_nondegenerate_per_step'], 2)} | "
                f"{_fmt(r['vs_uniform'])} |" for r in rows]
        out.append("")
    return out


def _styles(doc: dict) -> dict[str, dict]:
    """Line style per method: graphdiff and the best real baseline (the headline's, by MAE) in colour
    and drawn last, the rest thin and grey (oracles dashed), each still named in the legend."""
    methods = doc["metrics"]["methods"]
    best = ((doc.get("headline") or {}).get("estimate") or {}).get("baseline")
    greys = ["0.45", "0.6", "0.75"]
    styles = {}
    for i, n in enumerate(methods):
        if n == "graphdiff" or n == best:
            colour, lw = HIGHLIGHT["graphdiff" if n == "graphdiff" else "best"]
            styles[n] = {"color": colour, "lw": lw, "zorder": 4 if n == "graphdiff" else 3,
                         "label": n if n == "graphdiff" else f"{n} (best baseline)"}
        else:
            styles[n] = {"color": greys[i % len(greys)], "lw": 0.9, "zorder": 2, "alpha": 0.9, "label": n,
                         "ls": "--" if methods[n]["oracle"] else (":" if i % 2 else "-")}
    return styles


def _answer_plot(folder: Path, doc: dict, steps: np.ndarray, styles: dict) -> None:
    """The first screen's plot: graphdiff's and the estimate question's baseline's per-step MAE, each a moving
    average with a 95% band (mean +- 1.96 sd / sqrt(window) over the window). Without that question, the
    empty axes say so (the file always exists, so the report's file list is fixed)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    e = (doc.get("headline") or {}).get("estimate")
    series = doc["metrics"]["series"]
    width = max(3, steps.size // 25)
    drawn = 0
    if e:
        for name in ("graphdiff", e["baseline"]):
            y = np.asarray(series[name]["mae"], dtype=float)
            ok = np.isfinite(y)
            if ok.sum() < width:
                continue
            drawn += 1
            x, y = steps[ok], y[ok]
            win = np.lib.stride_tricks.sliding_window_view(y, width)
            mean, half = win.mean(axis=1), 1.96 * win.std(axis=1, ddof=1) / np.sqrt(width)
            xs = x[width - 1:]
            line = ax.plot(xs, mean, **{**styles[name], "label": name})[0]
            ax.fill_between(xs, mean - half, mean + half, color=line.get_color(), alpha=0.2, lw=0)
    if drawn:
        ax.set_ylabel(f"MAE within the batch (moving average over {width} steps)")
        ax.legend(fontsize=9)
    else:
        why = (f"{steps.size} step{'s' if steps.size != 1 else ''}: a moving average over {width} steps needs more"
               if e else "no estimate comparison on this log")
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_title("Estimate error over training: graphdiff vs the best real baseline (95% bands)")
    fig.tight_layout()
    fig.savefig(folder / "answer.png", dpi=110)


def plots_missing() -> str | None:
    """Why the report's plots cannot be drawn here (matplotlib, the ``plots`` extra, not installed), else None."""
    try:
        import matplotlib.figure  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        return f"matplotlib is not installed ({install_extra('plots')} installs it)"
    return None


def _plots(folder: Path, doc: dict) -> None:
    from matplotlib.figure import Figure

    metrics = doc["metrics"]
    series = metrics["series"]
    steps = np.asarray(series["step"])
    names = list(metrics["methods"])
    styles = _styles(doc)

    _answer_plot(folder, doc, steps, styles)

    fig = Figure(figsize=(10, 5.5))
    ax = fig.subplots()
    ax.plot(steps, series["observed"], color="black", lw=2.2, label="observed", zorder=5)
    for n in names:
        ax.plot(steps, series[n]["predicted"], **styles[n])
    ax.set_xlabel("step")
    ax.set_ylabel("batch-mean success rate")
    ax.set_title("Batch-mean prediction vs observed rate")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(folder / "batch_mean.png", dpi=110)

    fig = Figure(figsize=(10, 5.5))
    ax = fig.subplots()
    width = max(1, steps.size // 40)  # moving average over ~2.5% of the steps: readable, not hiding trends
    kernel = np.ones(width) / width
    for n in names:
        y = np.asarray(series[n]["mae"], dtype=float)
        ys = np.convolve(y, kernel, mode="valid") if y.size >= width else y
        ax.plot(steps[width - 1:width - 1 + ys.size], ys, **styles[n])
    ax.set_xlabel("step")
    ax.set_ylabel(f"MAE within the batch (moving average over {width} step{'s' if width > 1 else ''})")
    ax.set_title("Sample-level MAE over training")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(folder / "mae_over_steps.png", dpi=110)

    fig = Figure(figsize=(6.5, 6.5))
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls=":", label="perfect calibration")
    for n in names:
        rel = metrics["methods"][n]["reliability"]
        cnt = np.asarray(rel["count"])
        ok = cnt > 0
        ax.plot(np.asarray(rel["mean_pred"], dtype=float)[ok], np.asarray(rel["mean_obs"], dtype=float)[ok],
                marker="o", ms=3, **styles[n])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"mean predicted p ({N_BINS} equal-width bins)")
    ax.set_ylabel("mean observed rate s/n")
    ax.set_title("Reliability diagram (all rows)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "reliability.png", dpi=110)


def render_html(markdown: str, folder: Path) -> str:
    """report.md as one self-contained HTML page: the plots inline (base64 data URIs), nothing fetched."""
    import base64
    import html
    import re

    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)

    def inline(match):
        name = html.unescape(match.group(1))
        path = folder / name
        if "/" in name or not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="([^"]+\.png)"', inline, body)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>graphdiff evaluation report</title><style>{HTML_STYLE}</style></head>\n"
            f"<body>\n{body}</body></html>\n")


def write_report(folder, doc: dict) -> list[str]:
    """Write report.md, metrics.json and the plots into ``folder`` (without matplotlib no plots, and report.md
    says so); returns the file names."""
    # plain writes: the whole folder is the unit of atomicity (a staging folder renamed into place)
    folder = Path(folder)
    missing = plots_missing()
    if missing is None:
        _plots(folder, doc)
    (folder / "metrics.json").write_text(json.dumps(to_jsonable(doc), indent=1, allow_nan=False) + "\n",
                                         encoding="utf-8")
    markdown = render_markdown(to_jsonable(doc), missing)
    (folder / "report.md").write_text(markdown, encoding="utf-8")
    (folder / "report.html").write_text(render_html(markdown, folder), encoding="utf-8")
    return ["report.md", "report.html", "metrics.json", *(PLOTS if missing is None else ())]
