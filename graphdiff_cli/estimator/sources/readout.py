"""The ridge read-out of the prompts' embedding as a source (beyond the paper; ``core.readout``): a linear
map from a prompt's embedding to its forgotten success rate, fitted on every prompt with evidence. Setting
``readout``: its weight in the mix (a number, "auto" over ``core.readout.READOUT_GRID``, or None: off; off
too without embeddings); ``readout_ridge``: its ridge strength, a number or "auto", chosen on a board of its own
(``readout_errors``). Its state: the fit's sufficient statistics ``readout_gram``, ``readout_moment``."""

from __future__ import annotations

import numpy as np

from ...core import readout as ro
from ...errors import DataError
from .base import Source, global_rate


class RidgeBoard(Source):
    """A ridge read-out's choice of its ridge strength: ``readout_ridge``'s number, or "auto" chosen on a board of
    its own (``board``) among ``core.readout.RIDGE_GRID`` by the read-out's prequential absolute error. A subclass
    sets ``board`` and ``ridge_setting``."""

    board = ""

    def boards(self):
        return {self.board: (ro.RIDGE_GRID.size,) if self.on and self.ridge_setting == "auto" else (0,)}

    def ridge(self, boards) -> float:
        """The ridge strength in use: the configured number or the online choice ("auto")."""
        if self.ridge_setting != "auto":
            return float(self.ridge_setting)
        errors = boards[self.board]
        return ro.choose_ridge(errors) if errors.size else float(ro.RIDGE_GRID[1])


class Readout(RidgeBoard):
    name = "readout"
    arrays = ("readout_gram", "readout_moment", "readout_errors")
    grid = ro.READOUT_GRID
    start = ro.READOUT_START
    board = "readout_errors"  # its ridge strength's board (a read-out of other features names its own, and its
    # arrays: (gram, moment, board), and what it reads: ``matrix_of``/``matrix``, ``weight_of``, ``ridge_of``, ``fill``)

    def __init__(self, settings, n_nodes, inputs=None):
        x = self.matrix_of(inputs)
        self.weight = self.weight_of(settings) if x is not None else None
        self.ridge_setting = self.ridge_of(settings)
        d = x.shape[1] if self.on else -1
        self.readout_gram_, self.readout_moment_ = ro.empty_stats(d) if d >= 0 else (np.zeros((0, 0)), np.zeros(0))
        self._theta: dict[float, np.ndarray | None] = {}  # the fit per ridge strength, until the stats change

    # -- what a read-out of other features changes -----------------------------------------------------

    @staticmethod
    def matrix_of(inputs):
        """The features it reads (N x d, without the intercept) among the estimator's inputs, or None."""
        return None if inputs is None else inputs.embeddings

    @staticmethod
    def weight_of(settings):
        return settings.readout

    @staticmethod
    def ridge_of(settings):
        return settings.readout_ridge

    def matrix(self, est):
        return est.embeddings

    def fill(self, est, rows) -> np.ndarray | float:
        """Its estimate before any outcome: the observed global rate."""
        return global_rate(est.global_counts_)

    def fits(self, est, rows, ridges) -> list[np.ndarray]:
        """The read-out for ``rows`` under each ridge strength: before any outcome, the observed global rate."""
        n = est.n_nodes
        emb = self.matrix(est)
        emb = emb if rows.size == n and np.array_equal(rows, np.arange(n)) else emb[rows]
        out = []
        for ridge in ridges:
            ridge = float(ridge)
            if ridge not in self._theta:
                self._theta[ridge] = ro.solve(self.readout_gram_, self.readout_moment_, ridge)
            theta = self._theta[ridge]
            out.append(ro.predict_embeddings(theta, emb, 0.0) if theta is not None else
                       np.broadcast_to(np.asarray(self.fill(est, rows), dtype=np.float64), (rows.size,)).copy())
        return out

    def estimate(self, est, rows, model, context=None):
        return self.fits(est, rows, [self.ridge(est.mix.board)])[0], None

    def score(self, est, rows, rate, boards, context=None):
        if not boards[self.board].size:
            return {}
        return {self.board: boards[self.board] + [np.abs(r - rate).sum() for r in self.fits(est, rows, ro.RIDGE_GRID)]}

    def observe(self, est, step):
        """The (gram, moment) after the counts in use moved from ``step.old`` to ``step.new``: a rank-``len(rows)``
        change (only the observed prompts' rates S / C moved: a per-step decay scales S and C alike), or, when
        the time forgetting in use switched, a sum over every prompt with evidence, a block of rows at a time."""
        if not self.on:
            return {"_theta": {}}
        emb, rows, old, new = self.matrix(est), step.obs.ids, step.old, step.new
        if not step.switched:
            x = ro.features(emb[rows])
            gram, moment = ro.changed_stats(self.readout_gram_, self.readout_moment_, x,
                                            ro.rows_of(old[0][rows], old[1][rows]),
                                            ro.rows_of(new[0][rows], new[1][rows]))
        else:
            gram, moment = ro.empty_stats(emb.shape[1])
            seen = np.flatnonzero(new[1] > 0)
            for i in range(0, seen.size, 8192):  # 8,192 x (d + 1) float64 at a time (25 MB at d = 384)
                part = seen[i:i + 8192]
                g, m = ro.stats_of(ro.features(emb[part]), *ro.rows_of(new[0][part], new[1][part]))
                gram, moment = gram + g, moment + m
        return {"readout_gram_": gram, "readout_moment_": moment, "_theta": {}}

    def state(self):
        gram, moment = self.arrays[:2]
        return {gram: self.readout_gram_.copy(), moment: self.readout_moment_.copy()}

    def load(self, state, n_nodes):
        gram, moment = (np.array(state[name], dtype=np.float64) for name in self.arrays[:2])
        if gram.shape != self.readout_gram_.shape or moment.shape != self.readout_moment_.shape:
            raise DataError(f"saved {self.arrays[0]} and {self.arrays[1]} have shapes {gram.shape}, {moment.shape}; "
                            f"expected {self.readout_gram_.shape}, {self.readout_moment_.shape} (the read-out of "
                            "features of this size)")
        self.readout_gram_, self.readout_moment_ = gram, moment
