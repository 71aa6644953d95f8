"""The sources of the graph's estimate behind one protocol (``estimator.sources``) and their one mix: a source
added without touching the driver is blended in and weighed by the scoreboard; the paper preset is the
mean-field states alone; the nested blend is today's formula."""

import numpy as np
import pytest

from graphdiff_cli import Estimator
from graphdiff_cli.core import meanfield as mf
from graphdiff_cli.estimator.sources import SOURCES, History, Source
from graphdiff_cli.io import estimator_layout as layout

from _tolerances import FLOAT64
from test_estimator_options import problem, steps

KW = dict(device="cpu", dtype="float64")


class Column(Source):
    """A column of numbers, one per prompt, as a source; its weight in the mix chosen online."""

    name = "column"
    grid = np.array([0.0, 0.5, 1.0])
    start = 0.0
    values = np.zeros(0)

    def __init__(self, settings, n_nodes, inputs=None):
        self.weight = "auto"

    def estimate(self, est, rows, model, context=None):
        return self.values[rows], None


def with_column(values):
    """An Estimator whose sources are today's and a column: one entry more in its list, the driver untouched."""
    column = type("Column", (Column,), {"values": np.asarray(values, dtype=np.float64)})
    return type("WithColumn", (Estimator,), {"SOURCES": Estimator.SOURCES + (column,)})


@pytest.mark.parametrize("truth, weight", [(True, "high"), (False, 0.0)])
def test_a_source_added_later_is_weighed_by_the_scoreboard(truth, weight):
    w, labels, true_p, rng = problem()
    est = with_column(true_p if truth else 1.0 - true_p)(w, labels, 8, **KW)
    assert est.mix_errors_.ndim == 7  # (time, propagation, read-out, covariates, live, column, kappa)
    for ids, n, s in steps(rng, true_p, 15):
        est.update(ids, n, s)
    chosen = est.mix.weight(len(est.mix.sources) - 1)
    assert chosen >= 0.5 if weight == "high" else chosen == weight
    shares = est.source_weights()
    np.testing.assert_allclose(sum(v for v in shares.values() if v is not None), 1.0, **FLOAT64)
    np.testing.assert_allclose(shares["column"], (1.0 - shares["history"]) * chosen, **FLOAT64)
    back = type(est).from_state_dict(est.state_dict())  # its board is saved and read back with the rest
    np.testing.assert_array_equal(back.mix_errors_, est.mix_errors_)  # saved and read back: a copy, no arithmetic
    np.testing.assert_allclose(back.predict(), est.predict(), **FLOAT64)


def test_the_paper_preset_is_the_states_source_alone():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", **KW)
    assert [s.name for s in est.mix.sources] == [s.name for s in SOURCES] == ["states", "label_propagation",
                                                                                "readout", "covariate_readout", "live_readout"]
    assert [s.name for s in est.mix.sources if s.on] == ["states"]
    assert all(b.size == 0 for b in est.mix.board.values())  # nothing chosen online
    for ids, n, s in steps(rng, true_p, 4):
        est.update(ids, n, s)
    rows = np.arange(w.shape[0])
    p_model, _ = mf.model_prediction(est.q_, est.a_, est.b_)
    want = mf.mix_with_history(p_model, est.successes_.astype(float), est.rollouts_.astype(float),
                               est.settings.gamma)
    np.testing.assert_allclose(est.predict(), want, **FLOAT64)
    shares = est.source_weights(rows)
    assert shares["label_propagation"] is None and shares["readout"] is None


def test_the_nested_blend_is_the_formula_of_the_parts():
    w, labels, true_p, rng = problem()
    emb = rng.standard_normal((w.shape[0], 5))
    cov = rng.standard_normal((w.shape[0], 3))
    est = Estimator(w, labels, 8, embeddings=emb, covariates=cov, label_propagation=0.25, readout=0.4,
                    covariate_readout=0.3, live_readout=None, time_forgetting=1.0, prior_strength=2.0, **KW)
    for ids, n, s in steps(rng, true_p, 5):
        est.update(ids, n, s)
    rows = np.arange(w.shape[0])
    model = mf.model_prediction(est.q_, est.a_, est.b_)
    states, propagated, readout, covariates, live = est.mix.means(est, rows, model)
    assert live is None  # live_readout off
    want = (1 - 0.3) * ((1 - 0.4) * ((1 - 0.25) * states + 0.25 * propagated) + 0.4 * readout) + 0.3 * covariates
    np.testing.assert_allclose(est.mix.graph_estimate(est, rows, model), want, **FLOAT64)
    assert est.mix_errors_.size == 0 and [a.tolist() for a in est.mix.axes[1:4]] == [[0.25], [0.4], [0.3]]


def test_a_source_that_is_off_is_skipped_not_blended_at_weight_zero():
    class Off(Column):
        def __init__(self, settings, n_nodes, inputs=None):
            self.weight = None

        def estimate(self, est, rows, model, context=None):
            raise AssertionError("an off source is never read")

    w, labels, true_p, rng = problem()
    est = type("WithOff", (Estimator,), {"SOURCES": Estimator.SOURCES + (Off,)})(w, labels, 8, **KW)
    ref = Estimator(w, labels, 8, **KW)
    for ids, n, s in steps(rng, true_p, 3):
        est.update(ids, n, s)
        ref.update(ids, n, s)
    np.testing.assert_allclose(est.predict(), ref.predict(), **FLOAT64)  # Off.estimate raising proves the skip
    assert est.source_weights()["column"] is None and est.mix_errors_.shape[:-1] == ref.mix_errors_.shape[:-1] + (1,)


def test_every_state_array_has_one_keeper():
    """The rows of io.estimator_layout's table: the evidence the driver keeps for every source, the mix's board,
    the history's, and each source's own, every row once."""
    evidence = ["successes", "rollouts", "successes_decayed", "rollouts_decayed", "offset_decayed", "global_counts"]
    kept = evidence + ["mix_errors", *History.arrays, *(name for s in SOURCES for name in s.arrays)]
    assert sorted(kept) == sorted(layout.STATE_NAMES)


def test_an_estimator_without_propagation_or_readout_reports_them_absent():
    """An estimator whose list lacks a source answers for it as for one that is off (None, or an empty array),
    and still updates, saves and predicts."""
    w, labels, true_p, rng = problem()
    states_only = type("StatesOnly", (Estimator,), {"SOURCES": SOURCES[:1]})
    est = states_only(w, labels, 8, **KW)
    for ids, n, s in steps(rng, true_p, 3):
        est.update(ids, n, s)
    assert est.propagation_ is None and est.readout_ is None and est.readout_ridge_ is None
    assert est.lp_field_ is None and est.readout_gram_.size == 0 and est.readout_moment_.size == 0
    assert est.readout_errors_.size == 0
    np.testing.assert_allclose(states_only.from_state_dict(est.state_dict()).predict(), est.predict(), **FLOAT64)
