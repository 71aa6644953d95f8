"""Decision rules (core.decisions): hand-computed picks and counts, properties, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphdiff_cli.core import decisions as d
from graphdiff_cli.core.beta import from_moments
from graphdiff_cli.errors import InvalidArgumentError

# ----------------------------------------------------------------------------------------------------
# selection


def test_target_picks_closest_to_half():
    p = [0.9, 0.45, 0.2, 0.6, 0.5]  # |p - 0.5| = .4 .05 .3 .1 0
    sel = d.select("target", 2, p=p, seed=3)
    assert sel.chosen.tolist() == [4, 1]
    assert np.allclose(sel.key, [0.4, 0.05, 0.3, 0.1, 0.0])
    assert d.select("target", 3, p=p, seed=99).chosen.tolist() == [4, 1, 3]


def test_target_other_target():
    p = [0.9, 0.45, 0.2, 0.6, 0.5]  # |p - 0.8| = .1 .35 .6 .2 .3
    assert d.select("target", 2, p=p, target=0.8).chosen.tolist() == [0, 3]


def test_target_ties_broken_by_seed_not_by_order():
    p = np.full(20, 0.3)
    firsts = {tuple(d.select("target", 3, p=p, seed=s).chosen) for s in range(10)}
    assert len(firsts) > 1  # not always the first three of the pool
    a = d.select("target", 3, p=p, seed=7).chosen
    assert a.tolist() == d.select("target", 3, p=p, seed=7).chosen.tolist()


def test_target_explore_is_bayes_rule_with_pseudo_rollouts_at_the_target():
    # beliefs Beta(a, b) given by their moments; e pseudo-rollouts at t give Beta(a + e t, b + e (1 - t))
    a = np.array([1.0, 9.0, 0.5, 30.0, 2.0, 0.2])
    b = np.array([4.0, 1.0, 0.5, 10.0, 2.0, 3.0])
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    for t, e in ((0.5, 1.0), (0.5, 2.0), (0.3, 4.0)):
        sel = d.select("target", 3, p=mean, variance=var, target=t, explore=e, seed=0)
        brute = np.abs((a + e * t) / (a + b + e) - t)
        assert np.allclose(sel.key, brute) and sel.info["explore"] == e
        assert sel.chosen.tolist() == np.argsort(brute, kind="stable")[:3].tolist()  # no ties here


def test_target_explore_zero_or_no_spread_is_the_plain_rule():
    p = np.array([0.9, 0.45, 0.2, 0.6, 0.5])
    var = np.array([0.01, 0.002, 0.0, 0.05, 0.0])
    plain = np.abs(p - 0.5)
    assert np.allclose(d.select("target", 2, p=p, variance=var, explore=0.0).key, plain)
    assert np.allclose(d.select("target", 2, p=p, explore=3.0).key, plain)  # no variance: point estimates
    moved = d.select("target", 2, p=p, variance=var, explore=3.0).key
    assert np.allclose(moved[[2, 4]], plain[[2, 4]]) and (moved[[0, 1, 3]] < plain[[0, 1, 3]]).all()


def test_target_explore_prefers_the_little_known_and_keeps_order_at_equal_weight():
    # equal weight a + b = 10: the order of the plain rule is kept
    m = np.array([0.9, 0.2, 0.65, 0.35])
    var = m * (1 - m) / 11.0
    assert d.select("target", 4, p=m, variance=var, explore=5.0).chosen.tolist() == \
        d.select("target", 4, p=m, variance=var, explore=0.0).chosen.tolist()
    # a prompt at 0.8 known from 1 rollout beats one at 0.7 known from 100 once explore >= 1
    p, var = np.array([0.8, 0.7]), np.array([0.8 * 0.2 / 2.0, 0.7 * 0.3 / 101.0])
    assert d.select("target", 1, p=p, variance=var, explore=0.0).chosen.tolist() == [1]
    assert d.select("target", 1, p=p, variance=var, explore=1.0).chosen.tolist() == [0]


def test_beta_from_moments_hand_values():
    # m = 0.3, v = 0.01: alpha + beta = 0.21 / 0.01 - 1 = 20 -> Beta(6, 14)
    a, b, ok = from_moments([0.3, 0.5, 0.0], [0.01, 0.0, 0.02])
    assert ok.tolist() == [True, False, False]
    assert a[0] == pytest.approx(6.0) and b[0] == pytest.approx(14.0)


def test_thompson_without_variance_is_the_target_rule():
    p = [0.9, 0.45, 0.2, 0.6, 0.5]
    sel = d.select("thompson", 2, p=p, variance=np.zeros(5), seed=1)
    assert sel.chosen.tolist() == [4, 1]
    assert np.allclose(sel.theta, p)
    assert np.allclose(sel.key, (np.asarray(p) - 0.5) ** 2)


def test_thompson_draws_follow_the_moment_matched_beta():
    # one candidate, Beta(6, 14): mean 0.3, variance 0.01
    thetas = np.array([d.select("thompson", 1, p=[0.3], variance=[0.01], seed=s).theta[0] for s in range(2000)])
    assert thetas.mean() == pytest.approx(0.3, abs=0.006)
    assert thetas.var() == pytest.approx(0.01, rel=0.08)


def test_thompson_uncertain_prompt_is_sometimes_chosen_over_a_sure_one():
    # A: p = 0.3 known exactly; B: p = 0.2 but very uncertain. Target 0.5: A always closer by mean,
    # but B's draws land nearer 0.5 part of the time: (theta_B - .5)^2 < .04 iff theta_B in (.3, .7).
    from scipy.stats import beta as beta_dist

    a, b, _ = from_moments([0.2], [0.04])
    want = beta_dist.cdf(0.7, a[0], b[0]) - beta_dist.cdf(0.3, a[0], b[0])
    picks = [d.select("thompson", 1, p=[0.3, 0.2], variance=[0.0, 0.04], seed=s).chosen[0] for s in range(1500)]
    share_b = np.mean(np.asarray(picks) == 1)
    assert share_b == pytest.approx(want, abs=0.035)
    assert 0.1 < want < 0.5  # the test has teeth: neither always nor never


def test_skip_zero_variance_keeps_survivors():
    pzv = [1.0, 0.0, 1.0, 0.0, 1.0]  # rng.random() < 1 always, < 0 never
    sel = d.select("skip-zero-variance", 2, p_zero_variance=pzv, seed=0)
    assert sorted(sel.chosen.tolist()) == [1, 3]
    assert sel.dropped.tolist() == [True, False, True, False, True]
    assert sel.info == {"kept": 2, "filled": 0}


def test_skip_zero_variance_fills_from_dropped_by_lowest_probability():
    pzv = [1.0, 0.0, 0.999999999, 1.0]
    sel = d.select("skip-zero-variance", 3, p_zero_variance=pzv, seed=0)
    assert sel.chosen.tolist() == [1, 2, 0]  # the survivor, then dropped ones: .999999999, then 1.0 (first)
    assert sel.info == {"kept": 1, "filled": 2}


def test_skip_zero_variance_drop_rate_is_the_probability():
    pzv = np.full(2000, 0.3)
    sel = d.select("skip-zero-variance", 1, p_zero_variance=pzv, seed=5)
    assert sel.dropped.mean() == pytest.approx(0.3, abs=0.03)
    many = d.select("skip-zero-variance", 500, p_zero_variance=pzv, seed=5)
    assert not many.dropped[many.chosen].any()  # 1,400 survivors: the batch is all survivors


def test_uniform_is_seeded_distinct_and_fair():
    sel = d.select("uniform", 5, p=np.zeros(12), seed=4)
    assert len(set(sel.chosen.tolist())) == 5
    assert sel.chosen.tolist() == d.select("uniform", 5, p=np.zeros(12), seed=4).chosen.tolist()
    counts = np.zeros(12)
    for s in range(1200):
        counts[d.select("uniform", 3, p=np.zeros(12), seed=s).chosen] += 1
    assert counts.min() > 200 and counts.max() < 400  # expected 300 each


@pytest.mark.parametrize("strategy", d.SELECT_STRATEGIES)
def test_select_refuses_batch_larger_than_pool(strategy):
    with pytest.raises(InvalidArgumentError, match="larger than the pool of 3"):
        d.select(strategy, 4, p=[0.1, 0.2, 0.3], variance=[0, 0, 0], p_zero_variance=[0, 0, 0])


def test_select_refusals():
    with pytest.raises(InvalidArgumentError, match="unknown selection strategy 'best'"):
        d.select("best", 1, p=[0.5])
    with pytest.raises(InvalidArgumentError, match="batch size must be >= 1"):
        d.select("target", 0, p=[0.5])
    with pytest.raises(InvalidArgumentError, match=r"p\[1\] = 1.5"):
        d.select("target", 1, p=[0.5, 1.5])
    with pytest.raises(InvalidArgumentError, match="needs p_zero_variance"):
        d.select("skip-zero-variance", 1, p=[0.5])
    with pytest.raises(InvalidArgumentError, match="target must be a probability"):
        d.select("target", 1, p=[0.5], target=2)
    for bad in (-0.5, float("nan"), float("inf"), True, "1"):
        with pytest.raises(InvalidArgumentError, match="explore must be a number of pseudo-rollouts >= 0"):
            d.select("target", 1, p=[0.5], explore=bad)
    with pytest.raises(InvalidArgumentError, match="variance must be"):
        d.select("thompson", 1, p=[0.5], variance=[-1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=30), st.data(), st.sampled_from(d.SELECT_STRATEGIES))
def test_select_returns_b_distinct_positions(p, data, strategy):
    m = len(p)
    b = data.draw(st.integers(1, m))
    sel = d.select(strategy, b, p=p, variance=np.full(m, 0.01), p_zero_variance=p,
                   seed=data.draw(st.integers(0, 10)))
    assert sel.chosen.size == b and len(set(sel.chosen.tolist())) == b
    assert sel.chosen.min() >= 0 and sel.chosen.max() < m


# ----------------------------------------------------------------------------------------------------
# allocation


def test_uniform_allocation_hand_values():
    assert d.allocate("uniform", [0.1, 0.5, 0.9], 10).tolist() == [4, 3, 3]
    assert d.allocate("uniform", [0.1, 0.5, 0.9], 24, 2, 32).tolist() == [8, 8, 8]


def test_variance_allocation_hand_values():
    # w = sqrt(p(1-p)) = .5, .3, 0; min 2: 6 + .8c = 12 -> c = 7.5 -> 5.75, 4.25, 2 -> 6, 4, 2
    assert d.allocate("variance", [0.5, 0.1, 0.0], 12, 2, 32).tolist() == [6, 4, 2]
    # min 4: 12 + .8c = 20 -> c = 10 -> 9, 7, 4 exactly
    assert d.allocate("variance", [0.5, 0.1, 0.0], 20, 4, 32).tolist() == [9, 7, 4]
    # a prompt predicted certain gets the minimum, whatever the side
    assert d.allocate("variance", [1.0, 0.5, 0.0], 12, 2, 32).tolist() == [2, 8, 2]


def test_variance_allocation_spills_to_certain_prompts_only_when_the_others_are_full():
    # uncertain prompts capped at 5 each (10); 14 - 10 = 4 left for the two certain ones
    assert d.allocate("variance", [0.5, 0.3, 0.0, 1.0], 14, 2, 5).tolist() == [5, 5, 2, 2]
    assert d.allocate("variance", [0.5, 0.3, 0.0, 1.0], 16, 2, 5).tolist() == [5, 5, 3, 3]


def test_vip_allocation_hand_values():
    # gamma = 0: n_i - 1 = t sqrt(a_i), a = .25, .09, ~1e-6; min 4: (1 + .5t) + (1 + .3t) + 4 = 20
    # -> t = 17.5 -> 9.75, 6.25, 4 -> floors 9, 6, 4 (19) + 1 to the largest remainder -> 10, 6, 4
    x = d.continuous_allocation("vip", [0.5, 0.1, 0.0], 20, 4, 32)
    assert np.allclose(x, [9.75, 6.25, 4.0], atol=1e-9)
    assert d.allocate("vip", [0.5, 0.1, 0.0], 20, 4, 32).tolist() == [10, 6, 4]
    # the same budget by the variance rule (offset min, not 1) differs: 9, 7, 4
    assert d.allocate("variance", [0.5, 0.1, 0.0], 20, 4, 32).tolist() == [9, 7, 4]


def test_vip_allocation_with_binding_maximum():
    # p = .5, .5, .02 (sqrt a = .5, .5, .14), max 10: the two at 10, then 1 + .14 t = 4 -> t = 21.4 >= 18
    assert np.allclose(d.continuous_allocation("vip", [0.5, 0.5, 0.02], 24, 2, 10), [10, 10, 4], atol=1e-9)
    assert d.allocate("vip", [0.5, 0.5, 0.02], 24, 2, 10).tolist() == [10, 10, 4]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=12), st.floats(0, 0.01), st.data())
def test_vip_continuous_solution_satisfies_kkt_and_beats_other_points(p, gamma, data):
    p = np.asarray(p)
    lo, hi = 2, data.draw(st.integers(3, 20))
    budget = data.draw(st.integers(lo * p.size, hi * p.size))
    x = d.continuous_allocation("vip", p, budget, lo, hi, vip_gamma=gamma)
    assert x.sum() == pytest.approx(budget, abs=1e-6)
    assert (x >= lo - 1e-9).all() and (x <= hi + 1e-9).all()
    pc = np.clip(p, d.VIP_CLIP, 1 - d.VIP_CLIP)
    marginal = pc * (1 - pc) / (x - 1) ** 2 - gamma * np.log(pc)  # = lambda at every interior point
    interior = (x > lo + 1e-6) & (x < hi - 1e-6)
    if interior.sum() >= 2:
        assert np.ptp(marginal[interior]) <= 1e-6 * max(1.0, np.abs(marginal[interior]).max())
    # convexity: no other feasible point (a random move that keeps the sum and bounds) does better
    rng = np.random.default_rng(data.draw(st.integers(0, 100)))
    best = d.vip_objective(p, x, gamma)
    for _ in range(20):
        y = x + rng.normal(size=x.size)
        y -= (y.sum() - budget) / y.size
        if (y >= lo).all() and (y <= hi).all():
            assert d.vip_objective(p, y, gamma) >= best - 1e-9


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40), st.sampled_from(d.ALLOCATE_STRATEGIES), st.data())
def test_allocation_sums_to_budget_within_bounds(p, strategy, data):
    lo = data.draw(st.integers(2 if strategy == "vip" else 1, 6))
    hi = data.draw(st.integers(lo, 40))
    budget = data.draw(st.integers(lo * len(p), hi * len(p)))
    n = d.allocate(strategy, p, budget, lo, hi)
    assert n.dtype.kind == "i" and n.shape == (len(p),)
    assert int(n.sum()) == budget
    assert n.min() >= lo and n.max() <= hi


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 50), min_size=1, max_size=40), st.data())
def test_round_allocation_keeps_sum_and_bounds_for_any_input(x, data):
    lo = data.draw(st.integers(0, 5))
    hi = data.draw(st.integers(max(lo, 1), 50))
    budget = data.draw(st.integers(max(lo, 0) * len(x), hi * len(x)))
    if lo == 0:
        with pytest.raises(InvalidArgumentError):
            d.round_allocation(x, budget, lo, hi)
        return
    n = d.round_allocation(x, budget, lo, hi)
    assert int(n.sum()) == budget and n.min() >= lo and n.max() <= hi


def test_round_allocation_is_largest_remainder():
    # floors 1, 2, 3 (6); two units left -> the .9 and the .6 remainders
    assert d.round_allocation([1.9, 2.6, 3.5], 8, 1, 10).tolist() == [2, 3, 3]
    assert d.round_allocation([1.9, 2.6, 3.5], 8, 1, 3).tolist() == [2, 3, 3]
    # clipping: 9.5 is clipped to max 4 first; the shortfall goes to the others
    assert d.round_allocation([9.5, 1.2, 1.1], 8, 1, 4).tolist() == [4, 2, 2]


@pytest.mark.parametrize("strategy", d.ALLOCATE_STRATEGIES)
def test_allocation_refusals(strategy):
    with pytest.raises(InvalidArgumentError, match="below the minimum 2 x 3 prompts = 6"):
        d.allocate(strategy, [0.2, 0.5, 0.7], 5, 2, 32)
    with pytest.raises(InvalidArgumentError, match="above the maximum 4 x 3 prompts = 12"):
        d.allocate(strategy, [0.2, 0.5, 0.7], 13, 2, 4)
    with pytest.raises(InvalidArgumentError, match="max_count 1 is below min_count 2"):
        d.allocate(strategy, [0.2], 2, 2, 1)


def test_allocation_other_refusals():
    with pytest.raises(InvalidArgumentError, match="unknown allocation strategy 'greedy'"):
        d.allocate("greedy", [0.5], 4)
    with pytest.raises(InvalidArgumentError, match="vip strategy needs min_count >= 2"):
        d.allocate("vip", [0.5, 0.2], 4, 1, 8)
    with pytest.raises(InvalidArgumentError, match="at least one prompt"):
        d.allocate("uniform", [], 0)


def test_nondegenerate_probability_hand_values():
    # 1 - .5^4 - .5^4 = .875; p = 0 or 1: never; n = 1: never
    assert np.allclose(d.nondegenerate_probability([0.5, 0.0, 1.0, 0.5], [4, 8, 8, 1]), [0.875, 0, 0, 0])


def test_core_decisions_imports_numpy_only():
    import subprocess
    import sys

    code = ("import sys; import graphdiff_cli.core.decisions; "
            "bad = [m for m in ('torch', 'typer', 'rich', 'zarr', 'faiss') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_expected_signal_groups_under_the_belief():
    """A point belief gives the plug-in P(0 < s < n) summed; a Beta belief its Beta-Binomial expectation."""
    p = np.array([0.5] * 8 + [0.05] * 8)
    n = d.allocate("variance", p, 128, 2, 32)
    assert d.expected_signal_groups(p, np.zeros(16), n) == pytest.approx(d.nondegenerate_probability(p, n).sum())
    # the case: the variance rule's own estimate is worse than uniform's
    assert d.short_of_uniform(d.expected_signal_groups(p, np.zeros(16), n),
                              d.expected_signal_groups(p, np.zeros(16), np.full(16, 8)))
    assert not d.short_of_uniform(10.0, 10.0 + 1e-12) and d.short_of_uniform(10.0, 10.01)
    # Beta(2, 3), n = 4: P(0 < s < 4) by the Beta-Binomial
    from scipy.stats import betabinom

    a, b = 2.0, 3.0
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))
    want = 1 - betabinom.pmf(0, 4, a, b) - betabinom.pmf(4, 4, a, b)
    assert d.expected_signal_groups([mean], [var], np.array([4])) == pytest.approx(want)
    assert d.expected_signal_groups([mean, mean], [var, var], np.array([0, 1])) == 0.0  # no group of 2: no signal
    with pytest.raises(InvalidArgumentError):
        d.expected_signal_groups([0.5], [0.0], np.array([2.5]))


def test_selection_signal_groups_against_a_uniform_draw():
    pzv = np.array([0.1, 0.9, 0.5, 0.3])
    chosen, uniform = d.selection_signal_groups(pzv, [1, 3])
    assert chosen == pytest.approx(0.1 + 0.7) and uniform == pytest.approx(2 * np.mean(1 - pzv))
