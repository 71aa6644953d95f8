"""Stage behind ``graphdiff diagnose-clusters``: the paper's Appendix F diagnostics (``core.diagnostics``)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import DataError


def diagnose_clusters(clusters, labels_file, *, category: str = "subject", ordinal: str | None = "level",
                      id_field: str = "unique_id") -> dict:
    """Appendix F: clusters vs a categorical label (chi^2, Cramer's V) and, within each category, an
    ordinal label across clusters (Kruskal-Wallis with ties correction, Benjamini-Hochberg).

    Items are matched by id; labels rows whose id is not clustered are counted and left out, and so
    are rows with a missing category. A missing or non-numeric ordinal value leaves the row out of
    the Kruskal-Wallis tests only.
    """
    from ..core.diagnostics import cluster_association, within_category_kruskal
    from ..io.readers import read_clusters
    from ..io.tables import as_id, read_rows
    from .report import to_jsonable

    cls = read_clusters(clusters, None)
    ids, lab = cls.ids, cls.labels
    index = {pid: i for i, pid in enumerate(ids)}
    cl, cat, ordv = [], [], []
    unmatched = missing_category = 0
    seen = set()
    for line, row in read_rows(labels_file):
        if id_field not in row:
            raise DataError(f"{labels_file}:{line}: no {id_field!r} field (use --id-field to name the id column)")
        pid = as_id(row[id_field], labels_file, line, id_field)
        if pid in seen:
            raise DataError(f"{labels_file}:{line}: duplicate id {pid!r}")
        seen.add(pid)
        if pid not in index:
            unmatched += 1
            continue
        c = row.get(category)
        if c is None or (isinstance(c, str) and not c.strip()):
            missing_category += 1
            continue
        cl.append(int(lab[index[pid]]))
        cat.append(str(c))
        v = row.get(ordinal) if ordinal else None
        try:
            fv = float(v) if v not in (None, "") and not isinstance(v, bool) else float("nan")
        except (TypeError, ValueError):
            fv = float("nan")
        ordv.append(fv if math.isfinite(fv) else float("nan"))
    if not cl:
        raise DataError(f"{labels_file}: no row matches an id of {clusters} (match on {id_field!r}; "
                        "use --id-field to name the id column)")
    cl_a, cat_a = np.asarray(cl), np.asarray(cat)
    assoc = cluster_association(cl_a, cat_a)
    result = {"command": "diagnose-clusters", "clusters": str(clusters), "labels": str(labels_file),
              "category": category, "ordinal": ordinal, "matched": len(cl), "unmatched_label_rows": unmatched,
              "missing_category": missing_category, "clustered_without_labels": len(ids) - len(cl),
              "association": {k: assoc[k] for k in ("chi2", "dof", "p", "cramers_v", "n", "clusters", "categories")}}
    if ordinal:
        rows = within_category_kruskal(cl_a, cat_a, np.asarray(ordv))
        result["within_category"] = rows
        ps = [r["p_bh"] for r in rows if r["p_bh"] == r["p_bh"]]
        result["max_p_bh"] = max(ps) if ps else None
    return to_jsonable(result)
