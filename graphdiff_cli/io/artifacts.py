"""Stamped Zarr v3 artifacts, written atomically.

Every artifact is a Zarr v3 group whose root attribute ``graphdiff`` is a stamp:

    {"kind": "graph", "format_version": 1, "graphdiff_version": "0.1.0", "created": ISO-8601 UTC,
     "params": {...the parameters that made it...}, "inputs": {"embeddings": "<content hash>", ...},
     "content_hash": "<hash of this artifact's identifying content>"}

Zarr makes single files atomic, never a whole group, so a group is written into a staging folder next to
its destination and renamed into place: a reader sees the old artifact or the new one, never half of
one. Readers check the kind and its encoding version (``format_version``: one per kind, ``ENCODINGS``) and
turn anything unreadable into one ``ArtifactError``.

Verified reads: the stamp also holds ``checksums`` - a CRC-32C of every chunk row of every array, taken
of the *decoded* values - and ``attrs_hash``, a hash of the other attributes (an estimator's config).
Every read of an array recomputes its chunks' CRCs and every open the attributes' hash, so a chunk that
is missing (Zarr would return its fill value), truncated, flipped or copied from another artifact, or a
hand-edited attribute, is refused in one line instead of read as silently wrong numbers. Both are required:
a stamp without them is refused too (stripping them would otherwise turn every check off; every release
has written them). The stamp's checksums also list the artifact's arrays, so an array whose folder is
deleted is missing, never absent by design. The format is specified in docs/reference/artifact-format.md.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ArtifactError
from .estimator_layout import MODEL_VERSION, STEP_VERSION
from .estimator_layout import VERSION as STATE_VERSION
from .staging import staged_dir

STAMP_KEY = "graphdiff"

# Each kind's encoding version: (the version written, the versions read). A reader takes only those; each
# kind's reader turns every version it lists into what its callers expect (the estimator's: one reader per
# (kind, version) in io.estimator_store, older layouts migrated by graphdiff_cli.estimator.versions). A kind
# not listed (tests', benchmarks') is written and read as version 1. docs/reference/artifact-format.md lists them.
ENCODINGS: dict[str, tuple[int, tuple[int, ...]]] = {
    "embeddings": (1, (1,)),
    "graph": (1, (1,)),
    "clusters": (1, (1,)),
    "estimator-model": (MODEL_VERSION, (1, MODEL_VERSION)),
    "estimator-state": (STATE_VERSION, (1, 7, 8, STATE_VERSION)),
    "estimator-step": (STEP_VERSION, (1, 7, 8, 9, STEP_VERSION)),
}


def encoding_version(kind: str) -> int:
    """The encoding version ``write_artifact`` stamps an artifact of ``kind`` with."""
    return ENCODINGS.get(kind, (1, (1,)))[0]


def readable_versions(kind: str) -> tuple[int, ...]:
    """The encoding versions of ``kind`` that ``read_artifact`` opens."""
    return ENCODINGS.get(kind, (1, (1,)))[1]


def graphdiff_version() -> str:
    from .._version import __version__

    return __version__


def hash_arrays(*arrays: np.ndarray, extra: str = "") -> str:
    """A short, stable content hash (sha256, 16 hex digits) of arrays' dtype, shape and bytes."""
    h = hashlib.sha256()
    for arr in arrays:
        arr = np.asarray(arr)
        if arr.dtype.kind in "OUT":  # text: hash the UTF-8 content, never object pointers
            h.update(b"text" + str(arr.shape).encode())
            h.update("\x1f".join(str(v) for v in arr.reshape(-1)).encode("utf-8"))
            continue
        arr = np.ascontiguousarray(arr)
        h.update(str(arr.dtype).encode())
        h.update(str(arr.shape).encode())
        h.update(memoryview(arr).cast("B") if arr.size else b"")  # the bytes, without a copy
    h.update(extra.encode())
    return h.hexdigest()[:16]


def hash_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Artifact:
    """An opened artifact: its path, stamp and zarr group (arrays are read on access)."""

    path: Path
    stamp: dict
    group: object

    @property
    def kind(self) -> str:
        return self.stamp["kind"]

    @property
    def version(self) -> int:
        """Its kind's encoding version (``ENCODINGS``)."""
        return self.stamp["format_version"]

    @property
    def params(self) -> dict:
        return self.stamp.get("params", {})

    @property
    def inputs(self) -> dict:
        return self.stamp.get("inputs", {})

    @property
    def content_hash(self) -> str:
        return self.stamp["content_hash"]

    @property
    def names(self) -> tuple[str, ...]:
        """Its arrays, as its stamp's checksums list them (every array it was written with), sorted."""
        return tuple(sorted(self.stamp["checksums"]["arrays"]))

    def array(self, name: str) -> np.ndarray:
        """The whole array, checked against the checksums written with it; text arrays come back as numpy
        object arrays of ``str``."""
        sums = self.stamp["checksums"]["arrays"].get(name)
        if sums is None:
            raise ArtifactError(f"{self.path}: has no array {name!r} (its stamp lists {', '.join(self.names)}); "
                                f"{_FIX}")
        out = self.read_unchecked(name)
        got = chunk_checksums(out, sums["rows"])
        if got != sums["crc"]:
            bad = [i for i, (a, b) in enumerate(zip(got, sums["crc"])) if a != b] or [len(got)]
            rows = sums["rows"]
            where = ", ".join(f"rows {i * rows}..{(i + 1) * rows - 1}" for i in bad[:3]) if rows else "its value"
            raise ArtifactError(f"{self.path}: array {name!r} is damaged ({where} do not match the checksum written "
                                f"with it: a missing, altered or swapped chunk); {_FIX}")
        return out

    def read_unchecked(self, name: str) -> np.ndarray:
        """The array as Zarr decodes it, without the checksum check: what ``array`` reads before checking it.
        graphdiff reads through ``array``; this is public so that bench/verified_reads.py can time the two.

        Numeric arrays are read one chunk row at a time into the result: zarr reads a whole selection's
        chunks concurrently, which holds many decoded chunks at once beside the result (about +90 MB
        for a 150k x 320 float32 q); slab by slab the overhead is one chunk.
        """
        try:
            z = self.group[name]
            if z.ndim == 0 or z.dtype.kind not in "biuf" or z.shape[0] <= z.chunks[0]:
                arr = np.asarray(z[...])
                out = arr.astype(object) if arr.dtype.kind in "UT" else arr
            else:
                out = np.empty(z.shape, dtype=z.dtype)
                step = z.chunks[0]
                for start in range(0, z.shape[0], step):
                    out[start:start + step] = z[start:start + step]
        except Exception as exc:  # noqa: BLE001 - a missing or corrupt chunk is a damaged artifact
            raise ArtifactError(f"{self.path}: array {name!r} is missing or damaged ({exc.__class__.__name__}); "
                                f"{_FIX}") from exc
        return out

    def attr(self, name: str, default=None):
        return self.group.attrs.get(name, default)


_FIX = ("rollback a STATE to an intact step (graphdiff rollback --to), or re-create the artifact with the "
        "command that made it")


CHECKSUM = "crc32c of decoded chunk rows"


def chunk_checksums(arr: np.ndarray, rows: int) -> list[int]:
    """CRC-32C (google_crc32c: the CPU's CRC instruction, about 5 GB/s) of the decoded values of ``arr`` in
    slabs of ``rows`` rows along the first axis (0: the whole array as one). Text arrays: of the UTF-8 of
    their strings joined by U+001F."""
    import google_crc32c

    arr = np.asarray(arr)
    if arr.dtype.kind in "OUT":
        def crc(a):
            return google_crc32c.value("\x1f".join(str(v) for v in a.reshape(-1)).encode("utf-8"))
    else:
        if not arr.dtype.isnative:  # as read back: native byte order (zarr hands back '<f4', native here:
            arr = arr.astype(arr.dtype.newbyteorder("="))  # a test of byteorder "=" copied every array, 5.9 s at 1M)

        def crc(a):
            a = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # row slabs of a C array: views, no copy
            a.flags.writeable = False  # the C extension takes read-only buffers only
            return google_crc32c.value(a) if a.size else 0
    if arr.ndim == 0 or rows <= 0:
        return [crc(arr)]
    return [crc(arr[start:start + rows]) for start in range(0, arr.shape[0], rows)] or [0]


def attrs_hash(attrs: dict) -> str:
    """Hash of an artifact's attributes other than the stamp (their canonical JSON)."""
    body = {k: v for k, v in attrs.items() if k != STAMP_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_artifact(path, kind: str, arrays: dict[str, np.ndarray], *, params: dict | None = None,
                   inputs: dict | None = None, content_hash: str | None = None, attrs: dict | None = None,
                   durable: bool = True, before_replace=None) -> Path:
    """Write arrays and a stamp as a Zarr v3 group at ``path``, atomically (staging + rename).

    ``content_hash`` identifies the artifact's content for downstream input checks; by default it is
    the hash of all arrays. ``attrs`` are extra JSON attributes stored next to the stamp. An existing
    artifact at ``path`` is replaced; a crash at any point leaves either it or the new one.
    ``before_replace(path)`` runs just before the rename (``staging.staged_dir``): a writer that may
    replace only some things checks ``path`` there.
    """
    path = Path(path)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="graphdiff-hash") as hasher, \
            staged_dir(path, replace=True, durable=durable, before_replace=before_replace) as staging:
        # the content hash beside the chunks' encoding and writes (sha256 releases the GIL): 0.77 s of a
        # million-prompt step's 2.7 s write that no longer adds to it
        content = None if content_hash else hasher.submit(hash_arrays, *arrays.values(), extra=kind)
        arrays = {name: np.asarray(arr) for name, arr in arrays.items()}
        checksums = {}
        for name, arr in arrays.items():
            if arr.dtype.kind in "UOT":
                checksums[name] = {"rows": 0, "crc": chunk_checksums(arr, 0)}
            else:
                rows = chunk_shape(arr)[0] if arr.ndim else 0
                checksums[name] = {"rows": int(rows), "crc": chunk_checksums(arr, rows)}

        def attributes() -> dict:  # once the chunks are written: the content hash may still be running
            stamp = {
                "kind": kind,
                "format_version": encoding_version(kind),
                "graphdiff_version": graphdiff_version(),
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "params": _jsonable(params or {}),
                "inputs": _jsonable(inputs or {}),
                "content_hash": content_hash if content is None else content.result(),
                "checksums": {"algorithm": CHECKSUM, "arrays": checksums},
                "attrs_hash": attrs_hash(_jsonable(attrs or {})),
            }
            return {STAMP_KEY: stamp, **_jsonable(attrs or {})}

        write_group(staging, arrays, attributes, in_flight=_write_budget())
    return path


def write_group(folder: Path, arrays: dict[str, np.ndarray], attributes: Callable[[], dict], *,
                in_flight: int) -> None:
    """Write ``arrays`` as the arrays of a new Zarr v3 group in the empty ``folder``, all of them together.

    One coroutine on zarr's event loop creates every array and writes their chunks concurrently, so a step's
    ~30 small arrays cost one round trip to that loop instead of two or more each (the commit's time:
    docs/lab/performance.md, "The commit's arrays written together"). Every write is one chunk, so a failed one
    raises only once every other has ended. ``in_flight`` bounds the bytes handed to zarr at once (a chunk larger
    than it runs alone; 0: one chunk after another). ``attributes()`` (the group's, called in a worker thread once
    every chunk is written, so it may wait for work running beside the writes, but must not call zarr: it holds
    one of zarr's loop's workers) goes into the group's ``zarr.json`` last. Whatever ends the wait in this thread
    (ctrl-C, SIGTERM) stops the writes not yet started and is raised once those running have ended, so nothing
    writes into ``folder`` after this returns or raises.
    """
    import asyncio
    import threading

    import zarr.api.asynchronous as azarr
    from zarr.core.sync import sync
    from zarr.storage import LocalStore

    # set by this thread when it stops waiting (ctrl-C, SIGTERM: a KeyboardInterrupt in sync()); the coroutine
    # would otherwise go on writing after the staging folder is removed, making it again (LocalStore makes a
    # chunk's parent folders) with every array and the stamp in it
    stop, started, ended = threading.Event(), threading.Event(), threading.Event()

    async def write() -> None:
        try:
            started.set()
            if stop.is_set():  # interrupted before it began
                raise _Stopped()
            group = await azarr.open_group(store=LocalStore(folder), mode="w")
            made = await _all(_create(group, name, arr) for name, arr in arrays.items())
            budget = _ByteBudget(in_flight, stop)
            units = [(z, arr, sel, cost) for z, arr in zip(made, arrays.values()) for sel, cost in _pieces(arr)]
            await _all(budget.run(cost, _put(z, arr, sel)) for z, arr, sel, cost in units)
            attrs = await asyncio.to_thread(attributes)
            if stop.is_set():
                raise _Stopped()
            await group.update_attributes(attrs)
        finally:
            ended.set()

    async def _all(coros):  # every write finished (none left running into a staging folder being removed)
        results = await asyncio.gather(*coros, return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            raise failed
        return results

    try:
        sync(write())
    except BaseException:
        stop.set()  # no write starts after this (write() and _ByteBudget look), and those running end first
        if started.is_set():
            ended.wait()  # a second ctrl-C ends the wait
        raise


class _Stopped(Exception):
    """The thread waiting on ``write_group``'s coroutine stopped waiting: no further write is started."""


# chunk files named c.0.0 beside the array's zarr.json, not c/0/0: no folders of folders to create, fsync and remove
# (a 150,000-prompt step artifact: 82 files and folders instead of 116); a reader follows whichever separator an
# array's metadata names, so artifacts written with "/" read as before
CHUNK_KEYS = {"name": "default", "separator": "."}


def _is_text(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "UOT"  # text (prompt ids): Zarr v3 variable-length strings, 64 bytes a row counted


async def _create(group, name: str, arr: np.ndarray):
    return await group.create_array(name, shape=arr.shape, dtype=str if _is_text(arr) else arr.dtype,
                                    chunks=chunk_shape(arr, itemsize=64 if _is_text(arr) else None),
                                    chunk_key_encoding=CHUNK_KEYS)


def _pieces(arr: np.ndarray):
    """(selection, bytes) of the writes of ``arr``: one chunk each (its first axis's chunk rows), none for an
    empty array. One chunk a write: zarr raises a write's first failed chunk at once, while its others go on."""
    if arr.ndim == 0:
        yield Ellipsis, max(1, arr.nbytes)
        return
    text = _is_text(arr)
    rows = chunk_shape(arr, itemsize=64 if text else None)[0]
    row_bytes = 64 * max(1, arr.size // max(1, arr.shape[0])) if text else arr.nbytes // max(1, arr.shape[0])
    for start in range(0, arr.shape[0], rows):
        stop = min(start + rows, arr.shape[0])
        yield slice(start, stop), (stop - start) * row_bytes


async def _put(z, arr: np.ndarray, sel) -> None:
    """Write ``arr[sel]`` into ``z`` (text as the object array of ``str`` zarr takes, made only now)."""
    values = arr[sel]
    await z.setitem(sel, values.astype(object) if _is_text(arr) else values)


class _ByteBudget:
    """At most ``limit`` bytes of writes handed to zarr at once (one write at a time when 0; a write larger
    than the budget waits until it is alone); once ``stop`` (a ``threading.Event``) is set, none is started."""

    def __init__(self, limit: int, stop=None):
        import asyncio

        self.limit, self.used, self.busy, self.stop = limit, 0, 0, stop
        self.cond = asyncio.Condition()

    async def run(self, cost: int, coro):
        async with self.cond:
            await self.cond.wait_for(lambda: self.busy == 0 or (self.limit and self.used + cost <= self.limit))
            if self.stop is not None and self.stop.is_set():  # the writer was interrupted: start nothing more
                coro.close()
                raise _Stopped()
            self.used, self.busy = self.used + cost, self.busy + 1
        try:
            await coro
        finally:
            async with self.cond:
                self.used, self.busy = self.used - cost, self.busy - 1
                self.cond.notify_all()


def _write_budget() -> int:
    """Bytes of array writes in flight at once: as many as ``write_slab_chunks`` chunks of 16 MiB."""
    return write_slab_chunks() * (16 << 20)


def write_slab_chunks() -> int:
    """16 MiB chunks handed to zarr at once when writing: zarr encodes them concurrently (a 320 MB float32 array:
    0.89 s one at a time, 0.68-0.80 s two, 0.62 s four on the 2-core VM), one more chunk held each.
    The CPUs this process may use, at most 4."""
    from ..core.graph import usable_cpus

    return min(usable_cpus(), 4)


def chunk_shape(arr: np.ndarray, itemsize: int | None = None):
    """Chunks of about 16 MiB along the first axis: few files, cheap partial reads."""
    if arr.ndim == 0:
        return ()
    if arr.size == 0:
        return tuple(max(1, d) for d in arr.shape)
    row_bytes = max(1, (itemsize or arr.itemsize) * int(np.prod(arr.shape[1:])))
    rows = max(1, min(arr.shape[0], (16 << 20) // row_bytes))
    return (rows,) + tuple(arr.shape[1:])


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=_json_default))


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON-serializable: {type(o).__name__}")


def _article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def stamped_kind(path) -> str | None:
    """The ``kind`` in the stamp of the folder ``path``, or None when it holds no readable stamp (a plain
    folder, a Zarr group graphdiff did not write, a damaged ``zarr.json``). Reads the JSON only: no check
    of the format version or the checksums (``read_artifact`` makes those)."""
    try:
        stamp = json.loads((Path(path) / "zarr.json").read_text())["attributes"][STAMP_KEY]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    kind = stamp.get("kind") if isinstance(stamp, dict) else None
    return kind if isinstance(kind, str) else None


def read_artifact(path, kind: str | tuple[str, ...]) -> Artifact:
    """Open an artifact and check its stamp; any problem becomes one ``ArtifactError`` line."""
    import zarr
    from zarr.storage import LocalStore

    path = Path(path)
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    want = " or ".join(kinds)
    if not path.exists():
        raise ArtifactError(f"{path}: no such {want} artifact")
    if not (path / "zarr.json").is_file():
        raise ArtifactError(f"{path}: not a graphdiff artifact (no zarr.json); expected a {want} artifact")
    try:
        group = zarr.open_group(LocalStore(path, read_only=True), mode="r")
        stamp = dict(group.attrs.get(STAMP_KEY) or {})
    except Exception as exc:  # noqa: BLE001
        raise ArtifactError(f"{path}: damaged artifact, cannot be opened ({exc.__class__.__name__})") from exc
    if not stamp or "kind" not in stamp:
        raise ArtifactError(f"{path}: not a graphdiff artifact (no stamp); expected a {want} artifact")
    if stamp["kind"] not in kinds:
        raise ArtifactError(f"{path}: is {_article(stamp['kind'])} artifact, expected {_article(want)} artifact")
    version, known = stamp.get("format_version"), readable_versions(stamp["kind"])
    if version not in known:
        raise ArtifactError(f"{path}: {stamp['kind']} artifact has encoding version {version}; this graphdiff reads "
                            f"version{'s' if len(known) > 1 else ''} {', '.join(map(str, known))}: re-create it "
                            "with this version")
    _check_stamp_checks(path, stamp)
    if attrs_hash(dict(group.attrs)) != stamp["attrs_hash"]:
        raise ArtifactError(f"{path}: the attributes in its zarr.json were altered after it was written (they no "
                            f"longer match their hash); {_FIX}")
    return Artifact(path=path, stamp=stamp, group=group)


def _check_stamp_checks(path: Path, stamp: dict) -> None:
    """Refuse a stamp without its checksums and attributes hash, or with ones of another shape: removing them
    must not turn the checks off. Every graphdiff since 784e05e (2026-11-24) has written both, the previous
    release 79a4679 included (tests/data/legacy_79a4679), so a stamp without them was stripped, or written by a
    development build older than any release (docs/reference/artifact-format.md, "Verified reads")."""
    checks = stamp.get("checksums")
    if not isinstance(checks, dict) or not isinstance(stamp.get("attrs_hash"), str):
        raise ArtifactError(f"{path}: its stamp lacks its checksums or attributes hash (damaged, or stripped after it "
                            f"was written), so its content cannot be verified and it is not read; {_FIX}")
    if checks.get("algorithm") != CHECKSUM:
        raise ArtifactError(f"{path}: checksums of an unknown kind ({str(checks.get('algorithm'))[:60]!r}); re-create "
                            "the artifact with this graphdiff")
    arrays = checks.get("arrays")
    if not isinstance(arrays, dict) or not all(
            isinstance(c, dict) and isinstance(c.get("rows"), int) and isinstance(c.get("crc"), list)
            for c in arrays.values()):
        raise ArtifactError(f"{path}: the checksums in its stamp are damaged; {_FIX}")


def has_array(art, name: str) -> bool:
    """Whether artifact ``art`` was written with an array ``name`` (its stamp lists it; arrays added by later
    versions may be absent). A listed array whose files are gone is there, and damaged: reading it says so."""
    return name in art.stamp["checksums"]["arrays"]
