"""Covariates: their encoding (``core.covariates``) and the read-out of them as a source of the estimate
(``estimator.sources.covariates``): the fit is the ridge fit a dense solve gives, a prompt never rolled out starts
from its reference rate, a state round-trips and migrates, extend grows them, bad input is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from _tolerances import FLOAT64
from graphdiff_cli import Estimator
from graphdiff_cli.core import covariates as cv
from graphdiff_cli.core import readout as ro
from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.estimator.versions import MIGRATIONS

KW = dict(device="cpu", dtype="float64")


def world(n=160, seed=3, k=8, d=10):
    """Prompts whose pass rate follows a reference model's rate (a noisy, squeezed copy) and one categorical field."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    nbr, sim = exact_knn(x, 10)
    w = mutual_knn_graph(nbr, sim)
    labels = spectral_clustering(w, k, seed=seed, fallback_neighbors=nbr)
    ref = rng.uniform(0, 1, n)
    level = rng.integers(1, 6, n)
    true_p = np.clip(0.1 + 0.7 * ref - 0.05 * (level - 3) + rng.normal(0, 0.05, n), 0.01, 0.99)
    ref_seen = np.where(rng.uniform(size=n) < 0.8, ref, np.nan)  # 20% without a reference rate
    raw = {"level": cv.Raw("categorical", [str(v) for v in level]),
           "ref": cv.Raw("reference", [None if np.isnan(r) else float(r) for r in ref_seen])}
    return w, labels, raw, true_p, rng


def steps(rng, true_p, count, size=24):
    for _ in range(count):
        ids = rng.choice(true_p.size, size, replace=False)
        yield ids, np.full(size, 8), rng.binomial(8, true_p[ids])


def encoded(raw, n):
    spec = cv.make_spec(raw)
    return spec, cv.encode(spec, raw, n)


# ---------------------------------------------------------------------------------- the encoding


def test_numeric_columns_are_standardised_missing_values_are_the_mean_with_an_indicator():
    raw = {"x": cv.Raw("numeric", [1, 2, None, 5, float("nan")])}
    spec, enc = encoded(raw, 5)
    assert spec.names == ["x", "x missing"]
    seen = np.array([1.0, 2.0, 5.0])
    z = (seen - seen.mean()) / seen.std()
    np.testing.assert_allclose(enc.features[[0, 1, 3], 0], z, **FLOAT64)
    assert enc.features[[2, 4], 0].tolist() == [0.0, 0.0] and enc.features[:, 1].tolist() == [0, 0, 1, 0, 1]
    assert any("2 prompt(s) without a value" in note for note in enc.notes)


def test_categories_are_indicators_and_one_never_seen_is_the_baseline_said_in_a_note():
    raw = {"s": cv.Raw("categorical", ["a", "b", "a", None])}
    spec, enc = encoded(raw, 4)
    assert spec.names == ["s=a", "s=b"]
    assert enc.features.tolist() == [[1, 0], [0, 1], [1, 0], [0, 0]]
    later = cv.encode(spec, {"s": cv.Raw("categorical", ["b", "zebra"])}, 2)
    assert later.features.tolist() == [[0, 1], [0, 0]]
    assert any("1 prompt(s) with a category not among the 2 kept" in note for note in later.notes)


def test_a_reference_rate_is_smoothed_by_its_attempts_and_kept_beside_its_feature():
    raw = {"r": cv.Raw("reference", [0.0, 1.0, None], attempts=[128, 4, None], attempts_field="n")}
    spec, enc = encoded(raw, 3)
    np.testing.assert_allclose(enc.reference[:2], [1 / 130, 5 / 6], **FLOAT64)
    assert np.isnan(enc.reference[2]) and spec.reference.attempts == "n" and spec.names == ["r", "r missing"]
    assert cv.CovariateSpec.from_dict(spec.as_dict()) == spec


def test_text_statistics_read_the_form_of_the_answer():
    stats = cv.text_statistics(["What is $1+1$?", "Find $\\frac{a}{b}$.\nThen stop."],
                               ["$\\boxed{2}$", "\\frac{1}{2}"])
    assert stats["answer_integer"] == [1.0, 0.0] and stats["answer_fraction"] == [0.0, 1.0]
    assert stats["prompt_lines"][1] == pytest.approx(np.log1p(1)) and stats["answer_missing"] == [0.0, 0.0]
    assert cv.text_statistics(["a"], [None])["answer_chars"] == [None]


@pytest.mark.parametrize("raw, match", [
    ({"x": cv.Raw("numeric", [1, "abc"])}, "covariate 'x' \\(numeric\\): row 1 holds 'abc', not a number"),
    ({"x": cv.Raw("numeric", [1, float("inf")])}, "row 1 is infinite"),
    ({"r": cv.Raw("reference", [0.5, 57])}, "row 1 is 57, not a pass rate in \\[0, 1\\]"),
    ({"r": cv.Raw("reference", [0.5, 0.2], attempts=[8, 0])}, "row 1 has 0 attempts"),
    ({"c": cv.Raw("categorical", [{"a": 1}, "b"])}, "not a value"),
])
def test_bad_values_are_refused_in_one_line(raw, match):
    with pytest.raises(DataError, match=match):
        cv.make_spec(raw)


def test_encoding_needs_every_column_of_its_spec():
    spec = cv.make_spec({"x": cv.Raw("numeric", [1, 2])})
    with pytest.raises(DataError, match="covariate 'x' \\(numeric\\) is missing"):
        cv.encode(spec, {}, 2)


# ---------------------------------------------------------------------------------- the source


def test_the_fit_is_the_dense_ridge_fit_and_a_prompt_never_rolled_out_starts_from_its_reference_rate():
    w, labels, raw, true_p, rng = world()
    n = true_p.size
    spec, enc = encoded(raw, n)
    est = Estimator(w, labels, 8, covariates=enc.features, reference_rate=enc.reference, covariate_readout=1.0,
                    readout_ridge=10.0, label_propagation=None, prior_strength=2.0, **KW)
    src = est.mix.source("covariate_readout")
    has = ~np.isnan(enc.reference)
    # before any outcome: the reference rate where there is one, the observed global rate (1/2) elsewhere
    before = src.estimate(est, np.arange(n), None)[0]
    np.testing.assert_array_equal(before[has], enc.reference[has])
    assert np.all(before[~has] == 0.5)
    for ids, k, s in steps(rng, true_p, 6):
        est.update(ids, k, s)
    sd, rd = est.successes_decayed_, est.rollouts_decayed_
    seen = rd > 0
    f = np.concatenate([np.ones((int(seen.sum()), 1)), enc.features[seen]], axis=1)
    pen = np.eye(f.shape[1]) * 10.0
    pen[0, 0] = 0.0
    theta = np.linalg.solve(f.T @ f + pen, f.T @ (sd[seen] / rd[seen]))
    want = np.clip(np.concatenate([np.ones((n, 1)), enc.features], axis=1) @ theta, 0, 1)
    np.testing.assert_allclose(src.estimate(est, np.arange(n), None)[0], want, rtol=1e-9, atol=1e-9)
    assert est.covariate_readout_ == 1.0 and est.source_weights()["covariate_readout"] is not None


def test_auto_weighs_covariates_that_carry_the_pass_rate_up_and_paper_leaves_them_off():
    w, labels, raw, true_p, rng = world()
    spec, enc = encoded(raw, true_p.size)
    est = Estimator(w, labels, 8, covariates=enc.features, reference_rate=enc.reference, **KW)
    paper = Estimator(w, labels, 8, covariates=enc.features, reference_rate=enc.reference, preset="paper", **KW)
    plain = Estimator(w, labels, 8, preset="paper", **KW)
    for ids, k, s in steps(rng, true_p, 8):
        for e in (est, paper, plain):
            e.update(ids, k, s)
    assert est.covariate_readout_ >= 0.5 and paper.covariate_readout_ is None
    np.testing.assert_allclose(paper.predict(), plain.predict(), **FLOAT64)  # the same code path: off is skipped
    err = np.abs(est.predict() - true_p).mean()
    assert err < np.abs(Estimator(w, labels, 8, **KW).predict() - true_p).mean()


def test_a_state_with_covariates_round_trips_and_a_version_8_state_migrates_with_them_off(tmp_path):
    w, labels, raw, true_p, rng = world()
    spec, enc = encoded(raw, true_p.size)
    est = Estimator(w, labels, 8, covariates=enc.features, reference_rate=enc.reference, **KW)
    for ids, k, s in steps(rng, true_p, 4):
        est.update(ids, k, s)
    est.save(tmp_path / "est")
    back = Estimator.load(tmp_path / "est")
    np.testing.assert_array_equal(back.covariates, est.covariates)
    np.testing.assert_array_equal(back.reference_rate, est.reference_rate)
    np.testing.assert_allclose(back.predict(), est.predict(), **FLOAT64)
    ids, k, s = next(steps(rng, true_p, 1))
    est.update(ids, k, s)
    back.update(ids, k, s)
    np.testing.assert_allclose(back.predict(), est.predict(), **FLOAT64)
    # a version-8 state (no covariates then): the covariates' axis of one value, its arrays empty
    old = Estimator(w, labels, 8, **KW)
    for ids, k, s in steps(rng, true_p, 2):
        old.update(ids, k, s)
    sd = old.state_dict()
    v8 = {k: v for k, v in sd.items() if k not in ("covariate_gram", "covariate_moment", "covariate_errors",
                                                   "covariates", "reference_rate")}
    v8["mix_errors"] = sd["mix_errors"][:, :, :, 0, 0, :]  # before the covariates' and the live axes
    v8["config"] = {k: v for k, v in sd["config"].items() if k not in ("covariate_readout", "live_readout",
                                                                       "live_forgetting")}
    v8["version"] = 8
    up = MIGRATIONS[8](v8)
    assert up["mix_errors"].shape == sd["mix_errors"].shape[:4] + (1,) + sd["mix_errors"].shape[5:]
    assert up["covariate_gram"].shape == (0, 0) and up["live_gram"].shape == (0, 0)
    np.testing.assert_allclose(Estimator.from_state_dict(v8).predict(), old.predict(), **FLOAT64)


def test_extend_takes_the_new_prompts_covariates_encoded_by_the_first_spec():
    w, labels, raw, true_p, rng = world(n=180)
    n0 = 150
    first = {k: cv.Raw(v.kind, v.values[:n0]) for k, v in raw.items()}
    spec = cv.make_spec(first)
    enc = cv.encode(spec, first, n0)
    sub = w[:n0, :n0].tocsr()
    est = Estimator(sub, labels[:n0], 8, covariates=enc.features, reference_rate=enc.reference,
                    covariate_readout=1.0, **KW)
    for ids, k, s in steps(rng, true_p[:n0], 5):
        est.update(ids, k, s)
    new = cv.encode(spec, {k: cv.Raw(v.kind, v.values[n0:]) for k, v in raw.items()}, 30)
    grown = np.concatenate([labels[:n0], np.zeros(30, dtype=np.int64)])
    with pytest.raises(DataError, match="give the 30 new prompts' too"):
        est.extend(w, grown)
    with pytest.raises(DataError, match="the new covariates have 2 features"):
        est.extend(w, grown, covariates=new.features[:, :2], reference_rate=new.reference)
    est.extend(w, grown, covariates=new.features, reference_rate=new.reference)
    src = est.mix.source("covariate_readout")
    theta = ro.solve(src.readout_gram_, src.readout_moment_, src.ridge(est.mix.board))
    want = np.clip(theta[0] + new.features @ theta[1:], 0, 1)
    np.testing.assert_allclose(src.estimate(est, np.arange(n0, n0 + 30), None)[0], want, **FLOAT64)


def test_bad_covariate_arrays_are_refused_in_one_line():
    w, labels, raw, true_p, rng = world()
    n = true_p.size
    spec, enc = encoded(raw, n)
    bad = enc.features.copy()
    bad[3, 0] = np.nan
    with pytest.raises(DataError, match="covariates row 3 holds a NaN"):
        Estimator(w, labels, 8, covariates=bad, **KW)
    with pytest.raises(DataError, match=f"covariates must be a numeric {n} x c array"):
        Estimator(w, labels, 8, covariates=enc.features[:5], **KW)
    with pytest.raises(DataError, match="reference_rate\\[0\\] = 2.0 is not a pass rate"):
        Estimator(w, labels, 8, covariates=enc.features, reference_rate=np.full(n, 2.0), **KW)
    with pytest.raises(DataError, match="a reference rate comes with the covariates"):
        Estimator(w, labels, 8, reference_rate=enc.reference, **KW)
    with pytest.raises(InvalidArgumentError, match="covariate_readout 0.5 needs the prompts' covariates"):
        Estimator(w, labels, 8, covariate_readout=0.5, **KW)
