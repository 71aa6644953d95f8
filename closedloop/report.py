"""Aggregate closed-loop runs: per-scheduler table, native-vs-graphdiff comparisons, exact sign test, plots.

Pure functions (``curves``, ``first_reach``, ``compare``, ``sign_test``) take parsed metrics; only
``load_runs`` and ``write_report`` touch files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from graphdiff_cli.io.atomic import atomic_write, atomic_write_text

from . import scores
from .schedulers import COMPARISONS, LIVE_ESTIMATORS, LIVE_RULES, REFERENCES, RULES, SCHEDULERS


def _finished(root, filename: str):
    """(scheduler, seed, rows of ``root/<scheduler>/s<seed>/<filename>``) for finished runs only (a run writes
    ``summary.json`` last: a run cut short by a time limit or a crash is left out, not read as a short run)."""
    for path in sorted(Path(root).glob(f"*/s*/{filename}")):
        if (path.parent / "summary.json").exists():
            rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
            yield path.parent.parent.name, int(path.parent.name[1:]), rows


def load_outcomes(root) -> dict[str, dict[int, list[dict]]]:
    """``root/<scheduler>/s<seed>/outcomes.jsonl`` -> {scheduler: {seed: rows}} (for the per-cell shares)."""
    out: dict[str, dict[int, list[dict]]] = {}
    for name, seed, rows in _finished(root, "outcomes.jsonl"):
        out.setdefault(name, {})[seed] = rows
    return out


def load_runs(root) -> dict[str, dict[int, list[dict]]]:
    """``root/<scheduler>/s<seed>/metrics.jsonl`` -> {scheduler: {seed: rows}}, finished runs only."""
    out: dict[str, dict[int, list[dict]]] = {}
    for name, seed, rows in _finished(root, "metrics.jsonl"):
        out.setdefault(name, {})[seed] = rows
    return out


METRICS = {"heldout_acc": "held-out accuracy (greedy, exact match)",
           "heldout_sampled": "held-out mean pass rate (sampled, temperature 1)"}


def curve(rows: list[dict], key: str = "heldout_acc") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, cumulative rollouts, held-out ``key``) at the evaluated steps."""
    ev = [r for r in rows if key in r]
    return (np.array([r["step"] for r in ev], float), np.array([r["cum_rollouts"] for r in ev], float),
            np.array([r[key] for r in ev], float))


def has_metric(runs, key: str) -> bool:
    return all(any(key in r for r in rows) for v in runs.values() for rows in v.values())


def first_reach(x: np.ndarray, acc: np.ndarray, level: float) -> float | None:
    """The first x > 0 (step or rollouts, evaluations after the start) at which acc >= level (None if never)."""
    hit = np.flatnonzero((acc >= level - 1e-12) & (x > 0))
    return float(x[hit[0]]) if hit.size else None


def acc_at(xs: np.ndarray, acc: np.ndarray, x: float) -> float:
    """Held-out accuracy at x by linear interpolation (held at the ends)."""
    return float(np.interp(x, xs, acc))


def run_stats(rows: list[dict]) -> dict:
    steps = [r for r in rows if r["step"] > 0]
    st, ro, acc = curve(rows)
    _, _, samp = curve(rows, "heldout_sampled")
    extra = {"final_sampled": float(samp[-1]), "initial_sampled": float(samp[0])} if samp.size else {}
    return {"final_acc": float(acc[-1]), "mean_acc": float(acc[1:].mean()) if acc.size > 1 else float(acc[-1]),
            "initial_acc": float(acc[0]), "steps": int(st[-1]), "rollouts": int(ro[-1]), **extra,
            "effective_rate": float(np.mean([r["effective_rate"] for r in steps])),
            "train_reward": float(np.mean([r["mean_reward"] for r in steps])),
            "step_seconds": float(np.mean([r["step_seconds"] for r in steps])),
            "estimator_seconds": float(np.mean([r["estimator_seconds"] for r in steps]))}


def compare(runs, native: str, graphdiff: str, reference: str = "uniform") -> list[dict]:
    """Per seed present in both: final and mean accuracy of each, accuracy at equal rollouts, steps and
    rollouts to reach the reference's final accuracy."""
    out = []
    for seed in sorted(set(runs.get(native, {})) & set(runs.get(graphdiff, {}))):
        a, b = runs[native][seed], runs[graphdiff][seed]
        sa, ra, acc_a = curve(a)
        sb, rb, acc_b = curve(b)
        row = {"seed": seed, "native": native, "graphdiff": graphdiff}
        budget = min(ra[-1], rb[-1])
        row["native_acc_at_equal_rollouts"] = acc_at(ra, acc_a, budget)
        row["graphdiff_acc_at_equal_rollouts"] = acc_at(rb, acc_b, budget)
        row["equal_rollouts"] = float(budget)
        row["native_final_acc"], row["graphdiff_final_acc"] = float(acc_a[-1]), float(acc_b[-1])
        row["native_mean_acc"] = float(acc_a[1:].mean())
        row["graphdiff_mean_acc"] = float(acc_b[1:].mean())
        _, ra_s, sam_a = curve(a, "heldout_sampled")
        _, rb_s, sam_b = curve(b, "heldout_sampled")
        if sam_a.size and sam_b.size:
            row["native_sampled_at_equal_rollouts"] = acc_at(ra_s, sam_a, budget)
            row["graphdiff_sampled_at_equal_rollouts"] = acc_at(rb_s, sam_b, budget)
        if seed in runs.get(reference, {}):
            for key, suffix in (("heldout_acc", ""), ("heldout_sampled", "_sampled")):
                ref_steps, _, ref_acc = curve(runs[reference][seed], key)
                if not ref_acc.size:
                    continue
                level = float(ref_acc[-1])
                row[f"reference_final{suffix or '_acc'}"] = level
                if level <= ref_acc[0] + 1e-12:  # the reference did not improve: "reaching" it means nothing
                    row[f"reference_improved{suffix}"] = False
                    continue
                row[f"reference_improved{suffix}"] = True
                row[f"reference_steps_to_final{suffix}"] = first_reach(ref_steps, ref_acc, level)
                for tag, run_rows in (("native", a), ("graphdiff", b)):
                    s_, r_, acc_ = curve(run_rows, key)
                    row[f"{tag}_steps_to_reference{suffix}"] = first_reach(s_, acc_, level)
                    row[f"{tag}_rollouts_to_reference{suffix}"] = first_reach(r_, acc_, level)
        out.append(row)
    return out


def steps_ratio(row: dict, suffix: str = "") -> float | None:
    """graphdiff's steps to the reference's final level / the reference's own steps to it (None: undefined, or
    graphdiff never reached it)."""
    ref = row.get(f"reference_steps_to_final{suffix}")
    if not ref:
        return None
    gd = row.get(f"graphdiff_steps_to_reference{suffix}")
    return None if gd is None else gd / ref


def sign_test(diffs) -> dict:
    """Exact two-sided binomial sign test on paired differences (ties dropped)."""
    from scipy.stats import binomtest

    d = np.asarray([x for x in diffs if x is not None], float)
    wins, losses = int((d > 0).sum()), int((d < 0).sum())
    n = wins + losses
    p = float(binomtest(wins, n, 0.5).pvalue) if n else None
    return {"pairs": int(d.size), "graphdiff_better": wins, "native_better": losses, "ties": int(d.size - n),
            "p_value": p, "mean_difference": float(d.mean()) if d.size else None}


def _fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _ms(vals, nd=3):
    v = [x for x in vals if x is not None]
    if not v:
        return "-"
    if len(v) == 1:
        return f"{v[0]:.{nd}f}"
    return f"{np.mean(v):.{nd}f} ± {np.std(v, ddof=1):.{nd}f}"


def _targets(table: dict, rows: list[dict], tests: dict) -> list[dict]:
    """The closed-loop benchmark's three targets, each with what was measured and whether it is met."""
    out = []
    t = tests["acc_at_equal_rollouts"]
    if t["pairs"]:
        share = t["graphdiff_better"] / t["pairs"]
        out.append({"target": "graphdiff beats the native estimator on held-out accuracy at equal rollouts in >= 80% "
                              "of (scheduler, seed) pairs, sign test p < 0.05",
                    "measured": f"{t['graphdiff_better']} of {t['pairs']} ({share:.0%}), p = {_fmt(t['p_value'], 3)}",
                    "met": bool(share >= 0.8 and (t["p_value"] or 1.0) < 0.05)})
    for suffix, what in (("", "held-out accuracy"), ("_sampled", "sampled pass rate")):
        sel = [r for r in rows if r["graphdiff"] == "gd-thompson"]
        ratios = [steps_ratio(r, suffix) for r in sel]
        undefined = [r for r in sel if r.get(f"reference_improved{suffix}") is False]
        if not sel:
            continue
        if undefined:
            measured, met = f"uniform's {what} did not rise in {len(undefined)} of {len(sel)} seeds: undefined", None
        else:
            shown = ", ".join("never" if x is None else f"{x:.2f}" for x in ratios)
            met = all(x is not None and x <= 0.7 for x in ratios)
            measured = f"per seed {shown} (graphdiff's steps / uniform's)"
        out.append({"target": f"target selection with graphdiff reaches uniform's final {what} in <= 0.7x its steps",
                    "measured": measured, "met": met})
    shares = [s["estimator_seconds"] / s["step_seconds"] for name, st in table.items() if name.startswith("gd-")
              for s in st if s["step_seconds"]]
    if shares:
        out.append({"target": "the estimator's overhead < 5% of a training step's wall time",
                    "measured": f"{min(shares):.1%} to {max(shares):.1%} of the step (graphdiff runs)",
                    "met": max(shares) < 0.05})
    return out


def _reach(row: dict, suffix: str) -> str:
    if row.get(f"reference_improved{suffix}") is False:
        return "uniform did not improve"
    if f"reference_steps_to_final{suffix}" not in row:
        return "-"
    return " / ".join(_fmt(row.get(f"{t}_steps_to_reference{suffix}"), 0) if row.get(f"{t}_steps_to_reference{suffix}")
                      is not None else "never" for t in ("native", "graphdiff")) + \
        f" / {_fmt(row[f'reference_steps_to_final{suffix}'], 0)}"


def _plot(runs, out: Path) -> list[str]:
    files = []
    for key in METRICS:
        if has_metric(runs, key):
            files += _plot_metric(runs, out, key)
    return files


def _plot_metric(runs, out: Path, key: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    stem = "heldout" if key == "heldout_acc" else key
    for xkey, xlabel, fname in (("step", "training step", f"{stem}_vs_step.png"),
                                ("rollouts", "rollouts consumed", f"{stem}_vs_rollouts.png")):
        comps = [c for c in RULES if any(x in runs for x in c[2:])]
        if not comps:
            continue
        fig, axes = plt.subplots(1, len(comps), figsize=(5.2 * len(comps), 4), squeeze=False, sharey=True)
        for ax, (title, base, native, gdname, oracle) in zip(axes[0], comps):
            lines = ((native, "tab:blue", "-"), (gdname, "tab:red", "-"), (oracle, "black", "-."),
                     (base, "gray", "--"), ("ds", "tab:green", ":"))
            for name, color, ls in lines[:4] if base == "ds" else lines:  # DS once, as the pre-filter's baseline
                if name not in runs:
                    continue
                cs = [curve(r, key) for r in runs[name].values()]
                xs = cs[0][0] if xkey == "step" else cs[0][1]
                grid = np.linspace(0, min((c[0] if xkey == "step" else c[1])[-1] for c in cs), 50) \
                    if xkey == "rollouts" else xs
                ys = np.array([np.interp(grid, c[0] if xkey == "step" else c[1], c[2]) for c in cs])
                ax.plot(grid, ys.mean(0), color=color, ls=ls, label=f"{name} ({len(cs)} seeds)")
                if len(cs) > 1:
                    ax.fill_between(grid, ys.min(0), ys.max(0), color=color, alpha=0.15)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel(METRICS[key])
        fig.tight_layout()
        with atomic_write(out / fname, binary=True) as f:  # a reader never sees half a figure
            fig.savefig(f, dpi=110, format="png")
        plt.close(fig)
        files.append(fname)
    return files


def write_report(runs_dir, out_dir, sft_dir=None) -> dict:
    runs = load_runs(runs_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Closed-loop benchmark: does graphdiff make a real policy learn faster?", ""]
    lines += [f"Runs from `{runs_dir}`. Held-out accuracy: greedy decoding, exact match. Bands in the plots: "
              "min-max over seeds; table: mean ± sd over seeds.", ""]
    if sft_dir and Path(sft_dir).exists():
        lines += ["## Warm-started policies (SFT)", "", "| seed | params | SFT steps | SFT s | held-out acc | "
                  "train pass histogram (0..8 of 8) | effective-group rate |", "|---|---|---|---|---|---|---|"]
        for p in sorted(Path(sft_dir).glob("s*/sft.json")):
            s = json.loads(p.read_text())
            lines.append(f"| {s['seed']} | {s['parameters']} | {s['steps']} | {s['sft_seconds']:.0f} | "
                         f"{s['heldout_acc']:.3f} | {s['train_pass_histogram_8']} | {s['train_effective_rate_8']:.3f} |")
        lines.append("")
    init = sorted({round(run_stats(r)["initial_acc"], 4) for v in runs.values() for r in v.values()})
    lines += [f"Held-out accuracy at step 0 (the warm-started policy): {', '.join(f'{x:.4f}' for x in init)}.", ""]
    lines += ["## Per scheduler", "", "| scheduler | estimator | seeds | steps | rollouts | final held-out acc | "
              "mean held-out acc (evals after step 0) | held-out sampled pass rate, step 0 -> final | effective-group rate | "
              "train reward | step wall s | estimator s / step |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    table = {}
    for name in SCHEDULERS:
        if name not in runs:
            continue
        st = [run_stats(r) for r in runs[name].values()]
        table[name] = st
        lines.append(f"| {name} | {SCHEDULERS[name][2] or '-'} | {len(st)} | {st[0]['steps']} | "
                     f"{_ms([s['rollouts'] for s in st], 0)} | {_ms([s['final_acc'] for s in st])} | "
                     f"{_ms([s['mean_acc'] for s in st])} | "
                     f"{_ms([s.get('initial_sampled') for s in st])} -> {_ms([s.get('final_sampled') for s in st])} | "
                     f"{_ms([s['effective_rate'] for s in st])} | "
                     f"{_ms([s['train_reward'] for s in st])} | "
                     f"{_ms([s['step_seconds'] for s in st], 2)} | {_ms([s['estimator_seconds'] for s in st], 4)} |")
    lines.append("")
    all_rows, final_d, mean_d, eq_d, eff_d, samp_d = [], [], [], [], [], []
    lines += ["## Native estimator vs graphdiff, per comparison", "",
              "| comparison | seed | acc at equal rollouts (native / graphdiff) | final acc (native / graphdiff) | "
              "steps to uniform's final acc (native / graphdiff / uniform) | sampled pass rate at equal rollouts "
              "(native / graphdiff) | steps to uniform's final sampled rate (native / graphdiff / uniform) |",
              "|---|---|---|---|---|---|---|"]
    for title, native, gdname in COMPARISONS:
        rows = compare(runs, native, gdname)
        for r in rows:
            r["comparison"] = title
            all_rows.append(r)
            final_d.append(r["graphdiff_final_acc"] - r["native_final_acc"])
            mean_d.append(r["graphdiff_mean_acc"] - r["native_mean_acc"])
            eq_d.append(r["graphdiff_acc_at_equal_rollouts"] - r["native_acc_at_equal_rollouts"])
            if "graphdiff_sampled_at_equal_rollouts" in r:
                samp_d.append(r["graphdiff_sampled_at_equal_rollouts"] - r["native_sampled_at_equal_rollouts"])
            eff_d.append(run_stats(runs[gdname][r["seed"]])["effective_rate"]
                         - run_stats(runs[native][r["seed"]])["effective_rate"])
            lines.append(f"| {title} | {r['seed']} | {_fmt(r['native_acc_at_equal_rollouts'])} / "
                         f"{_fmt(r['graphdiff_acc_at_equal_rollouts'])} | {_fmt(r['native_final_acc'])} / "
                         f"{_fmt(r['graphdiff_final_acc'])} | {_reach(r, '')} | "
                         f"{_fmt(r.get('native_sampled_at_equal_rollouts'))} / "
                         f"{_fmt(r.get('graphdiff_sampled_at_equal_rollouts'))} | {_reach(r, '_sampled')} |")
    lines.append("")
    tests = {"final_acc": sign_test(final_d), "mean_acc": sign_test(mean_d), "acc_at_equal_rollouts": sign_test(eq_d),
             "effective_rate (secondary)": sign_test(eff_d)}
    if samp_d:
        tests["sampled_pass_rate_at_equal_rollouts (secondary)"] = sign_test(samp_d)
    lines += ["## Pooled exact sign test over (comparison, seed) pairs (scipy.stats.binomtest, two-sided, ties dropped)",
              "", "| statistic | pairs | graphdiff better | native better | ties | mean difference (gd - native) | p |",
              "|---|---|---|---|---|---|---|"]
    for k, t in tests.items():
        lines.append(f"| {k} | {t['pairs']} | {t['graphdiff_better']} | {t['native_better']} | {t['ties']} | "
                     f"{_fmt(t['mean_difference'], 4)} | {_fmt(t['p_value'], 4)} |")
    lines.append("")
    targets = _targets(table, all_rows, tests)
    lines += ["## The targets", "", "| target | measured | met |", "|---|---|---|"]
    for t in targets:
        lines.append(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no' if t['met'] is False else '-'} |")
    lines.append("")
    extra_lines, extra = _oracle_gain_sections(runs, load_outcomes(runs_dir))
    lines += extra_lines
    plots = _plot(runs, out)
    lines += [f"![{p}]({p})" for p in plots]
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    metrics = {"schedulers": table, "comparisons": all_rows, "sign_tests": tests, "targets": targets, "plots": plots,
               "references": [r for r in REFERENCES if r in runs], **extra}
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=1) + "\n")
    return {"report": str(out / "report.md"), "runs": sum(len(v) for v in runs.values()), "sign_tests": tests}


def interval_text(b: dict | None, nd: int = 3) -> str:
    """A bootstrap result as "value [lo, hi]" (the value alone without an interval, "-" without a value)."""
    if not b or b.get("value") is None:
        return "-"
    if b.get("lo") is None:
        return f"{b['value']:.{nd}f}"
    return f"{b['value']:.{nd}f} [{b['lo']:.{nd}f}, {b['hi']:.{nd}f}]"


def _oracle_gain_sections(runs, outcomes) -> tuple[list[str], dict]:
    """Rollouts to DS's final accuracy, the share of the oracle's gain per rule and estimator, the regime
    check, the zero-variance share under uniform, per-cell rollout shares against the oracle's, the targets."""
    lines, res = [], {}
    keys = [k for k in METRICS if has_metric(runs, k)]
    if "ds" in runs:
        lines += ["## Rollouts to DS's final held-out accuracy (per seed: DS's rollouts to it / the scheduler's; "
                  "> 1 = fewer rollouts than DS; a seed that never reaches it counts 0)", "",
                  "Read on each run's isotonic (non-decreasing) fit to its held-out evaluations, crossings "
                  "interpolated (`scores.curve`); the raw column reads the first evaluation at or above DS's last "
                  "one instead. Mean over seeds with a 95% bootstrap interval over seeds; MDD = minimum detectable "
                  "difference (80% power, 5% two-sided).", "",
                  "| scheduler | seeds | final greedy | final sampled | rollouts | saving vs DS, greedy | MDD | "
                  "saving vs DS, sampled | MDD | raw saving, greedy |", "|---|---|---|---|---|---|---|---|---|---|"]
        res["saving_vs_ds"] = {}
        for name in SCHEDULERS:
            if name not in runs:
                continue
            sv = {k: scores.bootstrap(list(scores.saving_vs_ds(runs, name, k).values())) for k in keys}
            sv["heldout_acc_raw"] = scores.bootstrap(list(scores.saving_vs_ds(runs, name, smooth=False).values()))
            res["saving_vs_ds"][name] = sv
            fin = {k: [scores.final(r, k) for r in runs[name].values()] for k in keys}
            lines.append(f"| {name} | {len(runs[name])} | {_ms(fin.get('heldout_acc', []))} | "
                         f"{_ms(fin.get('heldout_sampled', []))} | "
                         f"{_ms([float(r[-1]['cum_rollouts']) for r in runs[name].values()], 0)} | "
                         f"{interval_text(sv.get('heldout_acc'), 2)} | {_fmt((sv.get('heldout_acc') or {}).get('mdd'), 2)} | "
                         f"{interval_text(sv.get('heldout_sampled'), 2)} | {_fmt((sv.get('heldout_sampled') or {}).get('mdd'), 2)} | "
                         f"{interval_text(sv.get('heldout_acc_raw'), 2)} |")
        lines.append("")
    ds_family = [x for x in SCHEDULERS if SCHEDULERS[x][0] == "ds" and x != "ds" and x in runs]
    if "ds" in runs and ds_family:
        res["ds_equal_steps"], res["saving_along_ds"] = {}, {}
        lines += ["## The DS family at equal steps and along DS's curve", "",
                  "Every DS arm trains the same steps on B groups with a signal, so the papers' reading (GRESO, "
                  "MoPPS) is at equal steps: DS's rollouts / the arm's, and the arm's final accuracy minus DS's "
                  "(fitted curves; 95% bootstrap intervals over seeds). Along DS's curve: rollouts to DS's own "
                  "accuracy after 1/4, 1/2, 3/4 and all of its steps, DS's / the arm's (0: never reached). The "
                  "last column is the saving above, censored: an arm that ends level with DS reaches DS's last "
                  "value in about half the seeds only.", "",
                  "| scheduler | DS's rollouts / its rollouts | final greedy - DS's | final sampled - DS's | "
                  "seeds reaching DS's final greedy | saving at DS's greedy acc. after 1/4 | 1/2 | 3/4 | all |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for name in ds_family:
            eq = {k: scores.equal_steps_vs_ds(runs, name, k) for k in keys}
            g = eq.get("heldout_acc", [])
            ratio = scores.bootstrap([r["rollout_ratio"] for r in g])
            diffs = {k: scores.bootstrap([r["final_difference"] for r in v]) for k, v in eq.items()}
            along = {f: scores.bootstrap(list(v.values())) for f, v in scores.saving_along_ds(runs, name).items()}
            res["ds_equal_steps"][name] = {"rollout_ratio": ratio, "final_difference": diffs,
                                           "reached": sum(r["reached"] for r in g), "seeds": len(g)}
            res["saving_along_ds"][name] = {str(f): b for f, b in along.items()}
            lines.append(f"| {name} | {interval_text(ratio, 2)} | {interval_text(diffs.get('heldout_acc'), 4)} | "
                         f"{interval_text(diffs.get('heldout_sampled'), 4)} | {sum(r['reached'] for r in g)} of {len(g)} | "
                         + " | ".join(interval_text(along[f], 2) for f in sorted(along)) + " |")
        lines.append("")
    res["oracle_share"] = []
    share_lines = []
    for title, base, ests, oracle in [(t, b, (n, g), o) for t, b, n, g, o in RULES] + list(LIVE_RULES):
        for est in ests:
            if not all(x in runs for x in (base, est, oracle)):
                continue
            for k in keys:
                sh = scores.oracle_share(runs, base, est, oracle, k)
                acc, ro = scores.share_stats(sh["seeds"], "acc"), scores.share_stats(sh["seeds"], "rollouts")
                gain = scores.bootstrap([r["acc_oracle"] - r["acc_baseline"] for r in sh["seeds"]])
                res["oracle_share"].append({"rule": title, "metric": k, **sh, "share_acc": acc, "share_rollouts": ro,
                                            "oracle_gain_acc": gain})
                acc_mdd, ro_mdd = _fmt((acc or {}).get("mdd"), 2), _fmt((ro or {}).get("mdd"), 2)
                saved = _fmt(None if ro is None else round(ro["oracle_gain"]))
                share_lines.append(f"| {title} | {est} | {k} | {len(sh['seeds'])} | {interval_text(gain)} (MDD "
                                   f"{_fmt(gain.get('mdd'))}) | {interval_text(acc, 2)} (MDD {acc_mdd}) | "
                                   f"{interval_text(ro, 2)} (MDD {ro_mdd}; the oracle saves {saved}) |")
    if share_lines:
        lines += ["## Share of the oracle's gain each estimator recovers", "",
                  "(estimator - baseline) / (oracle - baseline); baseline = the rule without an estimator (uniform; "
                  "plain DS for the pre-filter). Accuracy at the rollouts all three reached; rollouts saved to the "
                  "baseline's final accuracy. Ratio of seed means, 95% bootstrap interval over seeds; MDD = the minimum "
                  "detectable share at these seeds. A share is a figure only where the oracle's own gain is clearly above "
                  "0: for the accuracy share, the gain shown with its interval; for the rollouts share, the oracle's "
                  "mean saving in rollouts, shown (per seed in metrics.json). `closedloop verdicts` pairs only the "
                  "accuracy shares whose gain's interval is above 0.", "",
                  "| rule | estimator | metric | seeds | oracle's gain in accuracy [95%] | share, accuracy | "
                  "share, rollouts |", "|---|---|---|---|---|---|---|"] + share_lines + [""]
    live_arms = [x for x in SCHEDULERS if SCHEDULERS[x][2] in LIVE_ESTIMATORS and x in runs]
    if live_arms:
        res["live_cost"] = {}
        lines += ["## The live features' cost", "",
                  "The policy's next-token entropy and largest probability at each candidate's end, one batched "
                  "forward pass per read of the candidates (the plan's pool, or each chunk the DS pre-filter reads): "
                  "its seconds per step and its share of the arm's step (the trainer step plus a plan made "
                  "outside it), mean over steps, then mean ± sd over seeds. Counted in the estimator's seconds.", "",
                  "| scheduler | seeds | live s / step | share of the step |", "|---|---|---|---|"]
        for name in live_arms:
            per = [[(r.get("live_seconds"), r.get("live_share")) for r in rows if r["step"] > 0 and "live_share" in r]
                   for rows in runs[name].values()]
            sec = [float(np.mean([a for a, _ in p])) for p in per if p]
            share = [float(np.mean([b for _, b in p])) for p in per if p]
            res["live_cost"][name] = {"seconds_per_step": sec, "share": share}
            lines.append(f"| {name} | {len(sec)} | {_ms(sec, 4)} | {_ms(share, 3)} |")
        lines.append("")
    checks = []
    if "oracle-ds" in runs and "ds" in runs:
        sv = res["saving_vs_ds"]["oracle-ds"].get("heldout_acc") or {}
        checks.append({"check": "oracle pre-filtered DS reaches DS's final greedy accuracy with >= 1.5x fewer "
                                "rollouts, interval excluding 1", "measured": interval_text(sv, 2),
                       "met": None if sv.get("lo") is None or sv["seeds"] < scores.MIN_SEEDS
                       else bool(sv["value"] >= 1.5 and sv["lo"] > 1)})
    along = (res.get("saving_along_ds") or {}).get("oracle-ds")
    if along:
        mid = {f: b for f, b in along.items() if float(f) < 1.0}
        ok = [b.get("lo") is not None and b["value"] >= 1.5 and b["lo"] > 1 for b in mid.values()]
        checks.append({"check": "(not a target: chosen after the first grid in this regime showed the censoring) "
                                "oracle pre-filtered DS reaches "
                                "DS's accuracy after 1/4, 1/2 and 3/4 of its steps with >= 1.5x fewer rollouts, "
                                "each interval excluding 1",
                       "measured": ", ".join(interval_text(b, 2) for _, b in sorted(mid.items())),
                       "met": None if any(b.get("lo") is None or b["seeds"] < scores.MIN_SEEDS for b in mid.values())
                       else all(ok)})
    if "oracle-thompson" in runs and "uniform" in runs:
        d = [r["acc_oracle"] - r["acc_baseline"] for r in scores.oracle_share(runs, "uniform", "uniform",
                                                                               "oracle-thompson")["seeds"]]
        b = scores.bootstrap(d)
        checks.append({"check": "oracle selection (Thompson) beats uniform at equal rollouts, interval excluding 0",
                       "measured": f"{interval_text(b)} (MDD {_fmt(b.get('mdd'))})",
                       "met": None if b.get("lo") is None or b["seeds"] < scores.MIN_SEEDS else bool(b["lo"] > 0)})
    res["live_targets"] = scores.live_targets(runs, res["oracle_share"])
    if res["live_targets"]:
        lines += ["## The live arms' targets", "",
                  f"On the greedy held-out accuracy's fitted curves; decided only on >= {scores.MIN_SEEDS} paired seeds "
                  "('-' below that).", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['measured']} | {'-' if t['met'] is None else 'yes' if t['met'] else 'no'} |"
                  for t in res["live_targets"]] + [""]
    res["regime_check"] = checks
    if checks:
        lines += ["## Regime check (tuned on the oracle and uniform arms only)", "",
                  f"Decided only on >= {scores.MIN_SEEDS} paired seeds ('-' below that).", "",
                  "| check | measured | met |",
                  "|---|---|---|"] + [f"| {c['check']} | {c['measured']} | "
                                      f"{'-' if c['met'] is None else 'yes' if c['met'] else 'no'} |" for c in checks]
        lines.append("")
    if "uniform" in runs:
        per_seed = [scores.zero_variance_share(r) for r in runs["uniform"].values()]
        res["uniform_zero_variance_share"] = per_seed
        lines += ["## Zero-variance groups over training under uniform (mean over seeds)", "",
                  "| steps | all-correct | all-wrong |", "|---|---|---|"]
        for j, w in enumerate(per_seed[0]):
            ac = np.mean([p[j]["all_correct"] for p in per_seed if j < len(p)])
            aw = np.mean([p[j]["all_wrong"] for p in per_seed if j < len(p)])
            lines.append(f"| {w['steps']} | {ac:.3f} | {aw:.3f} |")
        lines.append("")
    cell_rows, res["cell_shares"] = [], {}
    for title, base, native, gdname, oracle in RULES:
        if oracle not in outcomes:
            continue
        names = [x for x in (base, native, gdname, oracle) if x in outcomes]
        cells = sorted({c for x in names for o in outcomes[x].values() for c in scores.cell_shares(o)})
        ref = {c: float(np.mean([scores.cell_shares(o).get(c, 0.0) for o in outcomes[oracle].values()])) for c in cells}
        for name in (base, native, gdname, oracle):
            if name not in outcomes:
                continue
            sh = {c: float(np.mean([scores.cell_shares(o).get(c, 0.0) for o in outcomes[name].values()])) for c in ref}
            res["cell_shares"][name] = sh
            dist = sum(abs(sh[c] - ref[c]) for c in ref) / 2
            cell_rows.append(f"| {title} | {name} | " + ", ".join(f"{c} {sh[c]:.2f}" for c in ref)
                             + f" | {dist:.3f} |")
    if cell_rows:
        lines += ["## Rollout shares per (skill, level) cell against the oracle's (same rule)", "",
                  "| rule | scheduler | share of rollouts per cell | total variation distance to the oracle's |",
                  "|---|---|---|---|"] + cell_rows + [""]
    return lines, res
