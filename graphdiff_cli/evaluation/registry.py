"""The methods ``evaluate`` compares, each registered by the one class that implements it.

A method is a class decorated with ``register(key, ...)``: its key (``--methods``, the workflow's
``evaluate.methods``), its help line, its settings' defaults (``evaluate.settings.<section>``; none when it
reads none), whether it reads the prompt embeddings, whether it reads the prompts' covariates (their encoded
features and reference pass rate, ``core.covariates``), whether it is an oracle, and whether it can drive
decisions in the counterfactual replay (every method but an oracle, unless told). The class's
``build(inputs, settings)`` gives the estimators of the key, each with the description of its settings
that the report prints. Everything else (the keys in report order, the embedding methods, the covariate
methods, the counterfactual ones, the default config, ``build_methods``, the workflow schema's enums, evaluate's help)
is read from ``METHODS``, so a new peer is one class.

The estimators follow ``baselines.OnlineEstimator``: ``update(ids, n, s)`` and ``estimates(ids,
group_size)``; graphdiff's ``Estimator`` is one as it is, and ``GraphdiffMethod`` only gives it its name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.beta import DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class Inputs:
    """What a method is built from: the graph W, the prior states, the embeddings (None: not given), the
    number of prompts, graphdiff's settings and preset, discounted history's (lambda, m), and the prompts'
    encoded covariates (N x c) with their reference pass rate (N, NaN where none; None: no reference column),
    both None when not given."""

    graph: Any
    labels: np.ndarray
    n_states: int
    embeddings: np.ndarray | None
    n_nodes: int
    estimator: Any = None
    preset: str = "default"
    tuned: dict | None = None
    covariates: np.ndarray | None = None
    reference: np.ndarray | None = None


@dataclass(frozen=True)
class Method:
    """One registered method (see the module docstring)."""

    key: str
    build: Callable[[Inputs, dict], list]
    help: str
    settings: dict | None
    section: str
    embeddings: bool
    oracle: bool
    counterfactual: bool
    covariates: bool = False


# key -> Method, in registration order (``method_keys`` puts the oracles last)
METHODS: dict[str, Method] = {}


def register(key: str, *, help: str, settings: dict | None = None, section: str | None = None,
             embeddings: bool = False, covariates: bool = False, oracle: bool = False,
             counterfactual: bool | None = None):
    """Class decorator: register the class as method ``key`` (see the module docstring); ``section``: the
    settings section when several keys share one (the oracles')."""

    def add(cls):
        if key in METHODS:
            raise ValueError(f"method {key!r} is registered twice")
        METHODS[key] = Method(key, cls.build, help, None if settings is None else dict(settings), section or key,
                              bool(embeddings), bool(oracle), (not oracle) if counterfactual is None
                              else bool(counterfactual), bool(covariates))
        return cls

    return add


def method_keys() -> tuple[str, ...]:
    """Every key, in report order: the methods in registration order, then the oracles."""
    return (*(k for k, m in METHODS.items() if not m.oracle), *(k for k, m in METHODS.items() if m.oracle))


def oracle_keys() -> tuple[str, ...]:
    return tuple(k for k in method_keys() if METHODS[k].oracle)


def embedding_keys() -> tuple[str, ...]:
    """The methods that read the prompt embeddings (evaluate's --embeddings)."""
    return tuple(k for k in method_keys() if METHODS[k].embeddings)


def covariate_keys() -> tuple[str, ...]:
    """The methods that read the prompts' covariates (evaluate's --covariates)."""
    return tuple(k for k in method_keys() if METHODS[k].covariates)


def counterfactual_keys() -> tuple[str, ...]:
    """The methods that can drive decisions in a counterfactual replay."""
    return tuple(k for k in method_keys() if METHODS[k].counterfactual)


def default_settings() -> dict:
    """{section: its defaults} of every method that has settings, in registration order."""
    out: dict = {}
    for m in METHODS.values():
        if m.settings is not None:
            out.setdefault(m.section, copy.deepcopy(m.settings))
    return out


def methods_help() -> str:
    """The keys with their help lines, as evaluate's --methods help lists them."""
    return "; ".join(f"{k}: {METHODS[k].help}" for k in method_keys())


@register("graphdiff", help="graphdiff's estimator (the config's estimator section)")
class GraphdiffMethod:
    """graphdiff's ``Estimator`` under a method name. The estimator already is an ``OnlineEstimator``
    (``update``, ``estimates``); a report and a replay tell methods apart by ``name``, which is all this adds.
    It is given the embeddings and the covariates when the inputs have them (its settings say whether it reads
    them: the paper preset reads neither)."""

    def __init__(self, estimator, name: str = "graphdiff"):
        self.estimator = estimator
        self.name = name

    def update(self, ids, n, s) -> dict:
        return self.estimator.update(ids, n, s)

    def estimates(self, ids, group_size: int = DEFAULT_GROUP_SIZE) -> dict[str, np.ndarray]:
        return self.estimator.estimates(ids, group_size=group_size)

    def predict(self, ids) -> np.ndarray:
        return self.estimator.predict(ids)

    @classmethod
    def build(cls, inputs: Inputs, settings) -> list:
        from ..estimator import Estimator

        est = Estimator(inputs.graph, inputs.labels, inputs.n_states, embeddings=inputs.embeddings,
                        covariates=inputs.covariates,
                        reference_rate=None if inputs.covariates is None else inputs.reference,
                        settings=inputs.estimator)
        return [(cls(est), {"method": "graphdiff", "preset": inputs.preset, "n_states": inputs.n_states,
                            **inputs.estimator.as_dict(),
                            "covariates": None if inputs.covariates is None else int(inputs.covariates.shape[1])})]
