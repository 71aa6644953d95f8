"""Label propagation as a second source of the graph's estimate, per-step forgetting of prompts' own counts,
and the joint online choice of (time forgetting, propagation weight, kappa): each against its formula, and
"auto" against brute force (one estimator per fixed choice, each scored on its own predictions)."""

import numpy as np
import pytest
import scipy.sparse as sp

from graphdiff_cli import Estimator
from graphdiff_cli.core import belief as bl
from graphdiff_cli.errors import DataError, InvalidArgumentError

from test_estimator_options import problem, steps

KW = dict(preset="default", device="cpu", dtype="float64")


def dense_harmonic(w, successes, rollouts, fill):
    """Label propagation's field by a dense solve per connected component (brute force for harmonic_field)."""
    from scipy.sparse.csgraph import connected_components

    w = sp.csr_matrix(w).toarray()
    n = w.shape[0]
    seen = rollouts > 0
    f = np.full(n, float(fill))
    f[seen] = successes[seen] / rollouts[seen]
    comp = connected_components(sp.csr_matrix(w), directed=False)[1]
    for c in np.unique(comp):
        nodes = np.flatnonzero(comp == c)
        lab, unl = nodes[seen[nodes]], nodes[~seen[nodes]]
        if lab.size == 0 or unl.size == 0:
            continue
        lap = np.diag(w[unl].sum(axis=1)) - w[np.ix_(unl, unl)]
        f[unl] = np.linalg.solve(lap, w[np.ix_(unl, lab)] @ f[lab])
    return f


def test_harmonic_field_and_propagated_estimate_by_hand():
    w, labels, true_p, rng = problem()
    S = rng.integers(0, 9, w.shape[0]).astype(float)
    C = np.where(rng.uniform(size=w.shape[0]) < 0.3, 8.0, 0.0)
    S = np.minimum(S, C)
    from scipy.sparse.csgraph import connected_components

    comp = connected_components(w, directed=False)[1]
    f = bl.harmonic_field(w, S, C, 0.4, comp)
    np.testing.assert_allclose(f, dense_harmonic(w, S, C, 0.4), atol=5e-5)  # CG to a relative residual of FIELD_RTOL (1e-5): the error here ~1e-5
    rows = np.arange(w.shape[0])
    deg = np.asarray(w.sum(axis=1)).ravel()
    got = bl.propagated_estimate(w, deg, f, 0.4)
    dense = w.toarray()
    # the neighbours' mean (own value left out); a prompt without neighbours gets the fill, not its own rate
    want = np.where(deg > 0, dense @ f / np.where(deg > 0, deg, 1), 0.4)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert rows.size


def test_a_fixed_propagation_weight_mixes_the_two_estimates():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, label_propagation=0.25, prior_strength=2.0, time_forgetting=1.0, **KW)
    ref = Estimator(w, labels, 8, label_propagation=None, prior_strength=2.0, time_forgetting=1.0, **KW)  # states alone
    for b in steps(rng, true_p, 4):
        est.update(*b)
        ref.update(*b)
    rows = np.arange(w.shape[0])
    gc = est.global_counts_
    f = dense_harmonic(w, est.successes_decayed_, est.rollouts_decayed_, (gc[0] + 1) / (gc[1] + 2))
    deg = np.asarray(w.sum(axis=1)).ravel()
    lp = np.where(deg > 0, w.toarray() @ f / np.where(deg > 0, deg, 1), (gc[0] + 1) / (gc[1] + 2))
    states = ref._graph_estimate(rows, ref._model_prediction(rows)[0])
    m = 0.75 * states + 0.25 * lp
    want = (2.0 * m + est.successes_decayed_) / (2.0 + est.rollouts_decayed_)
    # the field is solved to a relative residual of FIELD_RTOL (1e-5): its error here is ~1e-6
    np.testing.assert_allclose(est.predict(), want, atol=1e-5)
    # the mean-field part is untouched by label propagation
    np.testing.assert_allclose(est.a_, ref.a_, rtol=1e-12)


def test_time_forgetting_decays_every_prompt_at_every_step():
    w, labels, _, _ = problem()
    est = Estimator(w, labels, 8, time_forgetting=0.9, prompt_forgetting=0.5, **KW)
    est.update([4, 9], [8, 8], [6, 1])
    est.update([11], [8], [3])
    est.update([4], [8], [2])
    # prompt 4: 6 / 8 at step 1, decayed 0.9 at steps 2 and 3, then lambda at its visit at step 3
    assert est.successes_decayed_[4] == pytest.approx(0.5 * 0.9 * 0.9 * 6 + 2)
    assert est.rollouts_decayed_[4] == pytest.approx(0.5 * 0.9 * 0.9 * 8 + 8)
    assert est.successes_decayed_[9] == pytest.approx(0.9 * 0.9 * 1)  # not visited again: time alone
    assert est.rollouts_[9] == 8  # raw counts are kept as they are


def test_joint_auto_choice_equals_brute_force_over_every_fixed_choice():
    """One estimator per (delta, weight, kappa) of the grids, each predicting before every step; "auto"
    must have summed exactly their absolute errors and must predict as the best of them."""
    w, labels, true_p, rng = problem()
    batches = list(steps(rng, true_p, 5))
    est = Estimator(w, labels, 8, label_propagation="auto", time_forgetting="auto", **KW)
    kappas = bl.KAPPA_GRID[[0, 4, 8, 11]]  # a subset keeps the brute force fast; every cell is checked
    fixed = {(i, j, k): Estimator(w, labels, 8, label_propagation=float(wt), time_forgetting=float(d),
                                  prior_strength=float(bl.KAPPA_GRID[k]), **KW)
             for i, d in enumerate(bl.TIME_GRID) for j, wt in enumerate(bl.PROPAGATION_GRID) for k in (0, 4, 8, 11)}
    errors = {key: 0.0 for key in fixed}
    assert est.propagation_ == bl.PROPAGATION_START and est.time_forgetting_ == 1.0 and est.kappa_ == bl.KAPPA_GRID[0]
    used = set()  # the deltas whose counts made the field at some step so far
    for ids, n, s in batches:
        for key, f in fixed.items():
            errors[key] += np.abs(f.predict(ids) - s / n).sum()
        used.add(int(np.flatnonzero(bl.TIME_GRID == est.time_forgetting_)[0]))
        est.update(ids, n, s)
        for f in fixed.values():
            f.update(ids, n, s)
        for (i, j, k), e in errors.items():
            # the propagated part is scored with the field of the counts in use (one harmonic solve a step):
            # exactly the brute force for the delta in use at every step so far, close for the others
            exact = used == {i} or j == 0  # weight 0: no propagated part at all
            assert est.mix_errors_[i, j, 0, 0, 0, k] == pytest.approx(e, rel=1e-6 if exact else 5e-2)
        for i, d in enumerate(bl.TIME_GRID):
            np.testing.assert_allclose(est.time_counts_[i, 0], fixed[(i, 0, 0)].successes_decayed_, rtol=1e-12)
            np.testing.assert_allclose(est.time_counts_[i, 1], fixed[(i, 0, 0)].rollouts_decayed_, rtol=1e-12)
    sub = est.mix_errors_[:, :, 0, 0, 0][:, :, [0, 4, 8, 11]]
    i, j, _, _, _, k = np.unravel_index(int(np.argmin(est.mix_errors_)), est.mix_errors_.shape)
    assert est.time_forgetting_ == bl.TIME_GRID[i] and est.propagation_ == bl.PROPAGATION_GRID[j]
    assert est.kappa_ == bl.KAPPA_GRID[k] and len(set(np.round(sub.ravel(), 6))) > 1
    if k in (0, 4, 8, 11):
        np.testing.assert_allclose(est.predict(), fixed[(i, j, k)].predict(), atol=1e-6)


def test_choose_mix_by_hand():
    e = np.full((3, 5, 12), 7.0)
    e[2, 1, 3] = 1.0
    assert bl.choose_mix(e) == (2, 1, 3)
    assert bl.choose_mix(np.zeros((3, 5, 12)), start=(0, 2, 0)) == (0, 2, 0)
    assert bl.choose_mix(np.zeros((3, 5, 5, 12))) == (0, 0, 0, 0)
    with pytest.raises(ValueError):
        bl.choose_mix(np.zeros((3, 5)), start=(0, 1, 2))


def test_online_choices_survive_save_and_load(tmp_path):
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, label_propagation="auto", time_forgetting="auto", **KW)
    batches = list(steps(rng, true_p, 5))
    for b in batches[:3]:
        est.update(*b)
    est.save(tmp_path / "e.zarr")
    back = Estimator.load(tmp_path / "e.zarr")
    np.testing.assert_array_equal(back.predict(), est.predict())
    for b in batches[3:]:
        est.update(*b)
        back.update(*b)
    np.testing.assert_array_equal(back.predict(), est.predict())
    np.testing.assert_array_equal(back.mix_errors_, est.mix_errors_)
    np.testing.assert_array_equal(back.time_counts_, est.time_counts_)
    # a state without the counts under every delta cannot continue "auto"
    state = est.state_dict()
    state["time_counts"] = np.zeros((0, 2, w.shape[0]))
    with pytest.raises(DataError, match="time_counts"):
        Estimator.from_state_dict(state)


@pytest.mark.parametrize("kwargs,match", [
    (dict(label_propagation=1.5), "label_propagation"),
    (dict(label_propagation=-0.1), "label_propagation"),
    (dict(label_propagation="best"), "label_propagation"),
    (dict(time_forgetting=0.0), "time_forgetting"),
    (dict(time_forgetting=1.2), "time_forgetting"),
    (dict(time_forgetting="sometimes"), "time_forgetting"),
    (dict(time_forgetting=float("nan")), "time_forgetting"),
])
def test_bad_online_options_are_refused_in_one_line(kwargs, match):
    w, labels, _, _ = problem(n=60)
    with pytest.raises(InvalidArgumentError, match=match) as err:
        Estimator(w, labels, 8, **kwargs)
    assert "\n" not in str(err.value)


def test_reads_change_nothing_and_a_failed_update_leaves_the_estimator_as_it_was():
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, **KW)
    before = est.state_dict()
    est.predict()  # before any update the field is solved for the read, not stored
    est.estimates([1, 2, 3])
    after = est.state_dict()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[key], value, err_msg=key)
    with pytest.raises(DataError):
        est.update([1, 2], [8, 8], [3, 9])  # s > n
    assert est.lp_field_ is None and est.step_ == 0 and not est.mix_errors_.any()


def test_an_isolated_prompt_gets_the_global_rate_from_propagation_not_its_own():
    w = sp.csr_matrix(np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=float))
    est = Estimator(w, np.array([0, 0, 1]), 2, label_propagation=1.0, prior_strength=2.0, time_forgetting=1.0,
                    neighbor_smoothing=None, **KW)
    est.update([2, 0], [8, 8], [8, 2])
    g = (10 + 1) / (16 + 2)
    propagated = est.mix.source("label_propagation").estimate(est, np.array([2]), (np.zeros(1), None))[0]
    assert propagated[0] == pytest.approx(g)
    assert est.predict([2])[0] == pytest.approx((2 * g + 8) / (2 + 8))


def test_offset_mixing_refuses_a_time_forgetting_and_ignores_auto():
    w, labels, true_p, rng = problem(n=60)
    with pytest.raises(InvalidArgumentError, match="time_forgetting"):
        Estimator(w, labels, 8, mixing="offset", time_forgetting=0.9)
    est = Estimator(w, labels, 8, mixing="offset", device="cpu")  # the preset's auto: acts as 1
    est.update([1, 2], [8, 8], [3, 4])
    est.update([3], [8], [1])
    assert est.time_counts_ is None and est.time_forgetting_ == 1.0
    assert est.rollouts_decayed_[1] == 8.0


def test_rounding_never_decides_an_online_choice():
    """Candidates that the outcomes cannot tell apart (every kappa while each prompt is on its first visit)
    sum to one error up to rounding, and rounding varies with the BLAS build and its thread
    count: the MATH log's replay chose kappa 0.05 on one BLAS thread and 0.67 on two at step 29 (p-hat apart by
    up to 0.07 on that step's prompts). Errors within TIE_RTOL are a tie: the start if tied, else the first."""
    from graphdiff_cli.core import readout as ro

    e = np.full((3, 5, 5, 12), 1000.0)
    e[2, 0, 3, 4] -= 2e-13  # rounding, not evidence: at the argmin, but tied with (2, 0, 3, 0) and the rest
    e[1:, 0, 3, :] -= 0.5   # evidence: (time 1 and 2, weight 0, read-out 3) are better than the rest
    assert bl.choose_mix(e, start=(0, 2, 2, 0)) == (1, 0, 3, 0)
    e[0, 2, 2, 0] -= 0.5 - 5e-4  # the start within 1e-6 (relative) of the best: kept
    assert bl.choose_mix(e, start=(0, 2, 2, 0)) == (0, 2, 2, 0)
    e[1, 0, 3, 0] -= 1e-2  # told apart by more than TIE_RTOL: the best wins
    assert bl.choose_mix(e, start=(0, 2, 2, 0)) == (1, 0, 3, 0)

    k = np.full(bl.KAPPA_GRID.size, 500.0)
    k[7] -= 1e-13
    assert bl.choose_prior_strength(k) == bl.KAPPA_GRID[0]
    k[7] -= 1.0
    assert bl.choose_prior_strength(k) == bl.KAPPA_GRID[7]
    ll = np.full(bl.KAPPA_GRID.size, -800.0)
    ll[9] += 1e-13
    assert bl.choose_belief_strength(ll) == bl.KAPPA_GRID[0]
    ll[9] += 1.0
    assert bl.choose_belief_strength(ll) == bl.KAPPA_GRID[9]
    r = np.array([300.0, 300.0 + 1e-4, 300.0 - 1e-13])
    assert ro.choose_ridge(r) == ro.RIDGE_GRID[1]  # the start, tied
    r = np.array([300.0 - 1e-13, 301.0, 300.0])
    assert ro.choose_ridge(r) == ro.RIDGE_GRID[0]  # the start out; the first of the tied
    r = np.array([300.0, 301.0, 299.0])
    assert ro.choose_ridge(r) == ro.RIDGE_GRID[2]


def test_the_field_solved_every_m_steps_is_clamped_in_between_and_survives_save_and_load(tmp_path):
    """propagation_every = 3: the field is solved at the first update and at updates 3 and 6 (to the dense solve
    of the counts then); at the others it is the last solution with the step's prompts set to S / C, exactly."""
    w, labels, true_p, rng = problem()
    est = Estimator(w, labels, 8, label_propagation=0.5, prior_strength=2.0, time_forgetting=1.0,
                    propagation_every=3, **KW)
    batches = list(steps(rng, true_p, 7))
    solved_at = []
    for t, (ids, n, s) in enumerate(batches[:6], start=1):
        before = None if est.lp_field_ is None else est.lp_field_.copy()
        est.update(ids, n, s)
        S, C = est.successes_decayed_, est.rollouts_decayed_
        gc = est.global_counts_
        if t in (1, 3, 6):
            solved_at.append(t)
            np.testing.assert_allclose(est.lp_field_, dense_harmonic(w, S, C, (gc[0] + 1) / (gc[1] + 2)), atol=5e-5)
        else:
            want = before.copy()
            want[ids] = S[ids] / C[ids]
            np.testing.assert_array_equal(est.lp_field_, want)  # a copy and a division: exact
        if t == 4:
            est.save(tmp_path / "e.zarr")
            back = Estimator.load(tmp_path / "e.zarr")
            assert back.settings.propagation_every == 3
    assert solved_at == [1, 3, 6]
    for b in batches[4:]:
        back.update(*b)
    est.update(*batches[6])
    np.testing.assert_array_equal(back.lp_field_, est.lp_field_)
    np.testing.assert_array_equal(back.predict(), est.predict())


def test_propagation_every_one_is_the_solve_at_every_step_and_needs_label_propagation():
    w, labels, true_p, rng = problem()
    a = Estimator(w, labels, 8, **KW)
    b = Estimator(w, labels, 8, propagation_every=1, **KW)
    assert a.settings == b.settings  # 1 is the default preset's
    with pytest.raises(InvalidArgumentError, match="propagation_every = 2 has no effect here") as err:
        Estimator(w, labels, 8, label_propagation=None, propagation_every=2, **KW)
    assert "\n" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match="propagation_every must be >= 1"):
        Estimator(w, labels, 8, propagation_every=0, **KW)
