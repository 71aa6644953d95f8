"""Small graph / clusters artifacts and STATE helpers for the handoff tests (no embedding model).

The artifacts follow the schemas ``build-graph`` and ``cluster`` write (kinds "graph" and "clusters"),
made here directly with ``io.artifacts.write_artifact`` from random clustered embeddings.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from graphdiff_cli.core.graph import drop_self, exact_knn, mutual_knn_graph
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.io.artifacts import hash_arrays, write_artifact

REPO = Path(__file__).resolve().parents[1]
GRAPHDIFF = REPO / ".venv" / "bin" / "graphdiff"


def make_inputs(folder: Path, n: int = 48, k_states: int = 4, k_nn: int = 6, seed: int = 0,
                prefix: str = "q") -> tuple[Path, Path, list[str]]:
    """(graph.zarr, clusters.zarr, ids) for ``n`` prompts in ``k_states`` planted topics."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k_states, 16))
    topic = np.arange(n) % k_states
    x = centers[topic] + 0.3 * rng.normal(size=(n, 16))
    nbr, sim = exact_knn(x, k_nn)
    nbr, sim = drop_self(nbr, sim, k_nn)
    w = mutual_knn_graph(nbr, sim)
    ids = [f"{prefix}{i:03d}" for i in range(n)]
    ids_arr = np.asarray(ids, dtype=str)
    arrays = {"ids": ids_arr.astype(object), "indptr": w.indptr.astype(np.int64),
              "indices": w.indices.astype(np.int64), "data": w.data.astype(np.float32),
              "knn_indices": nbr.astype(np.int64)}
    g_hash = hash_arrays(ids_arr, arrays["indptr"], arrays["indices"], arrays["data"], arrays["knn_indices"],
                         extra="graph")
    graph = write_artifact(folder / "graph.zarr", "graph", arrays, params={"k_nn": k_nn},
                           inputs={"embeddings": "test"}, content_hash=g_hash, durable=False)
    labels = spectral_clustering(w, k_states, seed=0, fallback_neighbors=nbr).astype(np.int64)
    clusters = write_clusters(folder / "clusters.zarr", ids, labels, k_states, g_hash)
    return graph, clusters, ids


def write_clusters(path: Path, ids, labels, k_states: int, graph_hash: str) -> Path:
    ids_arr = np.asarray(list(ids), dtype=str)
    return write_artifact(path, "clusters", {"ids": ids_arr.astype(object), "labels": np.asarray(labels)},
                          params={"states": int(k_states), "seed": 0}, inputs={"graph": graph_hash},
                          content_hash=hash_arrays(ids_arr, np.asarray(labels), extra="clusters"), durable=False)


def tree_hash(root: Path) -> str:
    """Hash of every path, folder and file byte under ``root`` (to prove a refusal changed nothing)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        h.update(f"D {rel}\n".encode())
        for name in sorted(filenames):
            p = Path(dirpath) / name
            h.update(f"F {os.path.join(rel, name)}\n".encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def write_outcomes(path: Path, rows: list[dict]) -> Path:
    """Rows as JSONL, CSV or Parquet by the extension."""
    path = Path(path)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".csv":
        cols = list(rows[0].keys())
        path.write_text(",".join(cols) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n" for r in rows),
                        encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({c: [r[c] for r in rows] for c in rows[0]}), path)
    return path


def step_rows(ids, step: int, batch: int = 12, n: int = 8, seed: int = 0) -> list[dict]:
    """A deterministic batch of counts rows for ``step`` (prompt difficulty by id position)."""
    rng = np.random.default_rng(1000 * seed + step)
    pick = rng.choice(len(ids), size=batch, replace=False)
    p_true = np.linspace(0.05, 0.95, len(ids))
    return [{"id": ids[i], "n": n, "s": int(rng.binomial(n, p_true[i]))} for i in pick]
