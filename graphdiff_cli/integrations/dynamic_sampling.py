"""Dynamic sampling (DS, DAPO's rule) as graphdiff runs it inside a trainer: what to generate, what to keep.

DAPO's dynamic sampling generates a batch of B prompt groups, drops every group whose rewards are all
equal (no GRPO signal), and generates again until B groups with 0 < successes < n are in hand or a cap
on generation rounds is hit. Every generated group is an outcome of the current policy, kept or not;
the trainer adapters apply all of them to the estimator as part of the step.

This module is the trainer-agnostic part (the TRL wiring is in ``trl.py``):

* ``CandidateDraw`` decides what a generation round rolls out. ``mode="uniform"`` is plain DS: B prompts
  uniformly at random, without replacement, from the prompts not yet generated in this step (and not
  retired). ``mode="prefilter"`` is GRESO's pre-filter with graphdiff's calibrated probability: the
  candidates are visited in a random order and each is skipped before generation with probability
  ``min(p_zero_variance, 1 - explore)``, i.e. kept with probability ``max(1 - p_zero_variance, explore)``,
  until B survive. GRESO keeps a prompt whose last z visits were all-correct (all-wrong) with probability
  ``max(p_e^z, 0.01)``; graphdiff replaces the streak heuristic by the estimate's P(a group of n rollouts
  is all-correct or all-wrong) and keeps GRESO's floor: ``explore`` = 0.01 by default, so no prompt is
  ever excluded for good. When fewer than B survive the whole candidate set, the round is filled with
  the skipped candidates of lowest ``p_zero_variance`` (they are then generated, not skipped).
* ``has_signal`` - which groups carry a GRPO signal: 0 < successes < n, success = reward >= threshold
  (NaN rewards, TRL's "not applicable", are not rollouts).
* ``DSRecord`` - one step's tally: generation rounds, groups generated / kept (trained, with signal) /
  filtered (zero-variance, dropped) / surplus (with signal, beyond B, dropped) / padded (zero-variance,
  trained because the round cap or the candidate set ran out), candidates skipped before generation,
  rollouts generated, seconds spent reading estimates for the pre-filter; ``metrics()`` gives the
  ``graphdiff/...`` scalars.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..core import decisions as dec
from ..errors import InvalidArgumentError
from ..io.outcomes import succeeded

DS_MODES = ("prefilter", "uniform")
DEFAULT_MAX_ROUNDS = 8  # DAPO's recipe allows 10 generation batches per step; verl's default is unbounded
DEFAULT_EXPLORE = 0.01  # GRESO's floor on the probability of generating a prompt predicted zero-variance


def check_mode(value) -> str | None:
    """``dynamic_sampling=`` as a mode: None/False (off), True or "prefilter", "uniform"."""
    if value is None or value is False:
        return None
    if value is True:
        return "prefilter"
    if value not in DS_MODES:
        raise InvalidArgumentError(f"dynamic_sampling must be True, False, 'prefilter' or 'uniform', got {value!r}")
    return value


def check_explore_p(explore) -> float:
    try:
        x = float(explore)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"prefilter_explore must be a number in (0, 1], got {explore!r}") from None
    if not 0.0 < x <= 1.0:
        raise InvalidArgumentError(f"prefilter_explore must lie in (0, 1], got {explore!r} (0 would never "
                                   "generate a prompt predicted zero-variance again)")
    return x


@dataclass
class Draw:
    """One generation round's choice: the rows generated and the candidates skipped before generation,
    each with the ``p_zero_variance`` the pre-filter saw (NaN in uniform mode) and the estimator step."""

    chosen: np.ndarray
    skipped: np.ndarray
    chosen_pzv: np.ndarray
    skipped_pzv: np.ndarray
    estimator_step: int
    extra: dict = field(default_factory=dict)
    seconds: float = 0.0  # spent reading the estimates (the pre-filter's cost; 0 in uniform mode)


class CandidateDraw:
    """Draw a generation round of ``batch_size`` dataset rows (see the module docstring for the rules).

    ``row_nodes[r]`` is dataset row r's node in ``target``; ``group_size`` the rollouts per prompt (the
    n of ``p_zero_variance``).
    """

    def __init__(self, target, row_nodes, batch_size: int, group_size: int, mode: str = "prefilter",
                 explore: float = DEFAULT_EXPLORE):
        self.target = target
        self.row_nodes = np.asarray(row_nodes, dtype=np.int64)
        self.batch_size = dec.check_batch(batch_size, self.row_nodes.size)
        self.group_size = dec.check_int(group_size, "group size", 1)
        self.mode = check_mode(mode)
        if self.mode is None:
            raise InvalidArgumentError("CandidateDraw needs a dynamic sampling mode")
        self.explore = check_explore_p(explore)

    def available(self, exclude=()) -> np.ndarray:
        """Rows that may be drawn: not retired, not in ``exclude`` (the rows generated this step)."""
        keep = np.ones(self.row_nodes.size, dtype=bool)
        retired = self.target.retired()
        if retired.size:
            keep &= ~np.isin(self.row_nodes, retired)
        exclude = np.asarray(list(exclude), dtype=np.int64)
        if exclude.size:
            keep[exclude] = False
        return np.flatnonzero(keep)

    def draw(self, seed, exclude=()) -> Draw:
        rng = np.random.default_rng(seed)
        rows = self.available(exclude)
        order = rows[rng.permutation(rows.size)]
        b = min(self.batch_size, order.size)
        step = self.target.step
        nan = np.full(b, np.nan)
        if self.mode == "uniform":
            return Draw(order[:b], np.zeros(0, np.int64), nan, np.zeros(0), step)
        keep_floor = 1.0 - self.explore
        read = 0.0
        chosen, chosen_pzv, skipped, skipped_pzv = [], [], [], []
        chunk = max(2 * self.batch_size, 16)  # candidates whose estimates are read at once
        for start in range(0, order.size, chunk):
            cand = order[start:start + chunk]
            t0 = time.perf_counter()
            pzv = np.asarray(self.target.estimates(self.row_nodes[cand], self.group_size)["p_zero_variance"],
                             dtype=np.float64)
            read += time.perf_counter() - t0
            skip = rng.random(cand.size) < np.minimum(pzv, keep_floor)
            for r, z, sk in zip(cand, pzv, skip):
                if len(chosen) == b:
                    break
                (skipped if sk else chosen).append(int(r))
                (skipped_pzv if sk else chosen_pzv).append(float(z))
            if len(chosen) == b:
                break
        filled = 0
        if len(chosen) < b:  # the whole candidate set was visited: fill from the skipped, lowest p first
            order_skipped = np.argsort(np.asarray(skipped_pzv), kind="stable")[: b - len(chosen)]
            take = set(order_skipped.tolist())
            chosen += [skipped[i] for i in order_skipped]
            chosen_pzv += [skipped_pzv[i] for i in order_skipped]
            skipped = [r for i, r in enumerate(skipped) if i not in take]
            skipped_pzv = [z for i, z in enumerate(skipped_pzv) if i not in take]
            filled = len(take)
        return Draw(np.asarray(chosen, np.int64), np.asarray(skipped, np.int64), np.asarray(chosen_pzv),
                    np.asarray(skipped_pzv), step, extra={"filled_from_skipped": filled}, seconds=read)


def has_signal(rewards, threshold: float | None) -> bool:
    """0 < successes < n over one group's rewards (success = reward >= threshold; NaN is no rollout). With no
    threshold the rewards are 0/1 (``count_outcomes`` refuses others when the group is applied): success = 1."""
    valid = [float(r) for r in rewards if not (r is None or (isinstance(r, float) and math.isnan(r)))]
    s = sum(bool(succeeded(r, threshold)) for r in valid)  # a reward the rule refuses is no success here
    return 0 < s < len(valid)


@dataclass
class DSRecord:
    """One step's dynamic sampling: what was generated, trained, dropped and skipped (ids per category)."""

    trainer_step: int
    batch_size: int
    max_rounds: int
    rounds: int = 0
    rollouts: int = 0
    generated: list[list[str]] = field(default_factory=list)  # per round, one id per group
    kept: list[str] = field(default_factory=list)  # trained, with signal
    padded: list[str] = field(default_factory=list)  # trained without signal (cap hit or candidates exhausted)
    filtered: list[str] = field(default_factory=list)  # zero-variance, dropped
    surplus: list[str] = field(default_factory=list)  # with signal beyond the batch, dropped
    skipped: list[str] = field(default_factory=list)  # skipped by the pre-filter before generation
    cap_hit: bool = False
    exhausted: bool = False
    prefilter_seconds: float = 0.0  # the pre-filter's reads of the estimates for this step's rounds

    def metrics(self, prefix: str) -> dict[str, float]:
        groups = sum(len(g) for g in self.generated)
        out = {"generation_rounds": self.rounds, "groups_generated": groups, "groups_kept": len(self.kept),
               "groups_filtered": len(self.filtered), "groups_surplus": len(self.surplus),
               "groups_padded": len(self.padded), "skipped_before_generation": len(self.skipped),
               "rollouts_generated": self.rollouts, "round_cap_hit": float(self.cap_hit),
               "prefilter_seconds": self.prefilter_seconds}
        if self.kept:  # left out rather than NaN: a NaN would poison the logging window's mean
            out["rollouts_per_kept_group"] = self.rollouts / len(self.kept)
        return {prefix + k: float(v) for k, v in out.items()}

    def summary(self) -> str:
        why = f"the cap of {self.max_rounds} generation rounds" if self.cap_hit else "the candidates ran out"
        return (f"graphdiff dynamic sampling, trainer step {self.trainer_step}: {len(self.kept)} of "
                f"{self.batch_size} groups with signal after {self.rounds} rounds ({why}); "
                f"{len(self.padded)} zero-variance groups fill the batch (advantage 0)")
