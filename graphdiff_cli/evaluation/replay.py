"""Replay a training log through online estimators, with no look-ahead.

For each step, in order: every method estimates the step's batch (``estimates(ids, group_size)`` of
``baselines.OnlineEstimator``: its p and, where it has one, its zero-variance probability) BEFORE the
batch's outcomes are revealed; then every method is updated with them. Oracles
(``baselines.OracleEstimator``) are the one exception, by design and by name: they are handed the batch's
outcomes through ``predict_with_outcomes``. Ordinary estimators are only ever called with ids before their
update, so they cannot see a batch's outcomes in its own predictions.

Zero-variance scores: a method's own "p_zero_variance" where its estimates have one, else the plug-in
p^n + (1 - p)^n of its p (the source is recorded per method). The group size is each row's n, known to the
trainer before it rolls out: the batch is estimated once per group size in it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

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


def _estimate(name: str, method, ids: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """(p, zero-variance probability, its source) of an online estimator for one batch, one ``estimates``
    call per group size in it."""
    p, zv, source = np.empty(ids.size), np.empty(ids.size), "native"
    for g in np.unique(n):
        rows = n == g
        est = method.estimates(ids[rows], int(g))
        pg = np.asarray(est["p"], dtype=np.float64)
        if pg.shape != (int(rows.sum()),):
            raise DataError(f"method {name!r} returned {pg.shape} predictions for {int(rows.sum())} prompts")
        p[rows] = pg
        if "p_zero_variance" in est:
            zv[rows] = np.asarray(est["p_zero_variance"], dtype=np.float64)
        else:
            zv[rows], source = zero_variance_point(pg, int(g)), "plug-in"
    return p, zv, source


def named(methods) -> dict:
    """{name: method}: ``methods`` as a mapping of names to estimators, or a sequence of estimators each with
    its ``name``; two of one name are refused."""
    if isinstance(methods, Mapping):
        return dict(methods)
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        dup = next(x for x in names if names.count(x) > 1)
        raise InvalidArgumentError(f"two methods are named {dup!r}; method names must be unique")
    return dict(zip(names, methods))


def replay(step, ids, n, s, methods: Mapping | Sequence, n_nodes: int | None = None,
           progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Replay the log (step, ids, n, s) through ``methods`` (OnlineEstimator or OracleEstimator): a mapping
    {name: estimator} (graphdiff's ``Estimator`` as it is) or a sequence of estimators with a ``name``.

    Rows of one step form its batch; steps must be non-decreasing. See the module docstring for the
    order of calls. ``progress(done, total)`` is called after every step.
    """
    step, ids, n, s = check_log(step, ids, n, s, n_nodes)
    by_name = named(methods)
    if not by_name:
        raise InvalidArgumentError("replay needs at least one method")
    names = list(by_name)
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    ends = np.r_[starts[1:], step.size]
    n_steps = starts.size
    res = ReplayResult(step=step, ids=ids, n=n, s=s, seen=np.zeros(step.size, dtype=bool),
                       steps=step[starts], methods=names)
    for name, m in by_name.items():
        res.predictions[name] = np.full(step.size, np.nan)
        res.zero_variance[name] = np.full(step.size, np.nan)
        res.oracle[name] = bool(getattr(m, "oracle", False))
        res.seconds[name] = np.zeros(n_steps)
        res.zero_variance_source[name] = "plug-in"
    observed = set()
    for k, (a, b) in enumerate(zip(starts, ends)):
        bid, bn, bs = ids[a:b], n[a:b], s[a:b]
        res.seen[a:b] = [int(i) in observed for i in bid]
        for name, m in by_name.items():
            t0 = time.perf_counter()
            if res.oracle[name]:
                p = np.asarray(m.predict_with_outcomes(bid.copy(), bn.copy(), bs.copy()), dtype=np.float64)
                if p.shape != (b - a,):
                    raise DataError(f"method {name!r} returned {p.shape} predictions for a batch of {b - a}")
                zv, src = zero_variance_point(p, bn), "plug-in"
            else:
                p, zv, src = _estimate(name, m, bid.copy(), bn)
            if not np.all(np.isfinite(p)) or (p < 0).any() or (p > 1).any():
                raise DataError(f"method {name!r} predicted values outside [0, 1] at step {step[a]}")
            t1 = time.perf_counter()
            res.predictions[name][a:b] = p
            res.zero_variance[name][a:b] = zv
            res.zero_variance_source[name] = src
            res.seconds[name][k] = t1 - t0
        # outcomes revealed only now, to every method alike
        for name, m in by_name.items():
            t0 = time.perf_counter()
            m.update(bid.copy(), bn.copy(), bs.copy())
            res.seconds[name][k] += time.perf_counter() - t0
        observed.update(int(i) for i in bid)
        if progress is not None:
            progress(k + 1, n_steps)
    return res
