"""Replay a training log through online estimators, with no look-ahead.

For each step, in order: every method predicts the step's batch (and, where it has one, gives its
zero-variance score) BEFORE the batch's outcomes are revealed; then every method is updated with them.
Oracles (``baselines.OracleEstimator``) are the one exception, by design and by name: they are handed
the batch's outcomes through ``predict_with_outcomes``. Ordinary estimators are only ever called with
ids before their update, so they cannot see a batch's outcomes in its own predictions.

Zero-variance scores: a method's own ``zero_variance(ids, group_size)`` where it has one, else the
plug-in p^n + (1 - p)^n of its prediction (the source is recorded per method). The group size is each
row's n, known to the trainer before it rolls out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..errors import DataError, InvalidArgumentError
from ..core.beta import zero_variance_point


@dataclass
class ReplayResult:
    """Tidy replay output: one entry per log row (in log order) and one per step.

    Row arrays: step, ids, n, s, rate (= s / n), seen (prompt observed at an earlier step). Per method
    (dict keyed by name, in ``methods`` order): predictions, zero_variance (per row), oracle (bool),
    zero_variance_source ("native" or "plug-in"), seconds (predict + update time per step, one per
    distinct step). ``steps`` lists the distinct steps in order.
    """

    step: np.ndarray
    ids: np.ndarray
    n: np.ndarray
    s: np.ndarray
    seen: np.ndarray
    steps: np.ndarray
    methods: list[str]
    predictions: dict[str, np.ndarray] = field(default_factory=dict)
    zero_variance: dict[str, np.ndarray] = field(default_factory=dict)
    zero_variance_source: dict[str, str] = field(default_factory=dict)
    oracle: dict[str, bool] = field(default_factory=dict)
    seconds: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def rate(self) -> np.ndarray:
        return self.s / self.n

    @property
    def n_steps(self) -> int:
        return int(self.steps.size)


def check_log(step, ids, n, s, n_nodes: int | None = None) -> tuple[np.ndarray, ...]:
    """Validate a log (int arrays of one length, steps non-decreasing, 0 <= s <= n, n >= 1)."""
    arrays = []
    for name, x in (("step", step), ("id", ids), ("n", n), ("s", s)):
        a = np.asarray(x)
        if a.ndim != 1:
            raise DataError(f"log column {name} must be 1-D, got shape {a.shape}")
        if a.size and a.dtype.kind not in "iu":
            if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.round(a)):
                a = a.astype(np.int64)
            else:
                raise DataError(f"log column {name} must hold integers, got dtype {a.dtype}")
        arrays.append(a.astype(np.int64))
    step, ids, n, s = arrays
    if not (step.size == ids.size == n.size == s.size):
        raise DataError("log columns step, id, n, s must have the same length")
    if step.size == 0:
        raise DataError("the log has no rows")
    if (np.diff(step) < 0).any():
        i = int(np.flatnonzero(np.diff(step) < 0)[0]) + 1
        raise DataError(f"log row {i}: step {step[i]} comes after step {step[i - 1]}; rows must be in step order")
    if (n < 1).any():
        i = int(np.flatnonzero(n < 1)[0])
        raise DataError(f"log row {i}: n = {n[i]}; every row needs at least one rollout")
    if (s < 0).any() or (s > n).any():
        i = int(np.flatnonzero((s < 0) | (s > n))[0])
        raise DataError(f"log row {i}: s = {s[i]} is outside [0, n = {n[i]}]")
    if (ids < 0).any() or (n_nodes is not None and (ids >= n_nodes).any()):
        i = int(np.flatnonzero((ids < 0) | ((ids >= n_nodes) if n_nodes is not None else False))[0])
        raise DataError(f"log row {i}: id {ids[i]} is not a node index in [0, {n_nodes})")
    return step, ids, n, s


def _zero_variance(method, ids: np.ndarray, p: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, str]:
    fn = getattr(method, "zero_variance", None)
    if fn is None:
        return zero_variance_point(p, n), "plug-in"
    out = np.empty(ids.size)
    for g in np.unique(n):  # one call per group size in the batch
        rows = n == g
        out[rows] = np.asarray(fn(ids[rows], int(g)), dtype=np.float64)
    return out, "native"


def replay(step, ids, n, s, methods: Sequence, n_nodes: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Replay the log (step, ids, n, s) through ``methods`` (OnlineEstimator or OracleEstimator).

    Rows of one step form its batch; steps must be non-decreasing. See the module docstring for the
    order of calls. ``progress(done, total)`` is called after every step.
    """
    step, ids, n, s = check_log(step, ids, n, s, n_nodes)
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise InvalidArgumentError(f"two methods are named {dup!r}; method names must be unique")
    if not methods:
        raise InvalidArgumentError("replay needs at least one method")
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    ends = np.r_[starts[1:], step.size]
    n_steps = starts.size
    res = ReplayResult(step=step, ids=ids, n=n, s=s, seen=np.zeros(step.size, dtype=bool),
                       steps=step[starts], methods=names)
    for m in methods:
        res.predictions[m.name] = np.full(step.size, np.nan)
        res.zero_variance[m.name] = np.full(step.size, np.nan)
        res.oracle[m.name] = bool(getattr(m, "oracle", False))
        res.seconds[m.name] = np.zeros(n_steps)
        res.zero_variance_source[m.name] = "plug-in"
    observed = set()
    for k, (a, b) in enumerate(zip(starts, ends)):
        bid, bn, bs = ids[a:b], n[a:b], s[a:b]
        res.seen[a:b] = [int(i) in observed for i in bid]
        for m in methods:
            t0 = time.perf_counter()
            if res.oracle[m.name]:
                p = m.predict_with_outcomes(bid.copy(), bn.copy(), bs.copy())
            else:
                p = m.predict(bid.copy())
            p = np.asarray(p, dtype=np.float64)
            if p.shape != (b - a,):
                raise DataError(f"method {m.name!r} returned {p.shape} predictions for a batch of {b - a}")
            if not np.all(np.isfinite(p)) or (p < 0).any() or (p > 1).any():
                raise DataError(f"method {m.name!r} predicted values outside [0, 1] at step {step[a]}")
            zv, src = _zero_variance(m, bid.copy(), p, bn)
            t1 = time.perf_counter()
            res.predictions[m.name][a:b] = p
            res.zero_variance[m.name][a:b] = zv
            res.zero_variance_source[m.name] = src
            res.seconds[m.name][k] = t1 - t0
        # outcomes revealed only now, to every method alike
        for m in methods:
            t0 = time.perf_counter()
            m.update(bid.copy(), bn.copy(), bs.copy())
            res.seconds[m.name][k] += time.perf_counter() - t0
        observed.update(int(i) for i in bid)
        if progress is not None:
            progress(k + 1, n_steps)
    return res
