"""Does a second grid say the same? Two reports' verdicts side by side.

The closed loop's first grids changed their verdict between two runs of the same grid (3 of 9 pairs, then 7 of
9). ``python -m closedloop verdicts A B`` reads two reports' ``metrics.json`` (``closedloop report``) and pairs,
by name, the figures each grid decides on, with what it measured and what it concluded:

- **figures**: a 95% bootstrap interval over seeds above its null, below it, or across it (ratios of rollouts
  against 1; differences, oracle gains and shares of the oracle's gain against 0), and the pooled sign test of
  graphdiff against the native estimators at equal rollouts (significant for graphdiff, for the native, or
  neither) and of the effective-group rate. A share of the oracle's gain is decided only where the oracle's own
  gain is above 0 in that grid (a share of nothing is undefined); the saving at DS's *final* accuracy (censored:
  an arm level with DS reaches it in about half the seeds) and an interval of zero width are not decided either;
  the oracle's gain is one row per rule where the rule's estimators read it at the same rollouts;
- **targets and checks**: the benchmark's targets and regime checks, met or not. Several restate a figure above
  (the regime check is the oracle's saving), so they are counted apart.

A decided figure whose conclusion differs between the grids is a flip; one that only one grid has is listed
as such. The schedulers' order by final greedy accuracy is compared by Kendall's tau over all of them and over
the arms that compare estimators at equal budgets (neither DS nor oracle), where the order says the most.
The report's other statistics (mean accuracy, rollout shares) are not compared.

Pure: dicts in, rows out (``rows``, ``agreement``); ``write`` is the only function that touches files.
"""
from __future__ import annotations

import json
from pathlib import Path

from scipy import stats

from .report import interval_text
from .schedulers import SCHEDULERS

_SIGN_TESTS = ("acc_at_equal_rollouts", "effective_rate (secondary)")
_ALONG = ("0.25", "0.5", "0.75", "1.0")
_METRIC = {"heldout_acc": "greedy accuracy", "heldout_sampled": "sampled pass rate"}
# the arms that compare estimators at one budget: not DS's (3-5x the rollouts), not an oracle's (the ceiling)
EQUAL_BUDGET = tuple(n for n, (kind, _rule, est) in SCHEDULERS.items() if kind != "ds" and est != "oracle")


def _side(b: dict | None, null: float) -> str | None:
    """'above' / 'below' the null when the interval excludes it, 'across' when it holds it; None when there is
    no interval or it has no width (every seed the same value: a censored saving)."""
    if not b or b.get("lo") is None or b.get("value") is None or b["lo"] == b["hi"]:
        return None
    if b["lo"] > null:
        return "above"
    if b["hi"] < null:
        return "below"
    return "across"


def _figure(name: str, b: dict | None, null: float, nd: int, decided: bool = True) -> dict:
    return {"figure": name, "kind": "figure", "measured": interval_text(b, nd),
            "verdict": _side(b, null) if decided else None}


def rows(metrics: dict) -> list[dict]:
    """Every figure, target and check of one report: {figure, kind, measured, verdict}; ``verdict`` is what the
    grid concludes, None where it decides nothing (too few seeds, a censored saving, a share of no gain)."""
    out: list[dict] = []
    for name, d in (metrics.get("ds_equal_steps") or {}).items():
        out.append(_figure(f"{name}: DS's rollouts / its own, equal steps", d.get("rollout_ratio"), 1.0, 2))
        for k, b in (d.get("final_difference") or {}).items():
            out.append(_figure(f"{name}: final {_METRIC.get(k, k)} - DS's", b, 0.0, 4))
    for name, along in (metrics.get("saving_along_ds") or {}).items():
        for f in _ALONG:
            if f in along:  # after all of DS's steps: censored (an arm level with DS reaches it in half the seeds)
                fig = f"{name}: rollouts to DS's greedy accuracy after {f} of its steps, DS's / its own"
                out.append(_figure(fig, along[f], 1.0, 2, decided=f != "1.0"))
    shares = metrics.get("oracle_share") or []
    budgets: dict[tuple, set] = {}  # the oracle's gain is read at the rollouts all three arms reached
    for s in shares:
        budgets.setdefault((s["rule"], s["metric"]), set()).add(tuple(r["budget"] for r in s.get("seeds") or []))
    gains = set()
    for s in shares:
        metric, rule = _METRIC.get(s["metric"], s["metric"]), s["rule"]
        gain = s.get("oracle_gain_acc")
        # one row per rule where its estimators share the budget (the same figure), else one per estimator
        who = rule if len(budgets[(s["rule"], s["metric"])]) == 1 else f"{rule}, {s['estimator']}"
        if (who, metric) not in gains:
            gains.add((who, metric))
            out.append(_figure(f"{who}: the oracle's gain in {metric}", gain, 0.0, 3))
        out.append(_figure(f"{rule}, {s['estimator']}: share of the oracle's gain in {metric}", s.get("share_acc"),
                           0.0, 2, decided=_side(gain, 0.0) == "above"))
    for k in _SIGN_TESTS:
        t = (metrics.get("sign_tests") or {}).get(k)
        if t:
            p = t.get("p_value")
            verdict = (None if p is None else "neither" if p >= 0.05
                       else "graphdiff" if t["graphdiff_better"] > t["native_better"] else "native")
            out.append({"figure": f"sign test, graphdiff vs native: {k}", "kind": "figure", "verdict": verdict,
                        "measured": f"{t['graphdiff_better']} of {t['pairs']}"
                                    + ("" if p is None else f", p = {p:.3f}")})
    for c in (metrics.get("regime_check") or []) + (metrics.get("targets") or []):
        met = c.get("met")
        out.append({"figure": c.get("check") or c.get("target"), "kind": "target", "measured": c["measured"],
                    "verdict": None if met is None else "met" if met else "not met"})
    names = [r["figure"] for r in out]
    if len(set(names)) != len(names):  # pairing is by name: two figures under one name would hide one
        raise ValueError(f"figures named twice: {sorted({n for n in names if names.count(n) > 1})}")
    return out


def final_means(metrics: dict) -> dict[str, float]:
    """Each scheduler's mean final greedy accuracy over its seeds."""
    return {name: sum(s["final_acc"] for s in st) / len(st) for name, st in (metrics.get("schedulers") or {}).items()
            if st}


def _tau(ma: dict, mb: dict, names) -> dict | None:
    common = [n for n in names if n in ma and n in mb]
    if len(common) < 3:
        return None
    t = stats.kendalltau([ma[n] for n in common], [mb[n] for n in common])
    return {"tau": float(t.statistic), "p_value": float(t.pvalue), "schedulers": common}


def agreement(a: dict, b: dict) -> dict:
    """The two reports' rows paired by name, each marked same, flipped, undecided (either grid decides nothing)
    or only in one grid; counts for figures and for targets apart; Kendall's tau of the schedulers' order."""
    ra, rb = {r["figure"]: r for r in rows(a)}, {r["figure"]: r for r in rows(b)}
    paired = []
    for fig in list(ra) + [f for f in rb if f not in ra]:
        x, y = ra.get(fig), rb.get(fig)
        va, vb = (x or {}).get("verdict"), (y or {}).get("verdict")
        status = ("only in A" if y is None else "only in B" if x is None else
                  "undecided" if va is None or vb is None else "same" if va == vb else "flipped")
        paired.append({"figure": fig, "kind": (x or y)["kind"], "a": (x or {}).get("measured", "-"),
                       "b": (y or {}).get("measured", "-"), "verdict_a": va, "verdict_b": vb, "status": status})
    counts = {}
    for kind in ("figure", "target"):
        decided = [p for p in paired if p["kind"] == kind and p["status"] in ("same", "flipped")]
        counts[kind] = {"decided": len(decided), "same": sum(p["status"] == "same" for p in decided),
                        "flipped": [p["figure"] for p in decided if p["status"] == "flipped"]}
    ma, mb = final_means(a), final_means(b)
    return {"figures": paired, "counts": counts,
            "one_sided": [p["figure"] for p in paired if p["status"].startswith("only")],
            "final_acc": {n: (ma[n], mb[n]) for n in ma if n in mb},
            "kendall_tau": {"all": _tau(ma, mb, list(ma)), "equal_budget": _tau(ma, mb, EQUAL_BUDGET)}}


def markdown(res: dict, names: tuple[str, str]) -> list[str]:
    a, b = names
    fig, tgt = res["counts"]["figure"], res["counts"]["target"]
    lines = [f"# Verdicts of two closed-loop grids: {a} and {b}", "",
             f"**{fig['same']} of {fig['decided']} decided figures agree**"
             + (f"; flipped: {'; '.join(fig['flipped'])}." if fig["flipped"] else "; none flipped."),
             f"Targets and checks: {tgt['same']} of {tgt['decided']} agree"
             + (f"; flipped: {'; '.join(tgt['flipped'])}." if tgt["flipped"] else "."), ""]
    if res["one_sided"]:
        lines += [f"In one grid only (not compared): {'; '.join(res['one_sided'])}.", ""]
    for key, what in (("all", "all schedulers"), ("equal_budget", "the equal-budget estimator arms")):
        kt = res["kendall_tau"][key]
        if kt:
            lines.append(f"Order by mean final greedy accuracy, {what} ({', '.join(kt['schedulers'])}): "
                         f"Kendall's tau {kt['tau']:.2f} (p = {kt['p_value']:.2g}).")
    lines += ["", "Undecided: no interval or one of no width, the saving at DS's final accuracy (censored), or a share "
              "of an oracle gain that is not above 0.", "", f"| figure | {a} | {b} | verdict {a} | verdict {b} | |", "|---|---|---|---|---|---|"]
    for kind in ("figure", "target"):
        for p in (p for p in res["figures"] if p["kind"] == kind):
            mark = {"same": "same", "flipped": "**flipped**"}.get(p["status"], p["status"])
            lines.append(f"| {p['figure']} | {p['a']} | {p['b']} | {p['verdict_a'] or '-'} | "
                         f"{p['verdict_b'] or '-'} | {mark} |")
    lines += ["", f"| scheduler | final greedy, {a} | {b} | difference |", "|---|---|---|---|"]
    for n, (x, y) in res["final_acc"].items():
        lines.append(f"| {n} | {x:.3f} | {y:.3f} | {y - x:+.3f} |")
    return lines + [""]


def write(report_a, report_b, out, names: tuple[str, str] | None = None, json_out=None) -> dict:
    """Read two report folders' metrics.json; write the markdown to ``out`` (and the pairing as JSON to
    ``json_out`` if given), each atomically. Unreadable reports are one ``InvalidArgumentError``."""
    from graphdiff_cli.errors import InvalidArgumentError
    from graphdiff_cli.io.atomic import atomic_write_text

    out = Path(out)
    if out.suffix == ".json" or out.is_dir():
        raise InvalidArgumentError(f"--out {out}: give a markdown file (the JSON goes to --json)")
    if json_out is not None and (Path(json_out).is_dir() or Path(json_out).resolve() == out.resolve()):
        raise InvalidArgumentError(f"--json {json_out}: give a file other than --out")
    loaded = []
    for folder in (report_a, report_b):
        path = Path(folder) / "metrics.json"
        if not path.is_file():
            raise InvalidArgumentError(f"{path} does not exist: run `python -m closedloop report` first")
        try:
            loaded.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidArgumentError(f"{path} is not a readable report: {exc}") from None
    names = names or (Path(report_a).parent.name or str(report_a), Path(report_b).parent.name or str(report_b))
    try:
        res = agreement(*loaded)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidArgumentError(f"{report_a} / {report_b}: not a closedloop report's metrics.json "
                                   f"({type(exc).__name__}: {exc})") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, "\n".join(markdown(res, names)))
    if json_out:
        atomic_write_text(Path(json_out), json.dumps(res, indent=1) + "\n")
    return {"out": str(out), **res["counts"]}
