"""graphdiff: online graph-based estimates of each RL prompt's success probability under the current policy.

The Python API:

    from graphdiff_cli import Estimator
    est = Estimator(graph, labels, n_states=K)            # the default preset; preset="paper" for the paper's
    est.update(ids, n, s); p = est.predict()

``Estimator`` and ``EstimatorSettings`` are imported on first use, so ``import graphdiff_cli.core`` stays
free of the facade and its dependencies.
"""

from ._version import __version__  # noqa: E402,F401

from .errors import (  # noqa: E402
    ArtifactError,
    BackendError,
    DataError,
    GraphdiffError,
    InvalidArgumentError,
    StateError,
)


def __getattr__(name):  # PEP 562: the facade on first use
    if name == "Estimator":
        from .estimator import Estimator

        return Estimator
    if name == "EstimatorSettings":
        from .settings import EstimatorSettings

        return EstimatorSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Estimator",
    "EstimatorSettings",
    "GraphdiffError",
    "InvalidArgumentError",
    "DataError",
    "ArtifactError",
    "StateError",
    "BackendError",
    "__version__",
]
