"""Appendix F statistics against hand computation on tiny tables (and scipy as a second opinion)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2, chi2_contingency, kruskal

from graphdiff_cli.core import diagnostics as D
from graphdiff_cli.errors import DataError


def test_chi_squared_and_cramers_v_by_hand():
    # table [[2, 1], [1, 2]]: E = 1.5 everywhere, chi2 = 4 * 0.25 / 1.5 = 2/3, V = sqrt(2/3 / 6) = 1/3
    clusters = np.array([0, 0, 0, 1, 1, 1])
    cats = np.array(["a", "a", "b", "a", "b", "b"])
    res = D.cluster_association(clusters, cats)
    np.testing.assert_array_equal(res["table"], [[2, 1], [1, 2]])
    assert res["chi2"] == pytest.approx(2 / 3)
    assert res["dof"] == 1
    assert res["cramers_v"] == pytest.approx(1 / 3)
    assert res["p"] == pytest.approx(chi2.sf(2 / 3, 1))
    sc = chi2_contingency(res["table"], correction=False)
    assert res["chi2"] == pytest.approx(sc[0]) and res["p"] == pytest.approx(sc[1])


def test_only_nonempty_clusters_count():
    # cluster labels 0, 3, 7 (states 1, 2, 4-6 empty): K+ = 3, U = 2 -> dof 2, V uses min(2, 1)
    clusters = np.array([0, 0, 3, 3, 7, 7, 7])
    cats = np.array([1, 2, 1, 1, 2, 2, 1])
    res = D.cluster_association(clusters, cats)
    assert res["clusters"] == 3 and res["dof"] == 2
    o = np.array([[1, 1], [2, 0], [1, 2]], dtype=float)
    e = np.outer(o.sum(1), o.sum(0)) / 7
    want = ((o - e) ** 2 / e).sum()
    assert res["chi2"] == pytest.approx(want)
    assert res["cramers_v"] == pytest.approx(np.sqrt(want / 7))
    # an explicit table with an empty row is reduced first
    assert D.chi_squared(np.vstack([o, np.zeros(2)]))["chi2"] == pytest.approx(want)
    with pytest.raises(DataError, match="at least 2"):
        D.cluster_association(np.zeros(4), np.array([1, 2, 1, 2]))


def test_kruskal_wallis_with_ties_by_hand():
    # values [1, 2, 2, 3] in groups a, a, b, b: midranks [1, 2.5, 2.5, 4]; R_a = 3.5, R_b = 6.5
    # H0 = 12 / 20 * (3.5^2 / 2 + 6.5^2 / 2) - 15 = 1.35; C = 1 - 6 / 60 = 0.9; H = 1.5
    res = D.kruskal_wallis([1, 2, 2, 3], ["a", "a", "b", "b"])
    assert res["H"] == pytest.approx(1.5)
    assert res["dof"] == 1
    assert res["p"] == pytest.approx(chi2.sf(1.5, 1))
    sk = kruskal([1, 2], [2, 3])
    assert res["H"] == pytest.approx(sk.statistic) and res["p"] == pytest.approx(sk.pvalue)
    assert np.isnan(D.kruskal_wallis([2, 2, 2], [0, 1, 1])["H"])  # all tied: undefined
    assert np.isnan(D.kruskal_wallis([1, 2, 3], [0, 0, 0])["p"])  # one group


def test_benjamini_hochberg_by_hand():
    # sorted 0.01, 0.03, 0.04, 0.5 -> m p / j = 0.04, 0.06, 0.0533, 0.5 -> monotone 0.04, 0.0533, 0.0533, 0.5
    adj = D.benjamini_hochberg([0.01, 0.04, 0.03, 0.5])
    np.testing.assert_allclose(adj, [0.04, 0.16 / 3, 0.16 / 3, 0.5])
    np.testing.assert_allclose(D.benjamini_hochberg([0.9, 0.8]), [0.9, 0.9])
    out = D.benjamini_hochberg([0.02, np.nan])
    assert out[0] == pytest.approx(0.02) and np.isnan(out[1])


def test_within_category_kruskal_runs_one_test_per_category_then_bh():
    clusters = np.array([0, 0, 1, 1, 0, 0, 1, 1, 1])
    cats = np.array(["x", "x", "x", "x", "y", "y", "y", "y", "y"])
    level = np.array([1, 2, 2, 3, 1, 1, 5, 4, np.nan])
    rows = D.within_category_kruskal(clusters, cats, level)
    assert [r["category"] for r in rows] == ["x", "y"]
    assert rows[0]["H"] == pytest.approx(1.5)
    assert rows[1]["n"] == 4  # the missing level is left out
    want_y = kruskal([1, 1], [5, 4])
    assert rows[1]["p"] == pytest.approx(want_y.pvalue)
    np.testing.assert_allclose([r["p_bh"] for r in rows], D.benjamini_hochberg([rows[0]["p"], rows[1]["p"]]))


def _reference_kruskal(x, g):
    """Kruskal-Wallis from the textbook formula, independent of scipy.stats.kruskal."""
    from scipy.stats import rankdata

    _, gi = np.unique(g, return_inverse=True)
    n, k = x.size, gi.max() + 1
    r = rankdata(x)
    h0 = 12.0 / (n * (n + 1)) * np.sum(np.bincount(gi, weights=r) ** 2 / np.bincount(gi)) - 3.0 * (n + 1)
    _, t = np.unique(x, return_counts=True)
    h = h0 / (1.0 - np.sum(t.astype(float) ** 3 - t) / (float(n) ** 3 - n))
    return h, chi2.sf(h, k - 1)


def _reference_bh(p):
    order = np.argsort(p, kind="stable")
    adj = np.minimum.accumulate((p[order] * p.size / np.arange(1, p.size + 1))[::-1])[::-1]
    out = np.empty_like(p)
    out[order] = np.minimum(adj, 1.0)
    return out


def test_statistics_match_an_independent_computation_on_a_larger_sample():
    # many clusters, heavy ties in the ordinal label, a missing value: the Appendix F setting in small
    rng = np.random.default_rng(7)
    n = 3000
    clusters = rng.integers(0, 12, n) * 3  # sparse labels 0, 3, ..., 33
    cats = rng.choice(np.array(["alg", "geo", "nt", "pre"]), n)
    level = (rng.integers(1, 6, n) + (clusters // 9)).astype(float)
    level[rng.random(n) < 0.03] = np.nan
    res = D.cluster_association(clusters, cats)
    o = res["table"].astype(float)
    e = np.outer(o.sum(1), o.sum(0)) / n
    want = float(((o - e) ** 2 / e).sum())
    dof = (o.shape[0] - 1) * (o.shape[1] - 1)
    assert res["chi2"] == pytest.approx(want, rel=1e-12) and res["dof"] == dof
    assert res["p"] == pytest.approx(chi2.sf(want, dof), rel=1e-9)
    assert res["cramers_v"] == pytest.approx(np.sqrt(want / (n * min(o.shape[0] - 1, o.shape[1] - 1))), rel=1e-12)
    rows = D.within_category_kruskal(clusters, cats, level)
    ps = []
    for r in rows:
        m = (cats == r["category"]) & ~np.isnan(level)
        h, p = _reference_kruskal(level[m], clusters[m])
        assert r["H"] == pytest.approx(h, rel=1e-12) and r["p"] == pytest.approx(p, rel=1e-9)
        ps.append(p)
    np.testing.assert_allclose([r["p_bh"] for r in rows], _reference_bh(np.array(ps)), rtol=1e-9)
    p = np.round(rng.random(25), 1)  # ties among the p-values
    np.testing.assert_allclose(D.benjamini_hochberg(p), _reference_bh(p), rtol=1e-12)


def test_two_by_two_has_no_yates_correction_and_tables_hold_counts():
    # Yates would give sum (|O - E| - 0.5)^2 / E = 4 * 0 = 0 on [[2, 1], [1, 2]]; we report 2/3
    assert D.chi_squared(np.array([[2, 1], [1, 2]]))["chi2"] == pytest.approx(2 / 3)
    with pytest.raises(DataError, match="counts"):
        D.chi_squared(np.array([[1.5, 1], [1, 2]]))
    with pytest.raises(DataError, match="counts"):
        D.chi_squared(np.array([[-1, 1], [1, 2]]))
