"""Do the spectral clusters capture semantic and difficulty structure? (Appendix F of the paper.)

* ``cluster_association``: the K+ x U contingency table O of nonempty clusters vs a categorical label,
  E_ku = O_k. O_.u / n, Pearson's chi^2 = sum (O - E)^2 / E with (K+ - 1)(U - 1) degrees of freedom
  (no Yates correction), and Cramer's V = sqrt(chi^2 / (n min(K+ - 1, U - 1))).
* ``within_category_kruskal``: for each category u, a Kruskal-Wallis test of an ordinal label across
  the clusters nonempty within u, midranks for ties and the ties correction
  H_u = H_u^(0) / (1 - sum_g (t^3 - t) / (n_u^3 - n_u)), p_u = P(chi^2_{K_u - 1} >= H_u).
* ``benjamini_hochberg``: adjusted p_(r) = min(1, min_{j >= r} m p_(j) / j).

The statistics come from scipy.stats: ``chi2_contingency`` with correction=False (no Yates correction,
also for 2 x 2 tables), ``contingency.association(method="cramer")``, ``kruskal`` (midranks and the
ties correction above) and ``false_discovery_control(method="bh")``; the tests check them against hand
computation.
"""

from __future__ import annotations

import numpy as np

from ..errors import DataError


def contingency_table(clusters, categories) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(table O, cluster values, category values): rows = nonempty clusters, columns = categories."""
    clusters = np.asarray(clusters)
    categories = np.asarray(categories)
    if clusters.shape != categories.shape or clusters.ndim != 1:
        raise DataError("clusters and categories must be 1-D arrays of the same length")
    if clusters.size == 0:
        raise DataError("no items to tabulate")
    kv, ki = np.unique(clusters, return_inverse=True)
    uv, ui = np.unique(categories, return_inverse=True)
    table = np.zeros((kv.size, uv.size), dtype=np.int64)
    np.add.at(table, (ki, ui), 1)
    return table, kv, uv


def chi_squared(table) -> dict:
    """Pearson's chi^2 (no continuity correction) of a contingency table, with dof, p and Cramer's V.

    Empty rows and columns are dropped first (only nonempty clusters and observed categories count).
    The table holds counts (nonnegative integers, of any numeric dtype).
    """
    from scipy.stats import chi2_contingency
    from scipy.stats.contingency import association

    o = np.asarray(table, dtype=np.float64)
    if o.ndim != 2:
        raise DataError("a contingency table must be 2-D")
    if np.any(o < 0) or np.any(o != np.round(o)):
        raise DataError("a contingency table holds nonnegative counts")
    o = o[o.sum(axis=1) > 0][:, o.sum(axis=0) > 0]
    k, u = o.shape
    if k < 2 or u < 2:
        raise DataError(f"a chi-squared test needs at least 2 nonempty clusters and 2 categories, got {k} x {u}")
    counts = o.astype(np.int64)
    res = chi2_contingency(counts, correction=False)
    v = association(counts, method="cramer", correction=False)
    return {"chi2": float(res.statistic), "dof": int(res.dof), "p": float(res.pvalue),
            "cramers_v": float(v), "n": int(counts.sum()), "clusters": int(k), "categories": int(u)}


def cluster_association(clusters, categories) -> dict:
    """Appendix F.1: chi^2 and Cramer's V of nonempty clusters vs a categorical label."""
    table, kv, uv = contingency_table(clusters, categories)
    out = chi_squared(table)
    out["table"] = table
    out["cluster_values"] = kv
    out["category_values"] = uv
    return out


def kruskal_wallis(values, groups) -> dict:
    """Kruskal-Wallis H with midranks and the ties correction; p from chi^2 with (groups - 1) dof.

    Returns {"H", "dof", "p", "n", "groups"}; H = NaN and p = NaN when fewer than 2 groups or every value
    is tied (the statistic is undefined).
    """
    from scipy.stats import kruskal

    x = np.asarray(values, dtype=np.float64)
    g = np.asarray(groups)
    if x.shape != g.shape or x.ndim != 1:
        raise DataError("values and groups must be 1-D arrays of the same length")
    gv, gi = np.unique(g, return_inverse=True)
    n = x.size
    k = gv.size
    if k < 2 or n < 2:
        return {"H": float("nan"), "dof": int(max(k - 1, 0)), "p": float("nan"), "n": int(n), "groups": int(k)}
    if np.all(x == x[0]):  # ties correction 1 - (n^3 - n) / (n^3 - n) = 0: H undefined
        return {"H": float("nan"), "dof": int(k - 1), "p": float("nan"), "n": int(n), "groups": int(k)}
    res = kruskal(*(x[gi == j] for j in range(k)))
    return {"H": float(res.statistic), "dof": int(k - 1), "p": float(res.pvalue), "n": int(n), "groups": int(k)}


def benjamini_hochberg(pvalues) -> np.ndarray:
    """BH-adjusted p-values in the input order: p~_(r) = min(1, min_{j >= r} m p_(j) / j). NaN stays NaN
    and does not count towards m."""
    from scipy.stats import false_discovery_control

    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = ~np.isnan(p)
    if ok.any():
        out[ok] = false_discovery_control(p[ok], method="bh")
    return out


def within_category_kruskal(clusters, categories, ordinal) -> list[dict]:
    """Appendix F.2: per category, Kruskal-Wallis of the ordinal label across clusters, then BH.

    Items with a missing ordinal value (NaN) are left out. Returns one dict per category (sorted by
    category value): {"category", "H", "dof", "p", "p_bh", "n", "groups"}.
    """
    clusters = np.asarray(clusters)
    categories = np.asarray(categories)
    y = np.asarray(ordinal, dtype=np.float64)
    if not (clusters.shape == categories.shape == y.shape) or clusters.ndim != 1:
        raise DataError("clusters, categories and the ordinal label must be 1-D arrays of the same length")
    keep = ~np.isnan(y)
    rows = []
    for u in np.unique(categories[keep]):
        m = keep & (categories == u)
        res = kruskal_wallis(y[m], clusters[m])
        res["category"] = u.item() if hasattr(u, "item") else u
        rows.append(res)
    adj = benjamini_hochberg([r["p"] for r in rows])
    for r, a in zip(rows, adj):
        r["p_bh"] = float(a)
    return rows
