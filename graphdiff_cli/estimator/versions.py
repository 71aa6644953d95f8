"""Migrations of the estimator's saved state from every encoding version written so far to the current one.

``io.estimator_store.read_state`` returns a state dict in its artifact's own layout, with that version under
``"version"`` (the versions and their arrays: ``io.estimator_layout``); ``upgrade`` applies one migration
per version, in order, so each is written once against the version before it. ``MIGRATIONS[v]`` takes a
version-v state dict and returns the version v + 1 one, without changing its argument. A migration
fills in what its version added as the estimator started it then (the estimator that wrote the older
state had no such evidence), so an upgraded state predicts what the older graphdiff predicted. Two exceptions
come from the tie rule of the online choices, not from a migration, and hold for a state of any version: see
``_v7_to_v8``; and since 2026-11-27 (``core.belief.tied``) candidates within ``TIE_RTOL`` of the best are a
tie, so a saved board whose best candidates differ only by rounding chooses the start or the first of them,
where the older code took whichever rounding made smallest (the choice that varied with the BLAS thread count).
"""

from __future__ import annotations

import numpy as np

from ..core import belief as bl
from ..errors import DataError
from ..io.estimator_layout import VERSION
from ..settings import from_dict
from .mix import Mix


def _choices(state: dict) -> Mix:
    """The online choices a state's settings make (``config``, n_states inside it before version 7), without the
    read-out (which came with version 8)."""
    cfg = {k: v for k, v in state["config"].items() if k != "n_states"}
    return Mix.of_settings(from_dict(cfg, "saved estimator settings"), np.asarray(state["labels"]).size)


def _v1_to_v2(state: dict) -> dict:
    """Version 2 added the forgotten counts and evidence, and the residual schedule's fixed point. Before
    any forgetting existed the forgotten counts were the counts, the state evidence a - 1 and b - 1; the
    global counts, the offsets and the fixed point start as at init (zeros, not at a fixed point)."""
    n = np.asarray(state["labels"]).size
    a, b = np.asarray(state["a"], dtype=np.float64), np.asarray(state["b"], dtype=np.float64)
    return {**state,
            "successes_decayed": np.asarray(state["successes"]).astype(np.float64),
            "rollouts_decayed": np.asarray(state["rollouts"]).astype(np.float64),
            "state_evidence": np.stack([a - 1.0, b - 1.0]),
            "global_counts": np.zeros(2), "offset_decayed": np.zeros(n),
            "dirty": np.zeros(0, dtype=np.int64), "at_fixed_point": np.array(False)}


def _v2_to_v3(state: dict) -> dict:
    """Version 3 added the moments prior_strength "auto" fitted kappa from (three running sums, zero at init)."""
    return {**state, "kappa_moments": np.zeros(3)}


def _v3_to_v4(state: dict) -> dict:
    """Version 4 chose kappa by prequential errors instead of the moment fit: the moments cannot become
    errors (they were sums of another quantity), so the errors start at zero, as at init."""
    out = {k: v for k, v in state.items() if k != "kappa_moments"}
    return {**out, "kappa_errors": np.zeros(bl.KAPPA_GRID.size)}


def _v4_to_v5(state: dict) -> dict:
    """Version 5 added belief_strength "auto"'s log-likelihoods (zero at init)."""
    return {**state, "belief_loglik": np.zeros(bl.KAPPA_GRID.size)}


def _v5_to_v6(state: dict) -> dict:
    """Version 6 added label propagation's field (none yet), the joint choice's errors (zero, one per
    candidate in play) and the counts under every delta (zero when time_forgetting is "auto", else none)."""
    ch = _choices(state)
    n = np.asarray(state["labels"]).size
    times, weights, kappas = ch.axes[0], ch.axes[1], ch.axes[-1]  # (time, propagation weight, read-out weight, kappa)
    return {**state, "lp_field": np.zeros(0), "mix_errors": np.zeros((times.size, weights.size, kappas.size)),
            "time_counts": np.zeros((bl.TIME_GRID.size if ch.history.time_counts is not None else 0, 2, n))}


def _v6_to_v7(state: dict) -> dict:
    """Version 7 keeps n_states beside the settings, and stores a board of the online choices' scoreboard
    that its settings do not keep empty (version 6 saved kappa_errors, belief_loglik and mix_errors always,
    zeros or, for kappa_errors under the joint choice, errors nothing read)."""
    config = dict(state["config"])
    if "n_states" not in config:
        raise DataError("a version 6 estimator state keeps n_states in its config, which lacks it")
    n_states = config.pop("n_states")
    ch = _choices(state)
    boards = {name: np.zeros(0) for name, shape in ch.shapes.items() if shape == (0,)}
    return {**state, "n_states": n_states, "config": config, **boards}


def _v7_to_v8(state: dict) -> dict:
    """Version 8 added the read-out of the embedding: no read-out before it (its statistics and board empty),
    and a read-out axis of one value (weight 0) in the joint choice's errors. One exception to "predicts what
    the older graphdiff predicted", from the tie rule that came with it (``core.belief.choose_mix``): a state
    whose joint choice is still all tied (saved after its first step) now keeps the start weights where the
    older code took the first candidate of each axis."""
    mix = np.asarray(state["mix_errors"], dtype=np.float64)
    if mix.ndim == 3:
        mix = mix[:, :, None, :]
    return {**state, "mix_errors": mix, "readout_errors": np.zeros(0), "readout_gram": np.zeros((0, 0)),
            "readout_moment": np.zeros(0)}


def _v8_to_v9(state: dict) -> dict:
    """Version 9 added the read-outs of the covariates and of live features: none before it (their statistics
    empty, no covariates), a covariates axis of one value (weight 0: off) in the joint choice's errors and a live
    axis before kappa's, and the live ridge board at zero. A version-8 config has no live_readout (off: an axis of
    one value); a config that names it gets every live weight's errors equal to the state's (no prompt had live
    features, so every live weight said the same)."""
    mix = np.asarray(state["mix_errors"], dtype=np.float64)
    choices = _choices(state)
    live = choices.shapes["live_errors"]
    if mix.ndim == 4:
        size = choices.source("live_readout").candidates().size
        mix = np.repeat(mix[:, :, :, None, None, :], size, axis=4)
    return {**state, "mix_errors": mix, "covariate_errors": np.zeros(0), "covariate_gram": np.zeros((0, 0)),
            "covariate_moment": np.zeros(0), "live_errors": np.zeros(live), "live_gram": np.zeros((0, 0)),
            "live_moment": np.zeros(0)}


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7, 7: _v7_to_v8,
              8: _v8_to_v9}


def upgrade(state: dict) -> dict:
    """``state`` in the current layout (a new dict; the arrays are shared, not copied): migrated from its
    ``"version"`` (1 to ``VERSION``; a dict without one is taken as current, as hand-made ones are)."""
    version = state.get("version", VERSION)
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 1 <= version <= VERSION:
        raise DataError(f"estimator state of version {version!r}: this graphdiff reads versions 1 to {VERSION} "
                        "(a newer graphdiff wrote it?)")
    for v in range(int(version), VERSION):
        state = MIGRATIONS[v](state)
    return {**state, "version": VERSION}
