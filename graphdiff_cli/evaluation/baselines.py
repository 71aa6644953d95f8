"""Online difficulty estimators that graphdiff is compared with, behind one protocol with graphdiff's own.

Every estimator is replayed over a training log step by step (``graphdiff_cli.evaluation.replay``): before a
step it estimates the step's prompts, then it is shown the step's outcomes. The rules are the peers'
published ones (see docs / shared notes "peers"):

* ``HistoryMean``      p_i = S_i / C_i over earlier rollouts; unseen -> global mean so far (0.5 before any).
* ``DiscountedHistory`` S_i <- lam S_i + s_i, C_i <- lam C_i + n_i per visit; p_i = (m g + S_i)/(m + C_i).
* ``MoPPS``            Beta(alpha_i, beta_i) from (1, 1); alpha <- lam alpha + (1 - lam) + s,
                       beta <- lam beta + (1 - lam) + (n - s); p_i = alpha / (alpha + beta).
* ``GRESO``            last visit's mean reward; skip probability 1 - max(p^z, 0.01) from trailing
                       all-correct / all-wrong visits, p_e / p_h adapted each step.
* ``VIP``              GP regression on logits of the previous step's rates, RBF kernel on embeddings, its
                       posterior mean carried from step to step (the authors' trainer).
* ``DOTS``             attention over the embeddings of the most recent observed prompts, calibrated linearly
                       on them (Sun et al.'s adaptive difficulty prediction).
* ``RidgeReadout``     ridge read-out of the embedding fitted online on every outcome so far, blended with a
                       seen prompt's own outcomes by evidence mixing (``core.readout``, the estimator's own).
* ``CovariateReadout``  the same ridge read-out on the prompts' encoded covariates (``core.covariates``: text
                       statistics, the prompt file's fields, a reference pass rate) instead of the embedding:
                       graphdiff's covariates source (``estimator.sources.covariates``) alone.
* ``ReferencePrior``   BOTS's interpolation prior (Trinity-RFT): each prompt's Beta takes its own outcomes as
                       explicit evidence and, every step, the reference pass rate rescaled to the policy as
                       implicit evidence.
* ``LabelPropagation`` harmonic function (Zhu et al. 2003) on the mutual-kNN graph W.
* ``SampleBeforeRL`` / ``SampleBeforeStep`` (oracles, see ``OracleEstimator``).

Each registers itself as a method of ``evaluate`` (``registry.register``: its key, settings and help line).

The protocol (``OnlineEstimator``), graphdiff's ``Estimator``'s own: ``update(ids, n, s)`` learns a step's
outcomes and ``estimates(ids, group_size)`` returns at least {"p": the point estimate in [0, 1]}; an estimator
with a belief about each p adds its "variance" (and its "mean" where it is not p), one with a zero-variance
predictor its "p_zero_variance" = P(s in {0, group_size}). ``belief`` fills in what a decision reads for
any of them. A peer also carries its ``name`` (several instances of one class can run side by side) and its
point rule as ``predict(ids)`` (``Peer``). ``ids`` are node indices 0..N-1; a prompt listed twice in one step
has its counts summed, as the estimator does.

Oracles see outcomes no real estimator has. They implement ``OracleEstimator`` instead:
``oracle = True`` and ``predict_with_outcomes(ids, n, s)``, which the replay calls with the batch's own
outcomes. Keeping this a separate, explicitly named method means an ordinary estimator can never be
handed outcomes of the batch it is predicting.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp

from ..errors import DataError, InvalidArgumentError
from ..core import beta as B
from ..core.beta import DEFAULT_GROUP_SIZE
from ..core.harmonic import harmonic_solution
from .registry import register

__all__ = [
    "OnlineEstimator", "OracleEstimator", "Peer", "belief", "has_belief", "point_estimate", "aggregate_counts",
    "HistoryMean", "DiscountedHistory", "MoPPS", "GRESO", "VIP", "DOTS", "RidgeReadout", "CovariateReadout",
    "ReferencePrior", "LabelPropagation",
    "harmonic_solution", "SampleBeforeRL", "SampleBeforeStep",
]


@runtime_checkable
class OnlineEstimator(Protocol):
    """An estimator that estimates before a step and learns after it (graphdiff's ``Estimator`` and every peer)."""

    def estimates(self, ids: np.ndarray, group_size: int) -> dict[str, np.ndarray]:
        """{"p": p-hat in [0, 1] per node index in ``ids``} from the outcomes already passed to update; with a
        belief also "variance" (and "mean" where it is not p); with a zero-variance predictor
        "p_zero_variance" for groups of ``group_size`` rollouts."""

    def update(self, ids: np.ndarray, n: np.ndarray, s: np.ndarray):
        """Learn one step's outcomes: prompt ``ids[j]`` got ``n[j]`` rollouts and ``s[j]`` successes."""


@runtime_checkable
class OracleEstimator(Protocol):
    """A reference that is shown the batch's own outcomes before predicting (not a real estimator)."""

    name: str
    oracle: bool  # always True

    def predict_with_outcomes(self, ids: np.ndarray, n: np.ndarray, s: np.ndarray) -> np.ndarray:
        """p-hat for ``ids`` given that batch's outcomes (n, s)."""

    def update(self, ids: np.ndarray, n: np.ndarray, s: np.ndarray) -> None:
        """Learn one step's outcomes (called after predict_with_outcomes, like any estimator)."""


def point_estimate(method, ids) -> np.ndarray:
    """An online estimator's p for ``ids`` (its estimates' "p", which no group size changes)."""
    return np.asarray(method.estimates(np.asarray(ids, dtype=np.int64), 1)["p"], dtype=np.float64)


def has_belief(method) -> bool:
    """Whether an online estimator keeps a belief with a spread about each p (its estimates have a variance)."""
    return "variance" in method.estimates(np.zeros(0, dtype=np.int64), 1)


def belief(method, ids, group_size: int) -> dict[str, np.ndarray]:
    """What a decision reads of an online estimator for node ``ids``: {"p": its point estimate, "mean" and
    "variance": its belief about p (graphdiff's Beta belief, exactly what `graphdiff select` decides by;
    MoPPS's Beta; a method without one: p and 0), "p_zero_variance": its own (graphdiff's, MoPPS's, GRESO's
    skip probability), else the plug-in p^g + (1 - p)^g}; p and p_zero_variance clipped to [0, 1]."""
    ids = np.asarray(ids, dtype=np.int64)
    est = method.estimates(ids, int(group_size))
    p = np.clip(np.asarray(est["p"], dtype=np.float64), 0.0, 1.0)
    if "variance" in est:
        mean = np.asarray(est.get("mean", est["p"]), dtype=np.float64)
        var = np.asarray(est["variance"], dtype=np.float64)
    else:
        mean, var = p, np.zeros(ids.size)
    pzv = est.get("p_zero_variance")
    pzv = B.zero_variance_point(p, int(group_size)) if pzv is None else np.asarray(pzv, dtype=np.float64)
    return {"p": p, "mean": mean, "variance": var, "p_zero_variance": np.clip(pzv, 0.0, 1.0)}


class Peer:
    """A peer's ``estimates`` from its point rule ``predict(ids)``; a peer with a belief or a zero-variance
    predictor extends it."""

    name: str

    def predict(self, ids) -> np.ndarray:
        raise NotImplementedError

    def estimates(self, ids, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, np.ndarray]:
        return {"p": self.predict(ids)}


class BetaPeer(Peer):
    """A peer whose belief about each prompt is a Beta(alpha_i, beta_i) (``alpha_``, ``beta_``: one per node; MoPPS,
    BOTS's reference prior): p = its mean, with its variance and the Beta-Binomial P(s in {0, g})."""

    n_nodes: int
    alpha_: np.ndarray
    beta_: np.ndarray

    def predict(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        a, b = self.alpha_[ids], self.beta_[ids]
        return a / (a + b)

    def estimates(self, ids, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, np.ndarray]:
        """p = the Beta's mean, its variance, and the Beta-Binomial P(s in {0, g})."""
        ids = _check_ids(ids, self.n_nodes)
        a, b = self.alpha_[ids], self.beta_[ids]
        mean, var = B.mean_variance(a, b)
        return {"p": mean, "variance": var, "p_zero_variance": B.zero_variance(a, b, int(group_size))}


def flag(value, where: str) -> bool:
    """A boolean setting, refused in one line when it is not one (YAML's "false" as text would be true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(f"{where} must be true or false, got {value!r}")
    return bool(value)


# ----------------------------------------------------------------------------------------------------
# helpers


def _check_ids(ids, n_nodes: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise DataError("ids must be a 1-D array of integer node indices")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= n_nodes):
        i = int(np.flatnonzero((ids < 0) | (ids >= n_nodes))[0])
        raise DataError(f"ids[{i}] = {ids[i]} is out of range: there are {n_nodes} prompts")
    return ids


def aggregate_counts(ids, n, s, n_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate one step's rows and sum them per prompt: (unique ids, n, s) as int64, n = 0 dropped."""
    ids = _check_ids(ids, n_nodes)
    n = np.asarray(n)
    s = np.asarray(s)
    if not (ids.shape == n.shape == s.shape):
        raise DataError(f"ids, n and s must have the same length, got {ids.size}, {n.size}, {s.size}")
    for name, arr in (("n", n), ("s", s)):
        if arr.size and arr.dtype.kind == "f" and not np.all(arr == np.round(arr)):
            raise DataError(f"{name} must hold integer counts")
    n = n.astype(np.int64)
    s = s.astype(np.int64)
    if (n < 0).any() or (s < 0).any():
        raise DataError("counts n and s must be non-negative")
    if (s > n).any():
        i = int(np.flatnonzero(s > n)[0])
        raise DataError(f"s[{i}] = {s[i]} is larger than n[{i}] = {n[i]}")
    keep = n > 0
    uniq, inv = np.unique(ids[keep], return_inverse=True)
    n_sum = np.bincount(inv, weights=n[keep], minlength=uniq.size).astype(np.int64)
    s_sum = np.bincount(inv, weights=s[keep], minlength=uniq.size).astype(np.int64)
    return uniq, n_sum, s_sum


def _check_n_nodes(n_nodes) -> int:
    if not isinstance(n_nodes, (int, np.integer)) or n_nodes < 1:
        raise InvalidArgumentError(f"n_nodes must be a positive integer, got {n_nodes!r}")
    return int(n_nodes)


class _GlobalMean:
    """Running global success rate of every outcome seen so far, 0.5 before any (used for unseen prompts)."""

    def __init__(self):
        self.successes = 0
        self.rollouts = 0

    def add(self, n: np.ndarray, s: np.ndarray) -> None:
        self.successes += int(s.sum())
        self.rollouts += int(n.sum())

    @property
    def value(self) -> float:
        return self.successes / self.rollouts if self.rollouts else 0.5


# ----------------------------------------------------------------------------------------------------
# per-prompt history baselines


@register("history", help="per-prompt history mean")
class HistoryMean(Peer):
    """Per-prompt history mean: p_i = S_i / C_i over all earlier rollouts of i.

    An unseen prompt gets the global mean of all outcomes seen so far (0.5 before any). This is the
    "VIP-style history" and GRESO's signal (peers note).
    """

    def __init__(self, n_nodes: int, name: str = "history"):
        self.n_nodes = _check_n_nodes(n_nodes)
        self.name = name
        self.successes_ = np.zeros(self.n_nodes)
        self.rollouts_ = np.zeros(self.n_nodes)
        self._global = _GlobalMean()

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.n_nodes), {"method": "per-prompt history mean"})]

    def predict(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        c = self.rollouts_[ids]
        return np.where(c > 0, self.successes_[ids] / np.maximum(c, 1e-300), self._global.value)

    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        self.successes_[ids] += s
        self.rollouts_[ids] += n
        self._global.add(n, s)


# discounted history where it is not tuned on the log (hindsight): the peers' suggested start
DISCOUNTED = {"lam": 0.9, "m": 1.0}


# its settings: the grid searched on the log itself (hindsight tuning: optimistic for it)
@register("discounted", help="discounted history, (lambda, m) tuned on the log",
          settings={"lambdas": [1.0, 0.95, 0.9, 0.8, 0.7, 0.5], "m": [0.0, 0.5, 1.0, 2.0, 4.0]})
class DiscountedHistory(Peer):
    """Discounted history: at each visit S_i <- lam S_i + s_i, C_i <- lam C_i + n_i;

    p_i = (m g + S_i) / (m + C_i), g the global mean of all outcomes so far (0.5 before any). Prompts
    not visited in a step are left untouched (the discount is per visit, not per step). lam = 1, m = 0
    is the plain history mean; an unseen prompt (C_i = 0) gets g for every m.
    """

    def __init__(self, n_nodes: int, lam: float = 0.9, m: float = 1.0, name: str | None = None):
        self.n_nodes = _check_n_nodes(n_nodes)
        if not 0 < lam <= 1:
            raise InvalidArgumentError(f"discount lambda must lie in (0, 1], got {lam!r}")
        if not m >= 0:
            raise InvalidArgumentError(f"prior strength m must be >= 0, got {m!r}")
        self.lam, self.m = float(lam), float(m)
        self.name = name or f"discounted(lam={self.lam:g},m={self.m:g})"
        self.successes_ = np.zeros(self.n_nodes)
        self.rollouts_ = np.zeros(self.n_nodes)
        self._global = _GlobalMean()

    @classmethod
    def build(cls, inputs, settings) -> list:
        """At ``inputs.tuned`` (the grid's best on the log), else at ``DISCOUNTED``."""
        tuned = DISCOUNTED if inputs.tuned is None else inputs.tuned
        lam, m = tuned["lam"], tuned["m"]
        return [(cls(inputs.n_nodes, lam, m, name="discounted"),
                 {"method": "discounted history", "lam": lam, "m": m, "tuned_on_this_log": tuned is not DISCOUNTED})]

    def predict(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        g = self._global.value
        c = self.rollouts_[ids]
        denom = self.m + c
        with np.errstate(invalid="ignore", divide="ignore"):
            p = (self.m * g + self.successes_[ids]) / denom
        return np.where(c > 0, p, g)

    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        self.successes_[ids] = self.lam * self.successes_[ids] + s
        self.rollouts_[ids] = self.lam * self.rollouts_[ids] + n
        self._global.add(n, s)


@register("mopps", help="MoPPS's Beta per prompt, one per lambda", settings={"lambdas": [1.0, 0.5]})
class MoPPS(BetaPeer):
    """MoPPS (Qu et al.): a Beta(alpha_i, beta_i) per prompt, starting at (1, 1).

    After a visit with n rollouts and s successes:
        alpha_i <- lam alpha_i + (1 - lam) * 1 + s,    beta_i <- lam beta_i + (1 - lam) * 1 + (n - s)
    p_i = alpha_i / (alpha_i + beta_i). The public code's operator-precedence slip for n = 1 is not
    reproduced: s and n - s enter exactly as written above for every n. The zero-variance probability is
    the Beta-Binomial predictive P(s in {0, g}) of the prompt's Beta.
    """

    def __init__(self, n_nodes: int, lam: float = 1.0, name: str | None = None):
        self.n_nodes = _check_n_nodes(n_nodes)
        if not 0 <= lam <= 1:
            raise InvalidArgumentError(f"MoPPS lambda must lie in [0, 1], got {lam!r}")
        self.lam = float(lam)
        self.name = name or f"mopps(lam={self.lam:g})"
        self.alpha_ = np.ones(self.n_nodes)
        self.beta_ = np.ones(self.n_nodes)

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.n_nodes, float(lam)), {"method": "MoPPS", "lam": float(lam)})
                for lam in settings["lambdas"]]


    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        lam = self.lam
        self.alpha_[ids] = lam * self.alpha_[ids] + (1.0 - lam) + s
        self.beta_[ids] = lam * self.beta_[ids] + (1.0 - lam) + (n - s)


@register("greso", help="GRESO's last visit's mean and skip probability", settings={"tau": 0.25})
class GRESO(Peer):
    """GRESO (Zheng et al.): selective rollout from each prompt's per-visit mean rewards.

    z_e = trailing number of visits with mean >= 0.98, z_h = trailing number with mean <= 0.11.
    Skip probability = 1 - max(p_e^z_e, 0.01) if z_e > 0, else 1 - max(p_h^z_h, 0.01) if z_h > 0, else 0.
    After every step: if the step's all-correct ratio >= tau/3, p_e <- p_e - 0.01 (skip more easy
    prompts), else p_e <- p_e + 0.01; likewise p_h with the all-wrong ratio against 2 tau / 3; both
    clipped to [0.05, 0.95]; tau = 0.25, p_e = p_h = 0.5 at the start. (The reference trainer adapts
    only from its second epoch on; the peers' rule, followed here, adapts from the first step.)

    As a probability the last visit's mean is used (the global mean so far for an unseen prompt, 0.5
    before any outcome); as a zero-variance predictor, the skip probability (0 for an unseen prompt:
    GRESO never skips one).
    """

    EASY_MEAN, HARD_MEAN = 0.98, 0.11
    MIN_KEEP = 0.01

    def __init__(self, n_nodes: int, tau: float = 0.25, p_easy: float = 0.5, p_hard: float = 0.5,
                 step_size: float = 0.01, p_min: float = 0.05, p_max: float = 0.95, name: str = "greso"):
        self.n_nodes = _check_n_nodes(n_nodes)
        if not 0 < tau <= 1:
            raise InvalidArgumentError(f"GRESO target zero-variance ratio tau must lie in (0, 1], got {tau!r}")
        self.name = name
        self.tau, self.step_size, self.p_min, self.p_max = float(tau), float(step_size), float(p_min), float(p_max)
        self.p_easy_, self.p_hard_ = float(p_easy), float(p_hard)
        self.last_mean_ = np.full(self.n_nodes, np.nan)
        self.z_easy_ = np.zeros(self.n_nodes, dtype=np.int64)
        self.z_hard_ = np.zeros(self.n_nodes, dtype=np.int64)
        self._global = _GlobalMean()

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.n_nodes, tau=float(settings["tau"])), {"method": "GRESO", "tau": settings["tau"]})]

    def predict(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        last = self.last_mean_[ids]
        return np.where(np.isnan(last), self._global.value, last)

    def skip_probability(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        ze, zh = self.z_easy_[ids], self.z_hard_[ids]
        keep_e = np.maximum(self.p_easy_ ** ze, self.MIN_KEEP)
        keep_h = np.maximum(self.p_hard_ ** zh, self.MIN_KEEP)
        return np.where(ze > 0, 1.0 - keep_e, np.where(zh > 0, 1.0 - keep_h, 0.0))

    def estimates(self, ids, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, np.ndarray]:
        # GRESO's zero-variance signal does not depend on the group size
        return {"p": self.predict(ids), "p_zero_variance": self.skip_probability(ids)}

    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        if ids.size == 0:
            return
        mean = s / n
        easy, hard = mean >= self.EASY_MEAN, mean <= self.HARD_MEAN
        self.z_easy_[ids] = np.where(easy, self.z_easy_[ids] + 1, 0)
        self.z_hard_[ids] = np.where(hard, self.z_hard_[ids] + 1, 0)
        self.last_mean_[ids] = mean
        self._global.add(n, s)
        all_correct = float(np.mean(s == n))
        all_wrong = float(np.mean(s == 0))
        d = self.step_size
        self.p_easy_ = float(np.clip(self.p_easy_ - d if all_correct >= self.tau / 3 else self.p_easy_ + d,
                                     self.p_min, self.p_max))
        self.p_hard_ = float(np.clip(self.p_hard_ - d if all_wrong >= 2 * self.tau / 3 else self.p_hard_ + d,
                                     self.p_min, self.p_max))


def _check_embeddings(embeddings, who: str, unit_norm: bool = False) -> np.ndarray:
    """A finite 2-D float64 array of prompt embeddings (rows unit-normalised where ``unit_norm``)."""
    e = np.asarray(embeddings, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] < 1 or e.shape[1] < 1:
        raise DataError(f"{who} needs a 2-D array of prompt embeddings, got shape {e.shape}")
    if not np.all(np.isfinite(e)):
        raise DataError(f"{who} embeddings contain NaN or infinite values")
    if unit_norm:
        norms = np.linalg.norm(e, axis=1)
        if not np.allclose(norms, 1.0, atol=1e-3):
            i = int(np.argmax(np.abs(norms - 1.0)))
            raise DataError(f"{who} needs unit-norm embeddings; row {i} has norm {norms[i]:.4f}")
        e = e / norms[:, None]
    return e


# rows of the N x |T| kernel block VIP's recursive update forms at once (bounds its memory at large N)
_VIP_BLOCK = 4096


# VIP as the authors' trainer runs it (posterior mean carried from step to step), the prior mean of their
# benchmark and the peers note (their trainer: -5); recursive: false = the previous step only
@register("vip", help="VIP's Gaussian process on the embeddings", embeddings=True,
          settings={"length_scale": 0.4, "noise": 1e-4, "prior_mean": -1.0, "recursive": True})
class VIP(Peer):
    """VIP's Gaussian-process predictor (Nguyen et al., "Adaptive Rollout Allocation for Online
    Reinforcement Learning with Verifiable Rewards", ICLR 2026, arXiv:2602.01601), as its code runs it.

    Checked against the authors' code (github.com/HieuNT91/VIP; its head now holds only a README, the
    earlier commits hold the code): ``src/vip/success_rate_prediction/gaussian_process.py`` (class ``GPR``)
    driven by ``train/vip/vip_ray_trainer.py`` (``_init_gbr``, ``_compute_allocation``):

    * unit-norm all-MiniLM-L6-v2 embeddings e_i, Euclidean distances, RBF kernel
      k(i, j) = exp(-||e_i - e_j||^2 / (2 l^2)), l = 0.4;
    * before each step the GP is fitted on the previous step's prompts T (the trainer's last logged step)
      with targets g_j = logit(clip(y_j, 1e-6, 1 - 1e-6)), y_j the observed success rate:
      alpha = (K_TT + 1e-4 I)^-1 (g - mu_T), then mu <- mu + K_.T alpha for every prompt, and mu_T <- g
      (a trained prompt's posterior mean is its own logit, exactly);
    * the trainer builds ``GPR(reuse_mean=True, reuse_covariance=False)``: mu is *kept* from step to step
      (``recursive=True`` here), so the mean after step t is the prior of step t + 1 - a recursive update
      in which a prompt keeps its last observed logit and every other prompt the kernel-smoothed residuals
      of every step so far. ``recursive=False`` resets mu to the prior mean before each fit
      (``reuse_mean=False``: GPR's default, the authors' first prediction benchmark and the peers note's
      rule): p_i = sigmoid(m0 + K_iT (K_TT + 1e-4 I)^-1 (g - m0)), T = the previous step only;
    * p_i = sigmoid(mu_i); before any step mu = m0 everywhere: the constant sigmoid(m0).

    Departures, each a setting: the prior mean m0 = -1 (``prior_mean``; the authors' trainer passes -5,
    their benchmark scripts -1 and -5: -1 is the peers note's value and the less extreme cold start); the
    length scale 0.4 (``length_scale``; 0.4 is hard-coded in one version of ``GPR``, a later version
    defaults to 0.27); the covariance is never updated (as in the trainer, ``reuse_covariance=False``),
    so VIP has no belief spread here (no variance in its estimates). A near-singular K_TT (duplicate embeddings) is
    solved by least squares where their Cholesky would fail. The recursive update costs
    O(N |T| d) per step (in blocks of ``_VIP_BLOCK`` rows), the non-recursive one O(|T|^2 d + |T|^3).
    """

    def __init__(self, embeddings: np.ndarray, length_scale: float = 0.4, noise: float = 1e-4,
                 prior_mean: float = -1.0, recursive: bool = True, clip: float = 1e-6, name: str = "vip"):
        e = _check_embeddings(embeddings, "VIP", unit_norm=True)
        if not (length_scale > 0 and noise >= 0 and np.isfinite(prior_mean)):
            raise InvalidArgumentError("VIP length scale must be > 0, noise >= 0 and the prior mean finite")
        self.name = name
        self.embeddings = e
        self.n_nodes = e.shape[0]
        self.length_scale, self.noise, self.prior_mean, self.clip = (float(length_scale), float(noise),
                                                                     float(prior_mean), float(clip))
        self.recursive = bool(recursive)
        # recursive: the posterior mean of every prompt (logit scale); otherwise the last fit's T, its
        # weights (K_TT + noise I)^-1 (g - m0) and targets g
        self.mean_: np.ndarray | None = np.full(self.n_nodes, self.prior_mean) if self.recursive else None
        self.train_ids_: np.ndarray | None = None
        self.weights_: np.ndarray | None = None
        self.targets_: np.ndarray | None = None

    @classmethod
    def build(cls, inputs, settings) -> list:
        v = settings
        return [(cls(inputs.embeddings, length_scale=float(v["length_scale"]), noise=float(v["noise"]),
                     prior_mean=float(v["prior_mean"]), recursive=flag(v["recursive"], "evaluate.vip.recursive")),
                 {"method": "VIP Gaussian process", **v})]

    def kernel(self, a_ids: np.ndarray, b_ids: np.ndarray) -> np.ndarray:
        ea, eb = self.embeddings[a_ids], self.embeddings[b_ids]
        # ||a - b||^2 = 2 - 2 a.b for unit vectors; clipped at 0 against rounding
        sq = np.maximum(2.0 - 2.0 * (ea @ eb.T), 0.0)
        return np.exp(-sq / (2.0 * self.length_scale ** 2))

    def _logit_mean(self, ids: np.ndarray) -> np.ndarray:
        if self.recursive:
            return self.mean_[ids]
        if self.train_ids_ is None:
            return np.full(ids.size, self.prior_mean)
        f = self.prior_mean + self.kernel(ids, self.train_ids_) @ self.weights_
        # a prompt of the training set has its own logit as posterior mean (GPR.fit: mean[train] = g_t)
        pos = np.searchsorted(self.train_ids_, ids)
        pos = np.minimum(pos, self.train_ids_.size - 1)
        hit = self.train_ids_[pos] == ids
        f[hit] = self.targets_[pos[hit]]
        return f

    def predict(self, ids) -> np.ndarray:
        from scipy.special import expit

        ids = _check_ids(ids, self.n_nodes)
        return expit(self._logit_mean(ids))

    def update(self, ids, n, s) -> None:
        import scipy.linalg as sla
        from scipy.special import logit

        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        if ids.size == 0:
            return  # nothing observed: the previous step's fit stays
        g = logit(np.clip(s / n, self.clip, 1.0 - self.clip))
        mu_t = self.mean_[ids] if self.recursive else np.full(ids.size, self.prior_mean)
        k = self.kernel(ids, ids) + self.noise * np.eye(ids.size)
        try:
            w = sla.solve(k, g - mu_t, assume_a="pos")
        except (np.linalg.LinAlgError, sla.LinAlgError):
            # near-duplicate embeddings make K_TT + 1e-4 I numerically singular: least squares instead
            w = np.linalg.lstsq(k, g - mu_t, rcond=None)[0]
        if self.recursive:
            for lo in range(0, self.n_nodes, _VIP_BLOCK):
                rows = np.arange(lo, min(lo + _VIP_BLOCK, self.n_nodes))
                self.mean_[rows] += self.kernel(rows, ids) @ w
            self.mean_[ids] = g
        self.train_ids_, self.weights_, self.targets_ = ids, w, g


# ----------------------------------------------------------------------------------------------------
# embedding read-outs: DOTS's attention (Sun et al.) and the ridge read-out (the estimator's own)


# query rows whose attention scores DOTS forms at once (bounds its memory: block x reference set)
_DOTS_BLOCK = 1024


# DOTS's inference settings: reference set of 256 (the most recent observed prompts here), softmax temperature
# 1, every reference prompt attended (top_k null), the least-squares calibration line
@register("dots", help="DOTS's attention over the embeddings", embeddings=True,
          settings={"ref_size": 256, "tau": 1.0, "top_k": None, "calibrate": True})
class DOTS(Peer):
    """DOTS's adaptive difficulty prediction (Sun et al., "Improving Data Efficiency for LLM Reinforcement
    Fine-tuning Through Difficulty-targeted Online Data Selection and Rollout Replay", NeurIPS 2025,
    arXiv:2506.05316): a prompt's success rate as attention over the embeddings of a reference set of
    prompts whose rates under the current policy are known.

    Followed from the authors' code (github.com/ASTRAL-Group/data-efficient-llm-rl):

    * the predictor (``rl_training/verl/verl/trainer/ppo/teacher_utils.py``, ``RegressionHead.forward``;
      the same in ``adaptive_difficulty_prediction/model.py``): query and reference embeddings each go
      through a projection LayerNorm -> Linear(s) -> LayerNorm, scores are the scaled dot products
      q . r / sqrt(d), optionally kept to the ``top_k`` highest (masked to -inf otherwise), and the
      prediction is sum_j softmax(score_j / tau)_j y_j over the reference set, tau = 1 at inference;
    * the reference set (``ray_trainer_teacher_replay.py``, the data-selection block of ``fit``): a fresh
      random draw of ``data.ref_size`` = 256 prompts each epoch, rolled out (8 rollouts) under the current
      policy, labelled with their mean reward;
    * the calibration (``TeacherModelWorker.predict``): a least-squares line y = a x + b fitted on the
      reference prompts' own predictions (each reference prompt is among the queries and attends over the
      reference set, itself included) against their labels, applied to every prediction.

    What this replay can and cannot reproduce: there are no extra reference rollouts, so the reference set
    is the ``ref_size`` most recently observed prompts (ties within a step in id order), labelled with
    their latest visit's rate s / n, rebuilt after every step rather than every epoch. The projections and
    DOTS's ``group_logit_temp`` head (an MLP of the reference labels' mean and spread setting a logit
    temperature and bias) are trained offline on another pool's rollouts (the published checkpoint is for
    Qwen2.5-Math-1.5B-Instruct embeddings of DeepScaleR); nothing to train them on exists here, so the
    linear layers are the identity and the head is DOTS's own ``plain`` option: q = r = LayerNorm(e)
    (no affine, eps 1e-5; the two LayerNorms of an identity projection compose to one), i.e. scores
    sqrt(d) x the Pearson correlation of the two embeddings. The calibrated value is clipped to [0, 1]
    (the authors' is not clipped; a probability here must be). ``calibrate=False`` drops the line.
    Before any outcome: the constant 0.5. A point estimator (no variance in its estimates).

    Cost per predict: O(|ids| x ref_size x d), in blocks of ``_DOTS_BLOCK`` queries; per update an
    O(N) pass for the reference set and O(ref_size^2 d) for the calibration, whatever the number of
    prompts observed.
    """

    LAYER_NORM_EPS = 1e-5

    def __init__(self, embeddings: np.ndarray, ref_size: int = 256, tau: float = 1.0, top_k: int | None = None,
                 calibrate: bool = True, name: str = "dots"):
        e = _check_embeddings(embeddings, "DOTS")
        if not isinstance(ref_size, (int, np.integer)) or ref_size < 1:
            raise InvalidArgumentError(f"DOTS reference size must be a positive integer, got {ref_size!r}")
        if not (isinstance(tau, (int, float)) and np.isfinite(tau) and tau > 0):
            raise InvalidArgumentError(f"DOTS temperature must be a finite number > 0, got {tau!r}")
        if top_k is not None and (not isinstance(top_k, (int, np.integer)) or top_k < 1):
            raise InvalidArgumentError(f"DOTS top_k must be a positive integer or null, got {top_k!r}")
        self.name = name
        self.n_nodes, d = e.shape
        self.ref_size, self.tau = int(ref_size), float(tau)
        self.top_k = None if top_k is None else int(top_k)
        self.calibrate = bool(calibrate)
        centred = e - e.mean(axis=1, keepdims=True)
        self.z = centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + self.LAYER_NORM_EPS)
        self.scale = 1.0 / (np.sqrt(d) * self.tau)  # softmax(q . r / sqrt(d) / tau)
        self.last_rate_ = np.full(self.n_nodes, np.nan)
        self.last_step_ = np.full(self.n_nodes, -1, dtype=np.int64)
        self._steps = 0
        self.ref_ids_ = np.zeros(0, dtype=np.int64)
        self.slope_, self.intercept_ = 1.0, 0.0

    @classmethod
    def build(cls, inputs, settings) -> list:
        v = settings
        return [(cls(inputs.embeddings, ref_size=v["ref_size"], tau=float(v["tau"]), top_k=v["top_k"],
                     calibrate=flag(v["calibrate"], "evaluate.dots.calibrate")),
                 {"method": "DOTS attention over the most recent observed prompts", **v})]

    def attention(self, ids: np.ndarray, ref_ids: np.ndarray, values: np.ndarray) -> np.ndarray:
        """sum_j softmax(z_i . z_j / (sqrt(d) tau))_j values_j over ``ref_ids`` (its ``top_k`` best), per id."""
        out = np.empty(ids.size)
        zr = self.z[ref_ids]
        k = self.top_k if self.top_k is not None and self.top_k < ref_ids.size else None
        for lo in range(0, ids.size, _DOTS_BLOCK):
            sc = (self.z[ids[lo:lo + _DOTS_BLOCK]] @ zr.T) * self.scale
            if k is None:
                v = np.broadcast_to(values, sc.shape)
            else:
                top = np.argpartition(-sc, k - 1, axis=1)[:, :k]
                sc, v = np.take_along_axis(sc, top, axis=1), values[top]
            w = np.exp(sc - sc.max(axis=1, keepdims=True))
            out[lo:lo + _DOTS_BLOCK] = (w * v).sum(axis=1) / w.sum(axis=1)
        return out

    def predict(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        if self.ref_ids_.size == 0:
            return np.full(ids.size, 0.5)
        raw = self.attention(ids, self.ref_ids_, self.last_rate_[self.ref_ids_])
        return np.clip(self.slope_ * raw + self.intercept_, 0.0, 1.0)

    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        if ids.size == 0:
            return
        self._steps += 1
        self.last_rate_[ids] = s / n
        self.last_step_[ids] = self._steps
        seen = np.flatnonzero(self.last_step_ >= 0)
        order = np.lexsort((seen, -self.last_step_[seen]))  # newest step first, then id order
        self.ref_ids_ = np.sort(seen[order[:self.ref_size]])
        if self.calibrate:
            y = self.last_rate_[self.ref_ids_]
            x = self.attention(self.ref_ids_, self.ref_ids_, y)
            # ordinary least squares of y on x (sklearn's LinearRegression; slope 0 when x is constant)
            sxx = float(((x - x.mean()) ** 2).sum())
            self.slope_ = float(((x - x.mean()) * (y - y.mean())).sum() / sxx) if sxx > 1e-12 else 0.0
            self.intercept_ = float(y.mean() - self.slope_ * x.mean())


# both its strengths (ridge, evidence mixing) are chosen online: nothing to set
@register("ridge", help="the ridge read-out of the embedding (the estimator's own, alone)", embeddings=True,
          settings={})
class RidgeReadout(Peer):
    """The ridge read-out of the prompt embedding alone, fitted online (``core.readout``, the estimator's own read-out).

    Before each step the read-out is the ridge fit of every outcome so far: one row per prompt with
    evidence, x_i = [1, e_i], target its observed rate S_i / C_i, weight 1, the intercept unpenalised and
    the slopes by lambda. It is kept as the two sufficient statistics of ``core.readout`` (gram, moment),
    updated row by row as a step changes its prompts' counts (``readout.changed_stats``: O(batch d^2) per
    step, an O(d^3) solve per ridge strength, whatever N), never refitted from scratch.

    m_i = clip(x_i . theta, 0, 1) is what the embedding says; an unseen prompt gets it (the global rate of
    the outcomes so far, 0.5 before any, while no prompt has evidence). A seen prompt's own outcomes are
    blended in by evidence mixing (``core.belief.mix_by_evidence``): p_i = (kappa m_i + S_i) / (kappa + C_i).

    Both strengths are chosen online, prequentially, as the estimator chooses its own: before the counts
    take a step's outcomes, each lambda of ``readout.RIDGE_GRID`` is charged the absolute errors of its
    read-out on the step's prompts, and each kappa of ``belief.KAPPA_GRID`` those of the p it would have
    given them (with the read-out at the lambda in use); p uses the lambda and the kappa with the smallest
    sums (``readout.choose_ridge``: 10 before any error; ``belief.choose_prior_strength``: ties to the
    smaller kappa). Every error is one per prompt and step, as ``evaluate`` scores.

    The counts are raw, never forgotten (S_i, C_i sum every rollout of the prompt so far): a drifting
    policy is followed only as far as new visits outweigh old ones. A point estimator (no belief spread,
    no variance in its estimates), like VIP.
    """

    def __init__(self, embeddings: np.ndarray, name: str = "ridge"):
        from ..core import belief, readout

        e = _check_embeddings(embeddings, "the ridge read-out")
        self.name = name
        self.n_nodes = e.shape[0]
        self.x = readout.features(e)
        self.successes_ = np.zeros(self.n_nodes)
        self.rollouts_ = np.zeros(self.n_nodes)
        self.gram_, self.moment_ = readout.empty_stats(e.shape[1])
        self.ridge_errors_ = np.zeros(readout.RIDGE_GRID.size)
        self.kappa_errors_ = np.zeros(belief.KAPPA_GRID.size)
        self._global = _GlobalMean()
        self._theta: dict[float, np.ndarray | None] = {}  # ridge -> theta of the current statistics

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.embeddings),
                 {"method": "ridge read-out of the embedding, evidence mixing (strengths chosen online)"})]

    @property
    def ridge(self) -> float:
        """The ridge strength in use (chosen online)."""
        from ..core import readout

        return readout.choose_ridge(self.ridge_errors_)

    @property
    def kappa(self) -> float:
        """The evidence-mixing strength in use (chosen online)."""
        from ..core import belief

        return belief.choose_prior_strength(self.kappa_errors_)

    def _readout(self, ids: np.ndarray, ridge: float) -> np.ndarray:
        from ..core import readout

        if ridge not in self._theta:
            self._theta[ridge] = readout.solve(self.gram_, self.moment_, ridge)
        return readout.predict(self._theta[ridge], self.x[ids], self._global.value)

    def predict(self, ids) -> np.ndarray:
        from ..core.belief import mix_by_evidence

        ids = _check_ids(ids, self.n_nodes)
        m = self._readout(ids, self.ridge)
        return mix_by_evidence(m, np.zeros(ids.size), self.successes_[ids], self.rollouts_[ids], self.kappa)[0]

    def update(self, ids, n, s) -> None:
        from ..core import belief, readout

        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        if ids.size == 0:
            return
        rate = s / n
        # prequential scores: what each strength would have predicted for these prompts before their outcomes
        # (kappa's with the read-out predict used, at the ridge chosen before this step's errors)
        m = self._readout(ids, self.ridge)
        for j, lam in enumerate(readout.RIDGE_GRID):
            self.ridge_errors_[j] += np.abs(self._readout(ids, float(lam)) - rate).sum()
        c, sc = self.rollouts_[ids], self.successes_[ids]
        for j, kappa in enumerate(belief.KAPPA_GRID):
            self.kappa_errors_[j] += np.abs((kappa * m + sc) / (kappa + c) - rate).sum()
        old = readout.rows_of(sc, c)
        self.successes_[ids] += s
        self.rollouts_[ids] += n
        new = readout.rows_of(self.successes_[ids], self.rollouts_[ids])
        self.gram_, self.moment_ = readout.changed_stats(self.gram_, self.moment_, self.x[ids], old, new)
        self._global.add(n, s)
        self._theta = {}


def _check_covariates(covariates, reference, who: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(covariates as a finite N x c float64 array, reference as N float64 in [0, 1] or NaN, or None)."""
    x = np.asarray(covariates, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise DataError(f"{who} needs a 2-D array of encoded covariates (one row per prompt), got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise DataError(f"{who}: the covariates contain NaN or infinite values (encode them: core.covariates)")
    if reference is None:
        return x, None
    r = np.asarray(reference, dtype=np.float64)
    if r.shape != (x.shape[0],) or (~np.isnan(r) & ~((r >= 0) & (r <= 1))).any():
        raise DataError(f"{who}: the reference rate must be {x.shape[0]} pass rates in [0, 1] (NaN: none)")
    return x, r


@register("covariates", help="the ridge read-out of the prompts' covariates (graphdiff's covariates source, alone)",
          covariates=True, settings={})
class CovariateReadout(RidgeReadout):
    """The ridge read-out of the prompts' encoded covariates alone (no graph, no embedding), fitted online:
    graphdiff's covariates source (``estimator.sources.covariates``) as a peer, as ``ridge`` is its read-out
    of the embedding.

    Everything is ``RidgeReadout``'s (one row per prompt with evidence, x_i = [1, c_i], target S_i / C_i,
    weight 1; both strengths chosen online; a seen prompt's own outcomes blended in by evidence mixing), on the
    covariates c_i that ``core.covariates.encode`` made (text statistics of the prompt and its answer, the
    prompt file's fields, a reference pass rate) instead of the embedding; and, as graphdiff's source does,
    before any outcome a prompt with a reference pass rate starts from it (the others from the global rate so
    far, 0.5 before any).
    """

    def __init__(self, covariates: np.ndarray, reference: np.ndarray | None = None, name: str = "covariates"):
        x, r = _check_covariates(covariates, reference, "the covariates' read-out")
        super().__init__(x, name=name)
        self.reference = r

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.covariates, inputs.reference),
                 {"method": "ridge read-out of the prompts' covariates, evidence mixing (strengths chosen online)",
                  "covariates": int(inputs.covariates.shape[1]), "reference_rate": inputs.reference is not None})]

    def _readout(self, ids: np.ndarray, ridge: float) -> np.ndarray:
        from ..core import readout

        if ridge not in self._theta:
            self._theta[ridge] = readout.solve(self.gram_, self.moment_, ridge)
        theta = self._theta[ridge]
        if theta is not None or self.reference is None:
            return readout.predict(theta, self.x[ids], self._global.value)
        r = self.reference[ids]
        return np.where(np.isnan(r), self._global.value, r)


# BOTS's settings as examples/bots/bots.yaml runs them (m = its repeat_times 16, lamb 0.1, rho 0.1) and its
# estimator's default discount of the capability coefficient (0.9)
BOTS_SETTINGS = {"m": 16, "lamb": 0.1, "rho": 0.1, "discount": 0.9}


@register("reference", help="BOTS's prior from the reference pass rate, fused with each prompt's outcomes",
          covariates=True, settings=BOTS_SETTINGS)
class ReferencePrior(BetaPeer):
    """BOTS's interpolation estimator (Shen et al. 2025, "BOTS: A Unified Framework for Bayesian Online Task
    Selection in LLM Reinforcement Finetuning"; Trinity-RFT, ``trinity/buffer/selector/diff_estimator.py``,
    ``InterpolationBetaPREstimator``, run by ``examples/bots/bots.yaml``) on one reference pass-rate column.

    Each prompt has a Beta(alpha_i, beta_i), from (1, 1). After every step, for every prompt (BOTS's
    ``_update``)::

        alpha_i <- (1 - lamb) alpha_i + lamb + (1 - rho) s_bar_i + rho m p_tilde_i
        beta_i  <- (1 - lamb) beta_i  + lamb + (1 - rho) f_bar_i + rho m (1 - p_tilde_i)

    with explicit evidence s_bar_i = m r_i, f_bar_i = m (1 - r_i) for the step's prompts (r_i = s_i / n_i, their
    observed rate; 0 for the others) and implicit evidence p_tilde_i: the observed rate for the step's prompts,
    and for every other prompt the estimate interpolated from the reference columns, clip(a_i + c (b_i - a_i),
    0, 1), where c, the policy's capability, is (mean r - mean a) / (mean b - mean a + 1e-6) over the step's
    prompts, smoothed as c <- discount c + (1 - discount) c_step (the first step's taken as it is). BOTS
    interpolates between two reference models' rates (a: Qwen2.5-7B's, b: Qwen3-30B's); with one column the
    weaker anchor is a model that solves nothing (a = 0, b = the reference rate), so p_tilde_i =
    clip(c ref_i, 0, 1). A prompt without a reference rate gets the global rate observed so far as its
    p_tilde, and takes no part in c (nor does a step without such prompts change c); before any c, every
    unselected prompt's p_tilde is that global rate. p = alpha / (alpha + beta); BOTS's adaptive rho is off
    (bots.yaml does not set it). Its settings (``BOTS_SETTINGS``) are bots.yaml's, not tuned on any log.
    """

    def __init__(self, reference: np.ndarray, m: float = 16, lamb: float = 0.1, rho: float = 0.1,
                 discount: float = 0.9, name: str = "reference"):
        r = np.asarray(reference, dtype=np.float64)
        if r.ndim != 1 or r.size < 1 or (~np.isnan(r) & ~((r >= 0) & (r <= 1))).any():
            raise DataError("the reference prior needs one reference pass rate in [0, 1] per prompt (NaN: none)")
        for key, v, lo_open in (("m", m, True), ("lamb", lamb, False), ("rho", rho, False),
                                ("discount", discount, False)):
            ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) and np.isfinite(v)
            if not ok or (v <= 0 if lo_open else v < 0) or (key != "m" and v > 1):
                raise InvalidArgumentError(f"the reference prior's {key} must be a number "
                                           f"{'> 0' if key == 'm' else 'in [0, 1]'}, got {v!r}")
        self.name = name
        self.reference = r
        self.n_nodes = r.size
        self.m, self.lamb, self.rho, self.discount = float(m), float(lamb), float(rho), float(discount)
        self.alpha_ = np.ones(self.n_nodes)
        self.beta_ = np.ones(self.n_nodes)
        self.capability_: float | None = None
        self._global = _GlobalMean()

    @classmethod
    def build(cls, inputs, settings) -> list:
        if inputs.reference is None:
            raise InvalidArgumentError("method reference needs a reference pass rate among the prompts' covariates "
                                       "(a reference column when they were encoded)")
        v = settings
        return [(cls(inputs.reference, m=v["m"], lamb=v["lamb"], rho=v["rho"], discount=v["discount"]),
                 {"method": "BOTS's interpolation prior from the reference pass rate", **v})]

    def implicit(self) -> np.ndarray:
        """p_tilde of every prompt from the reference rate at the current capability (before a step's own)."""
        g = self._global.value
        if self.capability_ is None:
            return np.full(self.n_nodes, g)
        return np.where(np.isnan(self.reference), g, np.clip(self.capability_ * self.reference, 0.0, 1.0))


    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        if ids.size == 0:
            return
        rate = s / n
        self._global.add(n, s)
        has = ~np.isnan(self.reference[ids])
        if has.any():
            c = float(rate[has].mean() / (self.reference[ids][has].mean() + 1e-6))
            self.capability_ = c if self.capability_ is None else \
                self.discount * self.capability_ + (1.0 - self.discount) * c
        p_tilde = self.implicit()
        p_tilde[ids] = rate
        s_bar, f_bar = np.zeros(self.n_nodes), np.zeros(self.n_nodes)
        s_bar[ids], f_bar[ids] = self.m * rate, self.m * (1.0 - rate)
        keep, rho, m = 1.0 - self.lamb, self.rho, self.m
        self.alpha_ = keep * self.alpha_ + self.lamb + (1.0 - rho) * s_bar + rho * m * p_tilde
        self.beta_ = keep * self.beta_ + self.lamb + (1.0 - rho) * f_bar + rho * m * (1.0 - p_tilde)


# ----------------------------------------------------------------------------------------------------
# label propagation


@register("labelprop", help="label propagation (harmonic function) on the graph")
class LabelPropagation(Peer):
    """Label propagation on the mutual-kNN graph W (harmonic function, Zhu et al. 2003).

    Observed prompts are clamped to their history mean S_i / C_i; every other prompt gets the harmonic
    value; prompts in components without an observed prompt get the global mean so far (0.5 before
    any). The graph baseline with no latent states: what graph sharing alone buys.
    """

    def __init__(self, graph: sp.spmatrix, name: str = "labelprop"):
        from scipy.sparse.csgraph import connected_components

        from ..core.graph import validate_graph

        self.name = name
        self.w = validate_graph(graph)
        self.n_nodes = self.w.shape[0]
        self._components = connected_components(self.w, directed=False)[1]
        self.successes_ = np.zeros(self.n_nodes)
        self.rollouts_ = np.zeros(self.n_nodes)
        self._global = _GlobalMean()
        self.f_ = np.full(self.n_nodes, 0.5)

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.graph), {"method": "label propagation (harmonic function)"})]

    def predict(self, ids) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        return self.f_[ids].copy()

    def update(self, ids, n, s) -> None:
        ids, n, s = aggregate_counts(ids, n, s, self.n_nodes)
        self.successes_[ids] += s
        self.rollouts_[ids] += n
        self._global.add(n, s)
        lab = np.flatnonzero(self.rollouts_ > 0)
        self.f_ = harmonic_solution(self.w, lab, self.successes_[lab] / self.rollouts_[lab],
                                    self._global.value, self._components, x0=self.f_)


# ----------------------------------------------------------------------------------------------------
# oracles


class _Probe:
    """Emulates probing a prompt with the current policy, given the row's own outcome (n, s).

    mode "exact": the probe returns s / n itself (a trivial bound: zero error against that row).
    mode "resample" (default): an independent group of n rollouts is emulated by s' ~ Binomial(n, s/n),
    seeded; its error against the row is then of the order of the sampling noise of n rollouts, as a
    real probe's would be (the paper's SBS/SBR used independent rollouts).
    """

    MODES = ("resample", "exact")

    def __init__(self, mode: str, seed: int):
        if mode not in self.MODES:
            raise InvalidArgumentError(f"unknown oracle probe mode {mode!r}; choose one of {', '.join(self.MODES)}")
        self.mode = mode
        self._rng = np.random.default_rng(seed)

    def __call__(self, n: np.ndarray, s: np.ndarray) -> np.ndarray:
        rate = s / n
        if self.mode == "exact":
            return rate
        return self._rng.binomial(n, rate) / n


# the oracles' one settings section: how a probe is emulated, and its seed (sample-before-step's is seed + 1)
ORACLE_SETTINGS = {"probe": "resample", "seed": 0}


@register("sbr", help="ORACLE sample-before-RL", oracle=True, settings=ORACLE_SETTINGS, section="oracles")
class SampleBeforeRL:
    """ORACLE "sample before RL" (SBR): one probe per prompt, taken at its first observation, frozen.

    Stands in for probing the whole data set before training: a prompt's first observation in the log
    is the earliest policy it was measured under. At that first visit it is shown the batch's outcome
    (which is why it is an oracle); afterwards it repeats the frozen value.
    """

    oracle = True

    def __init__(self, n_nodes: int, probe: str = "resample", seed: int = 0, name: str = "oracle-sbr"):
        self.n_nodes = _check_n_nodes(n_nodes)
        self.name = name
        self._probe = _Probe(probe, seed)
        self.frozen_ = np.full(self.n_nodes, np.nan)

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.n_nodes, probe=settings["probe"], seed=int(settings["seed"])),
                 {"method": "ORACLE sample-before-RL", **settings})]

    def predict_with_outcomes(self, ids, n, s) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        n = np.asarray(n, dtype=np.int64)
        s = np.asarray(s, dtype=np.int64)
        new = np.isnan(self.frozen_[ids]) & (n > 0)
        if new.any():
            # a prompt listed twice in its first batch is probed once
            first = np.unique(ids[new], return_index=True)[1]
            rows = np.flatnonzero(new)[first]
            self.frozen_[ids[rows]] = self._probe(n[rows], s[rows])
        out = self.frozen_[ids]
        return np.where(np.isnan(out), 0.5, out)

    def update(self, ids, n, s) -> None:
        aggregate_counts(ids, n, s, self.n_nodes)  # validation only: the probe was frozen at first sight


@register("sbs", help="ORACLE sample-before-step", oracle=True, settings=ORACLE_SETTINGS, section="oracles")
class SampleBeforeStep:
    """ORACLE "sample before step" (SBS): probes every prompt of the batch with the current policy.

    Shown the batch's outcomes, it predicts a probe of them (see ``_Probe``). An upper bound for
    reference, at the cost of a second set of rollouts every step; no real estimator can match it.
    """

    oracle = True

    def __init__(self, n_nodes: int, probe: str = "resample", seed: int = 0, name: str = "oracle-sbs"):
        self.n_nodes = _check_n_nodes(n_nodes)
        self.name = name
        self._probe = _Probe(probe, seed)

    @classmethod
    def build(cls, inputs, settings) -> list:
        return [(cls(inputs.n_nodes, probe=settings["probe"], seed=int(settings["seed"]) + 1),
                 {"method": "ORACLE sample-before-step", **settings})]

    def predict_with_outcomes(self, ids, n, s) -> np.ndarray:
        ids = _check_ids(ids, self.n_nodes)
        n = np.asarray(n, dtype=np.int64)
        s = np.asarray(s, dtype=np.int64)
        out = np.full(ids.size, 0.5)
        ok = n > 0
        out[ok] = self._probe(n[ok], s[ok])
        return out

    def update(self, ids, n, s) -> None:
        aggregate_counts(ids, n, s, self.n_nodes)  # validation only: SBS keeps no state
