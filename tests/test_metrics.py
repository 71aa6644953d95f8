"""Every metric against values worked out by hand on tiny inputs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from graphdiff_cli.evaluation import metrics as M


def test_mae():
    assert M.mae([0.2, 0.5], [0.0, 1.0]) == pytest.approx(0.35)
    assert np.isnan(M.mae([], []))


def test_pearson_and_spearman_hand_values():
    # x = [1, 2, 3], y = [1, 3, 2]: dx = [-1, 0, 1], dy = [-1, 1, 0]; r = 1 / (sqrt(2) sqrt(2)) = 0.5
    assert M.pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    # ties: x ranks [1, 2.5, 2.5, 4], y ranks [1, 2, 3, 4]
    x, y = [0.1, 0.5, 0.5, 0.9], [0.0, 0.2, 0.4, 1.0]
    assert M.spearman(x, y) == pytest.approx(M.pearson([1, 2.5, 2.5, 4], [1, 2, 3, 4]))
    assert M.spearman(x, y) == pytest.approx(spearmanr(x, y)[0])
    assert np.isnan(M.pearson([1, 1, 1], [1, 2, 3]))
    assert np.isnan(M.pearson([1], [2]))


def test_batch_level_pearson_uses_batch_means_across_steps():
    step = np.array([1, 1, 2, 2, 3, 3])
    p = np.array([0.2, 0.4, 0.5, 0.5, 0.9, 0.7])  # batch means 0.3, 0.5, 0.8
    r = np.array([0.0, 0.5, 0.25, 0.25, 1.0, 0.5])  # batch means 0.25, 0.25, 0.75
    bp, br = M.batch_means(step, p, r)
    np.testing.assert_allclose(bp, [0.3, 0.5, 0.8])
    np.testing.assert_allclose(br, [0.25, 0.25, 0.75])
    assert M.batch_pearson(step, p, r) == pytest.approx(pearsonr([0.3, 0.5, 0.8], [0.25, 0.25, 0.75])[0])


def test_within_batch_skips_uninformative_batches_and_scores_constant_predictions_zero():
    step = np.array([1, 1, 1, 2, 2, 2, 3, 3, 3, 4])
    r = np.array([0.5, 0.5, 0.5,  # batch 1: all outcomes equal -> skipped
                  0.0, 0.5, 1.0,  # batch 2: constant predictions -> 0
                  0.0, 1.0, 0.5,  # batch 3: scored
                  0.3])  # batch 4: one row -> skipped
    p = np.array([0.1, 0.9, 0.3, 0.4, 0.4, 0.4, 1.0, 2.0, 3.0, 0.5])
    wb = M.within_batch(step, p, r)
    assert wb["batches"] == 2
    # batch 3: pearson([1, 2, 3], [0, 1, 0.5]) = 0.5; spearman: ranks [1, 2, 3] vs [1, 3, 2] = 0.5
    assert wb["pearson"] == pytest.approx((0.0 + 0.5) / 2)
    assert wb["spearman"] == pytest.approx((0.0 + 0.5) / 2)
    assert np.isnan(M.within_batch(step[:3], p[:3], r[:3])["pearson"])


def test_brier_is_scored_against_every_rollout():
    # p = 0.25, 1 of 4 correct: [1 * 0.75^2 + 3 * 0.25^2] / 4 = 0.1875
    assert M.brier([0.25], [4], [1]) == pytest.approx(0.1875)
    # two rows: [0.5^2 * 2] + [0 + 0] over 3 rollouts
    assert M.brier([0.5, 0.0], [2, 1], [1, 0]) == pytest.approx(0.5 / 3)


def test_ece_and_reliability_with_ten_equal_width_bins():
    p = np.array([0.05, 0.15, 0.95, 1.0])
    r = np.array([0.0, 0.5, 1.0, 1.0])
    rel = M.reliability(p, r)
    assert M.N_BINS == 10
    np.testing.assert_allclose(rel["edges"], np.linspace(0, 1, 11))
    np.testing.assert_array_equal(rel["count"], [1, 1, 0, 0, 0, 0, 0, 0, 0, 2])  # p = 1 in the last bin
    assert rel["mean_pred"][9] == pytest.approx(0.975) and np.isnan(rel["mean_pred"][5])
    # (0.05 + 0.35 + 2 * 0.025) / 4
    assert M.ece(p, r) == pytest.approx(0.1125)


def test_auroc_with_ties_counts_one_half():
    score = [0.9, 0.8, 0.8, 0.1]
    pos = [True, False, True, False]
    # pairs (pos, neg): (0.9, 0.8) 1, (0.9, 0.1) 1, (0.8, 0.8) 0.5, (0.8, 0.1) 1 -> 3.5 / 4
    assert M.auroc(score, pos) == pytest.approx(0.875)
    assert np.isnan(M.auroc([0.1, 0.2], [True, True]))
    np.testing.assert_array_equal(M.zero_variance_outcome([8, 8, 8], [0, 3, 8]), [True, False, True])


def test_phases_split_the_distinct_steps_into_thirds():
    step = np.repeat([1, 2, 3, 5, 6, 7, 9], 2)
    ph = M.phase_of_steps(step)
    assert set(step[ph["early"]]) == {1, 2, 3}
    assert set(step[ph["middle"]]) == {5, 6}
    assert set(step[ph["last"]]) == {7, 9}
    assert ph["full"].all()


def test_evaluate_predictions_splits_seen_and_unseen():
    step = np.array([1, 1, 2, 2, 3, 3])
    p = np.array([0.5, 0.5, 0.2, 0.6, 0.9, 0.1])
    n = np.full(6, 4)
    s = np.array([2, 0, 0, 4, 4, 0])
    seen = np.array([False, False, True, False, True, True])
    zv = np.array([0.1, 0.9, 0.8, 0.2, 0.7, 0.6])
    res = M.evaluate_predictions(step, p, n, s, seen, zv, seconds_per_step=[1.0, 2.0, 3.0])
    full = res["full"]
    r = s / n
    assert full["all"]["mae"] == pytest.approx(np.mean(np.abs(p - r)))
    assert full["seen"]["mae"] == pytest.approx(np.mean(np.abs(p[seen] - r[seen])))
    assert full["unseen"]["mae"] == pytest.approx(np.mean(np.abs(p[~seen] - r[~seen])))
    assert full["seen"]["rows"] == 3 and full["unseen"]["rows"] == 3
    # zero-variance rows: s in {0, 4} -> all but row 0; AUROC = P(score of zv row > row 0's 0.1) = 1
    assert full["all"]["auroc"] == pytest.approx(1.0)
    assert full["all"]["seconds_per_step"] == pytest.approx(2.0)
    assert res["early"]["all"]["seconds_per_step"] == pytest.approx(1.0)
    assert res["early"]["all"]["rows"] == 2
    assert res["early"]["seen"]["rows"] == 0 and np.isnan(res["early"]["seen"]["mae"])
    # seen split: steps 2 and 3 only; batch means of p: 0.2, 0.5; of r: 0, 0.5
    assert full["seen"]["batch_r"] == pytest.approx(1.0)


def test_evaluate_replay_series_and_reliability():
    from graphdiff_cli.evaluation.baselines import HistoryMean
    from graphdiff_cli.evaluation.replay import replay

    step = np.array([1, 1, 2, 2, 3, 3])
    ids = np.array([0, 1, 0, 2, 1, 2])
    n = np.full(6, 4)
    s = np.array([4, 0, 2, 2, 1, 3])
    res = replay(step, ids, n, s, [HistoryMean(3)])
    ev = M.evaluate_replay(res)
    np.testing.assert_allclose(ev["series"]["observed"], [0.5, 0.5, 0.5])
    # predictions: step 1: 0.5, 0.5 (nothing seen); step 2: 1.0 (own), 0.5 (global 4/8); step 3: 0, 0.5 (own)
    np.testing.assert_allclose(ev["series"]["history"]["predicted"], [0.5, 0.75, 0.25])
    np.testing.assert_allclose(ev["series"]["history"]["mae"], [0.5, 0.25, 0.25])
    assert ev["methods"]["history"]["reliability"]["count"].sum() == 6
    assert ev["methods"]["history"]["zero_variance_source"] == "plug-in"
    assert ev["phases"] == {"early": [1, 1], "middle": [2, 2], "last": [3, 3], "full": [1, 3]}


# ------------------------------------------------------------------------------------------ intervals

def test_ratio_bootstrap_degenerate_and_small_cases():
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap

    den = np.array([3.0, 5.0, 2.0, 7.0, 4.0])
    ci = ratio_bootstrap(0.25 * den, den)  # every unit's ratio is 0.25: every resample's too
    assert ci["estimate"] == pytest.approx(0.25) and ci["lo"] == pytest.approx(0.25) and ci["hi"] == pytest.approx(0.25)
    one = ratio_bootstrap(np.array([1.0]), np.array([2.0]))
    assert one["estimate"] == 0.5 and np.isnan(one["lo"]) and np.isnan(one["hi"])
    with pytest.raises(Exception, match="1-d arrays of one length"):
        ratio_bootstrap(np.zeros(3), np.ones(4))


def test_ratio_bootstrap_covers_the_true_mean_and_widens_for_correlated_steps():
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap

    rng = np.random.default_rng(0)
    covered = 0
    for rep in range(200):  # i.i.d. unit differences: the 95% interval holds the true mean ~95% of the time
        x = 0.1 + rng.standard_normal(150)
        ci = ratio_bootstrap(x, np.ones(150), n_boot=500, seed=rep, block=1)
        covered += ci["lo"] <= 0.1 <= ci["hi"]
    assert 176 <= covered <= 199  # 88%-99.5%: a 200-draw binomial around 0.95
    # AR(1) steps (neighbours correlated 0.8): the block bootstrap interval is wider than the i.i.d. one, as
    # it must be (the effective sample is smaller)
    e = rng.standard_normal(400)
    x = np.zeros(400)
    for t in range(1, 400):
        x[t] = 0.8 * x[t - 1] + e[t]
    iid = ratio_bootstrap(x, np.ones(400), block=1)
    blocked = ratio_bootstrap(x, np.ones(400))
    assert blocked["block"] == 8  # ceil(400^(1/3))
    assert (blocked["hi"] - blocked["lo"]) > 1.5 * (iid["hi"] - iid["lo"])


def test_paired_comparison_point_estimates_are_the_plain_differences():
    from graphdiff_cli.evaluation.metrics import mae, mae_difference, within_batch, within_r_difference

    rng = np.random.default_rng(3)
    step = np.repeat(np.arange(12), 10)
    r = rng.integers(0, 9, step.size) / 8
    pa, pb = np.clip(r + 0.1 * rng.standard_normal(step.size), 0, 1), rng.random(step.size)
    c = {"mae_diff": mae_difference(step, pa, pb, r), "within_r_diff": within_r_difference(step, pa, pb, r)}
    assert c["mae_diff"]["estimate"] == pytest.approx(mae(pa, r) - mae(pb, r))
    assert c["within_r_diff"]["estimate"] == pytest.approx(
        within_batch(step, pa, r)["pearson"] - within_batch(step, pb, r)["pearson"])
    assert c["mae_diff"]["hi"] < 0 < c["within_r_diff"]["lo"]  # a is clearly better on both
    assert c["mae_diff"]["units"] == 12
