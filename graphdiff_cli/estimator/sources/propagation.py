"""Label propagation as a source (beyond the paper): the harmonic field of the prompts' forgotten counts on W,
and each prompt's neighbour mean of it (``core.belief.harmonic_field`` and ``propagated_estimate``, with the
estimator's global counts as the fill of a component without evidence). Setting ``label_propagation``: its
weight in the mix (a number, "auto" over ``core.belief.PROPAGATION_GRID``, or None: off); ``propagation_every``: the
field is solved at every m-th step, and between solves keeps its last solution with the observed prompts clamped."""

from __future__ import annotations

import numpy as np

from ...core import belief as bl
from ...errors import DataError
from .base import Source, global_rate


def components(graph) -> np.ndarray:
    """The connected component of every prompt of W."""
    from scipy.sparse.csgraph import connected_components

    return connected_components(graph, directed=False)[1]


def field(spec, comps, successes, rollouts, global_counts, x0=None) -> np.ndarray:
    """Label propagation's field for these forgotten counts on the model's W (``spec``, a ``ModelSpec``, with its
    ``comps``); a component without evidence gets the observed global rate. Warm-started from ``x0``; solved
    mixed-precision, float32 then float64 to the same float64 tolerance, from the float32 copy of W and the row
    sums that ``spec`` keeps."""
    return bl.harmonic_field(spec.graph, successes, rollouts, global_rate(global_counts), comps, x0=x0,
                             w_single=spec.graph_single(), degree=spec.degree())


def propagated(w_rows, values: np.ndarray, global_counts) -> np.ndarray:
    """Label propagation's estimate for the prompts whose rows of W these are (``bl.propagated_estimate``)."""
    degree = np.asarray(w_rows.sum(axis=1), dtype=np.float64).reshape(-1)
    return bl.propagated_estimate(w_rows, degree, values, global_rate(global_counts))


def clamped(old_field: np.ndarray, ids: np.ndarray, successes, rollouts) -> np.ndarray:
    """The field between two solves: ``old_field`` with the prompts ``ids`` that have evidence set to their rate
    S / C now (what a solve would clamp them to); every other value as last solved."""
    ids = np.asarray(ids)[np.asarray(rollouts)[ids] > 0]
    f = old_field.copy()
    f[ids] = np.asarray(successes, dtype=np.float64)[ids] / np.asarray(rollouts, dtype=np.float64)[ids]
    return f


def grown_field(spec, n: int, old_field, successes, rollouts, global_counts) -> tuple[np.ndarray, np.ndarray]:
    """(field, components) on the grown model's W (``spec``), W grown from n prompts to more, solved from the old
    field with each new prompt at its neighbours' mean (new neighbours counted at the global rate): a few
    conjugate-gradient iterations where a cold start would cost them all."""
    graph = spec.graph
    m = graph.shape[0] - n
    fill = global_rate(global_counts)
    x0 = np.concatenate([old_field, propagated(graph[n:], np.concatenate([old_field, np.full(m, fill)]),
                                               global_counts)])
    comps = components(graph)
    return field(spec, comps, successes, rollouts, global_counts, x0=x0), comps


class Propagation(Source):
    name = "label_propagation"
    arrays = ("lp_field",)
    grid = bl.PROPAGATION_GRID
    start = bl.PROPAGATION_START

    def __init__(self, settings, n_nodes, inputs=None):
        self.weight = settings.label_propagation
        self.every = settings.propagation_every
        self.lp_field_: np.ndarray | None = None  # None until the first update
        self._components: np.ndarray | None = None

    def _field(self, est, successes, rollouts, global_counts, x0=None) -> np.ndarray:
        if self._components is None:
            self._components = components(est.graph)
        return field(est._spec, self._components, successes, rollouts, global_counts, x0=x0)

    def estimate(self, est, rows, model, context=None):
        f = self.lp_field_
        if f is None:  # before the first update: solved here, never stored (a read changes nothing)
            f = self._field(est, est.successes_decayed_, est.rollouts_decayed_, est.global_counts_)
        return propagated(est.graph[rows], f, est.global_counts_), None

    def observe(self, est, step):
        if not self.on:
            return {"lp_field_": None}
        old = self.lp_field_
        # solved at every m-th step (est.step_ + 1 is this one), on the first and when the time forgetting in use
        # switched (every prompt's counts moved); in between, the last solution with the observed prompts clamped
        if old is None or step.switched or (est.step_ + 1) % self.every == 0:
            return {"lp_field_": self._field(est, *step.new, step.global_counts, x0=old)}
        return {"lp_field_": clamped(old, step.obs.ids, *step.new)}

    def grow(self, est, spec, n, counts):
        # the field on the new graph, solved here: it is what predictions read until the next update
        if self.lp_field_ is None:
            return {"lp_field_": None, "_components": None}
        f, comps = grown_field(spec, n, self.lp_field_, *counts, est.global_counts_)
        return {"lp_field_": f, "_components": comps}

    def state(self):
        return {"lp_field": np.zeros(0) if self.lp_field_ is None else self.lp_field_.copy()}

    def load(self, state, n_nodes):
        f = np.asarray(state["lp_field"], dtype=np.float64)
        if f.size not in (0, n_nodes):
            raise DataError(f"saved lp_field has {f.size} values for {n_nodes} prompts")
        self.lp_field_ = f.copy() if f.size else None
