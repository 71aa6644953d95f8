"""Public helpers for in-process users (``graphdiff_cli.load_graph``, ``load_clusters``, ``load_embeddings``,
``prompt_index``): a STATE's or an artifact's prompts, graph, clusters and embeddings, read and checked as every graphdiff command reads them."""

from __future__ import annotations

from pathlib import Path

from .artifacts import read_artifact
from .estimator_store import is_state_dir
from .readers import IdIndex, read_clusters, read_graph
from .state_dir import StateDir


def load_graph(path):
    """``(W, ids)``: the similarity graph of a graph artifact or of a STATE directory as a symmetric
    ``scipy.sparse.csr_matrix`` (row/column i = prompt ``ids[i]``), checked like every graphdiff read."""
    path = Path(path)
    if is_state_dir(path):
        _art, ids, w, _labels, _config = StateDir.open(path).model()
        return w, list(ids)
    g = read_graph(path)
    return g.w, g.ids


def load_clusters(path, graph=None):
    """``(labels, K)``: each prompt's spectral state in [0, K) from a clusters artifact, in its graph's node order
    (what ``Estimator(W, labels, n_states=K)`` takes). Given ``graph`` (its graph artifact), the clusters must
    have been made from it: provenance and ids are checked."""
    c = read_clusters(path, read_graph(graph) if graph is not None else None)
    return c.labels, c.k


def load_embeddings(path, graph):
    """The unit embeddings (N x d, float32) of an embeddings artifact in the node order of ``graph`` (the graph
    artifact built from them: provenance and ids are checked), what ``Estimator(..., embeddings=E)`` takes for
    the read-out of the embedding."""
    from .readers import embedding_matrix

    return embedding_matrix(path, read_graph(graph)).astype("float32")


def prompt_index(path) -> IdIndex:
    """The prompts of a STATE directory or of any graphdiff artifact with ids (embeddings, graph, clusters) as
    an ``IdIndex``: ``index.nodes(ids)`` -> node indices (an unknown id is refused in one line),
    ``index.ids[i]`` -> the id of node i, ``index.get(id)`` -> its node or None."""
    path = Path(path)
    if is_state_dir(path):
        return StateDir.open(path).id_index()
    art = read_artifact(path, ("embeddings", "graph", "clusters"))
    return IdIndex([str(x) for x in art.array("ids")], f"the prompts of {path}")
