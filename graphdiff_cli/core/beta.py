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


def zero_variance(alpha, beta, group_size: int) -> np.ndarray:
    """E[p^g + (1 - p)^g] for p ~ Beta(alpha, beta) = P(s = 0) + P(s = g) under Beta-Binomial(g, alpha, beta).

    E[p^g] = prod_{j<g} (alpha + j) / (alpha + beta + j), taken in log space (exact for integer g).
    """
    g = check_group_size(group_size)
    a = np.asarray(alpha, dtype=np.float64)
    b = np.asarray(beta, dtype=np.float64)
    j = np.arange(g).reshape((g,) + (1,) * a.ndim)
    log_denom = np.log(a + b + j).sum(axis=0)
    return np.exp(np.log(a + j).sum(axis=0) - log_denom) + np.exp(np.log(b + j).sum(axis=0) - log_denom)


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
