"""Each baseline against its published rule on hand-worked sequences."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.special import expit, logit

from graphdiff_cli.evaluation.baselines import (GRESO, VIP, DiscountedHistory, HistoryMean, LabelPropagation, MoPPS,
                                          OnlineEstimator, OracleEstimator, SampleBeforeRL, SampleBeforeStep,
                                          harmonic_solution)
from graphdiff_cli.core.beta import zero_variance, zero_variance_point
from graphdiff_cli.errors import DataError, InvalidArgumentError
from _tolerances import FLOAT64
from graphdiff_cli.evaluation.methods import GraphdiffMethod


def a(*x):
    return np.array(x, dtype=np.int64)


def test_core_modules_do_not_import_heavy_backends():
    code = ("import sys; import graphdiff_cli.evaluation.baselines, graphdiff_cli.evaluation.metrics, "
            "graphdiff_cli.evaluation.replay, graphdiff_cli.evaluation.simulate, graphdiff_cli.core.diagnostics; "
            "bad = [m for m in ('torch', 'typer', 'rich', 'zarr', 'faiss') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_protocols_are_satisfied():
    from graphdiff_cli.estimator import Estimator

    assert isinstance(HistoryMean(3), OnlineEstimator)
    assert isinstance(GRESO(3), OnlineEstimator)
    # graphdiff's own estimator is one as it is: one protocol for the product and the peers
    assert isinstance(Estimator(_graph(), a(0, 0, 1, 1, 2, 2, 2, 0), 3, device="cpu"), OnlineEstimator)
    assert isinstance(SampleBeforeStep(3), OracleEstimator)
    assert not hasattr(HistoryMean(3), "predict_with_outcomes")
    # an oracle cannot be replayed as a real estimator
    assert not hasattr(SampleBeforeStep(3), "predict") and not isinstance(SampleBeforeStep(3), OnlineEstimator)


def test_estimates_carry_a_belief_only_where_the_method_has_one():
    from graphdiff_cli.evaluation.baselines import belief, has_belief

    assert has_belief(MoPPS(3)) and not has_belief(HistoryMean(3)) and not has_belief(GRESO(3))
    assert set(HistoryMean(3).estimates(a(0, 1), 8)) == {"p"}
    assert set(GRESO(3).estimates(a(0, 1), 8)) == {"p", "p_zero_variance"}
    m = MoPPS(3)
    m.update(a(0), a(4), a(3))
    b = belief(m, a(0, 1), 4)
    np.testing.assert_allclose(b["mean"], [4 / 6, 0.5], **FLOAT64)
    np.testing.assert_allclose(b["variance"], [4 * 2 / (36 * 7), 1 / 12], **FLOAT64)
    h = HistoryMean(3)
    h.update(a(0), a(4), a(3))
    b = belief(h, a(0, 1), 4)  # a point estimate: variance 0, the plug-in p^g + (1 - p)^g
    np.testing.assert_allclose(b["mean"], b["p"], rtol=0)
    assert not b["variance"].any()
    np.testing.assert_allclose(b["p_zero_variance"], zero_variance_point(b["p"], 4), **FLOAT64)


# -- history mean -------------------------------------------------------------------------------------


def test_history_mean_hand_worked():
    h = HistoryMean(3)
    np.testing.assert_allclose(h.predict(a(0, 1, 2)), [0.5, 0.5, 0.5])  # before any outcome
    h.update(a(0, 1), a(4, 4), a(1, 2))
    # seen: own mean; unseen: global mean 3/8
    np.testing.assert_allclose(h.predict(a(0, 1, 2)), [0.25, 0.5, 0.375])
    h.update(a(0), a(4), a(4))
    np.testing.assert_allclose(h.predict(a(0, 2)), [5 / 8, 7 / 12])


def test_history_mean_sums_a_prompt_listed_twice_in_a_step():
    h = HistoryMean(2)
    h.update(a(0, 0), a(4, 4), a(4, 0))
    assert h.predict(a(0))[0] == pytest.approx(0.5)


def test_history_mean_refuses_bad_input():
    h = HistoryMean(2)
    with pytest.raises(DataError, match="out of range"):
        h.predict(a(2))
    with pytest.raises(DataError, match="larger than"):
        h.update(a(0), a(2), a(3))
    with pytest.raises(InvalidArgumentError):
        HistoryMean(0)


# -- discounted history ---------------------------------------------------------------------------------


def test_discounted_history_hand_worked():
    d = DiscountedHistory(3, lam=0.5, m=1.0)
    d.update(a(0, 1), a(8, 8), a(6, 0))
    g = 6 / 16
    assert d.predict(a(0))[0] == pytest.approx((g + 6) / 9)
    assert d.predict(a(2))[0] == pytest.approx(g)  # unseen -> g
    d.update(a(0), a(8), a(2))
    # S = 0.5 * 6 + 2 = 5, C = 0.5 * 8 + 8 = 12, g = 8 / 24
    assert d.predict(a(0))[0] == pytest.approx((1 / 3 + 5) / 13)
    # prompt 1 was not visited in step 2: its counts are not discounted
    assert d.predict(a(1))[0] == pytest.approx((1 / 3 + 0) / 9)


def test_discounted_history_with_lambda_1_and_m_0_is_the_history_mean():
    rng = np.random.default_rng(0)
    d, h = DiscountedHistory(20, lam=1.0, m=0.0), HistoryMean(20)
    for _ in range(15):
        ids = rng.choice(20, size=6, replace=False)
        n = rng.integers(1, 9, size=6)
        s = rng.binomial(n, 0.4)
        np.testing.assert_allclose(d.predict(np.arange(20)), h.predict(np.arange(20)))
        d.update(ids, n, s)
        h.update(ids, n, s)


# -- MoPPS -----------------------------------------------------------------------------------------------


def test_mopps_lambda_half_after_two_steps():
    m = MoPPS(2, lam=0.5)
    assert m.predict(a(0))[0] == 0.5
    m.update(a(0), a(8), a(6))  # alpha = 0.5 + 0.5 + 6 = 7, beta = 0.5 + 0.5 + 2 = 3
    assert m.alpha_[0] == pytest.approx(7) and m.beta_[0] == pytest.approx(3)
    m.update(a(0), a(8), a(2))  # alpha = 3.5 + 0.5 + 2 = 6, beta = 1.5 + 0.5 + 6 = 8
    assert m.predict(a(0))[0] == pytest.approx(6 / 14)
    assert m.predict(a(1))[0] == 0.5


def test_mopps_lambda_one_is_a_cumulative_beta():
    m = MoPPS(1, lam=1.0)
    m.update(a(0), a(8), a(6))
    m.update(a(0), a(8), a(2))
    assert (m.alpha_[0], m.beta_[0]) == (9.0, 9.0)


def test_mopps_single_rollout_is_not_the_reference_codes_precedence_bug():
    m = MoPPS(1, lam=0.5)
    m.update(a(0), a(1), a(1))  # alpha = 0.5 + 0.5 + 1, beta = 0.5 + 0.5 + 0
    assert m.predict(a(0))[0] == pytest.approx(2 / 3)
    m2 = MoPPS(1, lam=0.5)
    m2.update(a(0), a(1), a(0))
    assert m2.predict(a(0))[0] == pytest.approx(1 / 3)


def test_beta_binomial_zero_variance_hand_values():
    # Beta(1, 1), g = 2: E[p^2] + E[(1-p)^2] = 1/3 + 1/3
    assert zero_variance(np.array([1.0]), np.array([1.0]), 2)[0] == pytest.approx(2 / 3)
    # Beta(2, 1), g = 1: always 1 (one rollout is always all-correct or all-wrong)
    assert zero_variance(np.array([2.0]), np.array([1.0]), 1)[0] == pytest.approx(1.0)
    # Beta(2, 1), g = 2: E[p^2] = 2*3/(3*4) = 1/2, E[(1-p)^2] = 1*2/(3*4) = 1/6
    assert zero_variance(np.array([2.0]), np.array([1.0]), 2)[0] == pytest.approx(2 / 3)
    m = MoPPS(1)
    assert m.estimates(a(0), 2)["p_zero_variance"][0] == pytest.approx(2 / 3)
    assert zero_variance_point(np.array([0.25]), 2)[0] == pytest.approx(0.0625 + 0.5625)


def _zero_variance_as_before(a, b, g):
    """The formula as every earlier version took it: a g x N array of factors, summed over its first axis."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    j = np.arange(g).reshape((g,) + (1,) * a.ndim)
    log_denom = np.log(a + b + j).sum(axis=0)
    return np.exp(np.log(a + j).sum(axis=0) - log_denom) + np.exp(np.log(b + j).sum(axis=0) - log_denom)


def test_zero_variance_is_the_same_bit_for_bit_and_its_memory_does_not_follow_the_group_size():
    """predict --group-size 100000 took g x N memory (620 MB at 400 prompts): now a few N-arrays, whatever g,
    with every value of a group size up to EXACT_GROUP_SIZE unchanged to the bit (predictions must not move)."""
    import tracemalloc

    from graphdiff_cli.core.beta import EXACT_GROUP_SIZE

    rng = np.random.default_rng(0)
    for n in (0, 1, 2, 3, 400):
        a, b = rng.gamma(1.0, 5.0, n) + 1e-3, rng.gamma(1.0, 5.0, n) + 1e-3
        # exact on any machine: the same np.log of the same values, added in the same order (numpy adds a g x N
        # array's rows one by one), no BLAS
        for g in (1, 2, 7, 8, 9, 16, 64, 100, EXACT_GROUP_SIZE):
            np.testing.assert_array_equal(zero_variance(a, b, g), _zero_variance_as_before(a, b, g), err_msg=f"{n} {g}")
        for g in (EXACT_GROUP_SIZE + 1, 1000):  # the closed form beyond: the same values to rounding
            np.testing.assert_allclose(zero_variance(a, b, g), _zero_variance_as_before(a, b, g), rtol=1e-9, atol=0)
    assert zero_variance(2.5, 3.5, 8) == _zero_variance_as_before(2.5, 3.5, 8)  # a scalar, as before
    a, b = rng.gamma(1.0, 5.0, 400) + 1e-3, rng.gamma(1.0, 5.0, 400) + 1e-3
    for g in (EXACT_GROUP_SIZE, 5000, 10**9):
        tracemalloc.start()
        out = zero_variance(a, b, g)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert np.all((out >= 0) & (out <= 1 + 1e-12)) and peak < 16 * a.nbytes, (g, peak)


# -- GRESO -----------------------------------------------------------------------------------------------


def test_greso_skip_probability_after_trailing_all_correct_visits():
    g = GRESO(2)
    g.update(a(0), a(8), a(4))  # mean 0.5; all-correct ratio 0 < 1/12 -> p_e 0.51; all-wrong 0 < 1/6 -> p_h 0.51
    assert (g.p_easy_, g.p_hard_) == (pytest.approx(0.51), pytest.approx(0.51))
    assert g.skip_probability(a(0))[0] == 0.0
    g.update(a(0), a(8), a(8))  # p_e 0.50, p_h 0.52
    g.update(a(0), a(8), a(8))  # p_e 0.49, p_h 0.53
    assert g.z_easy_[0] == 2 and g.z_hard_[0] == 0
    assert g.skip_probability(a(0))[0] == pytest.approx(1 - 0.49 ** 2)
    assert g.estimates(a(0), 8)["p_zero_variance"][0] == pytest.approx(1 - 0.49 ** 2)
    assert g.predict(a(0))[0] == 1.0  # last visit's mean
    assert g.predict(a(1))[0] == pytest.approx(20 / 24)  # unseen: global mean
    assert g.skip_probability(a(1))[0] == 0.0  # never skips an unseen prompt
    g.update(a(0), a(8), a(0))  # trailing all-wrong: z_h = 1; p_e 0.50, p_h 0.52
    assert g.skip_probability(a(0))[0] == pytest.approx(1 - 0.52)


def test_greso_probabilities_clip_and_keep_floor():
    g = GRESO(1)
    for _ in range(100):
        g.update(a(0), a(8), a(8))
    assert g.p_easy_ == pytest.approx(0.05)  # clipped
    assert g.p_hard_ == pytest.approx(0.95)
    # 0.05 ** 100 is far below the floor: keep probability 0.01
    assert g.skip_probability(a(0))[0] == pytest.approx(0.99)


def test_greso_thresholds_use_visit_means():
    g = GRESO(2)
    g.update(a(0, 1), a(100, 100), a(98, 11))  # 0.98 counts as easy, 0.11 as hard
    assert g.z_easy_[0] == 1 and g.z_hard_[1] == 1


# -- VIP -------------------------------------------------------------------------------------------------


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("recursive", [True, False])
def test_vip_on_three_points_matches_a_direct_gp_solve(recursive):
    e = _unit([[1, 0, 0], [0.8, 0.6, 0], [0, 1, 0], [0.6, 0, 0.8]])
    v = VIP(e, recursive=recursive)
    np.testing.assert_allclose(v.predict(a(0, 3)), expit(-1.0))  # step 1: constant sigmoid(-1)
    ids, n, s = a(0, 1, 2), a(8, 8, 8), a(8, 2, 0)
    v.update(ids, n, s)
    y = np.clip(s / n, 1e-6, 1 - 1e-6)
    g = logit(y)
    sq = ((e[:, None, :] - e[None, :, :]) ** 2).sum(-1)
    k = np.exp(-sq / (2 * 0.4 ** 2))
    alpha = np.linalg.solve(k[np.ix_(ids, ids)] + 1e-4 * np.eye(3), g + 1)
    np.testing.assert_allclose(v.predict(a(3)), expit(-1 + k[np.ix_([3], ids)] @ alpha), rtol=1e-8)
    # a training prompt's posterior mean is its own logit (GPR.fit: mean[train_indices] = g_t)
    np.testing.assert_allclose(v.predict(a(0, 1, 2)), y, rtol=1e-12)


def _vip_reference(e, steps, prior=-1.0, ell=0.4):
    """VIP's GPR.fit with reuse_mean=True, reuse_covariance=False, written out as its code has it."""
    sq = ((e[:, None, :] - e[None, :, :]) ** 2).sum(-1)
    cov = np.exp(-0.5 * sq / ell ** 2)
    mean = np.zeros(e.shape[0]) + prior
    for ids, acc in steps:
        g = logit(np.clip(acc, 1e-6, 1 - 1e-6))
        alpha = np.linalg.solve(cov[np.ix_(ids, ids)] + 1e-4 * np.eye(len(ids)), g - mean[ids])
        mean = mean + cov[:, ids] @ alpha
        mean[ids] = g
    return expit(mean)


def test_vip_recursive_matches_the_authors_update_over_several_steps():
    rng = np.random.default_rng(3)
    e = _unit(rng.standard_normal((40, 5)))
    v = VIP(e, prior_mean=-5.0)
    steps = []
    for _ in range(4):
        ids = np.sort(rng.choice(40, 9, replace=False))
        s = rng.integers(0, 9, ids.size)
        v.update(ids, np.full(ids.size, 8), s)
        steps.append((ids, s / 8))
    np.testing.assert_allclose(v.predict(np.arange(40)), _vip_reference(e, steps, prior=-5.0), rtol=1e-9)


def test_vip_recursive_keeps_what_the_previous_step_forgets():
    e = _unit(np.eye(3))
    v = VIP(e, recursive=False)
    v.update(a(0), a(8), a(8))
    v.update(a(1), a(8), a(4))
    # orthogonal embeddings: k = exp(-2 / 0.32) ~ 0.002, so prompt 0 is back near the prior mean
    assert v.predict(a(0))[0] == pytest.approx(expit(-1.0), abs=0.01)
    r = VIP(e)  # the authors' trainer: the posterior mean is carried, prompt 0 keeps its logit
    r.update(a(0), a(8), a(8))
    r.update(a(1), a(8), a(4))
    assert r.predict(a(0, 1)) == pytest.approx([1 - 1e-6, 0.5], abs=1e-3)


def test_vip_refuses_embeddings_that_are_not_unit_norm():
    with pytest.raises(DataError, match="unit-norm"):
        VIP(np.array([[2.0, 0.0], [0.0, 1.0]]))


# -- label propagation -------------------------------------------------------------------------------------


def _graph():
    # 0-1-2-3 path with weights, a triangle 4-5-6, and isolated node 7
    rows, cols, w = [0, 1, 2, 4, 4, 5], [1, 2, 3, 5, 6, 6], [0.9, 0.5, 0.7, 0.6, 0.4, 0.8]
    m = sp.coo_matrix((w, (rows, cols)), shape=(8, 8)).tocsr()
    return (m + m.T).tocsr()


def test_harmonic_solution_matches_the_linear_system():
    w = _graph()
    lab = a(0, 3)
    vals = np.array([1.0, 0.0])
    f = harmonic_solution(w, lab, vals, fill=0.42)
    dense = w.toarray()
    u = np.array([1, 2])
    lap = np.diag(dense[u].sum(1)) - dense[np.ix_(u, u)]
    want = np.linalg.solve(lap, dense[np.ix_(u, lab)] @ vals)
    np.testing.assert_allclose(f[u], want)
    np.testing.assert_allclose(f[[0, 3]], vals)
    np.testing.assert_allclose(f[4:], 0.42)  # components with no clamped node get the fill
    # harmonic: each unlabeled node is the weighted mean of its neighbours
    for i in u:
        assert f[i] == pytest.approx(dense[i] @ f / dense[i].sum())


def test_label_propagation_clamps_history_means_and_fills_global_mean():
    lp = LabelPropagation(_graph())
    np.testing.assert_allclose(lp.predict(np.arange(8)), 0.5)
    lp.update(a(0, 3, 5), a(4, 4, 8), a(4, 0, 2))
    p = lp.predict(np.arange(8))
    assert p[0] == 1.0 and p[3] == 0.0 and p[5] == 0.25
    assert p[4] == pytest.approx(0.25) and p[6] == pytest.approx(0.25)  # only neighbour labeled: 0.25
    assert p[7] == pytest.approx(6 / 16)  # isolated: global mean
    dense = _graph().toarray()
    lap = np.diag(dense[[1, 2]].sum(1)) - dense[np.ix_([1, 2], [1, 2])]
    np.testing.assert_allclose(p[[1, 2]], np.linalg.solve(lap, dense[np.ix_([1, 2], [0, 3])] @ [1.0, 0.0]))


# -- oracles -----------------------------------------------------------------------------------------------


def test_sample_before_step_exact_returns_the_batch_rate():
    o = SampleBeforeStep(3, probe="exact")
    np.testing.assert_allclose(o.predict_with_outcomes(a(0, 2), a(8, 4), a(2, 4)), [0.25, 1.0])


def test_sample_before_step_resample_is_a_seeded_probe_of_n_rollouts():
    ids, n, s = np.arange(50), np.full(50, 8), np.arange(50) % 9
    p1 = SampleBeforeStep(50, seed=3).predict_with_outcomes(ids, n, s)
    p2 = SampleBeforeStep(50, seed=3).predict_with_outcomes(ids, n, s)
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_allclose(p1 * 8, np.round(p1 * 8))  # k / 8
    # rates 0 and 1 are reproduced exactly by any probe
    assert np.all(p1[s == 0] == 0) and np.all(p1[s == 8] == 1)
    assert not np.array_equal(p1, s / n)


def test_sample_before_rl_freezes_the_first_observation():
    o = SampleBeforeRL(3, probe="exact")
    np.testing.assert_allclose(o.predict_with_outcomes(a(0), a(4), a(1)), [0.25])
    o.update(a(0), a(4), a(1))
    np.testing.assert_allclose(o.predict_with_outcomes(a(0, 1), a(4, 4), a(4, 3)), [0.25, 0.75])
    with pytest.raises(InvalidArgumentError):
        SampleBeforeRL(3, probe="peek")


# -- graphdiff adapter ---------------------------------------------------------------------------------------


def test_graphdiff_adapter_matches_the_estimator():
    from graphdiff_cli.estimator import Estimator

    w = _graph()
    labels = a(0, 0, 1, 1, 2, 2, 2, 0)
    ad = GraphdiffMethod(Estimator(w, labels, 3, preset="paper", device="cpu", dtype="float64"))
    ref = Estimator(w, labels, 3, preset="paper", device="cpu", dtype="float64")
    ids, n, s = a(0, 3, 5), a(8, 8, 8), a(8, 0, 4)
    ad.update(ids, n, s)
    ref.update(ids, n, s)
    np.testing.assert_allclose(ad.predict(np.arange(8)), ref.predict(np.arange(8)))
    zv = ad.estimates(a(1, 2), 8)["p_zero_variance"]
    np.testing.assert_allclose(zv, ref.estimates(a(1, 2), group_size=8)["p_zero_variance"])
    assert ad.update(a(1), a(8), a(2))["iterations"] >= 1


def test_harmonic_solution_on_a_random_knn_graph_with_warm_start():
    from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph

    rng = np.random.default_rng(4)
    w = mutual_knn_graph(*exact_knn(rng.standard_normal((300, 8)), 8)).astype(np.float64)
    lab = rng.choice(300, 30, replace=False)
    vals = rng.random(30)
    f = harmonic_solution(w, lab, vals, fill=0.5, x0=rng.random(300))
    from scipy.sparse.csgraph import connected_components

    comp = connected_components(w, directed=False)[1]
    dense = w.toarray()
    u = np.setdiff1d(np.arange(300), lab)
    u = u[np.isin(comp[u], comp[lab])]
    lap = np.diag(dense[u].sum(1)) - dense[np.ix_(u, u)]
    np.testing.assert_allclose(f[u], np.linalg.solve(lap, dense[np.ix_(u, lab)] @ vals), atol=1e-9)
    assert f[u].min() >= vals.min() and f[u].max() <= vals.max()  # maximum principle


def _dirichlet(w, lab, vals):
    """(L_UU, W_UL f_L, U) of the harmonic problem on the unlabelled nodes of labelled components (dense)."""
    from scipy.sparse.csgraph import connected_components

    comp = connected_components(w, directed=False)[1]
    u = np.setdiff1d(np.arange(w.shape[0]), lab)
    u = u[np.isin(comp[u], comp[lab])]
    dense = w.toarray()
    return np.diag(dense[u].sum(1)) - dense[np.ix_(u, u)], dense[np.ix_(u, lab)] @ vals, u


def test_the_mixed_precision_solve_meets_the_float64_tolerance_and_its_error_bound():
    """float32 CG, then float64 CG from its result: the field's float64 relative residual is within rtol, as
    the plain float64 solve's, and its error obeys the residual's certificate |e_i| <= tau_i max|r| (tau =
    L_UU^-1 1: L_UU is an M-matrix). The float32 stage alone already gets near: it does the work."""
    from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph, single_precision
    from graphdiff_cli.core.harmonic import _single_precision_start

    rng = np.random.default_rng(7)
    w = mutual_knn_graph(*exact_knn(rng.standard_normal((1500, 8)), 12)).astype(np.float64)
    lab = rng.choice(1500, 60, replace=False)
    vals = rng.random(60)
    lap, rhs, u = _dirichlet(w, lab, vals)
    exact = np.linalg.solve(lap, rhs)
    tau = np.linalg.solve(lap, np.ones(u.size))
    w32 = single_precision(w)
    assert w32.data.dtype == np.float32 and w32.indices is w.indices and w32.indptr is w.indptr
    for rtol in (1e-6, 1e-9):
        for x0 in (None, rng.random(1500)):
            f = harmonic_solution(w, lab, vals, 0.5, x0=x0, rtol=rtol, w_single=w32)
            r = rhs - lap @ f[u]
            assert np.linalg.norm(r) <= rtol * np.linalg.norm(rhs) * (1 + 1e-9)
            assert np.all(np.abs(f[u] - exact) <= tau * np.abs(r).max() * (1 + 1e-6) + 1e-14)
            np.testing.assert_allclose(f[lab], vals)
            assert f[u].min() >= vals.min() and f[u].max() <= vals.max()
    # the float32 stage on its own: within a few times rtol = 1e-6 in float64, far from where it started
    mask = np.zeros(1500)
    mask[u] = 1.0
    deg = np.asarray(w.sum(axis=1)).ravel()
    full_rhs = np.zeros(1500)
    full_rhs[u] = rhs
    start = _single_precision_start(w32, mask, deg, mask / np.where(deg > 0, deg, 1.0), full_rhs, None, 1e-6, 10_000)
    assert np.linalg.norm(rhs - lap @ start[u]) <= 1e-5 * np.linalg.norm(rhs)


def test_a_float32_stage_that_breaks_down_leaves_the_float64_solve_to_do_it_all(monkeypatch):
    import scipy.sparse.linalg

    from graphdiff_cli.core.graph import csr_with_data, exact_knn, mutual_knn_graph

    def no_direct_solve(*_a, **_k):  # the CG must do it: a NaN start would send it to the direct fallback
        raise AssertionError("the direct solve ran")
    monkeypatch.setattr(scipy.sparse.linalg, "spsolve", no_direct_solve)

    rng = np.random.default_rng(8)
    w = mutual_knn_graph(*exact_knn(rng.standard_normal((400, 6)), 8)).astype(np.float64)
    lab = rng.choice(400, 20, replace=False)
    vals = rng.random(20)
    broken = csr_with_data(w, np.full(w.nnz, np.nan, dtype=np.float32))
    f = harmonic_solution(w, lab, vals, 0.5, rtol=1e-10, w_single=broken)
    lap, rhs, u = _dirichlet(w, lab, vals)
    assert np.isfinite(f).all()
    np.testing.assert_allclose(f[u], np.linalg.solve(lap, rhs), atol=1e-8)


def test_the_solve_runs_in_float32_first_then_float64_from_its_result(monkeypatch):
    """Two CG runs: the first with a float32 operator, right-hand side and start, the second in float64 from
    the first's result; below SINGLE_MIN_RTOL only the float64 one; a float64 W as ``w_single`` is refused."""
    import scipy.sparse.linalg

    from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph, single_precision
    from graphdiff_cli.core.harmonic import SINGLE_MIN_RTOL
    from graphdiff_cli.errors import InvalidArgumentError

    rng = np.random.default_rng(9)
    w = mutual_knn_graph(*exact_knn(rng.standard_normal((500, 6)), 8)).astype(np.float64)
    lab = rng.choice(500, 25, replace=False)
    vals = rng.random(25)
    plain = scipy.sparse.linalg.cg
    calls = []

    def spy(a, b, x0=None, **kw):
        x, info = plain(a, b, x0=x0, **kw)
        calls.append((a.dtype, np.asarray(b).dtype, None if x0 is None else np.array(x0), x.copy()))
        return x, info
    monkeypatch.setattr(scipy.sparse.linalg, "cg", spy)
    harmonic_solution(w, lab, vals, 0.5, x0=np.full(500, 0.5), rtol=1e-5, w_single=single_precision(w))
    assert [(c[0], c[1]) for c in calls] == [(np.float32, np.float32), (np.float64, np.float64)]
    assert calls[0][2].dtype == np.float32
    first = np.asarray(calls[0][3], dtype=np.float64)
    np.testing.assert_array_equal(calls[1][2][first != 0], first[first != 0])  # float64 starts where float32 ended
    calls.clear()
    harmonic_solution(w, lab, vals, 0.5, rtol=SINGLE_MIN_RTOL / 10, w_single=single_precision(w))
    assert [c[0] for c in calls] == [np.float64]
    with pytest.raises(InvalidArgumentError, match="float32"):
        harmonic_solution(w, lab, vals, 0.5, rtol=1e-5, w_single=w)
