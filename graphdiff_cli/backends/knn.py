"""Exact inner-product k-nearest-neighbour search over L2-normalized embeddings (Section 3.3).

On unit vectors the inner product is the cosine similarity c_ij = phi_i . phi_j, so an exact flat
inner-product index ("flat-ip") gives the k_nn most similar prompts of every prompt. One interface,
three implementations chosen once by ``make_search`` (CPU/GPU by interface, not by ``if``):

- ``FaissCpuSearch``: faiss ``IndexFlatIP`` on the CPU (always available).
- ``FaissGpuSearch``: faiss ``GpuIndexFlatIP`` where faiss was built with GPU support
  (``faiss.get_num_gpus() > 0``, the ``gpu`` extra).
- ``TorchCudaSearch``: the same exact search as a blocked matmul + top-k in torch, used on a working
  CUDA GPU when the installed faiss is CPU-only (the default ``faiss-cpu`` wheel).

All return, per query, the most similar base rows first; a query set equal to the base set returns
each row itself among its hits, which ``core.graph.drop_self`` removes.

For millions of prompts, two approximate faiss indexes (beyond the paper, which searched exactly):

- ``FaissHnswSearch`` (``index="hnsw"``): ``IndexHNSWFlat`` with the inner-product metric, CPU only
  (faiss has no GPU HNSW); M = 32 links, efConstruction = 200, efSearch = max(``ef_search``, 2 k).
- ``FaissIvfSearch`` (``index="ivf"``): ``IndexIVFFlat`` over ``nlist`` = 4 sqrt(N) inverted lists
  (at least 39 training points per list, faiss's rule), trained on up to 256 points per list, probing
  ``nprobe`` lists (default max(16, nlist / 8)); on a faiss GPU build the index moves to GPU 0.

Their recall is measured, never assumed: ``sampled_recall`` compares the hits of a random sample of
queries against an exact search of those queries, and `graphdiff build-graph` stamps it in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import BackendError, InvalidArgumentError

FAISS_GPU_MAX_K = 2048  # faiss GPU k-selection limit; larger k goes to the torch path
QUERY_BLOCK = 4096
INDEXES = ("exact", "hnsw", "ivf")
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128
IVF_MIN_POINTS_PER_LIST, IVF_TRAIN_POINTS_PER_LIST = 39, 256


class FaissCpuSearch:
    """Exact inner-product search with faiss IndexFlatIP on the CPU."""

    backend = "faiss-cpu"
    device = "cpu"

    def __init__(self, base: np.ndarray):
        import faiss

        self.index_ = self._make_index(faiss, base.shape[1])
        self.index_.add(base)

    def _make_index(self, faiss, dim: int):
        return faiss.IndexFlatIP(dim)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(neighbors int64 q x k, similarities float32 q x k), most similar first."""
        sims, nbrs = self.index_.search(queries, k)
        return nbrs.astype(np.int64, copy=False), sims.astype(np.float32, copy=False)


class FaissGpuSearch(FaissCpuSearch):
    """The same index on GPU 0 (faiss built with GPU support)."""

    backend = "faiss-gpu"
    device = "cuda"

    def _make_index(self, faiss, dim: int):
        self.resources_ = faiss.StandardGpuResources()
        return faiss.GpuIndexFlatIP(self.resources_, dim)


class TorchCudaSearch:
    """Exact inner-product search as blocked matmul + top-k on a CUDA GPU (float32 throughout)."""

    backend = "torch-cuda"
    device = "cuda"

    def __init__(self, base: np.ndarray):
        import torch

        self.torch_ = torch
        self.base_ = torch.from_numpy(base).to("cuda")

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        torch = self.torch_
        n = self.base_.shape[0]
        rows = max(1, (1 << 28) // max(n, 1))  # keep the q x N similarity block under ~1 GiB
        idx_out, val_out = [], []
        saved = torch.backends.cuda.matmul.allow_tf32
        # full float32: TF32 matmuls would reorder near-ties that the CPU index keeps apart
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            for s in range(0, queries.shape[0], rows):
                q = torch.from_numpy(queries[s:s + rows]).to("cuda")
                vals, idx = torch.topk(q @ self.base_.T, k, dim=1, largest=True, sorted=True)
                idx_out.append(idx.cpu().numpy())
                val_out.append(vals.cpu().numpy())
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
        return (np.concatenate(idx_out).astype(np.int64, copy=False),
                np.concatenate(val_out).astype(np.float32, copy=False))


class FaissHnswSearch(FaissCpuSearch):
    """Approximate inner-product search with faiss IndexHNSWFlat (CPU)."""

    backend = "faiss-hnsw"

    def __init__(self, base: np.ndarray, k: int, ef_search: int | None = None):
        import faiss

        self.index_ = faiss.IndexHNSWFlat(base.shape[1], HNSW_M, faiss.METRIC_INNER_PRODUCT)
        self.index_.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        self.index_.add(base)
        self.index_.hnsw.efSearch = max(int(ef_search or HNSW_EF_SEARCH), 2 * k)
        self.params = {"M": HNSW_M, "ef_construction": HNSW_EF_CONSTRUCTION, "ef_search": self.index_.hnsw.efSearch}


class FaissIvfSearch(FaissCpuSearch):
    """Approximate inner-product search with faiss IndexIVFFlat (GPU 0 on a faiss GPU build)."""

    backend = "faiss-ivf"

    def __init__(self, base: np.ndarray, k: int, nprobe: int | None = None, gpu: bool = False, seed: int = 0):
        import faiss

        n, dim = base.shape
        nlist = int(max(1, min(round(4 * np.sqrt(n)), n // IVF_MIN_POINTS_PER_LIST)))
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        train = base
        if n > IVF_TRAIN_POINTS_PER_LIST * nlist:
            pick = np.random.default_rng(seed).choice(n, IVF_TRAIN_POINTS_PER_LIST * nlist, replace=False)
            train = base[np.sort(pick)]
        if gpu:
            self.resources_ = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self.resources_, 0, index)
            self.backend, self.device = "faiss-ivf-gpu", "cuda"
        index.train(np.ascontiguousarray(train))
        index.add(base)
        index.nprobe = int(min(nlist, nprobe or max(16, nlist // 8)))
        self.index_ = index
        self.quantizer_ = quantizer  # the IVF index does not own it
        self.params = {"nlist": nlist, "nprobe": int(index.nprobe), "train_points": int(train.shape[0])}


def sampled_recall(x: np.ndarray, neighbors: np.ndarray, sample: int = 1000, seed: int = 0) -> dict:
    """Recall of approximate hits against exact search, on ``sample`` random queries.

    ``neighbors`` are the approximate N x k hits (self included, as ``knn_search`` returns them). For
    each sampled row the exact top k by inner product is computed directly (numpy); recall is the
    share of exact hits that the approximate list contains, averaged over the sample (ties at the k-th
    similarity count as found).
    """
    n, k = neighbors.shape
    rows = np.sort(np.random.default_rng(seed).choice(n, size=min(sample, n), replace=False))
    found = 0
    block = max(1, min(256, (1 << 26) // max(n, 1)))  # keep the block x N similarities near 256 MB
    for start in range(0, rows.size, block):
        r = rows[start:start + block]
        sims = x[r] @ x.T
        kth = -np.partition(-sims, k - 1, axis=1)[:, k - 1]
        nb = neighbors[r]
        approx_sims = np.where(nb >= 0, np.take_along_axis(sims, np.maximum(nb, 0), axis=1), -np.inf)
        found += int((approx_sims >= kth[:, None] - 1e-6).sum())
    return {"recall": found / (rows.size * k), "sample": int(rows.size), "k": int(k)}


def faiss_gpus() -> int:
    try:
        import faiss

        return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    except Exception:  # noqa: BLE001 - a broken faiss GPU build means "no faiss GPU"
        return 0


def make_search(base: np.ndarray, k: int, device: str = "auto", index: str = "exact",
                nprobe: int | None = None, ef_search: int | None = None):
    """The search implementation for ``device`` ("auto" | "cpu" | "cuda") and ``index`` ("exact" |
    "hnsw" | "ivf"), built over ``base``.

    "auto" uses a GPU only where one works; "cuda" where none works is refused by
    ``backends.device.resolve_device`` with a one-line BackendError. HNSW runs on the CPU whatever the
    device; IVF uses the GPU only on a faiss GPU build.
    """
    from .device import resolve_device

    if index not in INDEXES:
        raise InvalidArgumentError(f"unknown index {index!r}; choose one of {', '.join(INDEXES)}")
    dev = resolve_device(device)
    if index == "hnsw":
        return FaissHnswSearch(base, k, ef_search=ef_search)
    if index == "ivf":
        return FaissIvfSearch(base, k, nprobe=nprobe, gpu=dev.type == "cuda" and faiss_gpus() > 0)
    if dev.type == "cpu":
        return FaissCpuSearch(base)
    if faiss_gpus() > 0 and k <= FAISS_GPU_MAX_K:
        return FaissGpuSearch(base)
    return TorchCudaSearch(base)


@dataclass(frozen=True)
class KnnResult:
    neighbors: np.ndarray  # int64 N x k_search, most similar first (self included)
    similarities: np.ndarray  # float32 N x k_search
    backend: str
    device: str
    params: dict = field(default_factory=dict)  # the approximate index's settings ({} for exact)


def knn_search(embeddings: np.ndarray, k: int, device: str = "auto",
               progress: Callable[[int, int], None] | None = None, block: int = QUERY_BLOCK,
               index: str = "exact", nprobe: int | None = None, ef_search: int | None = None) -> KnnResult:
    """Search every row of ``embeddings`` (L2-normalized, N x D) against all rows for its k best hits.

    The query set equals the base set, so callers wanting k neighbours other than self ask for k + 1
    and pass the result to ``core.graph.drop_self``.
    """
    x = np.ascontiguousarray(embeddings, dtype=np.float32)
    if x.ndim != 2:
        raise InvalidArgumentError(f"embeddings must be a 2-D array, got shape {x.shape}")
    n = x.shape[0]
    if not 1 <= k <= n:
        raise InvalidArgumentError(f"cannot search {k} neighbours among {n} rows")
    search = make_search(x, k, device, index=index, nprobe=nprobe, ef_search=ef_search)
    nbrs = np.empty((n, k), dtype=np.int64)
    sims = np.empty((n, k), dtype=np.float32)
    if progress:
        progress(0, n)
    try:
        for start in range(0, n, block):
            stop = min(n, start + block)
            nbrs[start:stop], sims[start:stop] = search.search(x[start:stop], k)
            if progress:
                progress(stop, n)
    except (RuntimeError, MemoryError) as exc:
        raise BackendError(f"{search.backend} neighbour search failed ({exc.__class__.__name__}: "
                           f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''})") from None
    return KnnResult(nbrs, sims, search.backend, search.device, dict(getattr(search, "params", {})))
