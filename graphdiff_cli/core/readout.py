"""A learned read-out of the prompt embedding (beyond the paper): ridge regression of each
prompt's observed success rate on its embedding, fitted online from the trainer's own outcomes.

The graph turns the embeddings into who-is-near-whom and forgets them; on real pools a plain linear
read-out of the same embedding ranks unseen prompts better than any neighbour average (docs/lab/results.md,
"A read-out of the embedding"). The model: y_i = theta_0 + e_i . theta + noise, one row per prompt with
evidence (weight 1), y_i its forgotten rate S_i / C_i; the intercept is not penalised, the slopes by lambda
(``ridge``). Everything it needs is two sufficient statistics of the prompts with evidence, kept up to date
row by row as counts change:

    gram   = sum_i w_i x_i x_i^T        moment = sum_i w_i y_i x_i        x_i = [1, e_i]

so a step costs O(batch x d^2) to update and O(d^3) to solve (d = 384 for the bundled encoder: about a
millisecond), whatever the number of prompts. Pure numpy: no files, no torch.
"""

from __future__ import annotations

import numpy as np

from .belief import choose_mix  # ties: within belief.TIE_RTOL (relative), the start kept while tied
from .graph import single_blas_thread

# the ridge strengths chosen among online (the measurements: 10 ranked best on the cold start of a
# 29k-problem pool and 100 on the real One-Shot log; 1 had the lowest absolute error at 30% revealed)
RIDGE_GRID = np.array([1.0, 10.0, 100.0])
# the read-out's weight in the graph's estimate, chosen online among these; before any outcome has been
# scored: half and half, as label propagation's weight starts (the first version started at 0, the estimate
# without a read-out, and lagged on the cold start: docs/lab/results.md, "A read-out of the embedding")
READOUT_GRID = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
READOUT_START = 0.5


def features(embeddings: np.ndarray) -> np.ndarray:
    """x_i = [1, e_i] in float64 (the intercept first)."""
    e = np.asarray(embeddings, dtype=np.float64)
    return np.concatenate([np.ones((e.shape[0], 1)), e], axis=1)


def empty_stats(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(gram, moment) of no prompt, for embeddings of ``dim`` coordinates."""
    return np.zeros((dim + 1, dim + 1)), np.zeros(dim + 1)


def rows_of(successes: np.ndarray, rollouts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(weight, target) of prompts with these forgotten counts: weight 1 and target S / C for a prompt with
    evidence (C > 0), weight 0 otherwise."""
    c = np.asarray(rollouts, dtype=np.float64)
    has = c > 0
    y = np.divide(np.asarray(successes, dtype=np.float64), c, out=np.zeros_like(c), where=has)
    return has.astype(np.float64), y


def stats_of(x: np.ndarray, weight: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gram, moment) of rows ``x`` (features) with these weights and targets."""
    xw = x * weight[:, None]
    return xw.T @ x, xw.T @ target


def changed_stats(gram, moment, x, old, new) -> tuple[np.ndarray, np.ndarray]:
    """(gram, moment) after the rows ``x`` moved from ``old`` = (weight, target) to ``new``: a rank-``len(x)``
    update, new arrays (the inputs are left as they are)."""
    dw = new[0] - old[0]
    dwy = new[0] * new[1] - old[0] * old[1]
    return gram + (x * dw[:, None]).T @ x, moment + x.T @ dwy


def solve(gram: np.ndarray, moment: np.ndarray, ridge: float) -> np.ndarray | None:
    """theta of the ridge fit (intercept unpenalised), or None when no prompt has evidence yet."""
    import scipy.linalg as sla

    if gram[0, 0] <= 0:
        return None
    a = gram.copy()
    idx = np.arange(1, a.shape[0])
    a[idx, idx] += ridge
    with single_blas_thread():  # d + 1 unknowns: BLAS threads would only spin (``single_blas_thread``)
        try:
            return sla.solve(a, moment, assume_a="pos")
        except (np.linalg.LinAlgError, sla.LinAlgError):  # numerically singular (e.g. ridge tiny): least squares
            return np.linalg.lstsq(a, moment, rcond=None)[0]


def predict(theta: np.ndarray | None, x: np.ndarray, fill: float) -> np.ndarray:
    """The read-out x . theta, clipped to [0, 1]; ``fill`` (the global rate) when nothing is fitted yet."""
    if theta is None:
        return np.full(x.shape[0], float(fill))
    return np.clip(x @ theta, 0.0, 1.0)


def predict_embeddings(theta: np.ndarray | None, embeddings: np.ndarray, fill: float,
                       block: int = 65536) -> np.ndarray:
    """``predict`` of the features of these embeddings, a block of rows at a time (no N x (d + 1) float64
    copy: what predicting every prompt of a large pool needs)."""
    if theta is None:
        return np.full(embeddings.shape[0], float(fill))
    out = np.empty(embeddings.shape[0])
    for i in range(0, embeddings.shape[0], block):
        out[i:i + block] = theta[0] + np.asarray(embeddings[i:i + block], dtype=np.float64) @ theta[1:]
    return np.clip(out, 0.0, 1.0, out=out)


def choose_ridge(errors) -> float:
    """The ``RIDGE_GRID`` value whose read-out had the smallest summed prequential absolute error; the middle
    one, 10, before any error and while it ties the smallest (within ``TIE_RTOL``: after the first step every
    strength predicted the global rate); other ties go to the smaller strength."""
    errors = np.asarray(errors, dtype=np.float64)
    if errors.shape != RIDGE_GRID.shape:
        raise ValueError(f"expected {RIDGE_GRID.size} errors, got shape {errors.shape}")
    return float(RIDGE_GRID[choose_mix(errors, start=(1,))[0]])
