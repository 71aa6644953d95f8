"""Does a second grid say the same? Two reports' verdicts side by side.

The closed loop's first grids changed their verdict between two runs of the same grid (3 of 9 pairs, then 7 of
9). ``python -m closedloop verdicts A B`` reads two reports' ``metrics.json`` (``closedloop report``) and lists,
for every figure the report decides on, what each grid measured and what it concluded: an interval above its
null, below it, or across it; a sign test significant for graphdiff, for the native estimator, or neither; a
target or regime check met or not. A figure whose conclusion differs between the grids is a flip: a reader can
trust the verdicts that do not flip and should not trust the ones that do.

Pure: dicts in, rows out (``rows``, ``agreement``); ``write`` is the only function that touches files.
"""
from __future__ import annotations

import json
from pathlib import Path

from scipy import stats

# Figures read from a report's metrics.json: (section, key, null). Intervals are 95% bootstrap over seeds.
_SIGN_TESTS = ("acc_at_equal_rollouts", "final_acc", "effective_rate (secondary)")
_ALONG = ("0.25", "0.5", "0.75", "1.0")
_METRIC = {"heldout_acc": "greedy accuracy", "heldout_sampled": "sampled pass rate"}


def _side(b: dict | None, null: float) -> str | None:
    """'above' / 'below' the null when the interval excludes it, 'across' when it holds it, None if undecided."""
    if not b or b.get("lo") is None or b.get("value") is None:
        return None
    if b["lo"] > null:
        return "above"
    if b["hi"] < null:
        return "below"
    return "across"


def _interval(b: dict | None, nd: int) -> str:
    if not b or b.get("value") is None:
        return "-"
    if b.get("lo") is None:
        return f"{b['value']:.{nd}f}"
    return f"{b['value']:.{nd}f} [{b['lo']:.{nd}f}, {b['hi']:.{nd}f}]"


def _interval_row(name: str, b: dict | None, null: float, nd: int) -> dict:
    return {"figure": name, "measured": _interval(b, nd), "verdict": _side(b, null), "null": null}


def rows(metrics: dict) -> list[dict]:
    """Every decided figure of one report: {figure, measured, verdict, null}. ``verdict`` is what the grid
    concludes (None where the report could not decide, e.g. too few seeds)."""
    out: list[dict] = []
    for name, d in (metrics.get("ds_equal_steps") or {}).items():
        out.append(_interval_row(f"{name}: DS's rollouts / its own, equal steps", d.get("rollout_ratio"), 1.0, 2))
        for k, b in (d.get("final_difference") or {}).items():
            out.append(_interval_row(f"{name}: final {_METRIC.get(k, k)} - DS's", b, 0.0, 4))
    for name, along in (metrics.get("saving_along_ds") or {}).items():
        for f in _ALONG:
            if f in along:
                fig = f"{name}: rollouts to DS's greedy accuracy after {f} of its steps, DS's / its own"
                out.append(_interval_row(fig, along[f], 1.0, 2))
    gains = set()
    for s in metrics.get("oracle_share") or []:
        metric = _METRIC.get(s["metric"], s["metric"])
        if (s["rule"], metric) not in gains:
            gains.add((s["rule"], metric))
            out.append(_interval_row(f"{s['rule']}: the oracle's gain in {metric}", s.get("oracle_gain_acc"), 0.0, 3))
        out.append(_interval_row(f"{s['rule']}: {s['estimator']}'s share of the oracle's gain in {metric}",
                                 s.get("share_acc"), 0.0, 2))
    for k in _SIGN_TESTS:
        t = (metrics.get("sign_tests") or {}).get(k)
        if t:
            sig = t["p_value"] < 0.05
            verdict = ("graphdiff" if t["graphdiff_better"] > t["native_better"] else "native") if sig else "neither"
            out.append({"figure": f"sign test, graphdiff vs native: {k}", "null": None, "verdict": verdict,
                        "measured": f"{t['graphdiff_better']} of {t['pairs']}, p = {t['p_value']:.3f}"})
    for c in (metrics.get("regime_check") or []) + (metrics.get("targets") or []):
        met = c.get("met")
        out.append({"figure": c.get("check") or c.get("target"), "measured": c["measured"], "null": None,
                    "verdict": None if met is None else "met" if met else "not met"})
    return out


def final_means(metrics: dict) -> dict[str, float]:
    """Each scheduler's mean final greedy accuracy over its seeds."""
    return {name: sum(s["final_acc"] for s in st) / len(st) for name, st in (metrics.get("schedulers") or {}).items()
            if st}


def agreement(a: dict, b: dict) -> dict:
    """The two reports' figures paired by name, each marked same / flipped / one-sided, and the rank agreement
    of the schedulers' final accuracy (Kendall's tau over the schedulers both ran)."""
    ra, rb = {r["figure"]: r for r in rows(a)}, {r["figure"]: r for r in rows(b)}
    paired = []
    for fig in list(ra) + [f for f in rb if f not in ra]:
        x, y = ra.get(fig), rb.get(fig)
        va, vb = (x or {}).get("verdict"), (y or {}).get("verdict")
        status = "undecided" if va is None or vb is None else "same" if va == vb else "flipped"
        paired.append({"figure": fig, "a": (x or {}).get("measured", "-"), "b": (y or {}).get("measured", "-"),
                       "verdict_a": va, "verdict_b": vb, "status": status})
    ma, mb = final_means(a), final_means(b)
    common = [n for n in ma if n in mb]
    tau = stats.kendalltau([ma[n] for n in common], [mb[n] for n in common]) if len(common) > 2 else None
    decided = [p for p in paired if p["status"] != "undecided"]
    return {"figures": paired, "decided": len(decided), "same": sum(p["status"] == "same" for p in decided),
            "flipped": [p["figure"] for p in decided if p["status"] == "flipped"],
            "final_acc": {n: (ma[n], mb[n]) for n in common},
            "kendall_tau": None if tau is None else {"tau": float(tau.statistic), "p_value": float(tau.pvalue),
                                                     "schedulers": len(common)}}


def markdown(res: dict, names: tuple[str, str]) -> list[str]:
    a, b = names
    kt = res["kendall_tau"]
    lines = [f"# Verdicts of two closed-loop grids: {a} and {b}", "",
             f"**{res['same']} of {res['decided']} decided verdicts agree**"
             + (f"; flipped: {'; '.join(res['flipped'])}." if res["flipped"] else "; none flipped."), ""]
    if kt:
        lines += [f"Order of the {kt['schedulers']} schedulers by mean final greedy accuracy: Kendall's tau "
                  f"{kt['tau']:.2f} (p = {kt['p_value']:.2g}).", ""]
    lines += [f"| figure | {a} | {b} | verdict {a} | verdict {b} | |", "|---|---|---|---|---|---|"]
    for p in res["figures"]:
        mark = {"same": "same", "flipped": "**flipped**", "undecided": "-"}[p["status"]]
        lines.append(f"| {p['figure']} | {p['a']} | {p['b']} | {p['verdict_a'] or '-'} | {p['verdict_b'] or '-'} "
                     f"| {mark} |")
    lines += ["", f"| scheduler | final greedy, {a} | {b} | difference |", "|---|---|---|---|"]
    for n, (x, y) in res["final_acc"].items():
        lines.append(f"| {n} | {x:.3f} | {y:.3f} | {y - x:+.3f} |")
    return lines + [""]


def write(report_a, report_b, out, names: tuple[str, str] | None = None) -> dict:
    """Read two report folders' metrics.json, write ``out`` (markdown) and ``out``'s .json sibling atomically."""
    from graphdiff_cli.errors import InvalidArgumentError
    from graphdiff_cli.io.atomic import atomic_write_text

    loaded = []
    for folder in (report_a, report_b):
        path = Path(folder) / "metrics.json"
        if not path.is_file():
            raise InvalidArgumentError(f"{path} does not exist: run `python -m closedloop report` first")
        loaded.append(json.loads(path.read_text(encoding="utf-8")))
    names = names or (Path(report_a).parent.name or str(report_a), Path(report_b).parent.name or str(report_b))
    res = agreement(*loaded)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n".join(markdown(res, names)))
    atomic_write_text(out.with_suffix(".json"), json.dumps(res, indent=1) + "\n")
    return {"out": str(out), "decided": res["decided"], "same": res["same"], "flipped": res["flipped"]}
