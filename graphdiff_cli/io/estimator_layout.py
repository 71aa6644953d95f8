"""The estimator's state, declared once: every array, its dtype and axis, how ``extend`` grows it, what it starts at.

Plain data, so that both sides of the layer line read it: the estimator derives its construction, growth,
``state_dict`` and ``from_state_dict`` from ``STATE_ARRAYS``, and ``io.estimator_store`` its check that an
artifact holds every array. A new state array is one row here (and its update in the estimator); the
encoding version of ``estimator-state`` / ``estimator-step`` goes up by one, with a migration from the
previous version in ``graphdiff_cli.estimator.versions``.

Encoding versions of the estimator's state (``LAYOUTS``: the arrays of each). Versions 1-6 were written
before artifacts carried a version of their own kind: all are stamped ``format_version`` 1, and the arrays
an artifact holds tell which it is (``legacy_version``). From version 7 on the stamp says it.

1. q, a, b, successes, rollouts, window_evidence (read by the first commit's ``from_state_dict``, which
   filled in what version 2 adds: states written before the repository's history).
2. + the forgotten counts ``successes_decayed``, ``rollouts_decayed``, ``offset_decayed``, the forgotten
   state evidence and global counts ``state_evidence``, ``global_counts``, and the residual schedule's
   ``dirty`` / ``at_fixed_point`` (cf4c94d, the first commit).
3. + ``kappa_moments`` (a606698: prior_strength "auto" as a moment fit).
4. ``kappa_moments`` replaced by ``kappa_errors`` (0865059: kappa chosen by prequential errors).
5. + ``belief_loglik`` (20a41f0: belief_strength "auto").
6. + ``lp_field``, ``mix_errors``, ``time_counts`` (69909a9: label propagation and time forgetting, chosen
   jointly online); what 79a4679 wrote.
7. the same arrays; ``n_states`` kept beside the settings instead of inside them, and a scoreboard the
   online choices do not keep (``kappa_errors`` under the joint choice, ``mix_errors`` without one,
   ``belief_loglik`` with belief_strength fixed) stored empty instead of as zeros nothing reads.
8. + the read-out of the embedding: its sufficient statistics ``readout_gram``, ``readout_moment``
   and its ridge strength's board ``readout_errors`` (each empty without a read-out), and a read-out axis in
   ``mix_errors`` (time, weight, read-out weight, kappa). The embeddings themselves are static: the model
   artifact (and a standalone state) holds them as ``embeddings`` when the estimator has them.
9. + the read-out of the covariates (``core.covariates``): ``covariate_gram``, ``covariate_moment`` and its
   ridge strength's board ``covariate_errors`` (each empty without covariates), and a covariates axis in
   ``mix_errors`` (time, weight, read-out weight, covariates weight, kappa). The covariates and reference rates
   are static, held beside the embeddings as ``covariates`` and ``reference_rate`` when the estimator has them.
   + the read-out of live features (``estimator.sources.live``): ``live_gram``, ``live_moment`` (forgotten per
   step; empty until a step gives live features, and without the live read-out) and its ridge strength's board
   ``live_errors``, and a live axis in ``mix_errors`` (..., covariates weight, live weight, kappa). Live features
   themselves come with each call and are never saved.

The ``estimator-step`` artifact of a STATE has an encoding of its own from version 9 on (``STEP_VERSION``):
the state of version 8 (of version 9 from step encoding 10 on), with q either whole (a snapshot) or as a *delta*
of the step it was made from (its base): the rows of q that changed since (``q_rows``, ``q_values``), every
other array whole (a step costs what changed). Reading it composes the base's q and the deltas
(``io.estimator_store``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# axes
PROMPT = "per prompt"   # the first axis is the N prompts (``prompt_axis`` says which axis when not the first)
STATE = "per state"     # the last axis is the K states
SCALAR = "scalar"
OTHER = "other"

# how extend grows an array for m new prompts
ZEROS = "zeros"         # m zeros along the prompt axis: a new prompt has no outcomes
PRIOR = "prior"         # q: the new rows are A_i, then relaxed by Proposition 1 when q is at a fixed point
SOLVED = "solved"       # label propagation's field: solved again on the grown graph
MARKED = "marked"       # dirty: + the new rows and every old row whose edges changed
KEPT = "kept"           # no prompt axis: unchanged

# who keeps it
DRIVER = "driver"       # the estimator's own numpy attribute ``attr``
SPECIAL = "special"     # held otherwise (q as a torch tensor, lp_field / dirty as None when absent)
CHOICES = "choices"     # the online choices' scoreboard (``estimator.mix.Mix``)


@dataclass(frozen=True)
class StateArray:
    """One array of the estimator's state: ``name`` in ``state_dict`` and on disk, ``attr`` on the estimator.

    ``shape``: "N" prompts, "K" states, None a length that varies (steps, rows) or, for the online choices'
    boards, that their settings decide (``estimator.mix.Mix.shapes``); ``fill``: the value
    every element starts at (arrays the driver keeps); ``grows`` and ``start`` say the rest in words.
    """

    name: str
    dtype: str
    axis: str
    shape: tuple
    grows: str
    start: str
    owner: str
    attr: str = ""
    fill: float = 0.0
    prompt_axis: int = 0


STATE_ARRAYS: tuple[StateArray, ...] = (
    StateArray("q", "float32 or float64 (settings.dtype)", PROMPT, ("N", "K"), PRIOR,
               "A, the smoothed spectral prior", SPECIAL, "q_"),
    StateArray("a", "float64", STATE, ("K",), KEPT, "1 (Beta(1, 1))", DRIVER, "a_", fill=1.0),
    StateArray("b", "float64", STATE, ("K",), KEPT, "1 (Beta(1, 1))", DRIVER, "b_", fill=1.0),
    StateArray("successes", "int64", PROMPT, ("N",), ZEROS, "0", DRIVER, "successes_"),
    StateArray("rollouts", "int64", PROMPT, ("N",), ZEROS, "0", DRIVER, "rollouts_"),
    StateArray("window_evidence", "float64", STATE, (None, 2, "K"), KEPT,
               "no steps: the (sum q s, sum q f) of the last window - 1 steps (windowed variant only)", DRIVER,
               "_window_evidence"),
    StateArray("successes_decayed", "float64", PROMPT, ("N",), ZEROS, "0 (prompt and time forgetting applied)",
               DRIVER, "successes_decayed_"),
    StateArray("rollouts_decayed", "float64", PROMPT, ("N",), ZEROS, "0", DRIVER, "rollouts_decayed_"),
    StateArray("offset_decayed", "float64", PROMPT, ("N",), ZEROS, "0: sum over visits of s - n p_model", DRIVER,
               "offset_decayed_"),
    StateArray("state_evidence", "float64", STATE, (2, "K"), KEPT, "0 (state forgetting applied)", DRIVER,
               "state_evidence_"),
    StateArray("global_counts", "float64", OTHER, (2,), KEPT, "0: (successes, rollouts), state forgetting applied",
               DRIVER, "global_counts_"),
    StateArray("kappa_errors", "float64", OTHER, (None,), KEPT, "0 per KAPPA_GRID value; empty unless kappa is "
               "chosen alone", CHOICES, "kappa_errors_"),
    StateArray("belief_loglik", "float64", OTHER, (None,), KEPT, "0 per KAPPA_GRID value; empty unless "
               "belief_strength is auto", CHOICES, "belief_loglik_"),
    StateArray("mix_errors", "float64", OTHER, (None, None, None, None, None, None), KEPT, "0 per (time, "
               "weight, read-out weight, covariates weight, live weight, kappa) in play; empty without a joint "
               "choice", CHOICES,
               "mix_errors_"),
    StateArray("readout_errors", "float64", OTHER, (None,), KEPT, "0 per RIDGE_GRID value; empty unless the "
               "read-out is on with readout_ridge auto", CHOICES, "readout_errors_"),
    StateArray("time_counts", "float64", PROMPT, (None, 2, "N"), ZEROS, "0 per TIME_GRID delta; 0 x 2 x N unless "
               "time_forgetting is auto", CHOICES, "time_counts_", prompt_axis=2),
    StateArray("lp_field", "float64", PROMPT, (None,), SOLVED, "empty: solved at the first update (N after)",
               SPECIAL, "lp_field_"),
    StateArray("readout_gram", "float64", OTHER, (None, None), KEPT, "0, (d + 1) x (d + 1): sum over prompts "
               "with evidence of x x^T, x = [1, embedding]; 0 x 0 without a read-out", SPECIAL, "readout_gram_"),
    StateArray("readout_moment", "float64", OTHER, (None,), KEPT, "0, d + 1: sum of x times the prompt's "
               "forgotten rate; empty without a read-out", SPECIAL, "readout_moment_"),
    StateArray("covariate_errors", "float64", OTHER, (None,), KEPT, "0 per RIDGE_GRID value; empty unless the "
               "covariates' read-out is on with readout_ridge auto", CHOICES, "covariate_errors_"),
    StateArray("covariate_gram", "float64", OTHER, (None, None), KEPT, "0, (c + 1) x (c + 1): sum over prompts "
               "with evidence of x x^T, x = [1, covariates]; 0 x 0 without covariates", SPECIAL, "covariate_gram_"),
    StateArray("covariate_moment", "float64", OTHER, (None,), KEPT, "0, c + 1: sum of x times the prompt's "
               "forgotten rate; empty without covariates", SPECIAL, "covariate_moment_"),
    StateArray("live_errors", "float64", OTHER, (None,), KEPT, "0 per RIDGE_GRID value; empty unless the "
               "live read-out is on with readout_ridge auto", CHOICES, "live_errors_"),
    StateArray("live_gram", "float64", OTHER, (None, None), KEPT, "empty until a step gives f live features, then "
               "(f + 1) x (f + 1): sum over (prompt, step) pairs with live features of x x^T, x = [1, live], "
               "forgotten by live_forgetting per step; empty without the live read-out", SPECIAL, "live_gram_"),
    StateArray("live_moment", "float64", OTHER, (None,), KEPT, "empty, then f + 1: the same sum of x times the "
               "step's rate s / n", SPECIAL, "live_moment_"),
    StateArray("dirty", "int64", OTHER, (None,), MARKED, "empty: q = A is not at a fixed point", SPECIAL, "_dirty"),
    StateArray("at_fixed_point", "bool", SCALAR, (), KEPT, "false", SPECIAL),
)
DRIVER_ARRAYS = tuple(a for a in STATE_ARRAYS if a.owner == DRIVER)
STATE_NAMES = tuple(a.name for a in STATE_ARRAYS)

# besides the arrays: ``n_states`` (K), ``config`` (the settings), ``step``, ``graph`` and ``labels``
VERSION = 9
# the estimator-step artifact: 7 and 8 hold a state of that version; 9 a state of version 8 whose q may be a delta,
# 10 the same of version 9
STEP_VERSION = 10
STEP_LAYOUT = {1: 1, 7: 7, 8: 8, 9: 8, 10: 9}  # the state layout a step of each encoding version holds (1: 1-6)
# the arrays of a delta step that stand for q: the rows changed since its base step, and their values
Q_ROWS, Q_VALUES = "q_rows", "q_values"
# the estimator-model artifact: 1 wrote the settings with n_states inside them, twice (stamp params and the
# config attribute); 2 writes the attributes n_states and config (the settings) once
MODEL_VERSION = 2
_V2 = frozenset({"q", "a", "b", "successes", "rollouts", "window_evidence"}) | {
    "successes_decayed", "rollouts_decayed", "offset_decayed", "state_evidence", "global_counts", "dirty",
    "at_fixed_point"}
LAYOUTS: dict[int, frozenset] = {
    1: frozenset({"q", "a", "b", "successes", "rollouts", "window_evidence"}),
    2: _V2,
    3: _V2 | {"kappa_moments"},
    4: _V2 | {"kappa_errors"},
    5: _V2 | {"kappa_errors", "belief_loglik"},
    6: _V2 | {"kappa_errors", "belief_loglik", "lp_field", "mix_errors", "time_counts"},
    7: _V2 | {"kappa_errors", "belief_loglik", "lp_field", "mix_errors", "time_counts"},
    8: frozenset(STATE_NAMES) - {"covariate_errors", "covariate_gram", "covariate_moment", "live_errors", "live_gram",
                                 "live_moment"},
    9: frozenset(STATE_NAMES),
}
LEGACY = (1, 2, 3, 4, 5, 6)  # stamped format_version 1


def resolve_shape(a: StateArray, n: int, k: int) -> tuple:
    """``a.shape`` for n prompts and k states (None stays: a length that varies)."""
    return tuple(n if d == "N" else k if d == "K" else d for d in a.shape)


def initial(a: StateArray, n: int, k: int) -> np.ndarray:
    """What an array the driver keeps holds at t = 0 (a length that varies starts at 0)."""
    shape = tuple(0 if d is None else d for d in resolve_shape(a, n, k))
    return np.full(shape, a.fill, dtype=a.dtype)


def grow(a: StateArray, value: np.ndarray, m: int) -> np.ndarray:
    """``value`` of an array that grows by ``ZEROS``, with m new prompts (zeros along its prompt axis)."""
    shape = list(value.shape)
    shape[a.prompt_axis] = m
    return np.concatenate([value, np.zeros(shape, dtype=value.dtype)], axis=a.prompt_axis)


BY_NAME = {a.name: a for a in STATE_ARRAYS}


def legacy_version(names) -> int | None:
    """Which of versions 1-6 an artifact stamped version 1 holds, by its arrays (the latest layout all of
    whose arrays it has; other arrays, as a STATE's ``retired``, are not the estimator's); None if none."""
    names = set(names)
    found = [v for v in LEGACY if LAYOUTS[v] <= names]
    return max(found) if found else None
