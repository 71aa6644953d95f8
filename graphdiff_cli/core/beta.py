"""The Beta-distribution arithmetic every estimator and decision rule shares (one formula each).

- ``mean_variance``: the mean and variance of Beta(a, b) (the state posteriors of Appendix E, MoPPS's
  per-prompt Beta, graphdiff's belief).
- ``from_moments``: the Beta with a given mean and variance (moment matching), or a point mass.
- ``zero_variance``: E[p^g + (1 - p)^g] for p ~ Beta(a, b) = P(a group of g rollouts is all-correct or
  all-wrong) under the Beta-Binomial; ``zero_variance_from_moments`` for a moment-matched Beta;
  ``zero_variance_point`` for a point estimate (the var -> 0 limit, the peers' plug-in).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError


def mean_variance(a, b) -> tuple[np.ndarray, np.ndarray]:
    """(mean, variance) of Beta(a, b): a / (a + b), a b / ((a + b)^2 (a + b + 1))."""
    total = a + b
    return a / total, a * b / (total * total * (total + 1.0))


def from_moments(mean, var) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(alpha, beta, ok) of the Beta with this mean and variance; ok is False where no proper Beta
    exists (var ~ 0, or mean in {0, 1}): there the belief is the point mass at the mean.

    alpha + beta = m (1 - m) / v - 1, with v capped just below m (1 - m), the largest variance a
    distribution on [0, 1] with mean m has.
    """
    m = np.clip(np.asarray(mean, dtype=np.float64), 0.0, 1.0)
    v = np.asarray(var, dtype=np.float64)
    cap = m * (1.0 - m)
    ok = (v > 1e-12) & (cap > 1e-12)
    total = np.ones_like(m)
    total[ok] = cap[ok] / np.minimum(v[ok], cap[ok] * (1.0 - 1e-9)) - 1.0
    return m * total, (1.0 - m) * total, ok


DEFAULT_GROUP_SIZE = 8  # rollouts per group (GRPO's usual n) where a caller does not say


def check_group_size(group_size, name: str = "group size") -> int:
    """The one check of a group size g (rollouts per prompt); ``name`` is what the caller calls it."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise InvalidArgumentError(f"{name} must be an integer >= 1, got {group_size!r}")
    return int(group_size)


EXACT_GROUP_SIZE = 256  # group sizes up to this are taken factor by factor, as graphdiff always took them


def zero_variance(alpha, beta, group_size: int) -> np.ndarray:
    """E[p^g + (1 - p)^g] for p ~ Beta(alpha, beta) = P(s = 0) + P(s = g) under Beta-Binomial(g, alpha, beta).

    E[p^g] = prod_{j<g} (alpha + j) / (alpha + beta + j) = B(alpha + g, beta) / B(alpha, beta). The memory is
    that of a few arrays like ``alpha``, whatever g (a g x N array of factors took 12 GB at g = 10^5, N = 150k):
    up to EXACT_GROUP_SIZE the product is taken in log space one factor at a time, summed in the order numpy
    summed that array (so every value is the one earlier versions gave, bit for bit); beyond, in closed form
    by log-Beta functions (O(N) time as well; the two agree to ~1e-11 relative at g = 1,000).
    """
    g = check_group_size(group_size)
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    if g > EXACT_GROUP_SIZE:
        from scipy.special import betaln

        log_norm = betaln(a, b)
        return np.exp(betaln(a + g, b) - log_norm) + np.exp(betaln(a, b + g) - log_norm)
    if a.size < 2:  # one prompt: numpy summed its g factors pairwise, not in order; g <= EXACT_GROUP_SIZE values
        j = np.arange(g).reshape((g,) + (1,) * a.ndim)
        log_denom = np.log(a + b + j).sum(axis=0)
        return np.exp(np.log(a + j).sum(axis=0) - log_denom) + np.exp(np.log(b + j).sum(axis=0) - log_denom)
    log_a, log_b, log_denom = np.log(a), np.log(b), np.log(a + b)
    for j in range(1, g):
        log_a += np.log(a + j)
        log_b += np.log(b + j)
        log_denom += np.log(a + b + j)
    return np.exp(log_a - log_denom) + np.exp(log_b - log_denom)


def zero_variance_point(p, group_size) -> np.ndarray:
    """p^g + (1 - p)^g: the zero-variance probability of a point estimate (no parameter uncertainty)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    g = np.asarray(group_size, dtype=np.float64)
    return p ** g + (1.0 - p) ** g


def zero_variance_from_moments(mean, var, group_size: int) -> np.ndarray:
    """E[p^g + (1 - p)^g] for p ~ the Beta moment-matched to (mean, var) (``from_moments``); where no
    proper Beta exists (var = 0) the point value p^g + (1 - p)^g."""
    g = check_group_size(group_size)
    m = np.clip(np.asarray(mean, dtype=np.float64), 0.0, 1.0)
    out = zero_variance_point(m, g)
    alpha, beta_, ok = from_moments(m, var)
    if ok.any():
        out[ok] = zero_variance(alpha[ok], beta_[ok], g)
    return np.clip(out, 0.0, 1.0)
