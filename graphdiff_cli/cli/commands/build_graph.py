"""``graphdiff build-graph``: embeddings artifact -> mutual-kNN graph artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit, progress, warn


@command("build-graph")
def build_graph(
    embeddings: Path = typer.Argument(..., help="Embeddings artifact (from embed or merge-embeddings)."),
    out: Path = typer.Option(..., "--out", "-o", help="Graph artifact to write."),
    k_nn: Optional[int] = typer.Option(None, "--k-nn", help="Neighbours per prompt before the mutual filter "
                                       "(k = min(k_nn, N - 1)). Default: chosen from the N prompts, "
                                       "min(80, max(10, N // 10)); build-graph prints the value."),
    device: str = typer.Option("auto", "--device", help="auto (GPU where one works), cpu or cuda."),
    index: str = typer.Option("exact", "--index", help="exact (flat inner product, the paper's), or an "
                              "approximate faiss index for millions of prompts: hnsw (CPU) or ivf (GPU with "
                              "faiss-gpu); its recall is measured and reported."),
    nprobe: Optional[int] = typer.Option(None, "--nprobe", help="ivf: inverted lists probed per query "
                                         "(default: max(16, nlist / 8), nlist = 4 sqrt(N))."),
    ef_search: Optional[int] = typer.Option(None, "--ef-search", help="hnsw: search breadth (default: "
                                            "max(128, 2 k))."),
    recall_sample: int = typer.Option(1000, "--recall-sample", help="Approximate indexes: prompts whose "
                                      "hits are checked against exact search to measure recall."),
):
    """Build W (Section 3.3): W_ij = cos(phi_i, phi_j) for mutual k-nearest neighbours with positive similarity."""
    from ...stages.prepare import build_graph as build

    with progress("searching neighbours") as update:
        res = build(embeddings, out, k_nn=k_nn, device=device, index=index, nprobe=nprobe,
                    ef_search=ef_search, recall_sample=recall_sample, progress=update)
    s = res["summary"]
    text = ((f"{res['k_nn_rule']} (--k-nn sets it)\n" if res["k_nn_rule"] else "")
            + f"graph of {s['n_nodes']} prompts at k = {res['k']}, {s['n_edges']} edges (mean degree {s['mean_degree']:.1f}, "
            f"{s['isolated']} isolated, {s['components']} components) -> {res['out']}")
    if s["isolated"]:
        warn(f"{s['isolated']} of {s['n_nodes']} prompts have no mutual neighbour at k = {res['k']} "
             "(they learn only from their own outcomes and their cluster's state); a larger --k-nn joins more "
             "of them")
    if res["recall"] is not None:
        r = res["recall"]
        text += (f"\n{index} index: recall@{r['k']} {r['recall']:.4f} against exact search on "
                 f"{r['sample']:,} sampled prompts")
    emit(res, text)
