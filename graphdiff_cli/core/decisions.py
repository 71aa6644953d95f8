"""Decision rules that turn per-prompt estimates into scheduler decisions (numpy only, no I/O).

Two kinds of decision, each a pure function of arrays:

**Selection** (``select``): keep ``B`` distinct prompts out of a candidate pool of ``M >= B``.

* ``target``  - the B candidates whose estimated success probability is closest to ``target`` (0.5 by
  default): PCL's rule (prompts a policy solves about half of the time carry the most group signal).
  With a belief (a variance > 0) and ``explore`` = e > 0 (beyond PCL), the distance is taken after e
  pseudo-rollouts landing on the target are added to each candidate's Beta belief:
  |mean - target| * T / (T + e), where T = alpha + beta is the belief's weight in rollouts. A prompt
  the belief knows little about moves towards the target and is tried; one with much evidence keeps
  its distance; candidates of equal evidence keep their order. Default e = 1, the weight of Jeffreys'
  Beta(1/2, 1/2) prior (docs/lab/results.md measures e in 0..4: it pays where prompts are revisited many
  times and costs a little where they are seen only a few times). A point-mass estimate (variance 0)
  is not moved.
* ``thompson`` - draw theta_i from each candidate's posterior and keep the B with the smallest
  (theta_i - target)^2: MoPPS's rule. The posterior is a Beta moment-matched to (p_i, var_i), the same
  belief ``Estimator.estimates`` uses for ``p_zero_variance`` (var = 0 or p in {0, 1}: theta = p).
* ``skip-zero-variance`` - drop each candidate with probability ``p_zero_variance`` (the predicted
  P(a group is all-correct or all-wrong)); the batch is drawn from the survivors, and if fewer than B
  survive it is filled from the dropped ones, lowest p_zero_variance first: GRESO's selective rollout,
  with a calibrated probability instead of GRESO's streak heuristic.
* ``uniform`` - B candidates uniformly at random (the reference every rule is measured against).

Exact ties in ``target`` and ``thompson`` are broken by a seeded random order (never by the pool's
order, which often follows a file sorted by source or difficulty). Every random choice comes from
``numpy.random.default_rng(seed)``, so a decision is reproducible from its seed.

**Allocation** (``allocate``): split a TOTAL rollout budget over prompts into integer counts n_i with
min <= n_i <= max and sum n_i = budget exactly.

* ``uniform``  - budget / count each (the remainder goes one by one to the first prompts).
* ``variance`` - n_i = clip(min + c sqrt(p_i (1 - p_i)), min, max) with c set so that the counts sum to
  the budget: counts grow with the Bernoulli standard deviation, and a prompt predicted certain
  (p in {0, 1}) gets the minimum (unless the others are all at max and budget is left over).
* ``vip``      - VIP's convex allocation (Nguyen et al., "Adaptive Rollout Allocation for Online
  Reinforcement Learning with Verifiable Rewards", ICLR 2026, arXiv:2602.01601). VIP shows that the
  per-prompt gradient variance of RLOO with n rollouts is proportional to p (1 - p) / (n - 1), and
  allocates by solving

      minimise  sum_i a_i / (n_i - 1) + gamma * sum_i n_i log p_i
      s.t.      sum_i n_i = budget,  min <= n_i <= max,       a_i = p_i (1 - p_i), p clipped to [1e-6, 1 - 1e-6]

  (the linear term is the tilt of VIP's public code, ``gamma`` = 0.0007 there for RLOO; the paper's
  objective, and the default here, is gamma = 0). The problem is convex and separable; its KKT
  conditions give n_i = clip(1 + sqrt(a_i / (lambda + gamma log p_i)), min, max) (n_i = max where the
  denominator is <= 0), with the multiplier lambda found by bisection so that the sum is the budget.
  VIP's code solves the same problem with SLSQP; the closed form here is exact and needs no solver.
  It requires min >= 2 (the variance has n - 1 in the denominator).

Continuous allocations are made integral by ``round_allocation``: floors, then the remaining units to
the largest fractional parts (largest remainder), never past a bound, so sum and bounds hold exactly.

**Rules by name.** Each rule registers itself: ``@select_rule(name, help)`` on a function of
(``Candidates``, batch size, numpy Generator) -> ``Selection``, ``@allocation_rule(name, help)`` on a function
of an ``AllocationProblem`` -> real-valued counts. ``select`` and ``allocate`` check what every rule shares
and dispatch by name; ``SELECT_STRATEGIES`` / ``ALLOCATE_STRATEGIES`` (and ``SELECT_RULES`` /
``ALLOCATE_RULES`` with each rule's help line) list the registered names in registration order, whoever
registered them, so a new rule is one function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import InvalidArgumentError, option
from .beta import from_moments, zero_variance_from_moments  # the moment matching p_zero_variance uses

# the rule with the highest effective-group rate on the real log (docs/lab/results.md: 0.789 over eight shuffles,
# against 0.506 for uniform choice); what select uses unless told otherwise
DEFAULT_SELECT_STRATEGY = "target"
TARGET_EXPLORE = 1.0  # the target rule's exploration, in pseudo-rollouts (Jeffreys' prior weight)
VIP_CLIP = 1e-6


@dataclass(frozen=True)
class Rule:
    """A registered decision rule: its name, the function that applies it and its help line."""

    name: str
    apply: Callable
    help: str


# name -> Rule, in registration order
SELECT_RULES: dict[str, Rule] = {}
ALLOCATE_RULES: dict[str, Rule] = {}


def _registrar(rules: dict, kind: str, name: str, help: str):
    def add(fn):
        if name in rules:
            raise ValueError(f"{kind} rule {name!r} is registered twice")
        rules[name] = Rule(name, fn, help)
        return fn

    return add


def select_rule(name: str, help: str):
    """Register ``fn(candidates: Candidates, batch_size, rng) -> Selection`` as the selection rule ``name``."""
    return _registrar(SELECT_RULES, "selection", name, help)


def allocation_rule(name: str, help: str):
    """Register ``fn(problem: AllocationProblem) -> real-valued counts`` (summing to the budget, within the
    bounds; ``round_allocation`` makes them integral) as the allocation rule ``name``."""
    return _registrar(ALLOCATE_RULES, "allocation", name, help)


def __getattr__(name: str):
    # the registered names, read when asked for (a rule registered after this import is among them)
    if name == "SELECT_STRATEGIES":
        return tuple(SELECT_RULES)
    if name == "ALLOCATE_STRATEGIES":
        return tuple(ALLOCATE_RULES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------------
# argument checks


def check_strategy(strategy, choices, what: str) -> str:
    if strategy not in choices:
        raise InvalidArgumentError(f"unknown {what} strategy {strategy!r}; choose one of {', '.join(choices)}")
    return strategy


def check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_batch(batch_size, pool: int) -> int:
    """A batch size of distinct prompts drawn from a data set of ``pool`` prompts: an integer in [1, pool]."""
    batch_size = check_int(batch_size, "batch size", 1)
    if batch_size > pool:
        raise InvalidArgumentError(f"batch size {batch_size} is larger than the data set of {pool} prompts")
    return batch_size


def _check_unit(x, name: str, size: int | None = None) -> np.ndarray:
    """A 1-D float array of finite values in [0, 1] (probabilities)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise InvalidArgumentError(f"{name} must be a 1-D array, got shape {a.shape}")
    if size is not None and a.size != size:
        raise InvalidArgumentError(f"{name} has {a.size} values for {size} candidates")
    bad = ~np.isfinite(a) | (a < 0) | (a > 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidArgumentError(f"{name}[{i}] = {float(a[i])!r} is not a probability in [0, 1]")
    return a


def check_explore(explore) -> float:
    e = float(explore) if isinstance(explore, (int, float, np.integer, np.floating)) and not isinstance(
        explore, (bool, np.bool_)) else float("nan")
    if not (np.isfinite(e) and e >= 0.0):
        raise InvalidArgumentError(f"explore must be a number of pseudo-rollouts >= 0, got {explore!r}")
    return e


def check_target(target) -> float:
    t = float(target)
    if not (np.isfinite(t) and 0.0 <= t <= 1.0):
        raise InvalidArgumentError(f"target must be a probability in [0, 1], got {target!r}")
    return t


# ----------------------------------------------------------------------------------------------------
# selection


@dataclass
class Selection:
    """The outcome of ``select``.

    chosen: positions into the candidate arrays, distinct, in order of preference (first = best).
    key: per-candidate sort key that ranked them (lower = preferred; NaN where the rule has none).
    theta: the Thompson draws (thompson only). dropped: which candidates the skip rule dropped
    (skip-zero-variance only).
    """

    strategy: str
    chosen: np.ndarray
    key: np.ndarray
    theta: np.ndarray | None = None
    dropped: np.ndarray | None = None
    info: dict = field(default_factory=dict)


def _ranked(key: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Positions sorted by key (ascending), exact ties in a random order drawn from ``rng``."""
    perm = rng.permutation(key.size)
    return perm[np.argsort(key[perm], kind="stable")]


def _check_variance(variance, m: int) -> np.ndarray:
    var = np.zeros(m) if variance is None else np.asarray(variance, dtype=np.float64)
    if var.shape != (m,) or not np.all(np.isfinite(var)) or (var < 0).any():
        raise InvalidArgumentError("variance must be a 1-D array of finite values >= 0, one per candidate")
    return var


@dataclass(frozen=True)
class Candidates:
    """What a selection rule reads: M candidates' estimates (None where not given; ``p`` and
    ``p_zero_variance`` not yet checked: a rule checks what it needs) and the rule's settings."""

    m: int
    p: np.ndarray | None
    variance: np.ndarray | None
    p_zero_variance: np.ndarray | None
    target: float
    explore: float


def select(strategy: str, batch_size: int, *, p=None, variance=None, p_zero_variance=None,
           target: float = 0.5, explore: float = TARGET_EXPLORE, seed: int | None = 0) -> Selection:
    """Choose ``batch_size`` distinct candidates; see the module docstring for the rules.

    Inputs are per-candidate arrays of one length M: ``p`` (target, thompson), ``variance`` of the
    belief about p (target with ``explore``, thompson; zeros = no uncertainty), ``p_zero_variance``
    (skip-zero-variance).
    ``uniform`` needs only M, taken from whichever array is given. Refused: an unknown strategy,
    batch_size < 1 or larger than M, a missing or malformed input.
    """
    check_strategy(strategy, tuple(SELECT_RULES), "selection")
    target = check_target(target)
    explore = check_explore(explore)
    batch_size = check_int(batch_size, "batch size", 1)
    given = [a for a in (p, variance, p_zero_variance) if a is not None]
    if not given:
        raise InvalidArgumentError("select needs per-candidate estimates (p, variance or p_zero_variance)")
    m = int(np.asarray(given[0]).shape[0]) if np.asarray(given[0]).ndim == 1 else -1
    if m < 0:
        raise InvalidArgumentError("per-candidate estimates must be 1-D arrays")
    if batch_size > m:
        raise InvalidArgumentError(f"batch size {batch_size} is larger than the pool of {m} candidates")
    candidates = Candidates(m, p, variance, p_zero_variance, target, explore)
    return SELECT_RULES[strategy].apply(candidates, batch_size, np.random.default_rng(seed))


def _needs_p(c: Candidates, strategy: str) -> np.ndarray:
    if c.p is None:
        raise InvalidArgumentError(f"the {strategy} strategy needs p")
    return _check_unit(c.p, "p", c.m)


@select_rule("target", "closest p to --target")
def _target(c: Candidates, batch_size: int, rng: np.random.Generator) -> Selection:
    pa = _needs_p(c, "target")
    key = np.abs(pa - c.target)
    if c.explore > 0.0:
        alpha, beta, ok = from_moments(pa, _check_variance(c.variance, c.m))
        key[ok] *= (alpha + beta)[ok] / ((alpha + beta)[ok] + c.explore)
    return Selection("target", _ranked(key, rng)[:batch_size].astype(np.int64), key,
                     info={"target": c.target, "explore": c.explore})


@select_rule("thompson", "posterior draw closest to --target")
def _thompson(c: Candidates, batch_size: int, rng: np.random.Generator) -> Selection:
    pa = _needs_p(c, "thompson")
    alpha, beta, ok = from_moments(pa, _check_variance(c.variance, c.m))
    theta = pa.copy()
    if ok.any():
        theta[ok] = rng.beta(alpha[ok], beta[ok])
    key = (theta - c.target) ** 2
    return Selection("thompson", _ranked(key, rng)[:batch_size].astype(np.int64), key, theta=theta,
                     info={"target": c.target})


@select_rule("skip-zero-variance", "drop with P(all correct or all wrong)")
def _skip_zero_variance(c: Candidates, batch_size: int, rng: np.random.Generator) -> Selection:
    if c.p_zero_variance is None:
        raise InvalidArgumentError("the skip-zero-variance strategy needs p_zero_variance")
    pzv = _check_unit(c.p_zero_variance, "p_zero_variance", c.m)
    dropped = rng.random(c.m) < pzv
    kept = np.flatnonzero(~dropped)
    if kept.size >= batch_size:
        chosen = rng.choice(kept, size=batch_size, replace=False)
    else:
        pool = np.flatnonzero(dropped)
        fill = pool[np.argsort(pzv[pool], kind="stable")][: batch_size - kept.size]
        chosen = np.concatenate([rng.permutation(kept), fill])
    return Selection("skip-zero-variance", chosen.astype(np.int64), pzv.copy(), dropped=dropped,
                     info={"kept": int(kept.size), "filled": int(max(0, batch_size - kept.size))})


@select_rule("uniform", "at random")
def _uniform_choice(c: Candidates, batch_size: int, rng: np.random.Generator) -> Selection:
    chosen = rng.choice(c.m, size=batch_size, replace=False)
    return Selection("uniform", chosen.astype(np.int64), np.full(c.m, np.nan))


GRESO_MIN_KEEP = 0.01  # GRESO's exploration floor: a prompt is kept with probability at least this


def prefilter_zero_variance(p_zero_variance, min_keep: float = GRESO_MIN_KEEP, seed=0) -> np.ndarray:
    """Which candidates to generate (bool, True = keep) before any rollout, for dynamic sampling.

    GRESO's selective rollout (Zheng et al.; peers note): GRESO skips a prompt with probability
    1 - max(p^z, 0.01) from its streak z of all-equal visits; here the skip probability is the calibrated
    predicted P(the group is all-correct or all-wrong), with GRESO's exploration floor: each candidate is
    skipped with probability min(p_zero_variance, 1 - min_keep), independently. ``select``'s
    ``skip-zero-variance`` is the same idea as a selection rule (no floor, refills from the dropped).
    """
    pzv = np.asarray(p_zero_variance, dtype=np.float64)
    if pzv.ndim != 1 or not np.all(np.isfinite(pzv)) or (pzv < 0).any() or (pzv > 1).any():
        raise InvalidArgumentError("p_zero_variance must be a 1-D array of probabilities, one per candidate")
    if not 0.0 <= float(min_keep) <= 1.0:
        raise InvalidArgumentError(f"the pre-filter's minimum keep probability must lie in [0, 1], got {min_keep!r}")
    skip = np.minimum(pzv, 1.0 - float(min_keep))
    return np.random.default_rng(seed).random(pzv.size) >= skip


# ----------------------------------------------------------------------------------------------------
# allocation


def check_budget(count: int, budget, min_count, max_count) -> tuple[int, int, int]:
    """Validate (budget, min, max) for ``count`` prompts; returns them as ints."""
    if count < 1:
        raise InvalidArgumentError("allocation needs at least one prompt")
    min_count = check_int(min_count, option("--min", "min_count"), 1)
    max_count = check_int(max_count, option("--max", "max_count"), 1)
    budget = check_int(budget, option("--budget"), 0)
    if max_count < min_count:
        raise InvalidArgumentError(f"{option('--max', 'max_count')} {max_count} is below {option('--min', 'min_count')} {min_count}")
    if budget < min_count * count:
        raise InvalidArgumentError(f"budget {budget} is below the minimum {min_count} x {count} prompts "
                                   f"= {min_count * count}")
    if budget > max_count * count:
        raise InvalidArgumentError(f"budget {budget} is above the maximum {max_count} x {count} prompts "
                                   f"= {max_count * count}")
    return budget, min_count, max_count


def round_allocation(x, budget: int, min_count: int, max_count: int) -> np.ndarray:
    """Integer counts from a continuous allocation: floors, then largest remainders, within the bounds.

    ``x`` is clipped to [min, max] first. The floors are raised one unit at a time at the largest
    fractional parts (ties: first position) while below ``budget``, and, should rounding error have
    put the floors above it, lowered at the smallest fractional parts. No count leaves [min, max] and
    the result sums to ``budget`` exactly whenever min * len(x) <= budget <= max * len(x).
    """
    x = np.clip(np.asarray(x, dtype=np.float64), min_count, max_count)
    budget, min_count, max_count = check_budget(x.size, budget, min_count, max_count)
    n = np.floor(x + 1e-9).astype(np.int64)  # 2.9999999999 is 3, not 2 + a remainder of ~1
    n = np.clip(n, min_count, max_count)
    frac = x - n
    short = budget - int(n.sum())
    if short > 0:
        room = np.flatnonzero(n < max_count)
        order = room[np.argsort(-frac[room], kind="stable")]
        while short > 0:  # more than one pass only if x did not sum to the budget
            take = order[n[order] < max_count][:short]
            if take.size == 0:  # unreachable when check_budget passed
                raise InvalidArgumentError(f"cannot place {short} more rollouts within {option('--max', 'max_count')} {max_count}")
            n[take] += 1
            short -= take.size
    elif short < 0:
        room = np.flatnonzero(n > min_count)
        order = room[np.argsort(frac[room], kind="stable")]
        while short < 0:
            take = order[n[order] > min_count][:-short]
            if take.size == 0:  # unreachable when check_budget passed
                raise InvalidArgumentError(f"cannot remove {-short} rollouts within {option('--min', 'min_count')} {min_count}")
            n[take] -= 1
            short += take.size
    return n


def _water_fill(level, budget: float, lo: int, hi: int, t_lo: float, t_hi: float, iters: int = 200) -> np.ndarray:
    """x(t) = clip(level(t), lo, hi) with sum x(t) = budget; level(t) is nondecreasing in t and
    sum x(t_lo) <= budget <= sum x(t_hi). Bisection on t (exact to float precision)."""
    for _ in range(iters):
        mid = 0.5 * (t_lo + t_hi)
        if np.clip(level(mid), lo, hi).sum() < budget:
            t_lo = mid
        else:
            t_hi = mid
        if t_hi - t_lo <= 1e-15 * max(1.0, abs(t_hi)):
            break
    x_lo = np.clip(level(t_lo), lo, hi)
    x_hi = np.clip(level(t_hi), lo, hi)
    s_lo, s_hi = x_lo.sum(), x_hi.sum()
    # interpolate between the two brackets so that the sum is the budget up to rounding
    w = 0.0 if s_hi <= s_lo else (budget - s_lo) / (s_hi - s_lo)
    return x_lo + w * (x_hi - x_lo)


@dataclass(frozen=True)
class AllocationProblem:
    """What an allocation rule reads: each prompt's p (checked), the budget, the bounds (min < max) and
    vip's gamma."""

    p: np.ndarray
    budget: int
    min_count: int
    max_count: int
    vip_gamma: float = 0.0


def continuous_allocation(strategy: str, p, budget: int, min_count: int = 2, max_count: int = 32,
                          vip_gamma: float = 0.0) -> np.ndarray:
    """The real-valued allocation each strategy rounds (see the module docstring); sums to budget."""
    check_strategy(strategy, tuple(ALLOCATE_RULES), "allocation")
    pa = _check_unit(p, "p")
    budget, lo, hi = check_budget(pa.size, budget, min_count, max_count)
    if lo == hi:  # one count fits all
        return np.full(pa.size, budget / pa.size)
    return ALLOCATE_RULES[strategy].apply(AllocationProblem(pa, budget, lo, hi, vip_gamma))


@allocation_rule("uniform", "budget / count each")
def _uniform_allocation(a: AllocationProblem) -> np.ndarray:
    return np.full(a.p.size, a.budget / a.p.size)


@allocation_rule("variance", "counts grow with sqrt(p(1-p))")
def _variance_allocation(a: AllocationProblem) -> np.ndarray:
    pa, budget, lo, hi, count = a.p, a.budget, a.min_count, a.max_count, a.p.size
    w = np.sqrt(pa * (1.0 - pa))
    live = w > 0
    if not live.any():
        return np.full(count, budget / count)
    cap = hi * int(live.sum()) + lo * int((~live).sum())
    if budget >= cap:
        # every uncertain prompt is at max; what is left goes evenly to the certain ones
        x = np.where(live, float(hi), float(lo))
        if (~live).any():
            x[~live] = (budget - hi * live.sum()) / (~live).sum()
        return x
    t_hi = (hi - lo) / w[live].min()
    return _water_fill(lambda c: lo + c * w, budget, lo, hi, 0.0, t_hi)


@allocation_rule("vip", "VIP's convex allocation")
def _vip_allocation(a: AllocationProblem) -> np.ndarray:
    pa, budget, lo, hi, count = a.p, a.budget, a.min_count, a.max_count, a.p.size
    if lo < 2:
        raise InvalidArgumentError(f"the vip strategy needs {option('--min', 'min_count')} >= 2 (its variance has n - 1 in "
                                   f"the denominator), got {lo}")
    g = float(a.vip_gamma)
    if not (np.isfinite(g) and g >= 0):
        raise InvalidArgumentError(f"vip gamma must be a finite number >= 0, got {a.vip_gamma!r}")
    pc = np.clip(pa, VIP_CLIP, 1.0 - VIP_CLIP)
    var = pc * (1.0 - pc)
    tilt = g * np.log(pc)  # <= 0

    def level(t):
        # t = -lambda, so that the level rises with t; denominator mu_i = lambda + gamma log p_i
        mu = -t + tilt
        out = np.full(count, float(hi))
        pos = mu > 0
        out[pos] = 1.0 + np.sqrt(var[pos] / mu[pos])
        return out

    # at lambda_hi every prompt is at min, at lambda_lo every prompt is at max
    lam_hi = float(np.max(var / (lo - 1.0) ** 2 - tilt))
    lam_lo = float(np.min(var / (hi - 1.0) ** 2 - tilt))
    return _water_fill(level, budget, lo, hi, -lam_hi, -lam_lo + 1e-12)


def allocate(strategy: str, p, budget: int, min_count: int = 2, max_count: int = 32,
             vip_gamma: float = 0.0) -> np.ndarray:
    """Integer rollout counts per prompt (int64), min <= n_i <= max, sum = budget exactly.

    ``p``: each prompt's estimated success probability (ignored by ``uniform`` apart from its length).
    Refused: an unknown strategy, a budget outside [min * count, max * count], max < min, vip with
    min < 2.
    """
    x = continuous_allocation(strategy, p, budget, min_count, max_count, vip_gamma)
    return round_allocation(x, budget, min_count, max_count)


def vip_objective(p, n, vip_gamma: float = 0.0) -> float:
    """sum_i a_i / (n_i - 1) + gamma sum_i n_i log p_i with VIP's clipping (the quantity vip minimises)."""
    pc = np.clip(np.asarray(p, dtype=np.float64), VIP_CLIP, 1.0 - VIP_CLIP)
    n = np.asarray(n, dtype=np.float64)
    return float(np.sum(pc * (1.0 - pc) / (n - 1.0)) + vip_gamma * np.sum(n * np.log(pc)))


def nondegenerate_probability(p, n) -> np.ndarray:
    """P(0 < s < n) for s ~ Binomial(n, p): the chance that a group of n rollouts has signal."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    n = np.asarray(n, dtype=np.float64)
    return np.where(n >= 1, 1.0 - p ** n - (1.0 - p) ** n, 0.0)


# ----------------------------------------------------------------------------------------------------
# expected groups with a signal, against uniform's


def expected_signal_groups(mean, variance, counts) -> float:
    """The expected number of groups with a signal (0 < s < n_i: not all correct, not all wrong) when prompt i gets
    n_i rollouts and its success probability follows the belief, the Beta moment-matched to (mean_i, variance_i)
    (a point mass where the variance is 0): sum_i 1 - E[p_i^n_i + (1 - p_i)^n_i]. A prompt given fewer than two
    rollouts has none."""
    m = _check_unit(mean, "mean")
    var = _check_variance(variance, m.size)
    n = np.asarray(counts)
    if n.shape != m.shape or (n.size and (n.dtype.kind not in "iu" or n.min() < 0)):
        raise InvalidArgumentError("counts must be a 1-D array of integers >= 0, one per prompt")
    total = 0.0
    for g in np.unique(n[n >= 2]):
        at = n == g
        total += float(np.sum(1.0 - zero_variance_from_moments(m[at], var[at], int(g))))
    return total


def selection_signal_groups(p_zero_variance, chosen) -> tuple[float, float]:
    """(expected groups with a signal among the ``chosen`` candidates, the same for a uniform draw of as many from
    the whole pool): sum over the chosen of 1 - p_zero_variance, and B times its mean over the pool."""
    signal = 1.0 - _check_unit(p_zero_variance, "p_zero_variance")
    chosen = np.asarray(chosen, dtype=np.int64)
    uniform = chosen.size * float(signal.mean()) if signal.size else 0.0
    return float(signal[chosen].sum()), uniform


def short_of_uniform(expected: float, uniform: float) -> bool:
    """Whether a strategy's expected groups with a signal fall below uniform's (beyond rounding: equal ones, as
    when every prompt gets the same count, do not)."""
    return expected < uniform - 1e-9 * max(1.0, abs(uniform))
