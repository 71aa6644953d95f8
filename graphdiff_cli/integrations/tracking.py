"""What every trainer integration shares: where outcomes go, how they are counted, how a batch is chosen.

* ``Target`` - the estimator the trainer feeds: ``InMemoryTarget`` (a ``graphdiff_cli.estimator.Estimator``
  plus the string id of each node) or ``StateTarget`` (a STATE directory through a resident
  ``graphdiff_cli.State``; each step's outcomes are written to ``STATE/../<name>.outcomes/step_<T>-<hash>.jsonl``
  and applied with ``State.update``, so the STATE's log records the file's hash like any ``graphdiff update``). Both map string prompt ids to node
  indices, refuse unknown ids, and apply trainer step T only onto estimator step T - 1.
* ``OutcomeRecorder`` - a thread-safe list of (trainer step, prompt id, reward) rows.
* ``count_outcomes`` - rows -> per-prompt (n, s): a rollout succeeds when reward >= threshold; with no
  threshold (None) every reward must be 0 or 1, as for ``graphdiff update``.
* ``BatchChooser`` - draws a candidate pool and keeps B prompts by a ``core.decisions`` strategy, from
  the target's current estimates; every decision is kept (``decisions``) for inspection and tests.
* ``StepMetrics`` - what a trainer's dashboard shows per step (``graphdiff/...`` scalars): the step's
  prompts' mean p-hat and predicted effective-group share before their outcomes, the observed ones, the
  estimator's update time and the settings in use (kappa, nu, propagation weight, time forgetting).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core import decisions as dec
from ..core.beta import DEFAULT_GROUP_SIZE
from ..errors import DataError, InvalidArgumentError, RewardWarning, StateError
from ..io.outcomes import THRESHOLD_REASON, check_threshold, succeeded, threshold_warning
from ..io.readers import IdIndex


# ----------------------------------------------------------------------------------------------------
# targets


class Target:
    """The estimator a trainer feeds; subclasses set ``ids`` and implement ``step``, ``_apply``, ``_estimates``."""

    ids: list[str]

    def __init__(self):
        self._index: IdIndex | None = None

    @property
    def index(self) -> IdIndex:
        if self._index is None:
            self._index = IdIndex(self.ids, "the estimator's prompts")
        return self._index

    def nodes(self, ids, where: str = "ids") -> np.ndarray:
        """Node indices of string ids; an unknown id is refused (DataError)."""
        return self.index.nodes(ids, where=lambda j: f"{where}[{j}]")

    @property
    def step(self) -> int:
        raise NotImplementedError

    def apply(self, trainer_step: int, ids: list[str], n: np.ndarray, s: np.ndarray, live=None) -> dict:
        """Apply trainer step ``trainer_step``'s outcomes; it must be the estimator's step + 1. ``live``: the
        prompts' live features observed at that step (one row per id, a row of NaN: none; ``io.live``)."""
        cur = self.step
        if trainer_step != cur + 1:
            raise StateError(f"trainer step {trainer_step} cannot follow estimator step {cur}: the estimator "
                             f"must be at step {trainer_step - 1} (on resume, roll the STATE back to the "
                             "checkpoint's step: graphdiff rollback --to STEP)")
        nodes = self.nodes(ids, "outcomes")
        return self._apply(trainer_step, list(ids), nodes, np.asarray(n, np.int64), np.asarray(s, np.int64), live)

    def retired(self) -> np.ndarray:
        """Node indices of the prompts out of the candidate set (``graphdiff retire``); none by default."""
        return np.zeros(0, np.int64)

    def estimates(self, nodes: np.ndarray, group_size: int = DEFAULT_GROUP_SIZE, live=None) -> dict[str, np.ndarray]:
        """The estimates of ``nodes``; ``live``: their live features (one row per node, a row of NaN: none)."""
        return self._estimates(np.asarray(nodes, dtype=np.int64), int(group_size), live)

    def estimator(self):
        """The ``Estimator`` of the current step (read from the STATE when it moved)."""
        raise NotImplementedError


class InMemoryTarget(Target):
    """An ``Estimator`` held in memory; ``ids[i]`` is node i's prompt id (default: "0", "1", ...)."""

    def __init__(self, estimator, ids=None):
        super().__init__()
        self._estimator = estimator
        self.ids = [str(i) for i in (range(estimator.n_nodes) if ids is None else ids)]
        if len(self.ids) != estimator.n_nodes:
            raise InvalidArgumentError(f"{len(self.ids)} ids for an estimator of {estimator.n_nodes} prompts")
        if len(set(self.ids)) != len(self.ids):
            raise DataError("prompt ids must be unique")

    @property
    def step(self) -> int:
        return int(self._estimator.step_)

    def _apply(self, trainer_step, ids, nodes, n, s, live=None) -> dict:
        return self._estimator.update(nodes, n, s, live=live)

    def estimator(self):
        return self._estimator

    def _estimates(self, nodes, group_size, live=None):
        return self._estimator.estimates(nodes, group_size=group_size, live=live)


class StateTarget(Target):
    """A STATE directory (``graphdiff init``) through a resident ``graphdiff_cli.State``: each step's rows are
    written to ``STATE.outcomes/step_<T>-<hash>.jsonl`` (or ``outcomes_dir``, ``State.outcomes_dir``) and applied with ``State.update``, so the
    STATE's log records the file's hash like any ``graphdiff update``; the estimator stays in memory between
    steps and is read again only when another writer moved the STATE."""

    def __init__(self, state, outcomes_dir=None, device: str | None = "cpu", durable: bool = True):
        from ..state import State

        super().__init__()
        self.state = State.open(state, device=device, durable=durable, outcomes_dir=outcomes_dir)

    @property
    def ids(self) -> list[str]:
        return self.state.ids  # the current version's: graphdiff extend adds prompts

    @property
    def index(self) -> IdIndex:
        return self.state.index

    @property
    def step(self) -> int:
        return self.state.step

    def extend(self, prompts=None, **kwargs) -> dict:
        """Add prompts to the STATE (``graphdiff extend``): candidates from the next step on."""
        return self.state.extend(prompts, **kwargs)

    def retire(self, ids, *, restore: bool = False, **kwargs) -> dict:
        """Take prompts out of the candidate set (``graphdiff retire``), or put them back."""
        return self.state.retire(ids, restore=restore, **kwargs)

    def _apply(self, trainer_step, ids, nodes, n, s, live=None) -> dict:
        rows = [{"id": pid, "n": int(a), "s": int(b)} for pid, a, b in zip(ids, n, s)]
        return self.state.update(trainer_step, rows, live=live)  # live: the rows' live column (io.live)

    def retired(self) -> np.ndarray:
        self.state.estimator()
        return self.state.retired

    def estimator(self):
        return self.state.estimator()

    def _estimates(self, nodes, group_size, live=None):
        return self.state.estimator().estimates(nodes, group_size=group_size, live=live)


def resume_mismatch(at: int, want: int, who: str) -> str:
    """The one-line refusal of a resume whose STATE (at step ``at``) is not where the trainer's checkpoint
    (``who``) expects it (``want``): ahead - the steps after the checkpoint would count twice - or behind -
    the run stopped between saving the checkpoint and applying that step's outcomes."""
    if at > want:
        return (f"the graphdiff STATE is at step {at} but {who} resumes after step {want}: its steps {want + 1}.."
                f"{at} would count twice; roll the STATE back (graphdiff rollback --to {want}) or start a fresh "
                "STATE")
    return (f"the graphdiff STATE is at step {at} but {who} resumes after step {want}: steps {at + 1}..{want} "
            "were never applied (the run stopped between its checkpoint and their outcomes); resume from an "
            "earlier checkpoint C after graphdiff rollback --to C, or start a fresh STATE")


def open_target(target, ids=None, **kwargs) -> Target:
    """A ``Target`` from a Target, an ``Estimator`` (with ``ids``) or a STATE directory path."""
    if isinstance(target, Target):
        return target
    if isinstance(target, (str, Path)):
        return StateTarget(target, **kwargs)
    if hasattr(target, "update") and hasattr(target, "estimates"):
        return InMemoryTarget(target, ids)
    raise InvalidArgumentError(f"expected an Estimator or a STATE directory, got {type(target).__name__}")


# ----------------------------------------------------------------------------------------------------
# outcomes


class OutcomeRecorder:
    """Rows (trainer step, prompt id, reward) appended by reward functions, taken by the step callback."""

    def __init__(self):
        self._rows: list[tuple[int, str, float]] = []
        self._lock = threading.Lock()

    def add(self, step: int, ids, rewards) -> None:
        rows = [(int(step), str(i), float(r)) for i, r in zip(ids, rewards) if r is not None]
        with self._lock:
            self._rows.extend(rows)

    def take(self, before_step: int) -> list[tuple[int, str, float]]:
        """Remove and return every row recorded at a trainer step < ``before_step``."""
        with self._lock:
            out = [r for r in self._rows if r[0] < before_step]
            self._rows = [r for r in self._rows if r[0] >= before_step]
        return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._rows)


def count_outcomes(rows, threshold: float | None = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(ids in order of first appearance, n, s): one rollout per row, success = reward >= threshold.
    NaN rewards (TRL's "not applicable") are not rollouts of this reward and are skipped.

    The rule of ``graphdiff update`` (``io.outcomes``): with ``threshold=None`` (the trainer's config chose
    none) every reward must be 0 or 1, and any other is refused (DataError naming the prompt id); with a threshold, rewards that all fall below it (or all at or above it) are applied and
    reported with one ``RewardWarning``."""
    threshold = check_threshold(threshold)
    order: dict[str, int] = {}
    n: list[int] = []
    s: list[int] = []
    low, high, count = math.inf, -math.inf, 0
    for _, pid, r in rows:
        if isinstance(r, float) and math.isnan(r):
            continue
        r_ok = succeeded(r, threshold)
        if r_ok is None:
            raise DataError(f"prompt {pid!r} got reward {r:g}, not 0 or 1; set the "
                            f"integration's success_threshold ({THRESHOLD_REASON})")
        if threshold is not None:
            low, high, count = min(low, r), max(high, r), count + 1
        j = order.setdefault(pid, len(order))
        if j == len(n):
            n.append(0)
            s.append(0)
        n[j] += 1
        s[j] += int(r_ok)
    if count:
        line = threshold_warning(low, high, count, threshold, "this step")
        if line:
            import warnings

            warnings.warn(line.replace("--success-threshold", "success_threshold"), RewardWarning, stacklevel=2)
    return list(order), np.asarray(n, dtype=np.int64), np.asarray(s, dtype=np.int64)


# ----------------------------------------------------------------------------------------------------
# choosing a batch


@dataclass
class Decision:
    """One batch choice: the estimator step it used, the pool (dataset rows), their p, the chosen rows."""

    batch: int
    estimator_step: int
    pool: np.ndarray
    p: np.ndarray
    chosen: np.ndarray
    extra: dict = field(default_factory=dict)


class BatchChooser:
    """Keep ``batch_size`` of a random pool of ``pool_factor * batch_size`` dataset rows by ``strategy``.

    ``row_nodes[r]`` is dataset row r's node index in the target. The pool is drawn uniformly without
    replacement from all rows (the whole pool when it is smaller); the same seed, epoch and batch
    number give the same pool, and the same estimates give the same choice. ``live``: None, or a function of
    the pool's dataset rows giving their live features (one row each), read with the estimates.
    """

    def __init__(self, target: Target, row_nodes: np.ndarray, batch_size: int, strategy: str = "target",
                 pool_factor: float = 4.0, seed: int = 0, target_p: float = 0.5,
                 group_size: int = DEFAULT_GROUP_SIZE, explore: float = dec.TARGET_EXPLORE):
        dec.check_strategy(strategy, dec.SELECT_STRATEGIES, "selection")
        self.target = target
        self.row_nodes = np.asarray(row_nodes, dtype=np.int64)
        self.batch_size = dec.check_batch(batch_size, self.row_nodes.size)
        if not pool_factor >= 1:
            raise InvalidArgumentError(f"pool factor must be >= 1, got {pool_factor!r}")
        self.strategy, self.pool_factor, self.seed = strategy, float(pool_factor), int(seed)
        self.target_p, self.group_size = dec.check_target(target_p), int(group_size)
        self.explore = dec.check_explore(explore)
        self.decisions: list[Decision] = []
        self.live = None

    def choose(self, epoch: int, batch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch, batch])
        retired = self.target.retired()
        rows = (np.flatnonzero(~np.isin(self.row_nodes, retired)) if retired.size
                else np.arange(self.row_nodes.size))  # retired prompts are never drawn
        if rows.size < self.batch_size:
            raise InvalidArgumentError(f"batch size {self.batch_size} is larger than the {rows.size} prompts of "
                                       "the data set that are not retired")
        m = min(rows.size, max(self.batch_size, int(round(self.pool_factor * self.batch_size))))
        pool = rows[rng.choice(rows.size, size=m, replace=False)]
        live = None if self.live is None else self.live(pool)
        est = self.target.estimates(self.row_nodes[pool], self.group_size, live)
        sel = dec.select(self.strategy, self.batch_size, p=est["mean"], variance=est["variance"],
                         p_zero_variance=est["p_zero_variance"], target=self.target_p,
                         explore=self.explore, seed=[self.seed, epoch, batch, 1])
        chosen = pool[sel.chosen]
        self.decisions.append(Decision(batch=len(self.decisions), estimator_step=self.target.step, pool=pool,
                                       p=np.asarray(est["p"], dtype=np.float64), chosen=chosen,
                                       extra={"epoch": epoch, "p_zero_variance": est["p_zero_variance"]}))
        return chosen


# ----------------------------------------------------------------------------------------------------
# what the trainer's dashboard shows


METRIC_PREFIX = "graphdiff/"


def settings_in_use(est) -> dict[str, float]:
    """The estimator's settings as they act after its last step, online choices included: kappa (prior
    strength), nu (belief strength), label propagation's weight, the prompts' time forgetting, the read-out's
    weight and ridge strength; a setting that is off is left out."""
    out = {}
    for key, attr in (("kappa", "kappa_"), ("nu", "nu_"), ("propagation", "propagation_"),
                      ("time_forgetting", "time_forgetting_"), ("readout", "readout_"),
                      ("readout_ridge", "readout_ridge_"), ("live_readout", "live_readout_")):
        value = getattr(est, attr, None)
        if value is not None:
            out[key] = float(value)
    return out


class StepMetrics:
    """One trainer step's scalars for the trainer's logger, measured around ``Target.apply``.

    ``before(target, ids, n)`` reads the estimates of the step's prompts as they were when the batch was
    chosen (the estimator's previous step), ``after(target, n, s, seconds)`` returns the dict:

    * ``graphdiff/mean_p``: the step's prompts' mean p-hat just before their outcomes (the estimates after the
      previous step); ``graphdiff/success_rate``:
      the share of the step's rollouts that succeeded (what mean_p predicts);
    * ``graphdiff/predicted_effective``: the predicted share of the step's groups with both outcomes
      (1 - P(zero variance) at each prompt's own group size); ``graphdiff/effective``: the observed share
      (0 < s < n), which is TRL's 1 - frac_reward_zero_std;
    * ``graphdiff/update_seconds``, ``graphdiff/step`` (the estimator's step), ``graphdiff/prompts``;
    * ``graphdiff/kappa``, ``graphdiff/nu``, ``graphdiff/propagation``, ``graphdiff/time_forgetting``: the
      settings in use after the update (``settings_in_use``; nu and propagation absent when off).
    """

    def __init__(self):
        self._before: tuple[float, float] | None = None
        self._t0 = 0.0

    def before(self, target: Target, ids: list[str], n: np.ndarray) -> None:
        self._before = None
        if ids:
            nodes = target.nodes(ids, "outcomes")
            mean_p = np.zeros(len(ids))
            pzv = np.zeros(len(ids))
            for g in np.unique(n):  # p_zero_variance depends on the group size: one read per size
                rows = np.flatnonzero(n == g)
                est = target.estimates(nodes[rows], max(int(g), 1))
                mean_p[rows], pzv[rows] = est["mean"], est["p_zero_variance"]
            grouped = n > 1  # a single rollout is no group: it has no spread to lose
            self._before = (float(mean_p.mean()), float(1.0 - pzv[grouped].mean()) if grouped.any() else None)
        self._t0 = time.perf_counter()

    def after(self, target: Target, n: np.ndarray, s: np.ndarray) -> dict[str, float]:
        seconds = time.perf_counter() - self._t0
        n, s = np.asarray(n, np.int64), np.asarray(s, np.int64)
        out = {"step": float(target.step), "prompts": float(n.size), "update_seconds": seconds}
        if self._before is not None and n.sum() > 0:
            out["mean_p"], out["success_rate"] = self._before[0], float(s.sum() / n.sum())
            grouped = n > 1
            if grouped.any():
                out["predicted_effective"] = self._before[1]
                out["effective"] = float(((s > 0) & (s < n))[grouped].mean())
        out.update(settings_in_use(target.estimator()))
        return {METRIC_PREFIX + k: v for k, v in out.items()}
