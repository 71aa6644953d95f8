"""A small simulated world written as the pipeline's artifacts, for tests of ``graphdiff evaluate`` and its peers."""

from __future__ import annotations

import numpy as np

from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.evaluation.simulate import simulate
from graphdiff_cli.io.artifacts import read_artifact, write_artifact


def topic_world(d, n_prompts: int, steps: int, batch_size: int, seed: int, k: int) -> dict:
    """A simulated log over ``n_prompts`` prompts (``simulate``) whose 8-d unit embeddings carry each prompt's topic
    and level, its mutual-kNN graph (k 8) and ``k`` spectral clusters, written in ``d`` as emb.zarr, graph.zarr and
    clusters.zarr, each naming the one it was made from (provenance), as the pipeline's stages write them. Returns
    {sim, ids, x, w, labels, emb_hash, graph_hash}; the log is the caller's to write."""
    sim = simulate(n_prompts=n_prompts, steps=steps, batch_size=batch_size, rollouts=8, seed=seed)
    ids = np.array([p["id"] for p in sim.prompts], dtype=object)
    topics = sorted({p["topic"] for p in sim.prompts})
    rng = np.random.default_rng(0)
    x = np.zeros((n_prompts, 8))
    for i, p in enumerate(sim.prompts):
        x[i, topics.index(p["topic"])] = 1.0
        x[i, 5] = 0.3 * p["level"]
    x += 0.15 * rng.standard_normal(x.shape)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    nbr, simv = exact_knn(x, 8)
    w = mutual_knn_graph(nbr, simv)
    labels = spectral_clustering(w, k, seed=0, fallback_neighbors=nbr)
    write_artifact(d / "emb.zarr", "embeddings", {"ids": ids, "embeddings": x.astype(np.float32)})
    emb_hash = read_artifact(d / "emb.zarr", "embeddings").content_hash
    write_artifact(d / "graph.zarr", "graph", {"ids": ids, "indptr": w.indptr.astype(np.int64),
                                               "indices": w.indices.astype(np.int64),
                                               "data": w.data.astype(np.float32)}, params={"k_nn": 8},
                   inputs={"embeddings": emb_hash})
    graph_hash = read_artifact(d / "graph.zarr", "graph").content_hash
    write_artifact(d / "clusters.zarr", "clusters", {"ids": ids, "labels": labels.astype(np.int64)},
                   params={"states": k}, inputs={"graph": graph_hash})
    return {"sim": sim, "ids": ids, "x": x, "w": w, "labels": labels, "emb_hash": emb_hash, "graph_hash": graph_hash}
