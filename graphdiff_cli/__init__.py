"""graphdiff: online graph-based estimates of each RL prompt's success probability under the current policy.

The Python API:

    from graphdiff_cli import State                      # a STATE directory: the step handoff, resident
    st = State.init("graph.zarr", "clusters.zarr", "STATE")   # or State.open("STATE")
    st.update(1, [{"id": "p1", "n": 8, "s": 3}, ...]); st.estimates(["p1", "p7"])["p"]

    from graphdiff_cli import Estimator
    est = Estimator(graph, labels, n_states=K)            # the default preset; preset="paper" for the paper's
    est.update(ids, n, s); p = est.predict()

    W, ids = load_graph("graph.zarr")                    # a graph artifact (or a STATE) as a scipy CSR matrix
    labels, K = load_clusters("clusters.zarr", graph="graph.zarr")   # each prompt's state, and K
    nodes = prompt_index("STATE").nodes(["p1", "p7"])    # prompt ids -> node indices (unknown ids refused)

``State``, ``Estimator``, ``EstimatorSettings``, ``load_graph``, ``load_clusters`` and ``prompt_index`` are imported on first use, so
``import graphdiff_cli.core`` stays free of the facade and its dependencies.
"""

from ._version import __version__  # noqa: E402,F401

from .errors import (  # noqa: E402
    AlreadyAppliedError,
    ArtifactError,
    BackendError,
    DataError,
    GraphdiffError,
    InvalidArgumentError,
    LockedError,
    StateError,
    StepGapError,
)


def __getattr__(name):  # PEP 562: the facade on first use
    if name == "State":
        from .state import State

        return State
    if name == "Estimator":
        from .estimator import Estimator

        return Estimator
    if name == "EstimatorSettings":
        from .settings import EstimatorSettings

        return EstimatorSettings
    if name in ("load_graph", "load_clusters", "load_embeddings", "prompt_index"):
        from .io import lookup

        return getattr(lookup, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "State",
    "Estimator",
    "EstimatorSettings",
    "load_graph",
    "load_clusters",
    "load_embeddings",
    "prompt_index",
    "GraphdiffError",
    "InvalidArgumentError",
    "DataError",
    "ArtifactError",
    "StateError",
    "AlreadyAppliedError",
    "StepGapError",
    "LockedError",
    "BackendError",
    "__version__",
]
