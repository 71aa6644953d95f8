"""The mean-field states as a source (Sections 3.4-3.6, the paper's part, and the base of every mix): the
model's prediction p_model = sum_k q_ik mu_k, shifted by the neighbours' offsets when neighbor_smoothing is
set (``core.belief.neighbor_shift``). Its state - q, the states' Beta posteriors and evidence, the residual
schedule's rows - is the mean-field model's, which the driver runs (``core.meanfield``) and every source reads."""

from __future__ import annotations

import numpy as np

from ...core import belief as bl
from .base import Source


class States(Source):
    name = "states"
    arrays = ("q", "a", "b", "window_evidence", "state_evidence", "dirty", "at_fixed_point")

    def __init__(self, settings, n_nodes, inputs=None):
        self.weight = 1.0  # the base of the blend, m_0: always on, never weighed

    def estimate(self, est, rows, model, context=None):
        return self.estimates(est, rows, model, [None])[0], model[1]

    def estimates(self, est, rows, model, counts):
        """The shifted p_model under each of ``counts``, the neighbours' rows of W and model predictions read
        once for all of them (only the neighbours of ``rows``: a batch costs O(batch x degree x K), not O(N K))."""
        p_model = model[0]
        counts = [(est.successes_decayed_, est.rollouts_decayed_) if c is None else c for c in counts]
        tau = est.settings.neighbor_smoothing
        if tau is None or rows.size == 0:
            return [p_model for _ in counts]
        n = est.n_nodes
        graph = est.graph
        if rows.size == n and np.array_equal(rows, np.arange(n)):  # every prompt (predict): W as it is
            return [bl.neighbor_shift(p_model, graph, p_model, sd, rd, tau) for sd, rd in counts]
        sub = graph[rows]
        cols, local = np.unique(sub.indices, return_inverse=True)
        if cols.size == 0:
            return [p_model for _ in counts]
        sub = type(sub)((sub.data, local.reshape(-1), sub.indptr), shape=(rows.size, cols.size))
        p_nb = est._model_prediction(cols)[0]
        return [bl.neighbor_shift(p_model, sub, p_nb, sd[cols], rd[cols], tau) for sd, rd in counts]
