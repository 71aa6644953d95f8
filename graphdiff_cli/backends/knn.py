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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import BackendError, InvalidArgumentError

FAISS_GPU_MAX_K = 2048  # faiss GPU k-selection limit; larger k goes to the torch path
QUERY_BLOCK = 4096


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


def faiss_gpus() -> int:
    try:
        import faiss

        return int(faiss.get_num_gpus()) if hasattr(faiss, "get_num_gpus") else 0
    except Exception:  # noqa: BLE001 - a broken faiss GPU build means "no faiss GPU"
        return 0


def make_search(base: np.ndarray, k: int, device: str = "auto"):
    """The search implementation for ``device`` ("auto" | "cpu" | "cuda"), built over ``base``.

    "auto" uses a GPU only where one works; "cuda" where none works is refused by
    ``backends.device.resolve_device`` with a one-line BackendError.
    """
    from .device import resolve_device

    dev = resolve_device(device)
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


def knn_search(embeddings: np.ndarray, k: int, device: str = "auto",
               progress: Callable[[int, int], None] | None = None, block: int = QUERY_BLOCK) -> KnnResult:
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
    search = make_search(x, k, device)
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
    return KnnResult(nbrs, sims, search.backend, search.device)
