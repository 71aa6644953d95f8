"""What the estimator of a STATE believes (``graphdiff status --estimator``): the distribution of p over the
candidates, the states' rates and sizes, each source's weight in p, and the online choices in use.

p-hat mixes the graph's estimate m with the prompt's own outcomes (docs/explanation/estimator.md); m itself is the
mean-field states' estimate, label propagation's, the ridge read-outs of the embedding, of the covariates and of
live features, each with a weight (all but the states' when on). The summary reads them through the Estimator's public accessors (``estimates``,
``a_``/``b_``, ``state_occupancy``, ``source_weights``, ``kappa_``, ``nu_``, ``propagation_``,
``time_forgetting_``, ``readout_``, ``readout_ridge_``, ``covariate_readout_``, ``live_readout_``) over the candidates (retired prompts left out). Reads
only; no typer or rich here.
"""

from __future__ import annotations

import numpy as np

from ..core.beta import DEFAULT_GROUP_SIZE, mean_variance
from ..settings import inert_settings
from .handoff import active_rows

# the quantiles of p reported, by name
QUANTILES = {"min": 0.0, "p05": 0.05, "p25": 0.25, "median": 0.5, "p75": 0.75, "p95": 0.95, "max": 1.0}
# each online choice: its setting and the estimator's accessor of the value in use
CHOICES = {"prior_strength": "kappa_", "belief_strength": "nu_", "label_propagation": "propagation_",
           "time_forgetting": "time_forgetting_", "readout": "readout_", "readout_ridge": "readout_ridge_",
           "covariate_readout": "covariate_readout_",
           "live_readout": "live_readout_"}  # the live read-out's weight (its share in p here is 0: no live features)


def _distribution(x: np.ndarray) -> dict:
    if x.size == 0:
        return {"mean": None, **{name: None for name in QUANTILES}}
    qs = np.quantile(x, list(QUANTILES.values()))
    return {"mean": float(x.mean()), **{name: float(v) for name, v in zip(QUANTILES, qs)}}


def _mean(x) -> float | None:
    return None if x is None or x.size == 0 else float(np.mean(x))


def estimator_summary(est, retired: np.ndarray, group_size: int = DEFAULT_GROUP_SIZE) -> dict:
    """The summary of what the estimator ``est`` believes, ``retired`` (node indices) left out (see the module
    docstring): ``p`` (mean and quantiles over the candidates), ``belief_mean`` (the same of the decision belief's
    mean), ``p_zero_variance`` (its mean for groups of ``group_size``), ``states`` (per state: its Beta's mean
    ``rate``, ``a``, ``b``, ``expected_prompts`` = sum of q over the candidates and ``prompts`` whose most probable
    state it is), ``sources`` (each source's mean weight in p over the candidates, and ``history_seen``: the
    history's over those rolled out), ``online_choices`` (per setting: ``setting``, ``value`` in use or None when
    off, ``online``: chosen online now, ``inert``: no effect under these settings)."""
    every = np.arange(est.n_nodes)
    rows = every[active_rows(every, retired)]
    e = est.estimates(rows, group_size=group_size)
    seen = np.asarray(e["n_seen"]) > 0
    rate, _ = mean_variance(np.asarray(est.a_, dtype=np.float64), np.asarray(est.b_, dtype=np.float64))
    expected, counts = est.state_occupancy(rows)
    weights = est.source_weights(rows)
    inert = inert_settings(est.settings)
    choices = {}
    for name, accessor in CHOICES.items():
        setting = getattr(est.settings, name)
        value = getattr(est, accessor)
        choices[name] = {"setting": setting, "value": None if value is None else float(value),
                         "online": setting == "auto" and value is not None, "inert": name in inert}
    return {
        "step": int(est.step_), "candidates": int(rows.size), "retired": int(est.n_nodes - rows.size),
        "seen": int(seen.sum()), "mixing": est.settings.mixing,
        "p": _distribution(np.asarray(e["p"], dtype=np.float64)),
        "belief_mean": _distribution(np.asarray(e["mean"], dtype=np.float64)),
        "p_zero_variance": {"group_size": int(group_size), "mean": _mean(np.asarray(e["p_zero_variance"]))},
        "states": [{"state": k, "rate": float(rate[k]), "a": float(est.a_[k]), "b": float(est.b_[k]),
                    "expected_prompts": float(expected[k]), "prompts": int(counts[k])} for k in range(est.n_states)],
        "sources": {**{name: _mean(w) for name, w in weights.items()},
                    "history_seen": _mean(weights["history"][seen]) if seen.any() else None},
        "online_choices": choices,
    }
