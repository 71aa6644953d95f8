"""Snakemake script: one comparison table (markdown + CSV) and one plot across an experiment grid.

Reads the metrics.json of every grid point (graphdiff alone, written by ``graphdiff evaluate``) and of
the per-k_nn baseline replays, and writes

* ``comparison.md`` / ``comparison.csv``: one row per setting (k_nn, K, beta, gamma, window), the
  full-log metrics averaged over the seeds with their standard deviation, best MAE first; the
  baselines below as reference rows;
* ``points.csv``: every grid point (each seed) unaggregated;
* ``comparison.png``: MAE and within-batch r of every setting (mean and spread over seeds), the
  baselines as horizontal lines.

Importable without Snakemake (``write_comparison``), so the aggregation is tested on its own.
"""


import csv
import json
import math
from pathlib import Path

SETTING_KEYS = ("k_nn", "states", "beta", "gamma", "window")
METRICS = ("mae", "batch_r", "within_r", "brier", "ece", "auroc", "seconds_per_step")
LOWER_IS_BETTER = {"mae": True, "batch_r": False, "within_r": False, "brier": True, "ece": True, "auroc": False,
                   "seconds_per_step": True, "true_mae": True}
HEADERS = {"mae": "MAE", "batch_r": "batch r", "within_r": "within r", "brier": "Brier", "ece": "ECE",
           "auroc": "AUROC", "seconds_per_step": "ms/step", "true_mae": "MAE vs p_true"}


def _finite(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def read_metrics(folder: Path) -> dict:
    path = Path(folder) / "metrics.json"
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: cannot read the evaluate metrics ({exc.__class__.__name__}: {exc})")


def method_row(doc: dict, name: str) -> dict:
    """Full-log metrics of one method of a metrics.json (plus MAE vs the simulation's truth if known)."""
    full = doc["metrics"]["methods"][name]["phases"]["full"]["all"]
    row = {k: full.get(k) for k in METRICS}
    truth = (doc.get("ground_truth") or {}).get("methods", {})
    row["true_mae"] = truth.get(name)
    for phase in ("early", "middle", "last"):
        row[f"{phase}_mae"] = doc["metrics"]["methods"][name]["phases"][phase]["all"].get("mae")
    return row


def _mean_sd(values):
    vals = [v for v in values if _finite(v)]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
    return mean, sd


def aggregate(points: list[dict], folders: list) -> tuple[list[dict], list[dict]]:
    """(per-point rows, per-setting rows averaged over seeds, best mean MAE first)."""
    raw = []
    for p, folder in zip(points, folders):
        doc = read_metrics(folder)
        if "graphdiff" not in doc["metrics"]["methods"]:
            raise SystemExit(f"{folder}: no graphdiff metrics in this grid point's report")
        raw.append({**{k: p[k] for k in (*SETTING_KEYS, "seed")}, **method_row(doc, "graphdiff")})
    groups: dict[tuple, list[dict]] = {}
    for r in raw:
        groups.setdefault(tuple(r[k] for k in SETTING_KEYS), []).append(r)
    metric_keys = [k for k in raw[0] if k not in (*SETTING_KEYS, "seed")] if raw else []
    agg = []
    for key, rows in groups.items():
        out = dict(zip(SETTING_KEYS, key))
        out["seeds"] = len(rows)
        for m in metric_keys:
            out[m], out[f"{m}_sd"] = _mean_sd([r[m] for r in rows])
        agg.append(out)
    agg.sort(key=lambda r: (r["mae"] if _finite(r["mae"]) else math.inf))
    return raw, agg


def baseline_rows(folders: list, k_nns: list) -> list[dict]:
    rows = []
    for folder, k in zip(folders, k_nns):
        doc = read_metrics(folder)
        for name, m in doc["metrics"]["methods"].items():
            if m.get("oracle") or name == "graphdiff":
                continue
            rows.append({"method": name, "k_nn": k, **method_row(doc, name)})
    return rows


def _fmt(x, key="", sd=None):
    if not _finite(x):
        return "–"
    if key == "seconds_per_step":
        s = f"{1000 * x:.1f}"
        return s if not _finite(sd) else f"{s} ± {1000 * sd:.1f}"
    s = f"{x:.3f}"
    return s if not _finite(sd) or sd == 0 else f"{s} ± {sd:.3f}"


def write_comparison(points: list[dict], point_folders: list, baseline_folders: list, baseline_k_nn: list,
                     md_path, csv_path, points_csv_path, png_path) -> dict:
    raw, agg = aggregate(points, point_folders)
    base = baseline_rows(baseline_folders, baseline_k_nn)
    has_truth = any(_finite(r.get("true_mae")) for r in raw)
    cols = ["mae", "within_r", "batch_r", "brier", "ece", "auroc"] + (["true_mae"] if has_truth else []) + \
           ["seconds_per_step"]

    # CSV: the aggregated table (mean and sd columns), then the per-point rows in points.csv
    agg_fields = [*SETTING_KEYS, "seeds"] + [f for c in cols + ["early_mae", "middle_mae", "last_mae"]
                                             for f in (c, f"{c}_sd")]
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["kind", "method", *agg_fields])
        w.writeheader()
        for r in agg:
            w.writerow({"kind": "grid", "method": "graphdiff", **{k: r.get(k) for k in agg_fields}})
        for r in base:
            w.writerow({"kind": "baseline", "method": r["method"], "k_nn": r["k_nn"],
                        **{k: r.get(k) for k in cols + ["early_mae", "middle_mae", "last_mae"]}})
    raw_fields = [*SETTING_KEYS, "seed"] + [k for k in raw[0] if k not in (*SETTING_KEYS, "seed")]
    with open(points_csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=raw_fields)
        w.writeheader()
        w.writerows(raw)

    # markdown
    best = {c: (min if LOWER_IS_BETTER[c] else max)((r[c] for r in agg if _finite(r[c])), default=None) for c in cols}
    lines = ["# graphdiff experiment grid", "",
             f"{len(raw)} grid points = {len(agg)} settings x seeds; each replays the training log step by step "
             "with no look-ahead (`graphdiff evaluate --methods graphdiff`). Full-log metrics, mean ± standard "
             "deviation over the seeds of the spectral clustering; bold = best setting per column. Rows are "
             "ordered by MAE. The baselines, which do not depend on K, the seed or the estimator settings, are "
             "replayed once per k_nn.", "",
             "| k_nn | K | beta | gamma | window | seeds | " + " | ".join(HEADERS[c] for c in cols) + " |",
             "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(cols)]
    for r in agg:
        cells = []
        for c in cols:
            text = _fmt(r[c], c, r.get(f"{c}_sd"))
            cells.append(f"**{text}**" if best[c] is not None and r[c] == best[c] and len(agg) > 1 else text)
        lines.append(f"| {r['k_nn']} | {r['states']} | {r['beta']} | {r['gamma']} | {r['window']} | {r['seeds']} | "
                     + " | ".join(cells) + " |")
    if base:
        lines += ["", "## Baselines (reference)", "",
                  "| method | k_nn | " + " | ".join(HEADERS[c] for c in cols) + " |",
                  "|:---|---:|" + "---:|" * len(cols)]
        for r in base:
            lines.append(f"| {r['method']} | {r['k_nn']} | " + " | ".join(_fmt(r.get(c), c) for c in cols) + " |")
    lines += ["", f"Plot: `{Path(png_path).name}`. Every point: `{Path(points_csv_path).name}`.", ""]
    Path(md_path).write_text("\n".join(lines), encoding="utf-8")

    _plot(agg, base, png_path)
    return {"points": len(raw), "settings": len(agg), "baselines": len(base),
            "best": {k: agg[0][k] for k in (*SETTING_KEYS, "mae")} if agg else None}


def _plot(agg: list[dict], base: list[dict], png_path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"k{r['k_nn']} K{r['states']} b{r['beta']} g{r['gamma']} w{r['window']}" for r in agg]
    x = list(range(len(agg)))
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 0.35 * len(agg) + 2.5), 7.5), sharex=True)
    for ax, key, title in ((axes[0], "mae", "MAE (lower is better)"),
                           (axes[1], "within_r", "within-batch Pearson r (higher is better)")):
        y = [r[key] if _finite(r[key]) else float("nan") for r in agg]
        err = [r.get(f"{key}_sd") or 0.0 for r in agg]
        ax.errorbar(x, y, yerr=err, fmt="o", color="C0", capsize=3, label="graphdiff (mean ± sd over seeds)")
        seen = {}
        for r in base:
            v = r.get(key)
            if not _finite(v) or r["method"] in seen:
                continue  # one line per baseline (its first k_nn) keeps the plot readable
            seen[r["method"]] = v
            ax.axhline(v, linestyle="--", linewidth=1, color=f"C{1 + len(seen) % 9}", label=r["method"])
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="best")
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(labels, rotation=75, ha="right", fontsize=7)
    fig.suptitle("graphdiff experiment grid")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def _main(sm) -> None:
    points = list(sm.params.points)
    folders = list(sm.input.points)
    baselines = list(sm.input.baselines) if "baselines" in sm.input.keys() else []
    k_nns = [Path(b).name.removeprefix("baselines_k") for b in baselines]
    with open(sm.log[0], "w", encoding="utf-8") as log:
        res = write_comparison(points, folders, baselines, k_nns, sm.output.md, sm.output.csv, sm.output.points,
                               sm.output.png)
        log.write(json.dumps(res, sort_keys=True) + "\n")


if "snakemake" in globals():
    _main(snakemake)  # noqa: F821 - injected by Snakemake's script directive
