"""The read-out of live features as a source (beyond the paper): per-prompt numbers the trainer observes at a step
- the policy's next-token entropy and largest probability at the prompt's last position, say - mapped to the
prompt's success rate by a ridge fit on [1, features], learned online from each step's (features, observed rate)
pairs as they arrive.

Unlike the embedding and the covariates, live features are not the estimator's: they come with a call (a step's
``update``, a read's ``estimates``) for the prompts of that call (``sources.base.Context``), and say something only
about the policy of that step. So the source abstains - a NaN mean, "no opinion", where the blend keeps m_{j-1} -
for every prompt read without them (and for all before its first fitted pair): a read without live features
predicts exactly what it would without this source.

The fit: one row per prompt observed at a step with live features (weight 1, target the step's rate s / n), its
sufficient statistics forgotten by ``live_forgetting`` at every step,

    gram_t = rho gram_{t-1} + sum_i x_i x_i^T     moment_t = rho moment_{t-1} + sum_i y_i x_i     x_i = [1, live_i]

so that the map follows the policy as it trains (the same features mean another rate later on). The ridge
penalises the slopes, not the intercept (``core.readout.solve``). The number of features f is fixed by the first
step that gives them (``live_gram`` (f + 1) x (f + 1); 0 x 0 before).

Settings: ``live_readout``, its weight in the mix (a number, "auto" over ``core.readout.READOUT_GRID``, or None:
off); ``live_forgetting``; its ridge strength is ``readout_ridge``'s setting, chosen on a board of its own
(``live_errors``, scored on the step's prompts that came with live features).
"""

from __future__ import annotations

import numpy as np

from ...core import readout as ro
from ...errors import DataError
from .base import NO_CONTEXT
from .readout import RidgeBoard


class Live(RidgeBoard):
    name = "live_readout"
    arrays = ("live_gram", "live_moment", "live_errors")
    grid = ro.READOUT_GRID
    start = ro.READOUT_START
    board = "live_errors"

    def __init__(self, settings, n_nodes, inputs=None):
        self.weight = settings.live_readout
        self.ridge_setting = settings.readout_ridge
        self.forgetting = settings.live_forgetting
        self.live_gram_, self.live_moment_ = np.zeros((0, 0)), np.zeros(0)
        self._theta: dict[float, np.ndarray | None] = {}  # the fit per ridge strength, until the stats change

    @property
    def n_features(self) -> int | None:
        """f, the number of live features, once a step has given them (None before)."""
        return self.live_gram_.shape[0] - 1 if self.live_gram_.size else None

    def _fitted(self, context) -> bool:
        return context.live is not None and self.n_features is not None and self.live_gram_[0, 0] > 0

    def says(self, est, rows, context=NO_CONTEXT):
        if not self._fitted(context):
            return np.zeros(rows.size, dtype=bool)
        return ~np.isnan(context.live).any(axis=1)

    def fits(self, context, ridges) -> list[np.ndarray]:
        """The read-out of the context's live features under each ridge strength, NaN (no opinion) for a prompt
        without them or before any fitted pair."""
        live = context.live
        if not self._fitted(context):
            return [np.full(0 if live is None else live.shape[0], np.nan) for _ in ridges]
        out = []
        for ridge in ridges:
            ridge = float(ridge)
            if ridge not in self._theta:
                self._theta[ridge] = ro.solve(self.live_gram_, self.live_moment_, ridge)
            theta = self._theta[ridge]
            # a NaN row stays NaN (abstains); the others clipped to [0, 1] as every read-out is
            out.append(np.clip(theta[0] + live @ theta[1:], 0.0, 1.0))
        return out

    def estimate(self, est, rows, model, context=NO_CONTEXT):
        if context.live is None:
            return np.full(rows.size, np.nan), None
        return self.fits(context, [self.ridge(est.mix.board)])[0], None

    def score(self, est, rows, rate, boards, context=NO_CONTEXT):
        if not boards[self.board].size or not self._fitted(context):
            return {}
        given = ~np.isnan(context.live).any(axis=1)
        if not given.any():
            return {}
        return {self.board: boards[self.board] + [np.abs(r[given] - rate[given]).sum()
                                                  for r in self.fits(context, ro.RIDGE_GRID)]}

    def observe(self, est, step):
        """(gram, moment) forgotten by ``live_forgetting`` and plus this step's (features, rate) pairs."""
        if not self.on:
            return {}
        gram, moment = self.forgetting * self.live_gram_, self.forgetting * self.live_moment_
        live = step.context.live
        if live is not None:
            given = ~np.isnan(live).any(axis=1)
            if given.any():
                if not gram.size:
                    gram, moment = ro.empty_stats(live.shape[1])
                x = ro.features(live[given])
                g, m = ro.stats_of(x, np.ones(x.shape[0]), step.obs.s[given] / step.obs.n[given])
                gram, moment = gram + g, moment + m
        return {"live_gram_": gram, "live_moment_": moment, "_theta": {}}

    def state(self):
        return {"live_gram": self.live_gram_.copy(), "live_moment": self.live_moment_.copy()}

    def load(self, state, n_nodes):
        gram = np.array(state["live_gram"], dtype=np.float64)
        moment = np.array(state["live_moment"], dtype=np.float64)
        if gram.ndim != 2 or gram.shape[0] != gram.shape[1] or moment.shape != (gram.shape[0],) \
                or gram.shape[0] == 1 or (gram.size and not self.on):
            raise DataError(f"saved live_gram and live_moment have shapes {gram.shape}, {moment.shape}; expected "
                            + ("(f + 1) x (f + 1) and f + 1 for f >= 1 live features, or empty" if self.on else
                               "empty (these settings have the live read-out off)"))
        self.live_gram_, self.live_moment_ = gram, moment
