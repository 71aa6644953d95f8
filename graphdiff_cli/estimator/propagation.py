"""Label propagation as a source of the graph's estimate (beyond the paper): the harmonic field of the
prompts' forgotten counts on W, and each prompt's neighbour mean of it (``core.belief.harmonic_field`` and
``propagated_estimate``, with the estimator's global counts as the fill of a component without evidence)."""

from __future__ import annotations

import numpy as np

from ..core import belief as bl
from ..core.graph import single_precision


def global_rate(global_counts) -> float:
    """The observed global success rate (s + 1) / (n + 2) of (forgotten) global counts (s, n)."""
    gs, gn = global_counts
    return (gs + 1.0) / (gn + 2.0)


def components(graph) -> np.ndarray:
    """The connected component of every prompt of W."""
    from scipy.sparse.csgraph import connected_components

    return connected_components(graph, directed=False)[1]


def field(graph, comps, successes, rollouts, global_counts, x0=None, graph_single=None, degree=None) -> np.ndarray:
    """Label propagation's field for these forgotten counts on ``graph`` (with its ``comps``); a component
    without evidence gets the observed global rate. Warm-started from ``x0``; solved mixed-precision, float32
    then float64 to the same float64 tolerance, from ``graph_single`` (W's float32 copy; made here if not
    given) and W's row sums ``degree`` (summed here if not given)."""
    if graph_single is None:
        graph_single = single_precision(graph)
    return bl.harmonic_field(graph, successes, rollouts, global_rate(global_counts), comps, x0=x0,
                             w_single=graph_single, degree=degree)


def propagated(w_rows, values: np.ndarray, global_counts) -> np.ndarray:
    """Label propagation's estimate for the prompts whose rows of W these are (``bl.propagated_estimate``)."""
    degree = np.asarray(w_rows.sum(axis=1), dtype=np.float64).reshape(-1)
    return bl.propagated_estimate(w_rows, degree, values, global_rate(global_counts))


def grown_field(graph, n: int, old_field, successes, rollouts, global_counts, graph_single=None,
                degree=None) -> tuple[np.ndarray, np.ndarray]:
    """(field, components) on ``graph``, W grown from n prompts to more, solved from the old field with each
    new prompt at its neighbours' mean (new neighbours counted at the global rate): a few conjugate-gradient
    iterations where a cold start would cost them all. ``graph_single``, ``degree``: as for ``field``."""
    m = graph.shape[0] - n
    fill = global_rate(global_counts)
    x0 = np.concatenate([old_field, propagated(graph[n:], np.concatenate([old_field, np.full(m, fill)]),
                                               global_counts)])
    comps = components(graph)
    return field(graph, comps, successes, rollouts, global_counts, x0=x0, graph_single=graph_single,
                 degree=degree), comps
