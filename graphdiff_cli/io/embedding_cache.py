"""The embedding cache: the encoder's vectors kept by (encoder identity, exact text), so that ``embed`` and
``extend`` never encode a text twice, whichever artifact, shard or STATE it went into.

Where: ``--cache-dir``, else ``$GRAPHDIFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/graphdiff``, else
``~/.cache/graphdiff``. Inside (docs/reference/artifact-format.md, "The embedding cache")::

    embeddings-v1/<encoder key>/encoder.json    the identity the key hashes (for people; never read back)
    embeddings-v1/<encoder key>/<name>.npz      a shard: one per write, never changed after

The encoder key is the sha256 of the encoder's identity (``backends.embed.encoder_identity``: the model's files,
the recipe, the device kind, the libraries' versions; its name or folder left out). A shard is an uncompressed
NumPy ``.npz`` of three arrays: ``keys`` (n x 32 uint8: the sha256 of each exact text the encoder saw,
instruction included), ``vectors`` (n x d, the encoder's output in its own dtype, float32) and ``meta`` (one
JSON string: format, encoder key, rows, dim, dtype, and the sha256 of the keys' and vectors' bytes). A shard's
name is that sha256's first 32 hex digits.

Writes are atomic (``io.atomic.atomic_write``: a temporary name, fsync, rename): a killed embed leaves at most
a temporary, which no reader opens and the next write here sweeps. A shard is trusted only once its meta, shapes,
dtype and checksum agree; one that does not (truncated, changed on disk, another key's) is removed with a warning
and its texts are embedded again. A hit returns the stored bytes, so the same vectors, bit for bit, as the run
that stored them. The cache is an optimisation: a cache that cannot be read or written costs a warning, never
the command. No typer or rich; the stage decides what to look up and store.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import GraphdiffError
from .atomic import atomic_write, atomic_write_text
from .debris import owner, sweep

ENV = "GRAPHDIFF_CACHE_DIR"
FORMAT = 1
FOLDER = f"embeddings-v{FORMAT}"
KEY_BYTES = 32


def default_cache_dir() -> Path:
    """``$GRAPHDIFF_CACHE_DIR``, else ``$XDG_CACHE_HOME/graphdiff``, else ``~/.cache/graphdiff``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "graphdiff"


def text_key(text: str) -> bytes:
    """The key of one exact text (as the encoder sees it): its UTF-8 bytes' sha256 digest."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def encoder_key(identity: dict) -> str:
    """The sha256 of an encoder's identity, its ``model`` (name or folder) left out."""
    body = {k: v for k, v in identity.items() if k != "model"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def _checksum(keys: np.ndarray, vectors: np.ndarray) -> str:
    h = hashlib.sha256(np.ascontiguousarray(keys).tobytes())
    h.update(np.ascontiguousarray(vectors).tobytes())
    return h.hexdigest()


class DamagedShard(Exception):
    """A shard that is not what its meta says (internal: becomes a warning)."""


class EmbeddingCache:
    """The cached vectors of one encoder (``identity``) under ``root``. ``warnings``: one line per shard found
    damaged, or per read or write that failed."""

    def __init__(self, root, identity: dict):
        self.root = Path(root).expanduser()
        self.identity = identity
        self.key = encoder_key(identity)
        self.folder = self.root / FOLDER / self.key
        self.warnings: list[str] = []

    def _shards(self) -> list[Path]:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.warnings.append(f"embedding cache: cannot read {self.folder} ({exc.strerror}); every text is "
                                 "embedded")
            return []
        return [self.folder / n for n in sorted(names) if n.endswith(".npz") and not n.startswith(".")]

    def _damaged(self, path: Path, why: str) -> None:
        self.warnings.append(f"embedding cache: {path} is damaged ({why}); ignored and removed, its texts are "
                             "embedded again")
        with contextlib.suppress(OSError):
            path.unlink()

    def _read(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        """(keys, vectors) of one shard, checked against its meta and checksum; DamagedShard if they disagree."""
        try:
            with np.load(path, allow_pickle=False) as npz:
                if set(npz.files) != {"keys", "vectors", "meta"}:
                    raise DamagedShard(f"arrays {sorted(npz.files)}")
                meta = json.loads(str(npz["meta"]))
                keys, vectors = npz["keys"], npz["vectors"]
        except DamagedShard:
            raise
        except Exception as exc:  # noqa: BLE001 - a truncated zip, a bad CRC, bad JSON: all mean "do not trust"
            raise DamagedShard(f"{exc.__class__.__name__}: {str(exc)[:120]}") from None
        rows, dim = meta.get("rows"), meta.get("dim")
        if meta.get("format") != FORMAT or meta.get("encoder") != self.key:
            raise DamagedShard("its meta names another format or encoder")
        if keys.dtype != np.uint8 or keys.shape != (rows, KEY_BYTES):
            raise DamagedShard(f"keys {keys.dtype} {keys.shape}, the meta says {rows} rows")
        if str(vectors.dtype) != meta.get("dtype") or vectors.shape != (rows, dim):
            raise DamagedShard(f"vectors {vectors.dtype} {vectors.shape}, the meta says {meta.get('dtype')} "
                               f"({rows}, {dim})")
        if _checksum(keys, vectors) != meta.get("sha256"):
            raise DamagedShard("checksum mismatch")
        return keys, vectors

    def get(self, keys: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray | None]:
        """(positions in ``keys`` found, their vectors in that order) - or (empty, None) when none is. Only
        shards holding a wanted key are read whole and checked; the first shard (by name) holding a key wins."""
        wanted: dict[bytes, list[int]] = {}
        for i, k in enumerate(keys):
            wanted.setdefault(bytes(k), []).append(i)
        found, parts = [], []
        for path in self._shards():
            if not wanted:
                break
            try:
                with np.load(path, allow_pickle=False) as npz:
                    raw = npz["keys"].tobytes()
            except Exception as exc:  # noqa: BLE001
                self._damaged(path, f"{exc.__class__.__name__}: {str(exc)[:120]}")
                continue
            rows = [r for r in range(len(raw) // KEY_BYTES)
                    if raw[r * KEY_BYTES:(r + 1) * KEY_BYTES] in wanted]
            if not rows:
                continue
            try:
                shard_keys, vectors = self._read(path)
            except DamagedShard as why:
                self._damaged(path, str(why))
                continue
            if parts and (vectors.shape[1] != parts[0].shape[1] or vectors.dtype != parts[0].dtype):
                self._damaged(path, f"vectors {vectors.dtype} x {vectors.shape[1]}, the other shards' "
                                    f"{parts[0].dtype} x {parts[0].shape[1]}")
                continue
            take = []
            for r in rows:
                k = shard_keys[r].tobytes()
                if k in wanted:
                    for i in wanted.pop(k):
                        found.append(i)
                        take.append(r)
            parts.append(vectors[take])
        if not found:
            return np.zeros(0, dtype=np.int64), None
        order = np.argsort(found, kind="stable")
        return np.asarray(found, dtype=np.int64)[order], np.concatenate(parts)[order]

    def put(self, keys: Sequence[bytes], vectors: np.ndarray) -> Path | None:
        """Store ``vectors`` (row i: the text of ``keys[i]``) as one new shard; its path, or None when nothing was
        stored (no rows, or a write that failed: a warning)."""
        if not len(keys):
            return None
        k = np.frombuffer(b"".join(bytes(x) for x in keys), dtype=np.uint8).reshape(len(keys), KEY_BYTES)
        v = np.ascontiguousarray(vectors)
        digest = _checksum(k, v)
        meta = {"format": FORMAT, "encoder": self.key, "rows": int(v.shape[0]), "dim": int(v.shape[1]),
                "dtype": str(v.dtype), "sha256": digest}
        path = self.folder / f"{digest[:32]}.npz"
        try:
            if not (self.folder / "encoder.json").exists():
                atomic_write_text(self.folder / "encoder.json", json.dumps(self.identity, indent=1, sort_keys=True)
                                  + "\n")
            for name in os.listdir(self.folder):  # temporaries of writers that died (a killed embed)
                if (who := owner(name)) is not None:
                    sweep(self.folder, who[0])
            buf = io.BytesIO()
            np.savez(buf, keys=k, vectors=v, meta=np.asarray(json.dumps(meta, sort_keys=True)))
            with atomic_write(path, binary=True) as f:
                f.write(buf.getbuffer())
        except (OSError, GraphdiffError) as exc:
            self.warnings.append(f"embedding cache: cannot write to {self.folder} "
                                 f"({getattr(exc, 'strerror', None) or exc}); these vectors are not cached")
            return None
        return path
