"""Accuracy, ranking and calibration metrics of difficulty estimates replayed over a training log.

A row is one prompt at one step: prediction p (made before the step), n rollouts, s successes,
observed rate r = s / n. Rows of one step form its batch. Definitions:

* MAE: mean over rows of |p - r| (sample-level, the paper's Table 2).
* batch r: Pearson correlation, across steps, of the batch-mean prediction with the batch-mean observed
  rate (the paper's batch-level r).
* within-batch Pearson / Spearman: the correlation of p with r inside each batch, averaged over
  batches. A batch whose observed rates are all equal (or that has fewer than 2 rows) carries no
  ranking information and is skipped for every method alike; a method whose predictions inside a
  batch are all equal ranks nothing and scores 0 there (it is not skipped, which would reward it).
* Brier: the Brier score of p against every binary rollout outcome,
  sum_rows [s (1 - p)^2 + (n - s) p^2] / sum_rows n.
* ECE: expected calibration error over ``N_BINS`` = 10 equal-width bins of p on [0, 1] (p = 1 in the
  last bin): sum_b (rows_b / rows) |mean p_b - mean r_b|. ``reliability`` gives the per-bin data.
* AUROC of a zero-variance score: how well the score ranks groups that came out all-correct or
  all-wrong (s in {0, n}) above the others; Mann-Whitney with average ranks for ties.
* zero-variance ECE: the ECE above of the same score read as a probability, P(all-same group), against
  the observed outcome (1 where the group came out all-correct or all-wrong, else 0): whether the
  probability a decision reads (``p_zero_variance``) is calibrated, not only whether it ranks.

Everything is computed per phase (``PHASES``: early / middle / last third of the steps, and full) and
per split (all rows, prompts seen before the step, prompts never seen before).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

from ..errors import InvalidArgumentError

N_BINS = 10
PHASES = ("early", "middle", "last", "full")
SPLITS = ("all", "seen", "unseen")
METRICS = ("mae", "batch_r", "within_r", "within_spearman", "brier", "ece", "auroc", "zero_variance_ece")
# direction of "better" for each metric (used to bold the best value of a column)
HIGHER_IS_BETTER = {"mae": False, "batch_r": True, "within_r": True, "within_spearman": True,
                    "brier": False, "ece": False, "auroc": True, "zero_variance_ece": False,
                    "seconds_per_step": False}


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def mae(p, r) -> float:
    """Mean absolute error over rows; NaN for no rows."""
    p, r = _f(p), _f(r)
    return float(np.mean(np.abs(p - r))) if p.size else float("nan")


def pearson(x, y) -> float:
    """Pearson r; NaN when fewer than 2 points or either side is constant."""
    x, y = _f(x), _f(y)
    if x.size < 2:
        return float("nan")
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy = float(dx @ dx), float(dy @ dy)
    if sxx <= 0 or syy <= 0:
        return float("nan")
    return float(np.clip((dx @ dy) / np.sqrt(sxx * syy), -1.0, 1.0))


def spearman(x, y) -> float:
    """Spearman rho = Pearson r of average ranks; NaN as for ``pearson``."""
    x, y = _f(x), _f(y)
    if x.size < 2:
        return float("nan")
    return pearson(rankdata(x), rankdata(y))


def _batch_starts(step: np.ndarray) -> np.ndarray:
    """Start offsets of runs of equal ``step`` values (rows must be grouped by step)."""
    step = np.asarray(step)
    if step.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, step[1:] != step[:-1]])


def batch_means(step, p, r) -> tuple[np.ndarray, np.ndarray]:
    """(batch-mean prediction, batch-mean observed rate), one per step, rows grouped by step."""
    step, p, r = np.asarray(step), _f(p), _f(r)
    starts = _batch_starts(step)
    if starts.size == 0:
        return np.zeros(0), np.zeros(0)
    counts = np.diff(np.r_[starts, step.size])
    return np.add.reduceat(p, starts) / counts, np.add.reduceat(r, starts) / counts


def batch_pearson(step, p, r) -> float:
    """The paper's batch-level r: Pearson of batch-mean p with batch-mean r across steps."""
    bp, br = batch_means(step, p, r)
    return pearson(bp, br)


def within_batch_scores(step, p, r) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per batch (one per distinct step, in order): (Pearson, Spearman, scored). A batch with all-equal
    observed rates or fewer than 2 rows is not scored (NaN); constant predictions score 0 there."""
    step, p, r = np.asarray(step), _f(p), _f(r)
    starts = _batch_starts(step)
    ends = np.r_[starts[1:], step.size] if starts.size else starts
    pr, sr = np.full(starts.size, np.nan), np.full(starts.size, np.nan)
    for j, (a, b) in enumerate(zip(starts, ends)):
        rb, pb = r[a:b], p[a:b]
        if b - a < 2 or np.all(rb == rb[0]):
            continue
        if np.all(pb == pb[0]):
            pr[j] = sr[j] = 0.0
            continue
        pr[j], sr[j] = pearson(pb, rb), spearman(pb, rb)
    return pr, sr, ~np.isnan(pr)


def within_batch(step, p, r) -> dict:
    """Within-batch Pearson and Spearman averaged over informative batches.

    Returns {"pearson", "spearman", "batches"}: a batch with all-equal observed rates or fewer than 2
    rows is skipped; constant predictions in a batch score 0 there. NaN when no batch is informative.
    """
    pr, sr, ok = within_batch_scores(step, p, r)
    if not ok.any():
        return {"pearson": float("nan"), "spearman": float("nan"), "batches": 0}
    return {"pearson": float(np.mean(pr[ok])), "spearman": float(np.mean(sr[ok])), "batches": int(ok.sum())}


def ratio_bootstrap(num, den, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                    block: int | None = None) -> dict:
    """Confidence interval of sum(num) / sum(den) over units in order (steps, pools), by a circular block
    bootstrap: blocks of ``block`` consecutive units (default ceil(units^(1/3)), so that the correlation of
    neighbouring steps stays inside a block; wrapping around the end, so the first and last steps are drawn
    as often as the others) are drawn with replacement and cut to exactly the number of units.

    For a paired difference, num holds each unit's difference (e.g. the summed |p_a - r| - |p_b - r| of a
    step's rows) and den its weight (the step's rows). Returns {"estimate", "lo", "hi", "level",
    "units", "weighted_units" (units with a non-zero weight), "block", "n_boot"}; NaN bounds for fewer than
    2 units with weight.
    """
    num, den = _f(num), _f(den)
    if num.shape != den.shape or num.ndim != 1:
        raise InvalidArgumentError("num and den must be 1-d arrays of one length")
    units = int(num.size)
    total = den.sum()
    est = float(num.sum() / total) if total > 0 else float("nan")
    block = max(1, int(np.ceil(units ** (1 / 3)))) if block is None else int(block)
    weighted = int(np.count_nonzero(den))
    out = {"estimate": est, "lo": float("nan"), "hi": float("nan"), "level": level, "units": units,
           "weighted_units": weighted, "block": block, "n_boot": int(n_boot)}
    if units < 2 or weighted < 2:
        return out
    block = min(block, units)
    rng = np.random.default_rng(seed)
    blocks = -(-units // block)
    offsets = np.arange(block, dtype=np.int64)
    sn, sd = np.empty(int(n_boot)), np.empty(int(n_boot))
    for lo in range(0, int(n_boot), 256):  # in chunks: the index matrix is chunk x units
        m = min(256, int(n_boot) - lo)
        starts = rng.integers(0, units, size=(m, blocks))
        idx = ((starts[:, :, None] + offsets) % units).reshape(m, -1)[:, :units]
        sn[lo:lo + m], sd[lo:lo + m] = num[idx].sum(axis=1), den[idx].sum(axis=1)
    stats = sn[sd > 0] / sd[sd > 0]
    a = (1.0 - level) / 2.0
    out["lo"], out["hi"] = (float(v) for v in np.quantile(stats, [a, 1.0 - a]))
    return out


def mae_difference(step, p_a, p_b, r, **bootstrap) -> dict:
    """MAE(a) - MAE(b) on the same rows (grouped by step; negative: a is closer), with its interval from
    ``ratio_bootstrap`` over steps."""
    step, p_a, p_b, r = np.asarray(step), _f(p_a), _f(p_b), _f(r)
    starts = _batch_starts(step)
    rows = np.diff(np.r_[starts, step.size]).astype(np.float64)
    gap = np.add.reduceat(np.abs(p_a - r) - np.abs(p_b - r), starts) if starts.size else np.zeros(0)
    return ratio_bootstrap(gap, rows, **bootstrap)


def within_r_difference(step, p_a, p_b, r, **bootstrap) -> dict:
    """Mean over scored batches of a's within-batch Pearson r minus b's (positive: a ranks better), with its
    interval from ``ratio_bootstrap`` over steps."""
    ra, _, ok = within_batch_scores(step, p_a, r)
    rb, _, _ = within_batch_scores(step, p_b, r)  # the same batches are scored: they depend on r only
    return ratio_bootstrap(np.where(ok, ra - rb, 0.0), ok.astype(np.float64), **bootstrap)


def brier(p, n, s) -> float:
    """Brier score against every rollout: sum [s (1 - p)^2 + (n - s) p^2] / sum n."""
    p, n, s = _f(p), _f(n), _f(s)
    total = n.sum()
    if total <= 0:
        return float("nan")
    return float(np.sum(s * (1.0 - p) ** 2 + (n - s) * p ** 2) / total)


def reliability(p, r, n_bins: int = N_BINS) -> dict:
    """Reliability-diagram data over equal-width bins of p on [0, 1] (p = 1 falls in the last bin).

    Returns {"edges" (n_bins + 1), "count", "mean_pred", "mean_obs" (NaN for empty bins)}.
    """
    if n_bins < 1:
        raise InvalidArgumentError(f"the number of bins must be >= 1, got {n_bins}")
    p, r = _f(p), _f(r)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.floor(np.clip(p, 0.0, 1.0) * n_bins).astype(np.int64), 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    sp = np.bincount(idx, weights=p, minlength=n_bins)
    sr = np.bincount(idx, weights=r, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mp = np.where(count > 0, sp / np.maximum(count, 1), np.nan)
        mr = np.where(count > 0, sr / np.maximum(count, 1), np.nan)
    return {"edges": edges, "count": count, "mean_pred": mp, "mean_obs": mr}


def ece(p, r, n_bins: int = N_BINS) -> float:
    """Expected calibration error: sum over bins of (rows in bin / rows) |mean p - mean r|."""
    rel = reliability(p, r, n_bins)
    total = rel["count"].sum()
    if total == 0:
        return float("nan")
    ok = rel["count"] > 0
    gap = np.abs(rel["mean_pred"][ok] - rel["mean_obs"][ok])
    return float(np.sum(rel["count"][ok] * gap) / total)


def auroc(score, positive) -> float:
    """Area under the ROC curve of ``score`` for the boolean labels ``positive``.

    Mann-Whitney U / (n_pos n_neg) with average ranks, so tied scores count one half. NaN when either
    class is empty.
    """
    score = _f(score)
    positive = np.asarray(positive, dtype=bool)
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(score)
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def zero_variance_outcome(n, s) -> np.ndarray:
    """True where a group came out all-correct or all-wrong (s = 0 or s = n)."""
    n, s = np.asarray(n), np.asarray(s)
    return (s == 0) | (s == n)


def zero_variance_ece(score, n, s, n_bins: int = N_BINS) -> float:
    """ECE of P(all-same group) ``score`` against the outcome: 1 where s = 0 or s = n, else 0 (``ece``)."""
    return ece(score, zero_variance_outcome(n, s).astype(np.float64), n_bins)


def phase_of_steps(step) -> dict[str, np.ndarray]:
    """Boolean row masks per phase: the distinct steps, in order, split into thirds (np.array_split
    sizes: the first phases get the extra steps), plus "full"."""
    step = np.asarray(step)
    uniq = np.unique(step)
    parts = np.array_split(uniq, 3)
    masks = {name: np.isin(step, part) for name, part in zip(PHASES[:3], parts)}
    masks["full"] = np.ones(step.size, dtype=bool)
    return masks


def score_rows(step, p, n, s, zero_var=None) -> dict:
    """Every metric on one set of rows (grouped by step). Includes row and batch counts."""
    step, p, n, s = np.asarray(step), _f(p), _f(n), _f(s)
    out = {"rows": int(p.size), "steps": int(np.unique(step).size)}
    if p.size == 0:
        out.update({m: float("nan") for m in METRICS})
        out["within_batches"] = 0
        return out
    r = s / n
    wb = within_batch(step, p, r)
    out.update({
        "mae": mae(p, r),
        "batch_r": batch_pearson(step, p, r),
        "within_r": wb["pearson"],
        "within_spearman": wb["spearman"],
        "within_batches": wb["batches"],
        "brier": brier(p, n, s),
        "ece": ece(p, r),
        "auroc": auroc(zero_var, zero_variance_outcome(n, s)) if zero_var is not None else float("nan"),
        "zero_variance_ece": zero_variance_ece(zero_var, n, s) if zero_var is not None else float("nan"),
    })
    return out


def evaluate_predictions(step, p, n, s, seen, zero_var=None, seconds_per_step=None) -> dict:
    """metrics[phase][split] = ``score_rows`` for one method; rows grouped by step, in step order.

    ``seen`` flags rows whose prompt was observed at an earlier step. ``seconds_per_step`` (one value
    per distinct step, in order) adds "seconds_per_step" (mean over the phase's steps) to every split.
    """
    step = np.asarray(step)
    seen = np.asarray(seen, dtype=bool)
    zv = None if zero_var is None else _f(zero_var)
    phases = phase_of_steps(step)
    uniq = np.unique(step)
    result = {}
    for phase, pmask in phases.items():
        result[phase] = {}
        for split in SPLITS:
            mask = pmask if split == "all" else pmask & (seen if split == "seen" else ~seen)
            row = score_rows(step[mask], _f(p)[mask], _f(n)[mask], _f(s)[mask],
                             None if zv is None else zv[mask])
            if seconds_per_step is not None:
                sec = _f(seconds_per_step)
                in_phase = np.isin(uniq, np.unique(step[pmask]))
                row["seconds_per_step"] = float(sec[in_phase].mean()) if in_phase.any() else float("nan")
            result[phase][split] = row
    return result


def evaluate_replay(result) -> dict:
    """Every metric for every method of a ``replay.ReplayResult``, plus per-step series for plots.

    Returns {"methods": {name: {"oracle", "zero_variance_source", "phases": metrics[phase][split],
    "reliability": reliability data on all rows}}, "series": {"step", "observed", name: {"predicted",
    "mae"}}, "n_bins": N_BINS, "phases": {phase: [first step, last step]}}.
    """
    r = result.rate
    methods = {}
    bm_obs = batch_means(result.step, r, r)[1]
    series = {"step": np.unique(result.step), "observed": bm_obs}
    for name in result.methods:
        p = result.predictions[name]
        methods[name] = {
            "oracle": bool(result.oracle[name]),
            "zero_variance_source": result.zero_variance_source[name],
            "phases": evaluate_predictions(result.step, p, result.n, result.s, result.seen,
                                           result.zero_variance[name], result.seconds[name]),
            "reliability": reliability(p, r),
        }
        bp, _ = batch_means(result.step, p, r)
        bmae, _ = batch_means(result.step, np.abs(p - r), r)
        series[name] = {"predicted": bp, "mae": bmae}
    phases = {}
    for phase, mask in phase_of_steps(result.step).items():
        st = np.asarray(result.step)[mask]
        phases[phase] = [int(st.min()), int(st.max())] if st.size else [None, None]
    return {"methods": methods, "series": series, "n_bins": N_BINS, "phases": phases}
