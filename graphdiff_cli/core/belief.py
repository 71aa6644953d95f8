"""Beyond the paper: how p-hat and the decision belief combine the graph with a prompt's own outcomes.

The paper's estimate (Section 3.6, ``meanfield.mix_with_history``) weights the model's prediction by a
fixed gamma. These are the measured improvements (docs/explanation/estimator.md, "Improvements"; the default
preset), each a pure function of arrays:

- ``mix_by_evidence``: empirical-Bayes mixing, the graph's estimate as a Beta prior worth kappa rollouts;
- ``choose_prior_strength``: kappa chosen online from prequential absolute errors over ``KAPPA_GRID``;
- ``belief_parameters`` / ``belief_loglik`` / ``choose_belief_strength``: the Beta belief decisions read,
  its strength nu chosen online by the prequential likelihood of whole groups;
- ``neighbor_shift``: the mutual neighbours' residuals added to the graph's estimate;
- ``harmonic_field`` / ``propagated_estimate`` / ``choose_mix``: label propagation's harmonic estimate as a
  second source of the graph's estimate and per-step time forgetting, chosen online jointly with kappa.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln


def mix_by_evidence(p_model: np.ndarray, u: np.ndarray, successes: np.ndarray, rollouts: np.ndarray,
                    strength: float) -> tuple[np.ndarray, np.ndarray]:
    """Empirical-Bayes mixing (beyond the paper; the uncertainty-aware gamma Appendix E sketches).

    The graph's estimate is a Beta prior of mean p_model worth ``strength`` rollouts; the prompt's own
    (possibly forgotten) counts update it: p = (kappa p_model + S_i) / (kappa + C_i). The effective
    gamma_i = kappa / (kappa + C_i) falls as direct evidence accumulates, instead of staying at 0.5.
    Returns (p, variance of the belief): the Beta posterior's variance for seen prompts, the model's
    own u_i for unseen ones.
    """
    k = float(strength)
    p = (k * p_model + successes) / (k + rollouts)
    seen = rollouts > 0
    var = np.where(seen, p * (1.0 - p) / (k + rollouts + 1.0), u)
    return p, var


# the prior strengths (in rollouts) that prior_strength="auto" chooses among, log-spaced: from 0.05 (a
# seen prompt's own evidence all but alone) to 64 (the graph outweighs eight visits of eight rollouts)
KAPPA_GRID = np.geomspace(0.05, 64.0, 12)


def choose_prior_strength(errors) -> float:
    """kappa for prior_strength="auto" (beyond the paper): the KAPPA_GRID value whose predictions had the
    lowest summed absolute error against outcomes they had not seen (``errors``, one per grid value).

    A prequential choice: every prediction was made before its outcome, as in `graphdiff evaluate`, so
    the choice adapts to the log (a prompt seen fifty times needs the graph less than one seen twice)
    without hindsight. Ties (``tied``: within ``TIE_RTOL``), e.g. before any prompt has been seen twice, go to
    the smaller kappa.
    """
    errors = np.asarray(errors, dtype=np.float64)
    if errors.shape != KAPPA_GRID.shape:
        raise ValueError(f"expected {KAPPA_GRID.size} errors, got shape {errors.shape}")
    return float(KAPPA_GRID[first_tied(errors)])


BELIEF_CLIP = 1e-4  # the graph's estimate enters a belief clipped to [eps, 1 - eps]: a Beta needs a, b > 0


def belief_parameters(p_graph: np.ndarray, successes: np.ndarray, rollouts: np.ndarray,
                      strength: float) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of a prompt's belief about its success probability (beyond the paper; for decisions).

    Beta(nu p_graph + S_i, nu (1 - p_graph) + C_i - S_i): the graph's estimate worth ``strength`` = nu
    pseudo-rollouts, updated by the prompt's own (possibly forgotten) counts. It is the posterior of
    ``mix_by_evidence`` with its own strength: p-hat is scored by absolute error (its kappa is the
    predictive median's), the belief by the likelihood of whole groups (``belief_loglik``), since a
    decision (Thompson draws, P(a group has no signal)) needs the spread, not just a central value.
    """
    pg = np.clip(np.asarray(p_graph, dtype=np.float64), BELIEF_CLIP, 1.0 - BELIEF_CLIP)
    s = np.asarray(successes, dtype=np.float64)
    f = np.maximum(np.asarray(rollouts, dtype=np.float64) - s, 0.0)
    nu = float(strength)
    return nu * pg + s, nu * (1.0 - pg) + f


def belief_loglik(p_graph: np.ndarray, successes: np.ndarray, rollouts: np.ndarray, n: np.ndarray,
                  s: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Summed log-likelihood of the groups (n_i rollouts, s_i successes) under the belief of each
    strength in ``grid``, made before the groups were seen: log B(a + s, b + n - s) - log B(a, b) per
    group (the beta-binomial predictive without its binomial coefficient, which no strength changes)."""
    n = np.asarray(n, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    out = np.empty(len(grid))
    for j, nu in enumerate(grid):
        a, b = belief_parameters(p_graph, successes, rollouts, nu)
        out[j] = float((betaln(a + s, b + n - s) - betaln(a, b)).sum())
    return out


# before any group has been scored the belief is worth 2 pseudo-rollouts, Beta(1, 1)'s strength
BELIEF_START = 2.0


def choose_belief_strength(loglik) -> float:
    """nu for belief_strength="auto": the KAPPA_GRID value whose beliefs gave the groups seen so far the
    highest prequential log-likelihood (a proper score of the whole predictive distribution of s, where
    p-hat's absolute error scores only its median). Before any group: the grid value nearest 2; ties
    (``tied``: within ``TIE_RTOL``) go to the smaller nu."""
    loglik = np.asarray(loglik, dtype=np.float64)
    if loglik.shape != KAPPA_GRID.shape:
        raise ValueError(f"expected {KAPPA_GRID.size} log-likelihoods, got shape {loglik.shape}")
    if not loglik.any():
        return float(KAPPA_GRID[int(np.argmin(np.abs(np.log(KAPPA_GRID / BELIEF_START))))])
    return float(KAPPA_GRID[first_tied(loglik, best_is="max")])


def neighbor_shift(p_model: np.ndarray, w_rows, p_model_nb: np.ndarray, successes_nb: np.ndarray,
                   rollouts_nb: np.ndarray, strength: float) -> np.ndarray:
    """The graph's estimate with the neighbours' residuals (beyond the paper).

    p_i = clip(p_model_i + sum_j W_ij (S_j - C_j p_model_j) / (tau + sum_j W_ij C_j), 0, 1): how far the
    mutual neighbours' own (possibly forgotten) outcomes S_j / C_j sit above or below the model's
    prediction for them, shrunk towards 0 by tau pseudo-rollouts. Mean-field states are coarse (a state
    holds N / K prompts); the residuals carry what the states cannot resolve, the way label propagation
    does, and they give a never-seen prompt a signal of its own. ``w_rows``: the rows of W for the
    prompts of ``p_model`` (sparse, columns = the neighbours listed in the ``*_nb`` arrays).
    """
    resid = np.asarray(successes_nb, dtype=np.float64) - np.asarray(rollouts_nb, dtype=np.float64) * p_model_nb
    num = np.asarray(w_rows @ resid, dtype=np.float64).reshape(-1)
    den = float(strength) + np.asarray(w_rows @ np.asarray(rollouts_nb, dtype=np.float64), dtype=np.float64).reshape(-1)
    return np.clip(np.asarray(p_model, dtype=np.float64) + num / den, 0.0, 1.0)


# the weights of label propagation in the graph's estimate that label_propagation="auto" chooses among
PROPAGATION_GRID = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
# before any outcome has been scored: half and half (measured on the demo and MATH simulations and the
# real log, where the online choice settled at 1, 0.5-0.75 and 0.5: docs/lab/results.md)
PROPAGATION_START = 0.5


# conjugate gradients stop at this relative residual: the field enters p-hat as a neighbour mean mixed with
# other estimates, and the solve is the default preset's largest cost per step. On a 150,000-prompt kNN graph
# (mean degree 75), warm-started ten steps into a simulated run, the mixed-precision solve took 74 + 3 (float32 +
# float64) CG iterations at 1e-6 and 55 + 2 at 1e-5 (float64 alone at 1e-10: 142, on another such graph): at 1e-5
# the field is within 3.3e-4 of the exact one (mean under 5e-6), the next batch's propagated estimate within 6e-5,
# and the default preset's predictions on the demo, One-Shot and MATH logs within 3.1e-4 of those at 1e-6
# (docs/lab/performance.md)
FIELD_RTOL = 1e-5


def harmonic_field(w, successes: np.ndarray, rollouts: np.ndarray, fill: float, components: np.ndarray,
                   x0: np.ndarray | None = None, w_single=None, degree: np.ndarray | None = None) -> np.ndarray:
    """Label propagation's values f on every prompt: prompts with evidence keep their own (forgotten)
    rate S / C, every other prompt gets the harmonic value (the W-weighted mean of its neighbours'), and a
    component without evidence gets ``fill`` (Zhu, Ghahramani & Lafferty 2003; ``harmonic.harmonic_solution``).
    Warm-started from ``x0`` (the previous step's field), solved to a relative residual of ``FIELD_RTOL`` (in
    float64; mixed-precision when ``w_single``, W's float32 copy, is given: ``harmonic_solution``); ``degree``:
    W's row sums, when the caller keeps them."""
    from .harmonic import harmonic_solution

    seen = np.flatnonzero(np.asarray(rollouts) > 0)
    values = np.asarray(successes, dtype=np.float64)[seen] / np.asarray(rollouts, dtype=np.float64)[seen]
    return harmonic_solution(w, seen, values, fill, components, x0=x0, rtol=FIELD_RTOL, w_single=w_single,
                             degree=degree)


def propagated_estimate(w_rows, degree: np.ndarray, field_nb: np.ndarray, fill: float) -> np.ndarray:
    """Label propagation's estimate for some prompts, their own outcomes left out: the W-weighted mean of
    the neighbours' field values (``w_rows``: the prompts' rows of W, columns = the neighbours listed in
    ``field_nb``), or ``fill`` (the global rate) for a prompt without neighbours. The prompt's own evidence
    enters p-hat through the mixing, so it must not be in the graph's estimate too. (A neighbour without
    evidence of its own carries the harmonic value, to which the prompt contributed: an echo of one hop
    that the weight chosen online accounts for.)"""
    degree = np.asarray(degree, dtype=np.float64)
    num = np.asarray(w_rows @ np.asarray(field_nb, dtype=np.float64), dtype=np.float64).reshape(-1)
    return np.where(degree > 0, num / np.where(degree > 0, degree, 1.0), float(fill))


# the per-step forgetting of a prompt's own counts that time_forgetting="auto" chooses among (1 = none):
# a prompt not visited for t steps keeps delta^t of its evidence, so the graph's fresher estimate takes over
TIME_GRID = np.array([1.0, 0.97, 0.9])


# summed errors closer than this (relative) are a tie: before the first outcome every candidate predicts the
# global rate, up to rounding (differences of ~1e-8 of the sum on the real log); and candidates that differ only
# where no outcome can tell them apart (every kappa, while each prompt is on its first visit) sum to the same
# error up to rounding, which varies with the BLAS build and its thread count
TIE_RTOL = 1e-6


def tied(scores, best_is="min") -> np.ndarray:
    """The mask of ``scores`` within ``TIE_RTOL`` (relative) of the best (the smallest, or the largest for
    ``best_is="max"``): the candidates that the outcomes have not told apart. A choice taken among these by
    plain argmin/argmax would follow rounding, so that two machines (or two BLAS thread counts) replaying one
    log could choose differently; every online choice takes a fixed one of them instead."""
    scores = np.asarray(scores, dtype=np.float64)
    if best_is == "max":
        scores = -scores
    best = float(scores.min())
    return scores <= best + abs(best) * TIE_RTOL + 1e-12


def first_tied(scores, best_is="min") -> int:
    """The first (flat) index among the ``tied`` best of ``scores``."""
    return int(np.flatnonzero(np.ravel(tied(scores, best_is)))[0])


def choose_mix(errors, start=None) -> tuple[int, ...]:
    """The indices, one per axis, with the smallest summed prequential absolute error; ``errors`` has one
    axis per choice made online (the estimator's joint choice: TIME_GRID, PROPAGATION_GRID, the read-out's
    weights, the kappas in play; an axis of one value where that choice is fixed). Before any error:
    ``start`` (default: the first value of every axis), and after: ``start`` as long as it ties the smallest
    error (the first step, before which every candidate predicted the same, leaves all tied: the start stays
    until the outcomes tell the candidates apart); other ties go to the first in the order of the axes (the
    smallest index of the first axis, then of the second, ...), as for kappa alone. Ties are ``tied``'s: within
    ``TIE_RTOL``, so that rounding never decides."""
    errors = np.asarray(errors, dtype=np.float64)
    if errors.ndim < 1:
        raise ValueError(f"expected an error array with one axis per choice, got shape {errors.shape}")
    start = (0,) * errors.ndim if start is None else tuple(int(x) for x in start)
    if len(start) != errors.ndim:
        raise ValueError(f"start {start} has {len(start)} indices for {errors.ndim} axes")
    if tied(errors)[start]:
        return start
    return tuple(int(x) for x in np.unravel_index(first_tied(errors), errors.shape))
