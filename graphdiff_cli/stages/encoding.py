"""Texts -> the encoder's raw vectors, each distinct text encoded once and never again: the step ``embed`` and
``extend`` share.

``TextBatch.plan`` finds the distinct texts (a text twice in one file is encoded once) and looks them up in the
embedding cache (``io.embedding_cache``, keyed by the encoder's identity and the exact text); ``encode`` loads
the model only if some text is missing, encodes those, stores them in the cache and returns every row's raw
vector in input order. Normalization and Matryoshka truncation stay the callers' (``core.graph``), so the cache
serves any ``--dim``. No typer or rich.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from ..errors import BackendError
from .progress import Progress, no_progress


@dataclasses.dataclass
class TextBatch:
    """The texts to encode with one encoder: ``first`` (row -> its distinct text's index), the distinct texts and
    their cache keys, the vectors found in the cache for them (``hit``: distinct indices) and what is missing."""

    model: str
    device: str
    texts: list[str]  # the distinct texts, first-seen order
    first: np.ndarray  # input row -> index into texts
    keys: list[bytes]
    hit: np.ndarray
    hit_vectors: np.ndarray | None
    cache: object | None  # io.embedding_cache.EmbeddingCache (None with the cache off, or no text to look up)
    cache_root: object | None  # the cache's folder, None with the cache off
    warnings: list[str]
    encoded: int = 0
    device_used: str | None = None
    native_dim: int | None = None
    load_s: float = 0.0
    encode_s: float = 0.0
    _encoder: object = None

    @classmethod
    def plan(cls, texts: Sequence[str], *, model: str, device: str, cache_dir=None,
             use_cache: bool = True) -> "TextBatch":
        """``texts`` (exactly as the encoder is to see them) with ``model`` on ``device``; the cache at
        ``cache_dir`` (None: ``io.embedding_cache.default_cache_dir()``) unless ``use_cache`` is False."""
        from ..io.embedding_cache import EmbeddingCache, default_cache_dir, text_key

        index: dict[str, int] = {}
        first = np.fromiter((index.setdefault(t, len(index)) for t in texts), dtype=np.int64, count=len(texts))
        distinct = list(index)
        keys = [text_key(t) for t in distinct]
        root = None if not use_cache else (cache_dir if cache_dir is not None else default_cache_dir())
        cache, hit, hit_vectors = None, np.zeros(0, dtype=np.int64), None
        if root is not None and distinct:
            from ..backends.embed import encoder_identity

            cache = EmbeddingCache(root, encoder_identity(model, device))
            hit, hit_vectors = cache.get(keys)
        return cls(model, device, distinct, first, keys, hit, hit_vectors, cache, root,
                   cache.warnings if cache is not None else [])

    @property
    def rows(self) -> int:
        return len(self.first)

    @property
    def duplicates(self) -> int:
        """Rows whose text an earlier row has (encoded, or found, once)."""
        return self.rows - len(self.texts)

    @property
    def missing(self) -> np.ndarray:
        """Indices of the distinct texts the cache does not hold: the ones the encoder will see."""
        have = np.zeros(len(self.texts), dtype=bool)
        have[self.hit] = True
        return np.flatnonzero(~have)

    @property
    def from_cache(self) -> int:
        """Distinct texts whose vector came from the cache (embedded + from_cache + duplicates = rows)."""
        return int(self.hit.size)

    @property
    def cache_dir(self) -> str | None:
        return None if self.cache_root is None else str(self.cache_root)

    def load(self) -> int | None:
        """The encoder's native dimension: the model is loaded only if some text is missing (else the cached
        vectors' width; None with no texts at all)."""
        from ..backends.embed import open_encoder

        if self.native_dim is None and self.missing.size:
            tl = time.perf_counter()
            self._encoder = open_encoder(self.model, self.device)
            self.load_s = time.perf_counter() - tl
            self.device_used, self.native_dim = self._encoder.device, self._encoder.dim_
        elif self.native_dim is None and self.hit_vectors is not None:
            self.native_dim = int(self.hit_vectors.shape[1])
        return self.native_dim

    def encode(self, batch_size: int = 64, progress: Progress = no_progress) -> np.ndarray:
        """Every row's raw vector (rows x native dim, float32) in input order: the cached ones as stored, the
        missing ones encoded (``progress(done, total)`` over them) and stored in the cache."""
        miss = self.missing
        dim = self.load()
        if dim is None:  # no rows at all
            return np.empty((0, 0), dtype=np.float32)
        vectors = np.empty((len(self.texts), dim), dtype=np.float32)
        if miss.size:
            te = time.perf_counter()
            new = self._encoder.encode([self.texts[i] for i in miss], batch_size=batch_size, progress=progress)
            self.encode_s = time.perf_counter() - te
            self.encoded = int(miss.size)
            if self.cache is not None:
                self.cache.put([self.keys[i] for i in miss], new)
            vectors[miss] = new
        if self.hit.size:
            if self.hit_vectors.shape[1] != dim:
                raise BackendError(f"the embedding cache {self.cache.folder} holds {self.hit_vectors.shape[1]}-wide "
                                   f"vectors for this model, which gives {dim}: remove that folder")
            vectors[self.hit] = self.hit_vectors
        return vectors[self.first]

    def summary(self) -> dict:
        """What came from where, for a command's result."""
        return {"rows": self.rows, "embedded": self.encoded, "from_cache": self.from_cache,
                "duplicates": self.duplicates, "cache_dir": self.cache_dir}
