"""Offline counterfactual replay of scheduling decisions on a recorded training log.

A log records, for every step, which prompts were rolled out and how many of their n rollouts
succeeded. Replaying it lets every estimator drive a scheduler's decisions and scores the decisions
against what the log recorded. What it cannot show is how the policy would have changed had it been
trained on other prompts: every outcome comes from the recorded run, so the policy's response to the
choice is out of reach offline. The numbers measure how well each estimator steers a decision toward
groups that carry signal under the recorded policy, nothing more.

**Selection** (``selection_replay``). The log is cut into rounds (``split_rounds``: maximal runs of
steps in which no prompt repeats; for the One-Shot-RLVR log these are exactly its visit rounds). In
each round the round's prompts are shuffled (the same seeded order for every method) and cut into
pools of ``pool_factor * batch_size``; a round's remainder shorter than a full pool is not offered.
For each pool a method picks ``batch_size`` prompts; only the chosen prompts' recorded outcomes of
this round are revealed, and only they update the method's estimator (each (strategy, estimator)
pair runs on its own fresh estimator, since what it sees depends on what it chose). Score: the
effective-group rate, the share of chosen groups with 0 < s < n. References: ``uniform`` (random
choice, no estimator) and ``oracle`` (hindsight: prefers groups whose recorded outcome had signal).
The target rule runs at each value of ``target_explore`` (``decisions.select``'s exploration): the
first is labelled ``target``, the others ``target (explore e)``, the latter only for estimators with a
belief spread (graphdiff, MoPPS; for the others every value ranks alike).

**Allocation** (``allocation_replay``). Every step of the log keeps its recorded batch; a method
predicts the batch, each allocation strategy splits ``budget_per_prompt * |batch|`` rollouts over it
within [min, max], and the score is the expected number of non-degenerate groups,
sum_i 1 - r_i^n_i - (1 - r_i)^n_i, taking each prompt's recorded rate r_i = s_i / n_i as the truth.
The estimators then learn the recorded outcomes (the log has no others), so one pass per estimator
serves every strategy. Reference: ``oracle`` allocates with the recorded rates themselves.

Estimators follow ``evaluation.baselines.OnlineEstimator`` (update, estimates); selection reads
``baselines.belief``: the belief about p (graphdiff: ``Estimator.estimates``' mean and variance, exactly
what `graphdiff select` decides by; MoPPS: its Beta's; others: their p and variance 0, so Thompson sampling
reduces to the target rule for them) and the zero-variance probability (native where the method has one,
else the plug-in p^g + (1 - p)^g); allocation reads the estimates' p.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import DataError, InvalidArgumentError
from ..core import decisions as dec
from .baselines import belief, has_belief, point_estimate
from .replay import check_log

OUT_OF_REACH = ("offline replay: every outcome comes from the recorded run, so the policy's response to "
                "the choice (training on other prompts changes later success rates) is out of reach; the "
                "scores measure how well each estimator steers decisions under the recorded policy")


def split_rounds(step, ids) -> list[np.ndarray]:
    """Row index arrays of the rounds: maximal runs of whole steps in which no prompt appears twice."""
    step = np.asarray(step)
    ids = np.asarray(ids)
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    ends = np.r_[starts[1:], step.size]
    rounds: list[list[int]] = []
    seen: set[int] = set()
    current: list[int] = []
    for a, b in zip(starts, ends):
        batch = [int(i) for i in ids[a:b]]
        if len(set(batch)) != len(batch):
            raise DataError(f"step {step[a]} lists a prompt twice; a round needs each prompt once per step")
        if current and seen.intersection(batch):
            rounds.append(current)
            current, seen = [], set()
        current.extend(range(a, b))
        seen.update(batch)
    if current:
        rounds.append(current)
    return [np.asarray(r, dtype=np.int64) for r in rounds]


def target_label(explore: float, first: bool) -> str:
    return "target" if first else f"target (explore {explore:g})"


# ----------------------------------------------------------------------------------------------------
# selection


@dataclass
class SelectionRun:
    """One (strategy, estimator) replay: per offered pool, the number chosen and how many had signal."""

    strategy: str
    estimator: str
    round_of_pool: np.ndarray
    chosen: np.ndarray  # groups chosen per pool
    effective: np.ndarray  # chosen groups with 0 < s < n per pool
    seconds: float

    def summary(self) -> dict:
        first = self.round_of_pool == 0
        def rate(mask):
            c = int(self.chosen[mask].sum())
            return float(self.effective[mask].sum() / c) if c else None
        return {"strategy": self.strategy, "estimator": self.estimator, "pools": int(self.chosen.size),
                "groups": int(self.chosen.sum()), "effective_groups": int(self.effective.sum()),
                "effective_rate": rate(np.ones_like(first)), "effective_rate_round0": rate(first),
                "effective_rate_later": rate(~first), "seconds": round(self.seconds, 3),
                "effective_per_pool": self.effective.tolist()}  # for paired intervals (same pools for all)


def _pools(rounds, ids, batch_size: int, pool_size: int, seed: int) -> list[tuple[int, np.ndarray]]:
    """(round, row indices of the pool) for every full pool, in replay order (same for every method)."""
    out = []
    for k, rows in enumerate(rounds):
        order = rows[np.random.default_rng([seed, k]).permutation(rows.size)]
        for start in range(0, order.size - pool_size + 1, pool_size):
            out.append((k, order[start:start + pool_size]))
    return out


def selection_replay(step, ids, n, s, factories: dict[str, Callable[[], object]], *, strategies: Sequence[str]
                     = ("target", "thompson", "skip-zero-variance"), batch_size: int = 128,
                     pool_factor: float = 2.0, seed: int = 0, target: float = 0.5,
                     target_explore: Sequence[float] = (dec.TARGET_EXPLORE, 0.0), n_nodes: int | None = None,
                     progress: Callable[[int, int], None] | None = None) -> dict:
    """Replay selection on the log; see the module docstring. ``factories[name]()`` -> a fresh estimator."""
    step, ids, n, s = check_log(step, ids, n, s, n_nodes)
    explores = [dec.check_explore(e) for e in target_explore] or [dec.TARGET_EXPLORE]
    batch_size = dec.check_int(batch_size, "batch size", 1)
    if not pool_factor >= 1:
        raise InvalidArgumentError(f"pool factor must be >= 1, got {pool_factor!r}")
    for st in strategies:
        dec.check_strategy(st, dec.SELECT_STRATEGIES, "selection")
    pool_size = max(batch_size, int(round(pool_factor * batch_size)))
    rounds = split_rounds(step, ids)
    pools = _pools(rounds, ids, batch_size, pool_size, seed)
    if not pools:
        raise DataError(f"no round has {pool_size} prompts: lower the batch size or the pool factor")
    signal = (s > 0) & (s < n)
    runs: list[SelectionRun] = []
    # (strategy, estimator, explore, label, extra): an extra job (the target rule at a further explore
    # value) runs only for an estimator with a belief spread, decided on its first job's instance
    jobs = [("uniform", None, 0.0, "uniform", False), ("oracle", None, 0.0, "oracle", False)]
    for name in factories:
        for st in strategies:
            if st == "target":
                jobs += [(st, name, e, target_label(e, i == 0), i > 0) for i, e in enumerate(explores)]
            elif st != "uniform":
                jobs.append((st, name, explores[0], st, False))
    import time

    spread: dict[str, bool] = {}
    for j, (strategy, name, explore, label, extra) in enumerate(jobs):
        if extra and not spread.get(name, True):
            continue
        t0 = time.perf_counter()
        # a job's random choices (draws, tie-breaks) depend on the job itself, not on which other
        # methods and strategies share the table
        job_seed = zlib.crc32(f"{label}|{name}".encode())
        method = factories[name]() if name is not None else None
        if name is not None:
            spread.setdefault(name, has_belief(method))
        chosen_n = np.zeros(len(pools), dtype=np.int64)
        eff = np.zeros(len(pools), dtype=np.int64)
        for q, (k, rows) in enumerate(pools):
            sub_seed = [seed, q, job_seed]
            if strategy == "uniform":
                pick = np.random.default_rng(sub_seed).choice(rows.size, size=batch_size, replace=False)
            elif strategy == "oracle":
                key = np.where(signal[rows], 0.0, 1.0)  # hindsight: groups that had signal first
                perm = np.random.default_rng(sub_seed).permutation(rows.size)
                pick = perm[np.argsort(key[perm], kind="stable")][:batch_size]
            else:
                g = int(np.median(n[rows]))
                m = belief(method, ids[rows], g)
                pick = dec.select(strategy, batch_size, p=m["mean"], variance=m["variance"],
                                  p_zero_variance=m["p_zero_variance"], target=target, explore=explore,
                                  seed=sub_seed).chosen
            got = rows[pick]
            if method is not None:
                method.update(ids[got].copy(), n[got].copy(), s[got].copy())  # only the chosen are revealed
            chosen_n[q] = got.size
            eff[q] = int(signal[got].sum())
        runs.append(SelectionRun(label, name or "-", np.asarray([k for k, _ in pools]), chosen_n, eff,
                                 time.perf_counter() - t0))
        if progress is not None:
            progress(j + 1, len(jobs))
    summaries = [r.summary() for r in runs]
    base = summaries[0]["effective_rate"]
    for row in summaries:
        row["vs_uniform"] = None if row["effective_rate"] is None or not base else row["effective_rate"] / base
    return {"kind": "selection", "batch_size": batch_size, "pool_size": pool_size, "seed": seed,
            "target": target, "target_explore": explores, "rounds": len(rounds), "pools": len(pools),
            "offered_share": float(sum(r.size for _, r in pools) / step.size),
            "note": OUT_OF_REACH, "results": summaries}


# ----------------------------------------------------------------------------------------------------
# allocation


def allocation_replay(step, ids, n, s, factories: dict[str, Callable[[], object]], *,
                      strategies: Sequence[str] = ("uniform", "variance", "vip"), budget_per_prompt: int = 8,
                      min_count: int = 2, max_count: int = 32, vip_gamma: float = 0.0,
                      n_nodes: int | None = None, predictions: dict[str, np.ndarray] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> dict:
    """Replay allocation on the log; see the module docstring.

    ``predictions``: {name: each row's prediction made before its step's outcomes} for estimators already
    replayed on this log in the same order (``evaluation.replay.replay``: predict a step's batch, then learn its
    outcomes), which is exactly this replay's pass; those estimators are not replayed a second time."""
    step, ids, n, s = check_log(step, ids, n, s, n_nodes)
    for st in strategies:
        dec.check_strategy(st, dec.ALLOCATE_STRATEGIES, "allocation")
    rate = s / n
    starts = np.flatnonzero(np.r_[True, step[1:] != step[:-1]])
    ends = np.r_[starts[1:], step.size]
    dec.check_budget(int((ends - starts).min()), budget_per_prompt * int((ends - starts).min()), min_count, max_count)

    def score(p, a, b):
        budget = budget_per_prompt * (b - a)
        return {st: float(dec.nondegenerate_probability(rate[a:b], dec.allocate(
            st, p, budget, min_count, max_count, vip_gamma=vip_gamma)).sum()) for st in strategies}

    # per step, so that a paired interval over steps can be drawn (the same batches for every method)
    per_step: dict[tuple[str, str], list[float]] = {}
    oracle: dict[str, list[float]] = {st: [] for st in strategies}
    for a, b in zip(starts, ends):
        for st, v in score(rate[a:b], a, b).items():
            oracle[st].append(v)
    names = list(factories)
    known = predictions or {}
    for j, name in enumerate(names):
        given = known.get(name)
        if given is not None and np.shape(given) != step.shape:
            raise InvalidArgumentError(f"predictions of {name!r} have {np.shape(given)} rows, the log {step.size}")
        method = factories[name]() if given is None else None
        acc: dict[str, list[float]] = {st: [] for st in strategies}
        for a, b in zip(starts, ends):
            if method is None:
                p = np.clip(np.asarray(given[a:b], dtype=np.float64), 0.0, 1.0)
            else:
                p = np.clip(point_estimate(method, ids[a:b].copy()), 0.0, 1.0)
            for st, v in score(p, a, b).items():
                acc[st].append(v)
            if method is not None:
                method.update(ids[a:b].copy(), n[a:b].copy(), s[a:b].copy())
        for st in strategies:
            per_step[(name, st)] = acc[st]
        if progress is not None:
            progress(j + 1, len(names))
    n_steps = starts.size
    uniform_total = sum(per_step[(names[0], "uniform")]) if names and "uniform" in strategies else None
    results = []
    for (name, st), v in [*per_step.items(), *((("oracle(recorded rate)", st), v) for st, v in oracle.items())]:
        total = sum(v)
        results.append({"estimator": name, "strategy": st, "expected_nondegenerate_per_step": total / n_steps,
                        "vs_uniform": (total / uniform_total) if uniform_total else None,
                        "per_step": v})  # for paired intervals over steps
    return {"kind": "allocation", "steps": int(n_steps), "budget_per_prompt": budget_per_prompt,
            "min": min_count, "max": max_count, "vip_gamma": vip_gamma,
            "truth": "each prompt's recorded success rate s/n at that step",
            "note": OUT_OF_REACH, "results": results}
