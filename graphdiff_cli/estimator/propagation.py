"""Label propagation as a source of the graph's estimate (beyond the paper): the harmonic field of the
prompts' forgotten counts on W, and each prompt's neighbour mean of it (``core.belief.harmonic_field`` and
``propagated_estimate``, with the estimator's global counts as the fill of a component without evidence)."""

from __future__ import annotations

import numpy as np

from ..core import belief as bl


def global_rate(global_counts) -> float:
    """The observed global success rate (s + 1) / (n + 2) of (forgotten) global counts (s, n)."""
    gs, gn = global_counts
    return (gs + 1.0) / (gn + 2.0)


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
