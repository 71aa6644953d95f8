"""The ridge read-out of the embedding as a source of the graph's estimate: its statistics and fit
against a from-scratch ridge regression, its weight and ridge strength chosen online against brute force,
the paper preset untouched, persistence, extend, migration of a version-7 state, and init keeping the
embeddings in a STATE."""

import numpy as np
import pytest

from graphdiff_cli import Estimator
from graphdiff_cli.core import readout as ro
from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.errors import DataError, InvalidArgumentError

KW = dict(device="cpu", dtype="float64")


def world(n=160, seed=5, k=8, d=12):
    """A graph of unit embeddings in six topics whose pass rates follow a linear read-out of the embedding."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((6, d)) * 1.2
    topic = rng.integers(0, 6, n)
    x = centers[topic] + rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    nbr, sim = exact_knn(x, 10)
    w = mutual_knn_graph(nbr, sim)
    labels = spectral_clustering(w, k, seed=seed, fallback_neighbors=nbr)
    true_p = 1 / (1 + np.exp(-(x @ rng.normal(0, 3.0, d))))
    return w, labels, x.astype(np.float32), true_p, rng


def steps(rng, true_p, count, size=24):
    for _ in range(count):
        ids = rng.choice(true_p.size, size, replace=False)
        yield ids, np.full(size, 8), rng.binomial(8, true_p[ids])


def brute_ridge(x, succ, roll, ridge):
    """theta of the ridge fit of S/C on [1, x] over prompts with C > 0, intercept unpenalised (dense solve)."""
    seen = roll > 0
    f = np.concatenate([np.ones((int(seen.sum()), 1)), x[seen].astype(np.float64)], axis=1)
    pen = np.eye(f.shape[1]) * ridge
    pen[0, 0] = 0.0
    return np.linalg.solve(f.T @ f + pen, f.T @ (succ[seen] / roll[seen]))


def test_statistics_follow_the_counts_in_use_and_the_fit_is_ridge():
    w, labels, x, true_p, rng = world()
    est = Estimator(w, labels, 8, embeddings=x, readout="auto", time_forgetting=0.9, **KW)
    for ids, n, s in steps(rng, true_p, 6):
        est.update(ids, n, s)
    want = ro.stats_of(ro.features(x), *ro.rows_of(est.successes_decayed_, est.rollouts_decayed_))
    np.testing.assert_allclose(est.readout_gram_, want[0], atol=1e-9)
    np.testing.assert_allclose(est.readout_moment_, want[1], atol=1e-9)
    for ridge in ro.RIDGE_GRID:
        theta = brute_ridge(x, est.successes_decayed_, est.rollouts_decayed_, ridge)
        got = est.mix.source("readout").fits(est, np.arange(w.shape[0]), [ridge])[0]
        np.testing.assert_allclose(got, np.clip(ro.features(x) @ theta, 0, 1), atol=1e-9)


def test_time_forgetting_auto_keeps_the_statistics_of_the_counts_in_use():
    w, labels, x, true_p, rng = world(seed=8)
    est = Estimator(w, labels, 8, embeddings=x, readout="auto", **KW)  # time_forgetting auto (default preset)
    for t, (ids, n, s) in enumerate(steps(rng, true_p, 10)):
        est.update(ids, n, s if t < 5 else n - s)  # a jump: the choice may switch the counts in use
        want = ro.stats_of(ro.features(x), *ro.rows_of(est.successes_decayed_, est.rollouts_decayed_))
        np.testing.assert_allclose(est.readout_gram_, want[0], atol=1e-8)
        np.testing.assert_allclose(est.readout_moment_, want[1], atol=1e-8)


def test_readout_one_makes_the_graphs_estimate_the_readout():
    w, labels, x, true_p, rng = world()
    est = Estimator(w, labels, 8, embeddings=x, readout=1.0, readout_ridge=10.0, prior_strength=2.0,
                    time_forgetting=1.0, **KW)
    for ids, n, s in steps(rng, true_p, 4):
        est.update(ids, n, s)
    theta = brute_ridge(x, est.successes_decayed_, est.rollouts_decayed_, 10.0)
    m = np.clip(ro.features(x) @ theta, 0, 1)
    sd, rd = est.successes_decayed_, est.rollouts_decayed_
    np.testing.assert_allclose(est.predict(), (2.0 * m + sd) / (2.0 + rd), atol=1e-9)
    assert est.readout_ == 1.0 and est.readout_ridge_ == 10.0


def test_online_choices_match_brute_force():
    """readout auto with fixed kappa and no other joint axis: the weight chosen is the one whose fixed-weight
    estimator had the smallest summed error of its own predictions; the ridge board is the read-out's error."""
    w, labels, x, true_p, rng = world(seed=11)
    base = dict(embeddings=x, prior_strength=3.0, time_forgetting=1.0, label_propagation=None, readout_ridge="auto",
                live_readout=None, **KW)
    auto = Estimator(w, labels, 8, readout="auto", **base)
    fixed = {r: Estimator(w, labels, 8, readout=float(r), **base) for r in ro.READOUT_GRID}
    errors = {r: 0.0 for r in ro.READOUT_GRID}
    ridge_err = np.zeros(ro.RIDGE_GRID.size)
    for ids, n, s in steps(rng, true_p, 6):
        rate = s / n
        for r, e in fixed.items():
            errors[r] += np.abs(e.predict(ids) - rate).sum()
            e.update(ids, n, s)
        ridge_err += [np.abs(p - rate).sum() for p in auto.mix.source("readout").fits(auto, ids, ro.RIDGE_GRID)]
        auto.update(ids, n, s)
    np.testing.assert_allclose(auto.mix_errors_[0, 0, :, 0, 0, 0], [errors[r] for r in ro.READOUT_GRID], rtol=1e-9)
    np.testing.assert_allclose(auto.readout_errors_, ridge_err, rtol=1e-9)
    assert auto.readout_ == min(errors, key=errors.get)
    assert auto.readout_ridge_ == ro.RIDGE_GRID[int(np.argmin(ridge_err))]


def test_paper_preset_and_missing_embeddings():
    w, labels, x, true_p, rng = world()
    with_e = Estimator(w, labels, 8, preset="paper", embeddings=x, **KW)
    without = Estimator(w, labels, 8, preset="paper", **KW)
    auto_off = Estimator(w, labels, 8, readout="auto", **KW)  # auto without embeddings: no read-out
    default = Estimator(w, labels, 8, readout=None, **KW)
    for ids, n, s in steps(rng, true_p, 3):
        for e in (with_e, without, auto_off, default):
            e.update(ids, n, s)
    np.testing.assert_array_equal(with_e.predict(), without.predict())
    np.testing.assert_array_equal(auto_off.predict(), default.predict())
    assert with_e.readout_ is None and auto_off.readout_ is None and with_e.readout_gram_.size == 0
    with pytest.raises(InvalidArgumentError, match="needs the prompts' embeddings"):
        Estimator(w, labels, 8, readout=0.5, **KW)
    with pytest.raises(DataError, match="embeddings must be"):
        Estimator(w, labels, 8, embeddings=x[:-1], readout="auto", **KW)
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(DataError, match="row 3"):
        Estimator(w, labels, 8, embeddings=bad, readout="auto", **KW)


def test_save_load_and_a_version_7_state(tmp_path):
    from graphdiff_cli.estimator.versions import MIGRATIONS

    w, labels, x, true_p, rng = world()
    est = Estimator(w, labels, 8, embeddings=x, readout="auto", **KW)
    for ids, n, s in steps(rng, true_p, 4):
        est.update(ids, n, s)
    est.save(tmp_path / "est")
    back = Estimator.load(tmp_path / "est")
    np.testing.assert_array_equal(back.predict(), est.predict())
    np.testing.assert_array_equal(back.embeddings, est.embeddings)
    assert back.readout_ == est.readout_ and back.readout_ridge_ == est.readout_ridge_
    ids, n, s = next(steps(rng, true_p, 1))
    est.update(ids, n, s)
    back.update(ids, n, s)
    np.testing.assert_allclose(back.predict(), est.predict(), atol=1e-12)
    # a version-7 state (no read-out then): migrated with the read-out off and a read-out axis of one value
    old = Estimator(w, labels, 8, **KW)
    for ids, n, s in steps(rng, true_p, 2):
        old.update(ids, n, s)
    sd = old.state_dict()
    v7 = {k: v for k, v in sd.items() if k not in ("readout_gram", "readout_moment", "readout_errors", "embeddings",
                                                    "covariate_gram", "covariate_moment", "covariate_errors",
                                                    "covariates", "reference_rate")}
    v7["mix_errors"] = sd["mix_errors"][:, :, 0, 0, 0, :]  # (time, propagation, kappa): before the read-outs
    v7["config"] = {k: v for k, v in sd["config"].items() if k not in ("readout", "readout_ridge", "covariate_readout",
                                                                       "live_readout", "live_forgetting")}
    v7["version"] = 7
    up = MIGRATIONS[7](v7)
    assert up["mix_errors"].shape == sd["mix_errors"].shape[:3] + sd["mix_errors"].shape[5:]
    assert up["readout_gram"].shape == (0, 0)
    np.testing.assert_array_equal(Estimator.from_state_dict(v7).predict(), old.predict())


def test_extend_gives_new_prompts_the_readout_at_once():
    w, labels, x, true_p, rng = world(n=160)
    n0 = 140
    from graphdiff_cli.core.graph import extend_mutual_knn

    nbr, sim = exact_knn(x[:n0].astype(np.float64), 10)
    w0 = mutual_knn_graph(nbr, sim)
    lab0 = spectral_clustering(w0, 8, seed=0, fallback_neighbors=nbr)
    est = Estimator(w0, lab0, 8, embeddings=x[:n0], readout=1.0, readout_ridge=10.0, prior_strength=2.0, **KW)
    for ids, n, s in steps(np.random.default_rng(0), true_p[:n0], 5):
        est.update(ids, n, s)
    ext = extend_mutual_knn(w0, nbr, sim.astype(np.float32), x[:n0], x[n0:])
    labels = np.concatenate([lab0, np.zeros(20, dtype=np.int64)])
    with pytest.raises(DataError, match="give the 20 new prompts' too"):
        est.extend(ext.graph, labels)
    est.extend(ext.graph, labels, embeddings=x[n0:])
    theta = brute_ridge(x[:n0], est.successes_decayed_[:n0], est.rollouts_decayed_[:n0], 10.0)
    np.testing.assert_allclose(est.predict(np.arange(n0, 160)), np.clip(ro.features(x[n0:]) @ theta, 0, 1),
                               atol=1e-9)
