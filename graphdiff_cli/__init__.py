"""graphdiff: online graph-based estimates of each RL prompt's success probability under the current policy.

The Python API:

    from graphdiff_cli import Estimator
    est = Estimator(graph, labels, n_states=K)
    est.update(ids, n, s); p = est.predict()
"""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    ArtifactError,
    BackendError,
    DataError,
    GraphdiffError,
    InvalidArgumentError,
    StateError,
)
from .estimator import Estimator, EstimatorConfig  # noqa: E402

__all__ = [
    "Estimator",
    "EstimatorConfig",
    "GraphdiffError",
    "InvalidArgumentError",
    "DataError",
    "ArtifactError",
    "StateError",
    "BackendError",
    "__version__",
]
