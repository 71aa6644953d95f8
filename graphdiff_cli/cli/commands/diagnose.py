"""``graphdiff diagnose-clusters``: do the clusters capture category and difficulty? (Appendix F)"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit


@command("diagnose-clusters")
def diagnose_clusters(
    clusters: Path = typer.Option(..., "--clusters", help="Clusters artifact (from cluster)."),
    labels: Path = typer.Option(..., "--labels", help="Labels file (JSONL/CSV/Parquet) with an id column, a "
                                "categorical column and an ordinal column, e.g. MATH's subject and level."),
    category: str = typer.Option("subject", "--category", help="Categorical column (chi-squared, Cramer's V)."),
    ordinal: Optional[str] = typer.Option("level", "--ordinal", help="Ordinal column tested across clusters "
                                          "within each category (Kruskal-Wallis + Benjamini-Hochberg); "
                                          "'' to skip."),
    id_field: str = typer.Option("unique_id", "--id-field", help="Id column of the labels file."),
):
    """Chi-squared and Cramer's V of clusters vs a category; within-category Kruskal-Wallis of an ordinal."""
    from ...stages.diagnose import diagnose_clusters as run_diagnose

    res = run_diagnose(clusters, labels, category=category, ordinal=ordinal or None, id_field=id_field)
    a = res["association"]
    lines = [f"{res['matched']:,} items, {a['clusters']} nonempty clusters x {a['categories']} {category} values: "
             f"chi2 = {a['chi2']:.2f} (dof {a['dof']}, p = {a['p']:.3g}), Cramer's V = {a['cramers_v']:.3f}"]
    for r in res.get("within_category", []):
        h = "–" if r["H"] is None else f"{r['H']:.2f}"
        p = "–" if r["p"] is None else f"{r['p']:.3g}"
        q = "–" if r["p_bh"] is None else f"{r['p_bh']:.3g}"
        lines.append(f"  {r['category']}: Kruskal-Wallis H = {h} over {r['groups']} clusters, p = {p}, BH p = {q}")
    emit(res, "\n".join(lines))
