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

A ``LiveBelief`` reads what a user would give an estimator beyond outcomes: the policy's live features of the
candidates at every read (one batched forward pass, timed) and, for graphdiff and ``CellLive``, the task's
(skill, level) as covariates (``cell_covariates``); ``HiveBelief`` is HIVE's history + live entropy check. They
feed the same DS and selection paths as every estimator (docs/lab/closedloop.md).

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
    # what a user would give graphdiff: the task's (skill, level) as covariates and the policy's live
    # confidence at each candidate read (``LiveBelief``); their peers: HIVE (GRESO's history + the same live
    # check) and the covariates-only estimator (``CellLive``: cell mean + live features, no graph)
    "gd-live-ds": ("ds", "prefilter", "graphdiff-live"),
    "gd-live-thompson": ("select", "thompson", "graphdiff-live"),
    "gd-live-skip": ("select", "skip-zero-variance", "graphdiff-live"),
    "hive-ds": ("ds", "prefilter", "hive"),
    "cells-live-ds": ("ds", "prefilter", "cells-live"),
    "cells-live-thompson": ("select", "thompson", "cells-live"),
    "cells-live-skip": ("select", "skip-zero-variance", "cells-live"),
}
# the published grid's 14 arms (configs/closedloop.yaml, docs/lab/results.md): the arms above them read covariates
# and live features and are run beside these, never instead of them
PUBLISHED = tuple(list(SCHEDULERS)[:14])
# estimators fed the policy's live features of the candidates they read (one batched forward pass per read)
LIVE_ESTIMATORS = ("graphdiff-live", "hive", "cells-live")
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
# the live arms and their peers against the same oracles: (rule, baseline, estimators' schedulers, the oracle's)
LIVE_RULES = (
    ("target-difficulty selection", "uniform", ("cells-live-thompson", "gd-live-thompson"), "oracle-thompson"),
    ("zero-variance skipping", "uniform", ("cells-live-skip", "gd-live-skip"), "oracle-skip"),
    ("DS pre-filter", "ds", ("hive-ds", "cells-live-ds", "gd-live-ds"), "oracle-ds"),
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

    def _apply(self, trainer_step, ids, nodes, n, s, live=None) -> dict:
        # live: the product's own live features (GraphdiffTRL(live_features=...)), never set here; a
        # LiveBelief reads the policy's itself at each read and keeps them for its update
        stats = self.belief.update(nodes, n, s) if self.belief is not None else {}
        self._step = int(trainer_step)
        return stats

    def _estimates(self, nodes, group_size, live=None):
        if self.belief is None:  # plain DS: its draw reads nothing; the step metrics get "no estimate"
            nan = np.full(len(nodes), np.nan)
            return {"p": nan, "mean": nan, "variance": nan, "p_zero_variance": nan}
        return self.belief.beliefs(nodes, group_size)

    def estimator(self):
        return self.belief


def make_belief(kind: str | None, n_nodes: int, graphdiff_factory=None, oracle=None, features=None,
                covariates=None):
    """The native estimators at their papers' settings (MoPPS lambda = 1, their MATH setting), graphdiff, or
    the oracle (``oracle``: the ``OracleBelief`` the loop built over its policy). The live estimators
    (``LIVE_ESTIMATORS``) need ``features(nodes)`` (the policy's live features of those prompts, one row
    each) and, but HIVE, ``covariates`` (N x c, encoded by ``core.covariates``); ``graphdiff_factory(covariates)``
    then returns graphdiff's Estimator over them."""
    if kind is None:
        return None
    if kind in LIVE_ESTIMATORS and features is None:
        raise InvalidArgumentError(f"estimator {kind!r} reads the policy's live features: give features=")
    if kind == "hive":
        return HiveBelief(bl.GRESO(n_nodes), features)
    if kind in ("graphdiff-live", "cells-live"):
        if covariates is None:
            raise InvalidArgumentError(f"estimator {kind!r} needs the prompts' covariates")
        if kind == "cells-live":
            return LiveBelief(CellLive(covariates), "cells-live", features)
        if graphdiff_factory is None:
            raise InvalidArgumentError("the graphdiff schedulers need a graphdiff estimator")
        return LiveBelief(graphdiff_factory(covariates), "graphdiff-live", features)
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
# live features


class _ReadWithLive:
    """An estimator seen by ``evaluation.baselines.belief`` with live features ``x`` for the nodes it reads."""

    def __init__(self, method, x):
        self.method, self.x = method, x

    def estimates(self, ids, group_size):
        return self.method.estimates(ids, group_size=group_size, live=self.x)


class LiveBelief(Belief):
    """A ``Belief`` whose every read comes with the policy's live features of the prompts read:
    ``features(nodes)`` (the loop's: the next-token entropy and largest probability at each prompt's last
    position, ``graphdiff_cli.integrations.trl.next_token_features``, one batched forward pass over the
    candidates) goes to ``estimates(..., live=F)``; a prompt's features from its last read go with its outcomes
    to ``update(..., live=F)`` (a row of NaN for one never read), as ``GraphdiffTRL(live_features=True)`` does.
    The forward passes' wall time is counted (``seconds``, ``passes``, ``candidates``): it is the estimator's
    cost, inside the plan's or the pre-filter's time."""

    def __init__(self, method, name: str, features):
        super().__init__(method, name)
        self.features = features
        self._live: dict[int, np.ndarray] = {}
        self.seconds, self.passes, self.candidates = 0.0, 0, 0

    def read(self, nodes) -> np.ndarray:
        import time

        nodes = np.asarray(nodes, dtype=np.int64)
        t0 = time.perf_counter()
        x = np.asarray(self.features(nodes), dtype=np.float64)
        self.seconds += time.perf_counter() - t0
        if x.ndim != 2 or x.shape[0] != nodes.size:
            raise InvalidArgumentError(f"live features of shape {x.shape} for {nodes.size} prompts")
        self.passes += 1
        self.candidates += int(nodes.size)
        self._live.update(zip(nodes.tolist(), x))
        return x

    def beliefs(self, nodes, group_size: int) -> dict:
        return belief(_ReadWithLive(self.method, self.read(nodes)), nodes, int(group_size))

    def step_live(self, nodes) -> np.ndarray | None:
        """The nodes' live features as last read (a row of NaN for one never read); None before any read."""
        rows = [self._live.get(int(i)) for i in np.asarray(nodes).tolist()]
        f = next((r.size for r in rows if r is not None), None)
        if f is None:
            return None
        return np.stack([np.full(f, np.nan) if r is None else r for r in rows])

    def update(self, nodes, n, s) -> dict:
        nodes = np.asarray(nodes, np.int64)
        stats = self.method.update(nodes, np.asarray(n, np.int64), np.asarray(s, np.int64),
                                   live=self.step_live(nodes))
        return {k: v for k, v in (stats or {}).items() if isinstance(v, (int, float))}

    def cost(self) -> dict:
        return {"seconds": self.seconds, "passes": self.passes, "candidates": self.candidates}

    def live_statistics(self) -> dict:
        """What the estimator has learnt from live features: graphdiff's live read-out's number of features and
        its sufficient statistics' size, ``CellLive``'s fit."""
        m = self.method
        if hasattr(m, "live_features_"):
            src = m.mix.source("live_readout")
            return {"features": m.live_features_, "gram_entries": int(src.live_gram_.size),
                    "weight": m.live_readout_}
        return m.live_statistics()


class HiveBelief(LiveBelief):
    """HIVE's pre-filter (Wu et al., "HIVE: Online-Verified Prompt Selection for Efficient RL Training of Large
    Reasoning Model", arXiv 2603.25184): a history-informed coarse selection, then an online verification by
    the current policy's prompt entropy that prunes prompts whose history-based utility is stale.

    As built here (the paper's abstract and method summary; its exact thresholds were not available to us):

    * stage 1, history: GRESO's rule (``evaluation.baselines.GRESO``: skip probability 1 - max(p^z, 0.01)
      after z trailing all-correct or all-wrong visits, p_e and p_h adapted per step) - HIVE's history prior
      is GRESO-like reward statistics; its response-entropy term is left out (it needs the rollouts'
      token entropies, which this loop does not record);
    * stage 2, live check: among the candidates read at once, those whose next-token entropy at the
      prompt's end (the same live confidence feature as the graphdiff arms', ``LiveBelief``) lies below the
      ``quantile`` of the read (assumed 0.25: the least uncertain quarter, "off the learning edge") are
      pruned: their skip probability is 1 (the DS pre-filter's floor still explores them at 0.01).

    The result is handed to the same paths as every estimator: ``p_zero_variance`` = the skip probability,
    read by the product's DS pre-filter (``CandidateDraw``) or the selection rule. ``pruned`` counts the
    candidates the live check pruned."""

    def __init__(self, greso, features, quantile: float = 0.25):
        super().__init__(greso, "hive", features)
        if not 0.0 < float(quantile) < 1.0:
            raise InvalidArgumentError(f"HIVE's entropy quantile must lie in (0, 1), got {quantile!r}")
        self.quantile = float(quantile)
        self.pruned = 0

    def beliefs(self, nodes, group_size: int) -> dict:
        x = self.read(nodes)
        e = belief(self.method, nodes, int(group_size))
        entropy = x[:, 0]
        low = entropy < np.quantile(entropy, self.quantile) if entropy.size > 1 else np.zeros(entropy.size, bool)
        self.pruned += int(low.sum())
        e["p_zero_variance"] = np.where(low, 1.0, e["p_zero_variance"])
        return e

    def update(self, nodes, n, s) -> dict:  # GRESO learns from outcomes only
        return Belief.update(self, nodes, n, s)

    def cost(self) -> dict:
        return {**super().cost(), "pruned": self.pruned}

    def live_statistics(self) -> dict:
        return {"pruned": self.pruned, "quantile": self.quantile}


class CellLive:
    """The covariates-only peer with live features: no graph, no embedding. Cells are the distinct rows of the
    encoded covariates (here one per (skill, level)); p-hat_i = m_c(i) + [1, live_i] theta, clipped to [0, 1]:

    * m_c = (S_c + g) / (C_c + 1), the cell's success rate shrunk by one rollout's weight to g, the global rate
      (0.5 before any), its counts forgotten by ``forgetting`` per step, as the policy moves;
    * theta, the ridge fit (slopes penalised by ``ridge``, not the intercept) of the cell mean's residual
      rate_i - m_c(i) (before the step) on [1, live_i] over every prompt observed with live features,
      its sufficient statistics forgotten by the same factor (graphdiff's live source's fit,
      ``estimator.sources.live``); a prompt read without live features gets its cell mean.

    Point estimates only: the rules read the plug-in p^g + (1 - p)^g (``evaluation.baselines.belief``)."""

    name = "cells-live"

    def __init__(self, covariates, forgetting: float = 0.9, ridge: float = 1.0):
        x = np.asarray(covariates, dtype=np.float64)
        if x.ndim != 2:
            raise InvalidArgumentError(f"covariates must be 2-D, got shape {x.shape}")
        _, self.cell = np.unique(x, axis=0, return_inverse=True)
        self.cell = self.cell.reshape(-1).astype(np.int64)
        k = int(self.cell.max()) + 1 if self.cell.size else 0
        self.n_nodes = x.shape[0]
        self.forgetting, self.ridge = float(forgetting), float(ridge)
        self.s_, self.c_ = np.zeros(k), np.zeros(k)
        self.gs_, self.gc_ = 0.0, 0.0
        self.gram_, self.moment_ = np.zeros((0, 0)), np.zeros(0)
        self.pairs_ = 0

    def _cell_mean(self, ids) -> np.ndarray:
        g = self.gs_ / self.gc_ if self.gc_ > 0 else 0.5
        c = self.cell[ids]
        return (self.s_[c] + g) / (self.c_[c] + 1.0)

    def _live(self, live, m):
        if live is None or not self.gram_.size:
            return np.zeros(m)
        x = np.asarray(live, dtype=np.float64)
        z = np.column_stack([np.ones(m), x])
        pen = self.ridge * np.eye(z.shape[1])
        pen[0, 0] = 0.0
        theta = np.linalg.solve(self.gram_ + pen + 1e-9 * np.eye(z.shape[1]), self.moment_)
        out = z @ theta
        return np.where(np.isfinite(x).all(axis=1), out, 0.0)

    def estimates(self, ids, group_size: int = 8, live=None) -> dict:
        ids = np.asarray(ids, dtype=np.int64)
        p = np.clip(self._cell_mean(ids) + self._live(live, ids.size), 0.0, 1.0)
        return {"p": p}

    def update(self, ids, n, s, live=None) -> dict:
        ids, n, s = (np.asarray(a, dtype=np.int64) for a in (ids, n, s))
        rate = s / np.maximum(n, 1)
        resid = rate - self._cell_mean(ids)
        lam = self.forgetting
        if live is not None:
            x = np.asarray(live, dtype=np.float64)
            ok = np.isfinite(x).all(axis=1)
            if ok.any():
                z = np.column_stack([np.ones(int(ok.sum())), x[ok]])
                if not self.gram_.size:
                    self.gram_, self.moment_ = np.zeros((z.shape[1],) * 2), np.zeros(z.shape[1])
                self.gram_ = lam * self.gram_ + z.T @ z
                self.moment_ = lam * self.moment_ + z.T @ resid[ok]
                self.pairs_ += int(ok.sum())
        self.s_ *= lam
        self.c_ *= lam
        np.add.at(self.s_, self.cell[ids], s)
        np.add.at(self.c_, self.cell[ids], n)
        self.gs_, self.gc_ = lam * self.gs_ + float(s.sum()), lam * self.gc_ + float(n.sum())
        return {"live_pairs": self.pairs_}

    def live_statistics(self) -> dict:
        return {"features": (self.gram_.shape[0] - 1) if self.gram_.size else None,
                "gram_entries": int(self.gram_.size), "pairs": self.pairs_}


def cell_covariates(rows) -> np.ndarray:
    """The prompts' (skill, level) as categorical covariates, encoded as a user's prompt file's fields are
    (``core.covariates.make_spec`` / ``encode``: one indicator per category)."""
    from graphdiff_cli.core.covariates import Raw, encode, make_spec

    raw = {"skill": Raw("categorical", [r["skill"] for r in rows]),
           "level": Raw("categorical", [str(r["level"]) for r in rows])}
    return encode(make_spec(raw), raw, len(rows)).features


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
