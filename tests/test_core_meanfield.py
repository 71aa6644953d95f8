"""The estimator is the paper's algorithm: Propositions 1-2, the ELBO, Proposition 3, Appendix A.4 and G.

Reference values are computed here by brute force (explicit loops, exact enumeration over all K^N
assignments), independently of the vectorized kernels.
"""

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.special import betaln, digamma, gammaln

from graphdiff_cli import Estimator
from graphdiff_cli.core import meanfield as mf
from graphdiff_cli.core.beta import zero_variance_from_moments
from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering


# ----------------------------------------------------------------------------------------------------
# brute-force references


def tiny_model(seed=0, n=5, k=3, beta=1.5, eps=0.2):
    rng = np.random.default_rng(seed)
    w = np.triu(rng.uniform(0.2, 1.0, (n, n)) * (rng.random((n, n)) < 0.6), k=1)
    w = w + w.T
    labels = rng.integers(0, k, n)
    spec = mf.ModelSpec(graph=sp.csr_matrix(w), labels=labels, n_states=k, beta=beta, epsilon=eps)
    return spec, w, labels


def brute_log_a(labels, k, eps):
    a = np.full((labels.size, k), eps / (k - 1))
    a[np.arange(labels.size), labels] = 1 - eps
    return np.log(a)


def brute_elbo(w, log_a, beta, q, a, b, a_h, b_h, obs_rows):
    """The ELBO of Section 3.5 written term by term with loops."""
    n, k = q.shape
    total = 0.0
    for i in range(n):
        for j in range(n):
            for kk in range(k):
                total += 0.5 * beta * w[i, j] * q[i, kk] * q[j, kk]
    for i in range(n):
        for kk in range(k):
            total += q[i, kk] * log_a[i, kk]
            if q[i, kk] > 0:
                total -= q[i, kk] * math.log(q[i, kk])
    for i, n_i, s_i in obs_rows:
        for kk in range(k):
            e1 = digamma(a[kk]) - digamma(a[kk] + b[kk])
            e0 = digamma(b[kk]) - digamma(a[kk] + b[kk])
            total += q[i, kk] * (s_i * e1 + (n_i - s_i) * e0)
    for kk in range(k):
        kl = (betaln(a_h[kk], b_h[kk]) - betaln(a[kk], b[kk]) + (a[kk] - a_h[kk]) * digamma(a[kk])
              + (b[kk] - b_h[kk]) * digamma(b[kk]) + (a_h[kk] - a[kk] + b_h[kk] - b[kk]) * digamma(a[kk] + b[kk]))
        total -= kl
    return total


def random_simplex_rows(rng, n, k):
    q = rng.gamma(1.0, 1.0, (n, k))
    return q / q.sum(axis=1, keepdims=True)


def obs_of(rows, n_nodes):
    ids, n, s = zip(*rows)
    return mf.make_observations(np.array(ids), np.array(n), np.array(s), n_nodes)


def elbo_of(spec, q, a, b, a_h, b_h, obs):
    qt = torch.as_tensor(q)
    field = torch.as_tensor(spec.graph @ q)
    return mf.elbo(spec, qt, field, a, b, a_h, b_h, obs)


# ----------------------------------------------------------------------------------------------------
# the ELBO and Propositions 1-2


def test_elbo_matches_brute_force():
    spec, w, labels = tiny_model(seed=1)
    rng = np.random.default_rng(1)
    q = random_simplex_rows(rng, 5, 3)
    a, b = rng.uniform(0.5, 4, 3), rng.uniform(0.5, 4, 3)
    a_h, b_h = rng.uniform(0.5, 2, 3), rng.uniform(0.5, 2, 3)
    rows = [(0, 8, 3), (3, 4, 4), (4, 1, 0)]
    expected = brute_elbo(w, brute_log_a(labels, 3, 0.2), spec.beta, q, a, b, a_h, b_h, rows)
    assert elbo_of(spec, q, a, b, a_h, b_h, obs_of(rows, 5)) == pytest.approx(expected, rel=1e-12, abs=1e-10)


def test_elbo_is_a_lower_bound_on_the_exact_log_evidence():
    """L + C_t <= log p(s) for any q, with C_t = -log Z(W, A) + sum_i log binom(n_i, s_i) (Appendix A.1).

    The evidence is computed exactly: sum over all K^N assignments, Beta integrals in closed form.
    """
    spec, w, labels = tiny_model(seed=2, n=4, k=2, beta=1.0, eps=0.3)
    log_a = brute_log_a(labels, 2, 0.3)
    rows = [(0, 6, 5), (2, 3, 0)]
    a_h, b_h = np.array([1.0, 2.0]), np.array([1.5, 1.0])
    log_prior_unnorm, log_lik = [], []
    for z in itertools.product(range(2), repeat=4):
        z = np.array(z)
        lp = log_a[np.arange(4), z].sum() + 0.5 * spec.beta * sum(
            w[i, j] for i in range(4) for j in range(4) if z[i] == z[j])
        log_prior_unnorm.append(lp)
        ll = 0.0
        for kk in range(2):
            s_k = sum(s for i, n, s in rows if z[i] == kk)
            f_k = sum(n - s for i, n, s in rows if z[i] == kk)
            ll += betaln(a_h[kk] + s_k, b_h[kk] + f_k) - betaln(a_h[kk], b_h[kk])
        log_lik.append(ll)
    log_prior_unnorm, log_lik = np.array(log_prior_unnorm), np.array(log_lik)
    log_z = np.logaddexp.reduce(log_prior_unnorm)
    log_binom = sum(gammaln(n + 1) - gammaln(s + 1) - gammaln(n - s + 1) for _, n, s in rows)
    log_evidence = np.logaddexp.reduce(log_prior_unnorm - log_z + log_lik) + log_binom
    obs = obs_of(rows, 4)
    const = -log_z + log_binom
    rng = np.random.default_rng(0)
    for _ in range(50):
        q = random_simplex_rows(rng, 4, 2)
        a, b = rng.uniform(0.5, 8, 2), rng.uniform(0.5, 8, 2)
        assert elbo_of(spec, q, a, b, a_h, b_h, obs) + const <= log_evidence + 1e-9
    # coordinate ascent gets close to the bound on this weakly coupled model
    q0 = torch.as_tensor(mf.smoothed_prior(labels, 2, 0.3))
    res = mf.run_step(spec, q0, a_h, b_h, obs, schedule="sequential", max_iters=200, tol=0)
    assert res.elbo[-1] + const <= log_evidence + 1e-9
    assert res.elbo[-1] + const > log_evidence - 0.5


def test_proposition_1_is_the_coordinate_maximizer():
    spec, w, labels = tiny_model(seed=3)
    rng = np.random.default_rng(3)
    q = random_simplex_rows(rng, 5, 3)
    a, b = rng.uniform(0.5, 4, 3), rng.uniform(0.5, 4, 3)
    a_h, b_h = np.ones(3), np.ones(3)
    rows = [(1, 8, 6), (2, 2, 0)]
    obs = obs_of(rows, 5)
    log_a = brute_log_a(labels, 3, spec.epsilon)
    for i in range(5):
        # h_ik = log A_ik + beta sum_j W_ij q_jk + I(i in O) l_ik, by loops
        h = np.array([log_a[i, kk] + spec.beta * sum(w[i, j] * q[j, kk] for j in range(5)) for kk in range(3)])
        for (r_i, n_i, s_i) in rows:
            if r_i == i:
                h += [s_i * (digamma(a[kk]) - digamma(a[kk] + b[kk]))
                      + (n_i - s_i) * (digamma(b[kk]) - digamma(a[kk] + b[kk])) for kk in range(3)]
        expected = np.exp(h - h.max()) / np.exp(h - h.max()).sum()
        # the kernel's logits (all rows at once) give the same softmax
        field = torch.as_tensor(spec.graph @ q)
        logits = mf.assignment_logits(spec, field, a, b, obs, torch.as_tensor(obs.ids))
        np.testing.assert_allclose(torch.softmax(logits, 1)[i].numpy(), expected, rtol=1e-12)
        # and it beats every other distribution for q_i (others fixed)
        best = q.copy()
        best[i] = expected
        top = elbo_of(spec, best, a, b, a_h, b_h, obs)
        for cand in random_simplex_rows(rng, 300, 3):
            other = q.copy()
            other[i] = cand
            assert elbo_of(spec, other, a, b, a_h, b_h, obs) <= top + 1e-12


def test_proposition_2_is_the_coordinate_maximizer():
    spec, _, _ = tiny_model(seed=4)
    rng = np.random.default_rng(4)
    q = random_simplex_rows(rng, 5, 3)
    a_h, b_h = rng.uniform(0.5, 3, 3), rng.uniform(0.5, 3, 3)
    rows = [(0, 8, 2), (1, 8, 8), (4, 3, 1)]
    obs = obs_of(rows, 5)
    a, b = mf.beta_update(q[obs.ids], obs, a_h, b_h)
    exp_a = a_h + sum(q[i] * s for i, n, s in rows)
    exp_b = b_h + sum(q[i] * (n - s) for i, n, s in rows)
    np.testing.assert_allclose(a, exp_a, rtol=1e-13)
    np.testing.assert_allclose(b, exp_b, rtol=1e-13)
    top = elbo_of(spec, q, a, b, a_h, b_h, obs)
    for _ in range(300):
        da, db = rng.normal(0, 0.5, 3), rng.normal(0, 0.5, 3)
        a2, b2 = np.maximum(a + da, 1e-3), np.maximum(b + db, 1e-3)
        assert elbo_of(spec, q, a2, b2, a_h, b_h, obs) <= top + 1e-12


# ----------------------------------------------------------------------------------------------------
# Proposition 3 and Appendix A.4 on realistic graphs


def clustered_problem(n=600, k_true=8, dim=16, k_nn=12, n_states=16, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((k_true, dim)) * 1.2
    topic = rng.integers(0, k_true, n)
    x = centers[topic] + rng.standard_normal((n, dim))
    nbr, sim = exact_knn(x, k_nn)
    w = mutual_knn_graph(nbr, sim)
    labels = spectral_clustering(w, n_states, seed=seed, fallback_neighbors=nbr)
    true_p = 1 / (1 + np.exp(-(rng.normal(0, 1.5, k_true)[topic] + rng.normal(0, 0.5, n))))
    return w, labels, true_p, rng


def batches(rng, true_p, steps, size, rollouts=8):
    for _ in range(steps):
        ids = rng.choice(true_p.size, size, replace=False)
        yield ids, np.full(size, rollouts), rng.binomial(rollouts, true_p[ids])


@pytest.mark.parametrize("seed,beta", [(0, 2.0), (1, 0.5), (2, 10.0), (3, 50.0)])
def test_elbo_never_decreases_under_the_sequential_schedule(seed, beta):
    w, labels, true_p, rng = clustered_problem(n=300, seed=seed)
    est = Estimator(w, labels, 16, preset="paper", beta=beta, schedule="sequential", dtype="float64", tol=0, max_iters=15)
    for ids, n, s in batches(rng, true_p, 4, 40):
        elbo = np.array(est.update(ids, n, s)["elbo"])
        assert 2 <= len(elbo) <= 16
        steps = np.diff(elbo)
        assert np.all(steps >= -1e-9 * np.abs(elbo[1:])), f"ELBO decreased: {steps.min()}"


def test_synchronous_and_sequential_agree_at_convergence():
    """Appendix A.4: the converged predictions of the two schedules differ by at most 1e-2."""
    w, labels, true_p, rng = clustered_problem(n=800, seed=5)
    kw = dict(beta=2.0, dtype="float64", tol=1e-10, max_iters=300, device="cpu")
    sync = Estimator(w, labels, 16, preset="paper", schedule="synchronous", **kw)
    seq = Estimator(w, labels, 16, preset="paper", schedule="sequential", **kw)
    worst = 0.0
    for ids, n, s in batches(rng, true_p, 6, 64):
        sync.update(ids, n, s)
        seq.update(ids, n, s)
        worst = max(worst, np.abs(sync.predict() - seq.predict()).max())
    assert worst <= 1e-2


def test_estimates_track_the_truth_on_a_clustered_problem():
    w, labels, true_p, rng = clustered_problem(n=600, seed=6)
    est = Estimator(w, labels, 16, preset="paper", device="cpu")
    for ids, n, s in batches(rng, true_p, 8, 48):
        est.update(ids, n, s)
    p = est.predict()
    unseen = est.rollouts_ == 0
    assert unseen.sum() > 100
    # prompts never rolled out get their estimate from the graph alone
    assert np.corrcoef(p[unseen], true_p[unseen])[0, 1] > 0.7
    assert np.abs(p - true_p).mean() < 0.15


# ----------------------------------------------------------------------------------------------------
# warm start, frozen history, windowed variant (Appendix G)


def test_warm_start_and_frozen_history():
    w, labels, true_p, rng = clustered_problem(n=200, seed=7)
    est = Estimator(w, labels, 16, preset="paper", dtype="float64", device="cpu")
    steps = list(batches(rng, true_p, 3, 30))
    est.update(*steps[0])
    q1, a1, b1 = est.q_, est.a_.copy(), est.b_.copy()
    ids, n, s = steps[1]
    stats = est.update(ids, n, s)
    obs = mf.make_observations(ids, n, s, 200)
    # the first ELBO value is that of the warm start (q_{t-1}, a_hist = a_{t-1}, b_hist = b_{t-1})
    assert stats["elbo"][0] == pytest.approx(elbo_of(est._spec, q1, a1, b1, a1, b1, obs), rel=1e-12)
    # Proposition 2 with a_hist frozen at a_{t-1}: a_t = a_{t-1} + sum_i q_ik s_i at the final q
    a_exp, b_exp = mf.beta_update(est.q_[obs.ids], obs, a1, b1)
    np.testing.assert_allclose(est.a_, a_exp, rtol=1e-12)
    np.testing.assert_allclose(est.b_, b_exp, rtol=1e-12)


@pytest.mark.parametrize("window", [6, 100])
def test_window_covering_all_steps_equals_cumulative(window):
    w, labels, true_p, rng = clustered_problem(n=300, seed=8)
    kw = dict(dtype="float64", device="cpu")
    cum = Estimator(w, labels, 16, preset="paper", **kw)
    win = Estimator(w, labels, 16, preset="paper", window=window, **kw)
    for ids, n, s in batches(rng, true_p, 6, 40):  # t <= 6 <= L
        st_c, st_w = cum.update(ids, n, s), win.update(ids, n, s)
        np.testing.assert_allclose(st_c["elbo"], st_w["elbo"], rtol=1e-10)
        np.testing.assert_allclose(win.predict(), cum.predict(), atol=1e-10)
        np.testing.assert_allclose(win.a_, cum.a_, rtol=1e-10)


def test_short_window_forgets_old_steps():
    w, labels, true_p, rng = clustered_problem(n=300, seed=9)
    est = Estimator(w, labels, 16, preset="paper", window=2, dtype="float64", device="cpu")
    evid = []
    for ids, n, s in batches(rng, true_p, 4, 40):
        a_prev = est.a_.copy()
        est.update(ids, n, s)
        obs = mf.make_observations(ids, n, s, 300)
        evid.append(mf.responsibility_counts(est.q_[obs.ids], obs))
        del a_prev
    # after step 4 with L = 2: a = 1 + evidence of steps 3 and 4, each at the q its step converged to
    np.testing.assert_allclose(est.a_, 1 + evid[2][0] + evid[3][0], rtol=1e-10)
    np.testing.assert_allclose(est.b_, 1 + evid[2][1] + evid[3][1], rtol=1e-10)
    # the per-prompt history is kept in full (Appendix G, persistent sample-level history)
    assert est.rollouts_.sum() == 4 * 40 * 8


# ----------------------------------------------------------------------------------------------------
# prediction (Section 3.6, Appendix E)


def test_prediction_formulas():
    w, labels, true_p, rng = clustered_problem(n=150, seed=10)
    est = Estimator(w, labels, 16, preset="paper", gamma=0.3, dtype="float64", device="cpu")
    for ids, n, s in batches(rng, true_p, 2, 30):
        est.update(ids, n, s)
    q, a, b = est.q_, est.a_, est.b_
    mu = a / (a + b)
    v = a * b / ((a + b) ** 2 * (a + b + 1))
    p_model = q @ mu
    seen = est.rollouts_ > 0
    r_bar = np.where(seen, est.successes_ / np.maximum(est.rollouts_, 1), 0)
    p = np.where(seen, 0.3 * p_model + 0.7 * r_bar, p_model)
    u = np.array([sum(q[i, k] * (v[k] + (mu[k] - p_model[i]) ** 2) for k in range(16)) for i in range(150)])
    e = est.estimates()
    np.testing.assert_allclose(e["p_model"], p_model, rtol=1e-12)
    np.testing.assert_allclose(e["p"], p, rtol=1e-12)
    np.testing.assert_allclose(est.predict(), p, rtol=1e-12)
    np.testing.assert_allclose(e["difficulty"], 1 - p, rtol=1e-12)
    np.testing.assert_allclose(e["uncertainty"], u, rtol=1e-9, atol=1e-15)
    assert np.array_equal(e["n_seen"], est.rollouts_)
    sub = np.array([5, 0, 149])
    np.testing.assert_allclose(est.predict(sub), p[sub])


def test_initial_prediction_is_one_half():
    w, labels, _, _ = clustered_problem(n=100, seed=11)
    p = Estimator(w, labels, 16, preset="paper", device="cpu").predict()
    np.testing.assert_allclose(p, 0.5, atol=1e-6)


def test_zero_variance_probability_against_integration():
    from scipy import integrate
    from scipy.stats import beta as beta_dist

    for mean, var, g in [(0.3, 0.02, 8), (0.9, 0.005, 4), (0.5, 0.0, 8), (0.05, 0.01, 16)]:
        got = zero_variance_from_moments(np.array([mean]), np.array([var]), g)[0]
        if var == 0:
            expected = mean**g + (1 - mean) ** g
        else:
            t = mean * (1 - mean) / var - 1
            dist = beta_dist(mean * t, (1 - mean) * t)
            expected = integrate.quad(lambda x: (x**g + (1 - x) ** g) * dist.pdf(x), 0, 1)[0]
        assert got == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------------------------------
# numeric edge cases


def small_estimator(**kw):
    w, labels, true_p, rng = clustered_problem(n=120, seed=12)
    return Estimator(w, labels, 16, preset="paper", device="cpu", **kw), true_p, rng


def test_rows_with_zero_rollouts_are_ignored():
    e1, _, _ = small_estimator(dtype="float64")
    e2, _, _ = small_estimator(dtype="float64")
    e1.update([1, 2, 3], [8, 0, 8], [3, 0, 8])
    e2.update([1, 3], [8, 8], [3, 8])
    np.testing.assert_allclose(e1.predict(), e2.predict(), rtol=1e-12)
    assert e1.rollouts_[2] == 0


def test_duplicate_ids_in_one_step_are_summed():
    e1, _, _ = small_estimator(dtype="float64")
    e2, _, _ = small_estimator(dtype="float64")
    e1.update([4, 4, 7], [8, 8, 1], [2, 5, 1])
    e2.update([4, 7], [16, 1], [7, 1])
    np.testing.assert_allclose(e1.predict(), e2.predict(), rtol=1e-12)


@pytest.mark.parametrize("schedule", ["synchronous", "sequential"])
def test_extreme_batches_and_strong_coupling_stay_finite(schedule):
    for beta in (2.0, 1e4):
        est, _, _ = small_estimator(beta=beta, schedule=schedule)
        est.update(np.arange(30), np.ones(30, int), np.ones(30, int))  # n = 1, all correct
        est.update(np.arange(30, 90), np.full(60, 8), np.zeros(60, int))  # all wrong
        est.update([], [], [])  # an empty step is still a step
        e = est.estimates()
        for name, arr in e.items():
            assert np.all(np.isfinite(arr)), name
        assert np.all((e["p"] >= 0) & (e["p"] <= 1))
        assert est.step_ == 3
    # states that no prompt's prior favours keep (almost) no mass and stay well defined
    assert np.all(np.isfinite(est.a_)) and np.all(est.a_ >= 1)


def test_single_state():
    w, labels, true_p, rng = clustered_problem(n=80, seed=13)
    est = Estimator(w, np.zeros(80, int), 1, preset="paper", device="cpu", dtype="float64")
    est.update([0, 1], [8, 8], [8, 0])
    assert est.a_[0] == pytest.approx(9) and est.b_[0] == pytest.approx(9)


# ----------------------------------------------------------------------------------------------------
# persistence and the API contract


def test_save_load_round_trip(tmp_path):
    est, true_p, rng = small_estimator(window=3)
    bs = list(batches(rng, true_p, 4, 20))
    for b in bs[:2]:
        est.update(*b)
    est.save(tmp_path / "est.zarr")
    back = Estimator.load(tmp_path / "est.zarr")
    np.testing.assert_array_equal(back.predict(), est.predict())
    assert back.settings == est.settings and back.step_ == 2
    for b in bs[2:]:  # the loaded estimator continues exactly like the original
        s1, s2 = est.update(*b), back.update(*b)
        assert s1["elbo"] == s2["elbo"]
    np.testing.assert_array_equal(back.predict(), est.predict())


def test_update_returns_the_contract():
    est, true_p, rng = small_estimator()
    stats = est.update(*next(batches(rng, true_p, 1, 10)))
    assert isinstance(stats["elbo"], list) and len(stats["elbo"]) == stats["iterations"] + 1
    assert stats["step"] == 1 and stats["n_observed"] == 10


def snapshot(est):
    sd = est.state_dict()
    return {k: (v.toarray() if sp.issparse(v) else v) for k, v in sd.items()}


@pytest.mark.parametrize("ids,n,s,match", [
    ([0, 1], [8, 8], [9, 1], "larger than n"),
    ([0, 1], [-1, 8], [0, 1], "negative"),
    ([0, 1], [8, 8], [-2, 1], "negative"),
    ([0, 500], [8, 8], [1, 1], "out of range"),
    ([0, 1], [8], [1, 1], "same length"),
    ([0, 1], [8.5, 8], [1, 1], "not an integer"),
    ([0, 1], [8, np.nan], [1, 1], "NaN"),
])
def test_bad_updates_raise_and_change_nothing(ids, n, s, match):
    from graphdiff_cli.errors import DataError

    est, true_p, rng = small_estimator()
    est.update(*next(batches(rng, true_p, 1, 10)))
    before = snapshot(est)
    with pytest.raises(DataError, match=match):
        est.update(np.array(ids), np.array(n), np.array(s))
    after = snapshot(est)
    for key in before:
        if isinstance(before[key], np.ndarray):
            np.testing.assert_array_equal(before[key], after[key])
        else:
            assert before[key] == after[key]


@pytest.mark.parametrize("kwargs,match", [
    (dict(schedule="jacobi"), "unknown schedule"),
    (dict(device="tpu"), "unknown device"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(gamma=1.5), "gamma"),
    (dict(window=0), "window"),
    (dict(beta=-1.0), "beta"),
    (dict(max_iters=0), "max_iters"),
])
def test_bad_arguments(kwargs, match):
    from graphdiff_cli.errors import InvalidArgumentError

    w, labels, _, _ = clustered_problem(n=60, seed=14)
    with pytest.raises(InvalidArgumentError, match=match):
        Estimator(w, labels, 16, preset="paper", **kwargs)


def test_bad_labels_and_graphs():
    from graphdiff_cli.errors import DataError

    w, labels, _, _ = clustered_problem(n=60, seed=15)
    bad = labels.copy()
    bad[3] = 16
    with pytest.raises(DataError, match=r"labels\[3\] = 16 is out of range"):
        Estimator(w, bad, 16, preset="paper")
    with pytest.raises(DataError, match="graph has 60 nodes but labels have 59"):
        Estimator(w, labels[:59], 16, preset="paper")
    asym = w.tolil()
    asym[0, 1] = 5.0
    with pytest.raises(DataError, match="not symmetric"):
        Estimator(asym.tocsr(), labels, 16, preset="paper")


def test_cuda_refused_without_gpu():
    from graphdiff_cli.backends.device import cuda_works
    from graphdiff_cli.errors import BackendError

    if cuda_works():
        pytest.skip("a GPU is present")
    w, labels, _, _ = clustered_problem(n=60, seed=16)
    with pytest.raises(BackendError, match="no working CUDA GPU"):
        Estimator(w, labels, 16, preset="paper", device="cuda")
    assert Estimator(w, labels, 16, preset="paper", device="auto").device_.type == "cpu"


@pytest.mark.gpu
def test_gpu_matches_cpu():
    from graphdiff_cli.backends.device import cuda_works

    if not cuda_works():
        pytest.skip("no CUDA GPU")
    w, labels, true_p, rng = clustered_problem(n=400, seed=17)
    cpu = Estimator(w, labels, 16, preset="paper", device="cpu", dtype="float64")
    gpu = Estimator(w, labels, 16, preset="paper", device="cuda", dtype="float64")
    for b in batches(rng, true_p, 3, 40):
        cpu.update(*b)
        gpu.update(*b)
    np.testing.assert_allclose(gpu.predict(), cpu.predict(), atol=1e-8)


def test_core_imports_no_heavy_modules():
    import subprocess
    import sys

    code = ("import sys, graphdiff_cli.core.graph, graphdiff_cli.core.spectral, graphdiff_cli.core.meanfield;"
            "bad=[m for m in ('torch','typer','rich','zarr','faiss') if m in sys.modules];"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ----------------------------------------------------------------------------------------------------
# the residual (push-style) schedule reaches the synchronous fixed point


def test_residual_schedule_matches_converged_synchronous():
    """Issue bound: predictions within 2e-3 (max abs) of the converged synchronous solution."""
    w, labels, true_p, rng = clustered_problem(n=1500, seed=21, n_states=24)
    ref = Estimator(w, labels, 24, preset="paper", schedule="synchronous", tol=0, max_iters=500, device="cpu")
    fast = Estimator(w, labels, 24, preset="paper", schedule="residual", max_iters=500, device="cpu")
    worst, work = 0.0, []
    for ids, n, s in batches(rng, true_p, 6, 64):
        ref.update(ids, n, s)
        st = fast.update(ids, n, s)
        assert st["converged"] and st["elbo"] == []
        work.append(st["rows_updated"])
        worst = max(worst, np.abs(ref.predict() - fast.predict()).max())
    assert worst <= 2e-3
    # after the first step (a full start from q = A) it revisits far fewer rows than full sweeps would
    assert work[0] >= 1500 and np.mean(work[1:]) < 5 * 1500


def test_residual_rounds_in_blocks_reach_the_same_fixed_point():
    """A round over more rows than block_rows (the first step after init at scale) runs block by block
    (Gauss-Seidel across blocks); forced here with blocks of 37 rows, it must land on the converged
    synchronous solution as the one-block round does."""
    w, labels, true_p, rng = clustered_problem(n=900, seed=23, n_states=16)
    ref = Estimator(w, labels, 16, preset="paper", schedule="synchronous", tol=0, max_iters=500, device="cpu", dtype="float64")
    spec = ref._spec
    q0 = ref._q.clone()
    ids, n, s = next(iter(batches(rng, true_p, 1, 64)))
    obs = mf.make_observations(ids, n, s, 900)
    one = mf.run_step_residual(spec, q0, ref.a_, ref.b_, obs, None, max_iters=500, tol=1e-7)
    blocked = mf.run_step_residual(spec, q0, ref.a_, ref.b_, obs, None, max_iters=500, tol=1e-7, block_rows=37)
    ref.update(ids, n, s)
    assert one.converged and blocked.converged
    for res in (one, blocked):
        np.testing.assert_allclose(res.q.numpy(), ref._q.numpy(), atol=2e-4)
        np.testing.assert_allclose(res.a, ref.a_, rtol=1e-4)


def test_residual_state_survives_save_and_load(tmp_path):
    w, labels, true_p, rng = clustered_problem(n=300, seed=22)
    est = Estimator(w, labels, 16, preset="paper", schedule="residual", device="cpu", dtype="float64")
    bs = list(batches(rng, true_p, 3, 30))
    est.update(*bs[0])
    est.save(tmp_path / "s.zarr")
    back = Estimator.load(tmp_path / "s.zarr")
    for b in bs[1:]:
        assert est.update(*b)["rows_updated"] == back.update(*b)["rows_updated"]
    np.testing.assert_array_equal(est.predict(), back.predict())


def _residual_snapshot(est):
    return {k: (v.toarray() if sp.issparse(v) else np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
            for k, v in est.state_dict().items()}


def _assert_same(before, after):
    for key in before:
        if isinstance(before[key], np.ndarray):
            np.testing.assert_array_equal(before[key], after[key], err_msg=key)
        else:
            assert before[key] == after[key], key


@pytest.mark.parametrize("first", [False, True], ids=["steady step", "first step from A"])
@pytest.mark.parametrize("where", ["inside the step", "while committing"])
def test_in_place_residual_update_that_raises_changes_nothing(monkeypatch, where, first):
    """The residual schedule updates q in place (the first step from q = A too, undone by rebuilding A);
    a failure at any point must leave q as it was."""
    w, labels, true_p, rng = clustered_problem(n=300, seed=23)
    est = Estimator(w, labels, 16, preset="paper", schedule="residual", device="cpu", dtype="float64")
    bs = list(batches(rng, true_p, 3, 30))
    if first:
        bs = [([], [], [])] + bs  # nothing applied before the failing step: q is A
        assert est._q_is_prior
    else:
        est.update(*bs[0])
    before = _residual_snapshot(est)
    calls = {"n": 0}
    if where == "inside the step":
        real = mf._row_logits

        def flaky(*args, **kwargs):  # fails on the second round, after the first changed rows of q
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("injected")
            return real(*args, **kwargs)

        monkeypatch.setattr(mf, "_row_logits", flaky)
    else:
        def broken(*args, **kwargs):
            calls["n"] += 1
            raise RuntimeError("injected")

        monkeypatch.setattr(Estimator, "_commit", broken)
    with pytest.raises(RuntimeError, match="injected"):
        est.update(*bs[1])
    assert calls["n"] >= 1
    _assert_same(before, _residual_snapshot(est))
    monkeypatch.undo()
    # and it goes on exactly like an estimator that never saw the failure
    ref = Estimator(w, labels, 16, preset="paper", schedule="residual", device="cpu", dtype="float64")
    if not first:
        ref.update(*bs[0])
    for b in bs[1:]:
        est.update(*b)
        ref.update(*b)
    np.testing.assert_array_equal(est.predict(), ref.predict())


def test_only_a_step_zero_q_equal_to_a_is_taken_for_the_prior():
    w, labels, true_p, rng = clustered_problem(n=200, seed=25)
    est = Estimator(w, labels, 16, preset="paper", schedule="residual", device="cpu")
    assert mf.is_prior(est._q, labels, est.settings.epsilon)
    assert Estimator.from_state_dict(est.state_dict())._q_is_prior
    st = est.state_dict()
    st["q"][7, 3] += 1e-6  # not A: the first step must not rebuild A on undo
    assert not Estimator.from_state_dict(st)._q_is_prior
    est.update(*next(iter(batches(rng, true_p, 1, 30))))
    assert not est._q_is_prior and not Estimator.from_state_dict(est.state_dict())._q_is_prior


def test_from_state_dict_never_updates_the_callers_q():
    w, labels, true_p, rng = clustered_problem(n=300, seed=24)
    est = Estimator(w, labels, 16, preset="paper", schedule="residual", device="cpu", dtype="float64")
    bs = list(batches(rng, true_p, 2, 30))
    est.update(*bs[0])
    state = est.state_dict()
    kept = state["q"].copy()
    twin = Estimator.from_state_dict(state)
    twin.update(*bs[1])
    np.testing.assert_array_equal(state["q"], kept)  # the in-place step worked on a copy
    assert not np.array_equal(twin.q_, kept)
    owned = Estimator.from_state_dict(est.state_dict(), copy=False)  # handed over: updated where it lies
    owned.update(*bs[1])
    np.testing.assert_array_equal(owned.q_, twin.q_)
