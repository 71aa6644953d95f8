"""The one exception hierarchy of graphdiff.

Library code raises these; the CLI turns each into a one-line message and its class's ``exit_code`` in
one place (``run_guarded`` in ``graphdiff_cli/cli/common.py``). Messages name what was wrong and, where it
helps, how to fix it.
"""


class GraphdiffError(Exception):
    """Base class of every error graphdiff raises on purpose."""

    exit_code = 1


class InvalidArgumentError(GraphdiffError, ValueError):
    """A parameter, shape or option that cannot be used (usage error)."""

    exit_code = 2


class DataError(GraphdiffError, ValueError):
    """User data that breaks the contract: counts, ids, graphs, files."""


class ArtifactError(GraphdiffError):
    """An artifact or state directory that is missing, of the wrong kind or version, or damaged."""


class StateError(GraphdiffError):
    """A step-handoff request that conflicts with the state (step already applied, lock held, ...)."""


class RewardWarning(UserWarning):
    """A step's rewards all fell on one side of a chosen success threshold (trainer integrations warn with it;
    the CLI and ``State.update`` put the same line in the result's ``warnings``)."""


class BackendError(GraphdiffError):
    """A device, model or index backend that cannot be used (no GPU, model not found, ...)."""
