"""Scheduler x estimator pairs for the closed-loop benchmark (numpy only, no file I/O).

A ``Belief`` is an online estimator seen through one interface: ``beliefs(nodes, group_size)`` ->
``{"p", "mean", "variance", "p_zero_variance"}`` and ``update(nodes, n, s)``. The natives are the
peers of ``graphdiff_cli.core.baselines`` (MoPPS, GRESO, per-prompt history); ``graphdiff_belief``
wraps ``graphdiff_cli.Estimator.estimates``.

A ``Scheduler`` turns beliefs into one step's plan: a list of ``(node, units)`` - the prompts to roll
out and how many groups of the trainer's fixed group size each gets - by a rule of
``graphdiff_cli.core.decisions``:

* ``uniform``   - B prompts drawn uniformly from the training pool (one group each);
* ``dapo``      - ``oversample`` x B prompts drawn uniformly (DAPO's dynamic sampling: the reward
  wrapper in ``loop`` keeps the first B groups with 0 < s < n and flattens the rest; every rollout counts);
* ``select``    - a pool of ``pool_factor`` x B uniform candidates, B kept by ``rule`` (``thompson``:
  MoPPS's target-difficulty rule; ``skip-zero-variance``: GRESO's selective rollout) from the beliefs;
* ``allocate``  - B uniform prompts, a budget of B x ``units_per_prompt`` groups split by ``rule``
  (``variance``) within [1, ``max_units``] groups each.

The paper's protocol: each scheduler runs with its native estimator and with graphdiff plugged in,
everything else equal (the same pools: pools come from a generator seeded by (seed, step) only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphdiff_cli.core import baselines as bl
from graphdiff_cli.core import decisions as dec
from graphdiff_cli.core.counterfactual import moments
from graphdiff_cli.errors import InvalidArgumentError

# name -> (kind, rule, estimator)
SCHEDULERS = {
    "uniform": ("uniform", None, None),
    "dapo": ("dapo", None, None),
    "mopps": ("select", "thompson", "mopps"),
    "gd-thompson": ("select", "thompson", "graphdiff"),
    "greso": ("select", "skip-zero-variance", "greso"),
    "gd-skip": ("select", "skip-zero-variance", "graphdiff"),
    "history-alloc": ("allocate", "variance", "history"),
    "gd-alloc": ("allocate", "variance", "graphdiff"),
}
# (comparison, native scheduler, graphdiff scheduler)
COMPARISONS = (
    ("target-difficulty selection", "mopps", "gd-thompson"),
    ("zero-variance skipping", "greso", "gd-skip"),
    ("rollout allocation by variance", "history-alloc", "gd-alloc"),
)
REFERENCES = ("uniform", "dapo")


# ----------------------------------------------------------------------------------------------------
# beliefs


class Belief:
    """An estimator as a scheduler reads it: the belief decisions use (``core.counterfactual.moments``,
    exactly what the offline replay and `graphdiff select` read: graphdiff's Beta belief, MoPPS's Beta,
    GRESO's skip probability, the plug-in p^g + (1 - p)^g for a point estimate) and its point estimate p."""

    def __init__(self, method, name: str):
        self.method = method
        self.name = name

    def beliefs(self, nodes, group_size: int) -> dict:
        nodes = np.asarray(nodes, dtype=np.int64)
        m = moments(self.method, nodes, int(group_size))
        p = np.clip(np.asarray(self.method.predict(nodes), dtype=np.float64), 0.0, 1.0)
        return {"p": p, "mean": m["p"], "variance": m["variance"], "p_zero_variance": m["p_zero_variance"]}

    def update(self, nodes, n, s) -> dict:
        self.method.update(np.asarray(nodes, np.int64), np.asarray(n, np.int64), np.asarray(s, np.int64))
        stats = getattr(self.method, "last_update_", None) or {}
        return {k: v for k, v in stats.items() if isinstance(v, (int, float))}


def make_belief(kind: str | None, n_nodes: int, graphdiff_factory=None):
    """The native estimators at their papers' settings (MoPPS lambda = 1, their MATH setting), or graphdiff."""
    if kind is None:
        return None
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
    from graphdiff_cli.methods import GraphdiffMethod

    return Belief(GraphdiffMethod(estimator), "graphdiff")


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
                 belief=None, pool_factor: float = 4.0, oversample: float = 2.0, units_per_prompt: int = 2,
                 max_units: int = 4, target: float = 0.5):
        if name not in SCHEDULERS:
            raise InvalidArgumentError(f"unknown scheduler {name!r}; choose one of {', '.join(SCHEDULERS)}")
        self.name = name
        self.kind, self.rule, self.belief_kind = SCHEDULERS[name]
        if (self.belief_kind is None) != (belief is None):
            raise InvalidArgumentError(f"scheduler {name!r} needs estimator {self.belief_kind!r}")
        self.belief = belief
        self.n_nodes, self.batch_prompts, self.group_size = int(n_nodes), int(batch_prompts), int(group_size)
        self.seed, self.pool_factor, self.oversample = int(seed), float(pool_factor), float(oversample)
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
        if self.kind == "dapo":
            m = int(round(self.oversample * b))
            nodes = self._pool(step, m)
            return Plan(nodes, np.ones(nodes.size, np.int64), m, {"keep_effective": b})
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


def dapo_keep(groups: list[list[float]], keep: int) -> tuple[list[list[float]], int]:
    """DAPO's dynamic-sampling filter on one generation batch: the first ``keep`` groups with mixed rewards are
    kept as they are; every other group is flattened to a constant (zero advantage: no gradient). Returns
    the rewards to hand the trainer and how many effective groups were kept."""
    out, kept = [], 0
    for g in groups:
        mixed = min(g) != max(g)
        if mixed and kept < keep:
            out.append(list(g))
            kept += 1
        else:
            out.append([0.0] * len(g))
    return out, kept
