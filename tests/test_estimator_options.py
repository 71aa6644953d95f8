"""The estimator's options beyond the paper, each checked against its formula computed by hand.

The paper-faithful path (gamma mixing, cumulative Beta(1, 1) states) is tested in test_core_meanfield.py;
here: evidence and offset mixing, prompt and state forgetting, the observed state prior and the
neighbours' residuals, plus the rule that the paper's settings reproduce the paper exactly.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from _tolerances import FLOAT64
from graphdiff_cli import Estimator
from graphdiff_cli.core import belief as bl
from graphdiff_cli.settings import preset_settings
from graphdiff_cli.core import meanfield as mf
from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.errors import InvalidArgumentError


def problem(n=150, seed=3, n_states=8):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((6, 12)) * 1.5
    topic = rng.integers(0, 6, n)
    x = centers[topic] + rng.standard_normal((n, 12))
    nbr, sim = exact_knn(x, 10)
    w = mutual_knn_graph(nbr, sim)
    labels = spectral_clustering(w, n_states, seed=seed, fallback_neighbors=nbr)
    true_p = 1 / (1 + np.exp(-(rng.normal(0, 1.5, 6)[topic] + rng.normal(0, 0.4, n))))
    return w, labels, true_p, rng


def steps(rng, true_p, count, size=30):
    for _ in range(count):
        ids = rng.choice(true_p.size, size, replace=False)
        yield ids, np.full(size, 8), rng.binomial(8, true_p[ids])


def model_part(est, rows):
    return mf.model_prediction(est.q_[rows], est.a_, est.b_)


def test_mix_by_evidence_by_hand():
    p, var = bl.mix_by_evidence(np.array([0.3, 0.3]), np.array([0.01, 0.01]), np.array([6.0, 0.0]),
                                np.array([8.0, 0.0]), 2.0)
    assert p[0] == pytest.approx((2 * 0.3 + 6) / (2 + 8))
    assert var[0] == pytest.approx(p[0] * (1 - p[0]) / 11.0)
    assert p[1] == pytest.approx(0.3) and var[1] == pytest.approx(0.01)  # unseen: the model's own belief


def test_evidence_mixing_and_prompt_forgetting_follow_their_formulas():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64", mixing="evidence", prior_strength=1.5,
                    prompt_forgetting=0.7)
    est.update([4, 9], [8, 8], [6, 1])
    est.update([4, 11], [8, 4], [2, 4])
    assert est.successes_decayed_[4] == pytest.approx(0.7 * 6 + 2)
    assert est.rollouts_decayed_[4] == pytest.approx(0.7 * 8 + 8)
    assert est.successes_[4] == 8 and est.rollouts_[4] == 16  # raw counts are kept as well
    rows = np.array([4, 9, 11, 20])
    pm, _ = model_part(est, rows)
    s_d, c_d = est.successes_decayed_[rows], est.rollouts_decayed_[rows]
    np.testing.assert_allclose(est.predict(rows), (1.5 * pm + s_d) / (1.5 + c_d), rtol=1e-10)
    assert est.predict([20])[0] == pytest.approx(pm[3])  # an unseen prompt gets the graph's estimate


def test_offset_mixing_keeps_the_prompts_offset_from_its_states():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64", mixing="offset", prior_strength=2.0,
                    prompt_forgetting=0.5)
    before = est.estimates([3])["p_model"][0]
    est.update([3], [8], [7])
    mid = est.estimates([3])["p_model"][0]
    est.update([3], [8], [2])
    assert est.offset_decayed_[3] == pytest.approx(0.5 * (7 - 8 * before) + (2 - 8 * mid))
    pm = est.estimates([3])["p_model"][0]
    assert est.predict([3])[0] == pytest.approx(np.clip(pm + est.offset_decayed_[3] / (2.0 + 0.5 * 8 + 8), 0, 1))


def test_state_forgetting_and_the_observed_prior():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64", mixing="evidence", state_forgetting=0.8,
                    state_prior="observed")
    assert est._state_prior() == (1.0, 1.0)  # (0 + 1) / (0 + 2) = 0.5 before any outcome: Beta(1, 1)
    evidence = []
    for ids, n, s in steps(rng, true_p, 3):
        q_before = est.q_
        est.update(ids, n, s)
        evidence.append((est.q_[ids] * s[:, None]).sum(0))  # sum_i q_ik s_i at the step's converged q
    np.testing.assert_allclose(est.state_evidence_[0], 0.64 * evidence[0] + 0.8 * evidence[1] + evidence[2],
                               rtol=1e-8)
    gs, gn = est.global_counts_
    a0, b0 = est._state_prior()
    g = (gs + 1) / (gn + 2)
    assert (a0, b0) == pytest.approx((2 * g, 2 * (1 - g)))
    a_h, b_h = est._history_prior()
    np.testing.assert_allclose(a_h, a0 + 0.8 * est.state_evidence_[0])
    np.testing.assert_allclose(b_h, b0 + 0.8 * est.state_evidence_[1])
    del q_before


def test_neighbor_shift_by_hand():
    w = sp.csr_matrix(np.array([[0.5, 1.0, 0.0], [0.0, 0.0, 2.0]]))  # 2 prompts x 3 neighbours
    p_nb = np.array([0.5, 0.2, 0.9])
    s_nb, c_nb = np.array([6.0, 0.0, 4.0]), np.array([8.0, 0.0, 8.0])
    out = bl.neighbor_shift(np.array([0.4, 0.95]), w, p_nb, s_nb, c_nb, 2.0)
    assert out[0] == pytest.approx(0.4 + 0.5 * (6 - 4) / (2 + 0.5 * 8))
    assert out[1] == pytest.approx(np.clip(0.95 + 2 * (4 - 7.2) / (2 + 16), 0, 1))
    assert bl.neighbor_shift(np.array([0.99]), sp.csr_matrix([[1.0]]), np.array([0.0]), np.array([8.0]),
                             np.array([8.0]), 0.1)[0] == 1.0  # clipped into [0, 1]


def test_neighbor_smoothing_of_a_batch_equals_the_whole_graph_computation():
    """The estimator reads only the batch's neighbours; the result must equal the dense formula."""
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64", mixing="evidence", prior_strength=0.5,
                    prompt_forgetting=0.85, neighbor_smoothing=3.0)
    for batch in steps(rng, true_p, 4):
        est.update(*batch)
    pm_all, _ = model_part(est, np.arange(w.shape[0]))
    s, c = est.successes_decayed_, est.rollouts_decayed_
    dense = w.toarray()
    p_graph = np.array([np.clip(pm_all[i] + sum(dense[i, j] * (s[j] - c[j] * pm_all[j]) for j in range(w.shape[0]))
                                / (3.0 + sum(dense[i, j] * c[j] for j in range(w.shape[0]))), 0, 1)
                        for i in range(w.shape[0])])
    want = (0.5 * p_graph + s) / (0.5 + c)
    rows = rng.choice(w.shape[0], 25, replace=False)
    np.testing.assert_allclose(est.predict(rows), want[rows], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(est.predict(), want, rtol=1e-9, atol=1e-12)
    assert est.estimates(rows)["p_model"] == pytest.approx(pm_all[rows])  # p_model stays the paper's


def test_neighbor_smoothing_moves_an_unseen_prompt_towards_its_neighbours_outcomes():
    w, labels, true_p, rng = problem()
    i = int(np.argmax(np.diff(w.indptr)))
    nbrs = w.indices[w.indptr[i]:w.indptr[i + 1]]
    runs = {}
    for outcome in (0, 8):
        est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64", mixing="evidence", neighbor_smoothing=2.0)
        est.update(nbrs, np.full(nbrs.size, 8), np.full(nbrs.size, outcome))
        e = est.estimates([i])
        runs[outcome] = (e["p"][0], e["p_model"][0])
    assert runs[8][0] > runs[8][1] and runs[0][0] < runs[0][1]


def test_paper_settings_reproduce_the_paper_exactly():
    """None of the options is active at the paper's values: the same predictions as plain gamma mixing."""
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64")
    assert est.settings.paper_exact and est.settings.mixing == "gamma" and est.settings.neighbor_smoothing is None
    for batch in steps(rng, true_p, 3):
        est.update(*batch)
        # the same evidence summed two ways (a_ from 1, the evidence from 0): equal to rounding (_tolerances.FLOAT64)
        np.testing.assert_allclose(est.a_ - 1, est.state_evidence_[0], **FLOAT64)
    pm, _ = model_part(est, np.arange(w.shape[0]))
    h = np.where(est.rollouts_ > 0, est.successes_ / np.maximum(est.rollouts_, 1), 0)
    want = np.where(est.rollouts_ > 0, 0.5 * pm + 0.5 * h, pm)
    np.testing.assert_allclose(est.predict(), want, rtol=1e-10)


def test_choose_prior_strength_by_hand():
    errors = np.full(bl.KAPPA_GRID.size, 5.0)
    errors[3] = 1.0
    assert bl.choose_prior_strength(errors) == bl.KAPPA_GRID[3]
    assert bl.choose_prior_strength(np.zeros(bl.KAPPA_GRID.size)) == bl.KAPPA_GRID[0]  # ties: the smaller
    with pytest.raises(ValueError):
        bl.choose_prior_strength([1.0, 2.0])


@pytest.mark.parametrize("mixing", ["evidence", "offset"])
def test_auto_prior_strength_is_the_grid_kappa_with_the_least_prequential_error(mixing):
    """Brute force: one estimator per grid kappa, each scored on its own predictions made before every
    step's outcomes; "auto" must have summed exactly those errors and predict as the best of them."""
    w, labels, true_p, rng = problem()
    kw = dict(device="cpu", dtype="float64", mixing=mixing, prompt_forgetting=0.85, state_prior="observed",
              neighbor_smoothing=4.0)
    batches = list(steps(rng, true_p, 6))
    est = Estimator(w, labels, 8, preset="paper", prior_strength="auto", **kw)
    fixed = [Estimator(w, labels, 8, preset="paper", prior_strength=float(k), **kw) for k in bl.KAPPA_GRID]
    errors = np.zeros(bl.KAPPA_GRID.size)
    for ids, n, s in batches:
        errors += [np.abs(f.predict(ids) - s / n).sum() for f in fixed]
        for e in [est, *fixed]:
            e.update(ids, n, s)
        np.testing.assert_allclose(est.kappa_errors_, errors, rtol=1e-10)
    best = int(np.argmin(errors))
    assert est.kappa_ == bl.KAPPA_GRID[best] and len(set(np.round(errors, 6))) > 1  # the choice is not a tie
    np.testing.assert_allclose(est.predict(), fixed[best].predict(), rtol=1e-10)
    # kappa enters only the mixing: the fixed-kappa estimators share everything else with "auto"
    np.testing.assert_allclose(est.a_, fixed[0].a_, rtol=1e-12)


def test_belief_loglik_is_the_beta_binomial_predictive():
    from scipy.special import comb
    from scipy.stats import betabinom

    rng = np.random.default_rng(3)
    pg, S = rng.uniform(0, 1, 30), rng.integers(0, 9, 30).astype(float)
    C = S + rng.integers(0, 9, 30)
    n = rng.integers(1, 12, 30)
    s = rng.integers(0, n + 1)
    grid = np.array([0.3, 2.0, 17.0])
    got = bl.belief_loglik(pg, S, C, n, s, grid)
    pc = np.clip(pg, bl.BELIEF_CLIP, 1 - bl.BELIEF_CLIP)
    for j, nu in enumerate(grid):
        a, b = nu * pc + S, nu * (1 - pc) + C - S
        want = (betabinom.logpmf(s, n, a, b) - np.log(comb(n, s))).sum()
        assert got[j] == pytest.approx(want, rel=1e-10)


def test_choose_belief_strength_by_hand():
    ll = np.full(bl.KAPPA_GRID.size, -50.0)
    ll[4] = -10.0
    assert bl.choose_belief_strength(ll) == bl.KAPPA_GRID[4]
    start = bl.choose_belief_strength(np.zeros(bl.KAPPA_GRID.size))  # nothing scored yet: about Beta(1, 1)'s 2
    assert start == bl.KAPPA_GRID[np.argmin(np.abs(np.log(bl.KAPPA_GRID / 2.0)))] and 1.0 < start < 4.0
    with pytest.raises(ValueError):
        bl.choose_belief_strength([1.0])


def test_auto_belief_strength_is_the_grid_value_with_the_best_prequential_likelihood():
    """Brute force: the belief's log-likelihood of every group, before its outcome, per grid value, from
    p_graph and the decayed counts as they stood; "auto" must have summed exactly that and its estimates
    must be the Beta of the best value, while p (kappa's) is untouched by the belief."""
    from scipy.special import comb
    from scipy.stats import betabinom

    w, labels, true_p, rng = problem()
    kw = dict(device="cpu", dtype="float64", mixing="evidence", prior_strength="auto", prompt_forgetting=0.85,
              state_prior="observed", neighbor_smoothing=4.0)
    est = Estimator(w, labels, 8, preset="paper", belief_strength="auto", **kw)
    plain = Estimator(w, labels, 8, preset="paper", **kw)
    ll = np.zeros(bl.KAPPA_GRID.size)
    for ids, n, s in steps(rng, true_p, 6):
        pm, _ = est._model_prediction(ids)
        pg = np.clip(est._graph_estimate(ids, pm), bl.BELIEF_CLIP, 1 - bl.BELIEF_CLIP)
        S, C = est.successes_decayed_[ids], est.rollouts_decayed_[ids]
        for j, nu in enumerate(bl.KAPPA_GRID):
            ll[j] += (betabinom.logpmf(s, n, nu * pg + S, nu * (1 - pg) + C - S)
                      - np.log(comb(n, s))).sum()
        est.update(ids, n, s)
        plain.update(ids, n, s)
        np.testing.assert_allclose(est.belief_loglik_, ll, rtol=1e-9)
    nu = bl.KAPPA_GRID[int(np.argmax(ll))]
    assert est.nu_ == nu
    np.testing.assert_allclose(est.predict(), plain.predict(), rtol=1e-12)  # p does not depend on the belief
    e = est.estimates()
    rows = np.arange(w.shape[0])
    pg = np.clip(est._graph_estimate(rows, est._model_prediction(rows)[0]), bl.BELIEF_CLIP, 1 - bl.BELIEF_CLIP)
    a = nu * pg + est.successes_decayed_
    b = nu * (1 - pg) + est.rollouts_decayed_ - est.successes_decayed_
    np.testing.assert_allclose(e["mean"], a / (a + b), rtol=1e-10)
    np.testing.assert_allclose(e["variance"], a * b / ((a + b) ** 2 * (a + b + 1)), rtol=1e-10)
    np.testing.assert_allclose(e["p_zero_variance"], betabinom.pmf(0, 8, a, b) + betabinom.pmf(8, 8, a, b), rtol=1e-8)
    # unset, the belief is the mixing's own, around p
    assert plain.nu_ is None and np.array_equal(plain.estimates()["mean"], plain.predict())  # p itself: exact


@pytest.mark.parametrize("kwargs,match", [
    (dict(belief_strength=0.0), "belief_strength"),
    (dict(belief_strength="best"), "belief_strength"),
    (dict(mixing="average"), "unknown mixing"),
    (dict(prior_strength=0.0), "prior_strength"),
    (dict(prior_strength="automatic"), "prior_strength"),
    (dict(prior_strength=float("nan")), "prior_strength"),
    (dict(prompt_forgetting=0.0), "prompt_forgetting"),
    (dict(state_forgetting=1.5), "state_forgetting"),
    (dict(state_prior="flat"), "unknown state_prior"),
    (dict(neighbor_smoothing=0.0), "neighbor_smoothing"),
    (dict(neighbor_smoothing=float("inf")), "neighbor_smoothing"),
    (dict(window=4, state_forgetting=0.9), "either a window"),
])
def test_bad_options_are_refused(kwargs, match):
    w, labels, _, _ = problem(n=60)
    with pytest.raises(InvalidArgumentError, match=match):
        Estimator(w, labels, 8, preset="paper", **kwargs)


@pytest.mark.parametrize("mixing,kappa", [("evidence", 0.5), ("offset", 0.5), ("evidence", "auto")])
def test_options_survive_save_and_load(tmp_path, mixing, kappa):
    w, labels, true_p, rng = problem()
    kw = dict(mixing=mixing, prior_strength=kappa, belief_strength="auto", prompt_forgetting=0.85, state_forgetting=0.9,
              state_prior="observed", neighbor_smoothing=4.0, schedule="residual", device="cpu")
    est = Estimator(w, labels, 8, preset="paper", **kw)
    batches = list(steps(rng, true_p, 4))
    for b in batches[:2]:
        est.update(*b)
    est.save(tmp_path / "e.zarr")
    back = Estimator.load(tmp_path / "e.zarr")
    assert back.settings == est.settings
    for b in batches[2:]:
        est.update(*b)
        back.update(*b)
    np.testing.assert_array_equal(back.predict(), est.predict())
    np.testing.assert_array_equal(back.belief_loglik_, est.belief_loglik_)
    for key in ("mean", "variance", "p_zero_variance"):
        np.testing.assert_array_equal(back.estimates()[key], est.estimates()[key])


def test_estimates_for_every_prompt_equal_those_of_any_subset():
    """predict's all-prompts path (W as it is, one pass of model predictions) must give what the
    neighbour-remapping path gives for any order or subset of the prompts."""
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, preset="paper", device="cpu", dtype="float64", **{
        k: v for k, v in preset_settings("default").items() if k not in ("device", "dtype")})
    for b in list(steps(rng, true_p, 3)):
        est.update(*b)
    full = est.estimates()
    order = rng.permutation(w.shape[0])
    part = est.estimates(order)
    for key in ("p", "mean", "variance", "p_zero_variance", "p_model"):
        np.testing.assert_allclose(part[key], full[key][order], rtol=1e-12, err_msg=key)
