"""Scheduler x estimator pairs for the closed-loop benchmark (numpy only, no file I/O).

A ``Belief`` is an online estimator (``evaluation.baselines.OnlineEstimator``, the protocol of graphdiff's
``Estimator`` and the peers) seen as a scheduler reads it: ``beliefs(nodes, group_size)`` -> ``{"p", "mean",
"variance", "p_zero_variance"}`` (``evaluation.baselines.belief``) and ``update(nodes, n, s)``. The natives are
the peers of ``graphdiff_cli.evaluation.baselines`` (MoPPS, GRESO, per-prompt history); ``graphdiff_belief``
takes graphdiff's ``Estimator`` as it is.

A ``Scheduler`` turns beliefs into one step's plan: a list of ``(node, units)`` - the prompts to roll
out and how many groups of the trainer's fixed group size each gets - by a rule of
``graphdiff_cli.core.decisions``:

* ``uniform``   - B prompts drawn uniformly from the training pool (one group each);
* ``ds``        - dynamic sampling as DAPO defines it, run by the product's TRL path
  (``GraphdiffTRL(..., dynamic_sampling=...)``, ``graphdiff_cli.integrations.dynamic_sampling``): generation
  rounds of B prompts until B groups with 0 < s < n are kept (a cap on rounds); rule ``uniform`` is plain DS,
  rule ``prefilter`` GRESO's pre-filter (a candidate is skipped before generation with probability
  ``min(p_zero_variance, 1 - 0.01)``) fed by the estimator named (GRESO's own skip probability, graphdiff's
  ``p_zero_variance``, or the oracle's). The estimator is seen by the product through ``BeliefTarget``;
  every generated group, kept or filtered, is applied to it and counted as rollouts;
* ``select``    - a pool of ``pool_factor`` x B uniform candidates, B kept by ``rule`` (``thompson``:
  MoPPS's target-difficulty rule; ``skip-zero-variance``: GRESO's selective rollout) from the beliefs;
* ``allocate``  - B uniform prompts, a budget of B x ``units_per_prompt`` groups split by ``rule``
  (``variance``) within [1, ``max_units``] groups each.

An ``oracle`` estimator (``OracleBelief``) is the ceiling of a rule: before each plan it measures every
candidate the rule looks at by ``oracle_samples`` (>= 32) extra completions of the current policy (not
rollouts, no training) and hands the rule the Beta(s + 1, n - s + 1) belief of that measurement.

The paper's protocol: each scheduler runs with its native estimator and with graphdiff plugged in,
everything else equal (the same pools: pools come from a generator seeded by (seed, step) only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphdiff_cli.evaluation import baselines as bl
from graphdiff_cli.core import decisions as dec
from graphdiff_cli.core.beta import mean_variance as beta_mean_variance
from graphdiff_cli.core.beta import zero_variance
from graphdiff_cli.evaluation.baselines import belief
from graphdiff_cli.errors import InvalidArgumentError
from graphdiff_cli.integrations.tracking import Target

# name -> (kind, rule, estimator)
SCHEDULERS = {
    "uniform": ("uniform", None, None),
    "ds": ("ds", "uniform", None),
    "greso-ds": ("ds", "prefilter", "greso"),
    "gd-ds": ("ds", "prefilter", "graphdiff"),
    "oracle-ds": ("ds", "prefilter", "oracle"),
    "mopps": ("select", "thompson", "mopps"),
    "gd-thompson": ("select", "thompson", "graphdiff"),
    "greso": ("select", "skip-zero-variance", "greso"),
    "gd-skip": ("select", "skip-zero-variance", "graphdiff"),
    "history-alloc": ("allocate", "variance", "history"),
    "gd-alloc": ("allocate", "variance", "graphdiff"),
    "oracle-thompson": ("select", "thompson", "oracle"),
    "oracle-skip": ("select", "skip-zero-variance", "oracle"),
    "oracle-alloc": ("allocate", "variance", "oracle"),
}
# (comparison, native scheduler, graphdiff scheduler)
COMPARISONS = (
    ("target-difficulty selection", "mopps", "gd-thompson"),
    ("zero-variance skipping", "greso", "gd-skip"),
    ("rollout allocation by variance", "history-alloc", "gd-alloc"),
)
# (rule, no-estimator baseline, native estimator's scheduler, graphdiff's, the oracle's): the share of the
# oracle's gain each estimator recovers is (estimator - baseline) / (oracle - baseline)
RULES = (
    ("target-difficulty selection", "uniform", "mopps", "gd-thompson", "oracle-thompson"),
    ("zero-variance skipping", "uniform", "greso", "gd-skip", "oracle-skip"),
    ("rollout allocation by variance", "uniform", "history-alloc", "gd-alloc", "oracle-alloc"),
    ("DS pre-filter", "ds", "greso-ds", "gd-ds", "oracle-ds"),
)
REFERENCES = ("uniform", "ds")
MIN_ORACLE_SAMPLES = 32


# ----------------------------------------------------------------------------------------------------
# beliefs


class Belief:
    """An online estimator (``evaluation.baselines.OnlineEstimator``: graphdiff's ``Estimator`` or a peer) as a
    scheduler reads it: the belief decisions use (``evaluation.baselines.belief``, exactly what the offline
    replay and `graphdiff select` read: graphdiff's Beta belief, MoPPS's Beta, GRESO's skip probability, the
    plug-in p^g + (1 - p)^g for a point estimate) and its point estimate p."""

    def __init__(self, method, name: str):
        self.method = method
        self.name = name

    def beliefs(self, nodes, group_size: int) -> dict:
        return belief(self.method, nodes, int(group_size))

    def update(self, nodes, n, s) -> dict:
        """Learn a step; the numbers the estimator reports about it (graphdiff's iterations, ...)."""
        stats = self.method.update(np.asarray(nodes, np.int64), np.asarray(n, np.int64), np.asarray(s, np.int64))
        return {k: v for k, v in (stats or {}).items() if isinstance(v, (int, float))}


class OracleBelief:
    """The ceiling of a rule: each candidate's current pass rate, measured by ``measure(nodes) -> s`` (the
    successes of ``samples`` fresh completions per node from the current policy; the loop batches them in one
    generation call and counts them apart: not rollouts, not trained on). A node is measured at most once per
    policy version (``version()``, the optimiser steps taken), so the rule reads one measurement however
    often it asks. The rule is handed the measurement's Beta(s + 1, n - s + 1) belief: mean, variance and
    P(a group of ``group_size`` is zero-variance) under it. Rollouts teach it nothing (``update`` is a no-op)."""

    name = "oracle"

    def __init__(self, measure, version, samples: int = MIN_ORACLE_SAMPLES):
        if int(samples) < MIN_ORACLE_SAMPLES:
            raise InvalidArgumentError(f"the oracle needs at least {MIN_ORACLE_SAMPLES} samples per candidate "
                                       f"(got {samples})")
        self.measure, self.version, self.samples = measure, version, int(samples)
        self._cache: dict[int, int] = {}
        self._cache_version = None
        self.measured = 0  # candidates measured so far (x samples = extra completions)

    def successes(self, nodes) -> np.ndarray:
        nodes = np.asarray(nodes, dtype=np.int64)
        v = self.version()
        if v != self._cache_version:
            self._cache, self._cache_version = {}, v
        todo = np.unique(np.array([n for n in nodes.tolist() if n not in self._cache], dtype=np.int64))
        if todo.size:
            s = np.asarray(self.measure(todo, self.samples), dtype=np.int64)
            if s.shape != todo.shape or (s < 0).any() or (s > self.samples).any():
                raise InvalidArgumentError("the oracle's measurement must give 0..samples successes per node")
            self._cache.update(zip(todo.tolist(), s.tolist()))
            self.measured += int(todo.size)
        return np.array([self._cache[n] for n in nodes.tolist()], dtype=np.int64)

    def beliefs(self, nodes, group_size: int) -> dict:
        s = self.successes(nodes).astype(np.float64)
        a, b = s + 1.0, self.samples - s + 1.0
        mean, var = beta_mean_variance(a, b)
        return {"p": s / self.samples, "mean": mean, "variance": var,
                "p_zero_variance": zero_variance(a, b, int(group_size))}

    def update(self, nodes, n, s) -> dict:
        return {}


class BeliefTarget(Target):
    """A scheduler's ``Belief`` (GRESO, the oracle; None for plain DS, whose estimates are NaN) seen by the
    product's TRL integration as its estimator: ``apply`` feeds a step's outcomes to it, ``estimates`` gives
    its ``p_zero_variance`` (what ``CandidateDraw``'s pre-filter reads)."""

    def __init__(self, belief, ids):
        super().__init__()
        self.belief = belief
        self.ids = [str(i) for i in ids]
        self._step = 0

    @property
    def step(self) -> int:
        return self._step

    def _apply(self, trainer_step, ids, nodes, n, s) -> dict:
        stats = self.belief.update(nodes, n, s) if self.belief is not None else {}
        self._step = int(trainer_step)
        return stats

    def _estimates(self, nodes, group_size):
        if self.belief is None:  # plain DS: its draw reads nothing; the step metrics get "no estimate"
            nan = np.full(len(nodes), np.nan)
            return {"p": nan, "mean": nan, "variance": nan, "p_zero_variance": nan}
        return self.belief.beliefs(nodes, group_size)

    def estimator(self):
        return self.belief


def make_belief(kind: str | None, n_nodes: int, graphdiff_factory=None, oracle=None):
    """The native estimators at their papers' settings (MoPPS lambda = 1, their MATH setting), graphdiff, or
    the oracle (``oracle``: the ``OracleBelief`` the loop built over its policy)."""
    if kind is None:
        return None
    if kind == "oracle":
        if oracle is None:
            raise InvalidArgumentError("the oracle schedulers need the policy's measurement (OracleBelief)")
        return oracle
    if kind == "mopps":
        return Belief(bl.MoPPS(n_nodes, lam=1.0), "mopps")
    if kind == "greso":
        return Belief(bl.GRESO(n_nodes), "greso")
    if kind == "history":
        return Belief(bl.HistoryMean(n_nodes), "history")
    if kind == "graphdiff":
        if graphdiff_factory is None:
            raise InvalidArgumentError("the graphdiff schedulers need a graphdiff estimator")
        return graphdiff_belief(graphdiff_factory())
    raise InvalidArgumentError(f"unknown estimator {kind!r}")


def graphdiff_belief(estimator) -> Belief:
    return Belief(estimator, "graphdiff")


# ----------------------------------------------------------------------------------------------------
# schedulers


@dataclass
class Plan:
    """One step's plan: prompt nodes and the number of groups each gets (the rollouts are units x group)."""

    nodes: np.ndarray
    units: np.ndarray
    pool_size: int
    info: dict


class Scheduler:
    def __init__(self, name: str, n_nodes: int, batch_prompts: int, group_size: int, *, seed: int,
                 belief=None, pool_factor: float = 4.0, units_per_prompt: int = 2,
                 max_units: int = 4, target: float = 0.5):
        if name not in SCHEDULERS:
            raise InvalidArgumentError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
        self.name = name
        self.kind, self.rule, self.belief_kind = SCHEDULERS[name]
        if (self.belief_kind is None) != (belief is None):
            raise InvalidArgumentError(f"scheduler {name!r} needs estimator {self.belief_kind!r}")
        self.belief = belief
        self.n_nodes, self.batch_prompts, self.group_size = int(n_nodes), int(batch_prompts), int(group_size)
        self.seed, self.pool_factor = int(seed), float(pool_factor)
        self.units_per_prompt, self.max_units, self.target = int(units_per_prompt), int(max_units), float(target)

    def _pool(self, step: int, size: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step, 7])
        return rng.choice(self.n_nodes, size=min(size, self.n_nodes), replace=False)

    def plan(self, step: int) -> Plan:
        """The plan for trainer step ``step`` from the beliefs as they are now."""
        b = self.batch_prompts
        if self.kind == "uniform":
            nodes = self._pool(step, b)
            return Plan(nodes, np.ones(b, np.int64), b, {})
        if self.kind == "ds":
            raise InvalidArgumentError("dynamic sampling is planned by graphdiff's TRL integration "
                                       "(GraphdiffTRL(dynamic_sampling=...)), not by a Scheduler")
        if self.kind == "select":
            pool = self._pool(step, int(round(self.pool_factor * b)))
            e = self.belief.beliefs(pool, self.group_size)
            sel = dec.select(self.rule, b, p=e["mean"], variance=e["variance"],
                             p_zero_variance=e["p_zero_variance"], target=self.target,
                             seed=[self.seed, step, 11])
            info = {"p_chosen": float(np.mean(e["p"][sel.chosen])), "p_pool": float(np.mean(e["p"]))}
            info.update({k: v for k, v in sel.info.items() if isinstance(v, (int, float))})
            return Plan(pool[sel.chosen], np.ones(b, np.int64), pool.size, info)
        # allocate
        nodes = self._pool(step, b)
        e = self.belief.beliefs(nodes, self.group_size * self.units_per_prompt)
        units = dec.allocate(self.rule, e["p"], b * self.units_per_prompt, 1, self.max_units)
        return Plan(nodes, units.astype(np.int64), b, {"units_max": int(units.max()), "units_min": int(units.min())})

    def update(self, nodes, n, s) -> dict:
        if self.belief is None:
            return {}
        return self.belief.update(nodes, n, s)


def effective_groups(n, s) -> np.ndarray:
    """Per prompt: 0 < s < n (a group with a learning signal)."""
    n, s = np.asarray(n), np.asarray(s)
    return (s > 0) & (s < n)
