"""The static cold-start protocol on a pool of prompts with known success rates: reveal a random
part of the pool, hand the revealed outcomes to each estimator as a trainer would, then predict every prompt
that was not revealed and score the predictions against its known rate. Pure numpy: no files.

Protocol (``reveal`` then ``score_cold_start``):

1. A seeded random subset of round(fraction x N) prompts is revealed (``numpy.random.default_rng(seed)``:
   first the permutation, then the outcomes).
2. Each revealed prompt gets the outcomes of ``rollouts`` rollouts, s ~ Binomial(rollouts, rate_i), rate_i
   the prompt's known rate (for DeepScaleR s / 128 of Qwen2.5-Math-7B).
3. The revealed prompts are fed to every estimator in reveal order, ``batch`` prompts per step (steps 1, 2,
   ...; the last step may be short), one ``update(ids, n, s)`` per step, so online choices (graphdiff's
   kappa, label-propagation weight, ...) act as they would in training.
4. Every prompt not revealed is estimated in one ``estimates(hidden, ...)`` call after the last step and scored
   by Pearson r and MAE against its known rate. A method whose predictions are all equal ranks nothing and
   scores r = 0 (as ``metrics.within_batch`` scores a constant batch), not NaN.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import DataError, InvalidArgumentError
from .baselines import point_estimate
from .metrics import mae, pearson


@dataclass
class Reveal:
    """One draw of the protocol. ``revealed``: node indices in the order they are fed; ``hidden``: the
    others, sorted. The feed log, one row per revealed prompt: step (1-based), id, n, s."""

    revealed: np.ndarray
    hidden: np.ndarray
    step: np.ndarray
    id: np.ndarray
    n: np.ndarray
    s: np.ndarray
    fraction: float
    seed: int

    @property
    def steps(self) -> int:
        return int(self.step.max()) if self.step.size else 0


def reveal(rate, fraction: float, *, seed: int, rollouts: int = 8, batch: int = 256) -> Reveal:
    """Draw the revealed subset and its outcomes (steps 1-2 of the protocol) for prompts whose known success
    rates are ``rate`` (node order)."""
    rate = np.asarray(rate, dtype=np.float64)
    if rate.ndim != 1 or rate.size < 2:
        raise DataError(f"the pool needs at least 2 known rates, got shape {rate.shape}")
    if not np.all((rate >= 0) & (rate <= 1)):
        raise DataError("known rates must lie in [0, 1]")
    if not 0 < fraction < 1:
        raise InvalidArgumentError(f"the revealed fraction must lie in (0, 1), got {fraction!r}")
    for name, v in (("rollouts", rollouts), ("batch", batch)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise InvalidArgumentError(f"{name} must be a positive integer, got {v!r}")
    n_nodes = rate.size
    m = int(round(fraction * n_nodes))
    if not 1 <= m < n_nodes:
        raise InvalidArgumentError(f"revealing {fraction:g} of {n_nodes} prompts leaves {m} revealed; "
                                   "need at least one revealed and one hidden")
    rng = np.random.default_rng(int(seed))
    order = rng.permutation(n_nodes)
    revealed = order[:m].astype(np.int64)
    s = rng.binomial(int(rollouts), rate[revealed]).astype(np.int64)
    return Reveal(revealed=revealed, hidden=np.sort(order[m:]).astype(np.int64),
                  step=(np.arange(m) // int(batch) + 1).astype(np.int64), id=revealed,
                  n=np.full(m, int(rollouts), dtype=np.int64), s=s, fraction=float(fraction), seed=int(seed))


def feed(methods, plan: Reveal) -> dict[str, float]:
    """Step 3: every method updated with the plan's steps in order; returns each method's seconds."""
    seconds = {m.name: 0.0 for m in methods}
    starts = np.flatnonzero(np.r_[True, plan.step[1:] != plan.step[:-1]])
    for a, b in zip(starts, np.r_[starts[1:], plan.step.size]):
        for m in methods:
            t0 = time.perf_counter()
            m.update(plan.id[a:b].copy(), plan.n[a:b].copy(), plan.s[a:b].copy())
            seconds[m.name] += time.perf_counter() - t0
    return seconds


def score_cold_start(methods, plan: Reveal, rate) -> dict[str, dict]:
    """Steps 3-4 for fresh ``methods`` (``baselines.OnlineEstimator``s, each with its ``name``): {name: {"pearson",
    "mae", "update_seconds", "predict_seconds", "hidden", "predictions"}}."""
    rate = np.asarray(rate, dtype=np.float64)
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise InvalidArgumentError("method names must be unique")
    upd = feed(methods, plan)
    truth = rate[plan.hidden]
    out = {}
    for m in methods:
        t0 = time.perf_counter()
        p = point_estimate(m, plan.hidden.copy())
        sec = time.perf_counter() - t0
        if p.shape != plan.hidden.shape or not np.all(np.isfinite(p)):
            raise DataError(f"method {m.name!r} returned {p.shape} predictions (or non-finite ones) for "
                            f"{plan.hidden.size} hidden prompts")
        r = 0.0 if np.all(p == p[0]) else pearson(p, truth)
        out[m.name] = {"pearson": r, "mae": mae(p, truth), "update_seconds": upd[m.name], "predict_seconds": sec,
                       "hidden": int(plan.hidden.size), "predictions": p}
    return out


def t_interval(values, level: float = 0.95) -> dict:
    """Mean of per-draw figures with its Student-t interval (NaN bounds for fewer than 2 draws)."""
    from scipy.stats import t as student

    v = np.asarray(values, dtype=np.float64)
    out = {"mean": float(v.mean()) if v.size else float("nan"), "lo": float("nan"), "hi": float("nan"),
           "draws": int(v.size), "level": level}
    if v.size >= 2:
        half = float(student.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
        out["lo"], out["hi"] = out["mean"] - half, out["mean"] + half
    return out
