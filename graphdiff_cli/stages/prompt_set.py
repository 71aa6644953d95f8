"""Growing and shrinking a STATE's prompt set mid-training: ``graphdiff extend`` and ``graphdiff retire``.

``extend`` adds prompts without rebuilding anything: it embeds only the new prompts with the encoder,
instruction and dimension the STATE's embeddings were made with, finds their neighbours among all
prompts by exact search with the graph's k (``core.graph.extend_mutual_knn``: the same W a rebuild
from scratch gives), updates the old prompts' lists where a new prompt enters them, gives each new
prompt a prior state from its neighbours' states (``core.spectral.label_new_nodes``), grows the
estimator (``Estimator.extend``: nothing learned is lost) and commits it all as the next revision of
the current step, with a new model artifact. ``retire`` takes prompts out of the candidate set (predict,
select and allocate skip them) while their evidence stays; ``retire --restore`` brings them back.

What the STATE keeps for this (docs/reference/handoff.md): the model holds the directed kNN lists and their
similarities, the embeddings of every added prompt, and ``joined`` (the step at which each prompt
joined); it names the embeddings artifact it was built from by path and content hash (``init``
records it; ``--embeddings`` points at a moved copy, which must have the same hash). No typer or rich.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from ..errors import ArtifactError, DataError, InvalidArgumentError, StateError, either, option
from ..io.artifacts import has_array
from ..io.locks import DEFAULT_LOCK_TIMEOUT
from ..io.layout import ADDED_EMBEDDINGS, ADDED_TEXT_HASH, JOINED, KNN_INDICES, KNN_SIMILARITIES, PROMPT_SET
from .covariates import STATE_KEY as COVARIATES_KEY
from .covariates import encode_embedded, encode_new
from .progress import Progress, no_progress, phase


def init_model_extras(graph, embeddings=None, covariates: dict | None = None) -> tuple[dict, dict]:
    """(model arrays, model attributes) that ``init`` stores for ``extend``: the graph's kNN lists (and their
    similarities when the graph has them), ``joined`` (all 0), where the embeddings are, and the fields and spec
    of the covariates the estimator keeps (``covariates``: ``stages.covariates.state_covariates``' entry)."""
    from ..io.readers import read_embeddings

    n = len(graph.ids)
    arrays = {KNN_INDICES: graph.knn_indices().astype(np.int32 if n < 2**31 else np.int64),
              JOINED: np.zeros(n, dtype=np.int64)}
    if has_array(graph.art, KNN_SIMILARITIES):
        arrays[KNN_SIMILARITIES] = graph.art.array(KNN_SIMILARITIES).astype(np.float32)
    emb_hash = graph.art.inputs.get("embeddings")
    path = embeddings if embeddings is not None else graph.art.attr("embeddings_path")
    if embeddings is not None and read_embeddings(embeddings).content_hash != emb_hash:
        raise DataError(f"{option('--embeddings')} {embeddings}: is not the embeddings {graph.path} was built from (content "
                        f"hash {read_embeddings(embeddings).content_hash}, the graph names {emb_hash})")
    attrs = {PROMPT_SET: {"embeddings": {"path": None if path is None else str(Path(path).resolve()),
                                         "hash": emb_hash, "rows": n},
                          "k": graph.art.attr("k"), "k_nn": graph.art.params.get("k_nn"),
                          "index": graph.art.params.get("index")}}
    if covariates is not None:
        attrs[PROMPT_SET][COVARIATES_KEY] = covariates
    return arrays, attrs


# ---------------------------------------------------------------------------------------- the model

class _Model:
    """What extend reads from the current model: ids, W, labels, lists, embeddings."""

    def __init__(self, sd, embeddings=None):
        from ..io.readers import read_embeddings

        self.sd = sd
        self.art, self.ids, self.w, self.labels, self.config = sd.model()
        art = self.art
        info = art.attr(PROMPT_SET) or self._legacy_info()
        self.info = info
        base = info["embeddings"]
        path = embeddings if embeddings is not None else base.get("path")
        if path is None:
            raise StateError(f"{sd.root}: the STATE does not say where its embeddings are; pass "
                             f"{option('--embeddings')} (the embeddings artifact its graph was built from)")
        if not Path(path).exists():
            raise StateError(f"{path}: the embeddings this STATE was built from are not there any more; pass "
                             f"{option('--embeddings')} with their new location")
        self.base = read_embeddings(path)
        if self.base.content_hash != base["hash"]:
            raise DataError(f"{path}: is not the embeddings this STATE was built from (content hash "
                            f"{self.base.content_hash}, the STATE names {base['hash']})")
        self.n_base = int(base["rows"])
        base_ids = [str(x) for x in self.base.array("ids")]
        if base_ids != self.ids[:self.n_base]:
            raise DataError(f"{path}: its prompt ids are not the STATE's first {self.n_base} prompts")
        self.params = self.base.params

    def _legacy_info(self) -> dict:
        """A STATE made before init stored the lists: read them from the graph artifact init names."""
        from ..io.readers import read_graph

        init = self.sd.log_entries(upto=(0, 0))[0]
        path, want = init.get("graph"), init.get("graph_hash")
        if path is None or not Path(path).exists():
            raise StateError(f"{self.sd.root}: made before graphdiff extend existed and its graph {path} is gone; "
                             "re-create the STATE with graphdiff init")
        g = read_graph(path)
        if g.art.content_hash != want:
            raise StateError(f"{path}: changed since this STATE was made (content hash {g.art.content_hash}, the "
                             f"STATE names {want}); re-create the STATE with graphdiff init")
        self._legacy_graph = g
        arrays, attrs = init_model_extras(g)
        self._legacy_arrays = arrays
        return attrs[PROMPT_SET]

    def array(self, name: str):
        if has_array(self.art, name):
            return self.art.array(name)
        legacy = getattr(self, "_legacy_arrays", None)
        return None if legacy is None else legacy.get(name)

    def embeddings(self) -> np.ndarray:
        """Unit rows of every prompt (base artifact, then the added ones), float32, model node order."""
        from ..core.graph import normalize_rows

        x = normalize_rows(self.base.array("embeddings"))
        added = self.array(ADDED_EMBEDDINGS)
        if added is not None and added.size:
            x = np.concatenate([x, added.astype(np.float32)])
        if x.shape[0] != len(self.ids):
            raise ArtifactError(f"{self.art.path}: {x.shape[0]} embeddings for {len(self.ids)} prompts")
        return x

    def text_hashes(self, base: bool = True) -> list[str]:
        """Text hashes of every prompt in node order (``base=False``: of the added ones only)."""
        added = self.array(ADDED_TEXT_HASH)
        added = [] if added is None else [str(h) for h in added]
        return ([str(h) for h in self.base.array("text_hash")] if base else []) + added


def _embed_new(model: _Model, texts: list[str], device: str, batch_size: int, progress: Progress, *,
               cache_dir=None, use_cache: bool = True) -> tuple[np.ndarray, dict, list[str]]:
    """(the new prompts' unit embeddings with the encoder, instruction and dimension of the STATE's, what came
    from the embedding cache and what was embedded, the cache's warnings). A text the STATE already has never
    gets here (``_check_new`` refuses it first), so the cache is the only place to find one embedded before."""
    from ..backends.embed import format_text
    from ..core.graph import truncate_matryoshka
    from .encoding import TextBatch

    p = model.params
    changed = []
    recorded = p.get("encoder_files")
    if recorded is not None:
        from ..backends.embed import encoder_identity, openvino_export, resolve_model

        if encoder_identity(p["model"], device)["files"] != recorded:
            target, local = resolve_model(p["model"])
            if local and openvino_export(target):  # re-exported in place: int8 vectors of another calibration
                raise DataError(f"the encoder at {p['model']} is not the export the STATE's prompts were embedded "
                                "with (re-exported in place?); put that export back there, or embed the new prompts "
                                "with it and pass the embeddings artifact")
            changed.append(f"the encoder's files at {p['model']} changed since the STATE's prompts were embedded "
                           "(an upgraded or replaced model): the new prompts' vectors may differ slightly")
    batch = TextBatch.plan([format_text(t, p.get("instruction")) for t in texts], model=p["model"], device=device,
                           cache_dir=cache_dir, use_cache=use_cache)
    raw = batch.encode(batch_size, progress)
    return truncate_matryoshka(raw, int(p["dim"])), batch.summary(), changed + list(batch.warnings)


def _check_new(model: _Model, path, ids: list[str], hashes: list[str]) -> None:
    """Refuse an id the STATE has, or a text it has under another id (or twice in the new prompts)."""
    have = set(model.ids)
    first: dict[str, int] = {}
    for j, pid in enumerate(ids):
        if pid in first:
            raise DataError(f"{path}: duplicate id {pid!r} (rows {first[pid] + 1} and {j + 1})")
        first[pid] = j
    for pid in ids:
        if pid in have:
            raise DataError(f"{path}: prompt {pid!r} is already in the STATE (ids must be new; "
                            f"{either('graphdiff retire --restore', 'State.retire(ids, restore=True)')} brings a "
                            "retired prompt back)")
    seen = {h: model.ids[i] for i, h in enumerate(model.text_hashes())}
    for pid, h in zip(ids, hashes):
        if h in seen:
            raise DataError(f"{path}: prompt {pid!r} has the same text as {seen[h]!r}, already in the STATE or "
                            "among the new prompts (a duplicate would be its own nearest neighbour)")
        seen[h] = pid


def _embedded(model: _Model, path) -> tuple[list[str], list[str], np.ndarray]:
    """(ids, text hashes, unit rows) of an embeddings artifact of new prompts, refused unless it was made
    with the STATE's encoder, instruction and dimension."""
    from ..core.graph import normalize_rows
    from ..io.readers import read_embeddings

    art = read_embeddings(path)
    for key in ("model", "instruction", "dim", "encoder_files"):
        if key == "encoder_files" and None in (art.params.get(key), model.params.get(key)):
            continue  # made before graphdiff recorded it
        if art.params.get(key) != model.params.get(key):
            raise DataError(f"{path}: made with {key} {art.params.get(key)!r}, but the STATE's prompts were embedded "
                            f"with {model.params.get(key)!r}; embed the new prompts as the STATE's were")
    ids = [str(x) for x in art.array("ids")]
    if not ids:
        raise DataError(f"{path}: no prompts")
    return ids, [str(h) for h in art.array("text_hash")], normalize_rows(art.array("embeddings"))


# ------------------------------------------------------------------------------------------- extend

@dataclasses.dataclass
class NewPrompts:
    """The prompts an extend adds, read and embedded before the lock: ``source`` (the prompts file or
    embeddings artifact) and its hash, their ids, text hashes and unit embeddings, and when each phase ended."""

    source: object
    source_hash: str
    ids: list[str]
    hashes: list[str]
    x: np.ndarray
    embeddings: object  # where the STATE's own embeddings are now (None: where its model says)
    t0: float
    t_read: float
    t_embed: float
    covariates: object = None  # their core.covariates.Encoded by the STATE's spec, when the STATE keeps covariates
    encoding: dict | None = None  # stages.encoding.TextBatch.summary(): embedded, from the cache (None: --embedded)
    warnings: list = dataclasses.field(default_factory=list)  # the embedding cache's


def read_new_prompts(sd, prompts=None, *, embedded=None, embeddings=None, id_field: str = "id",
                     text_field: str = "prompt", messages: str = "user", batch_size: int = 64, device: str = "auto",
                     cache_dir=None, use_cache: bool = True, lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                     progress: Progress = no_progress) -> NewPrompts:
    """The prompts to add to the STATE directory ``sd`` (a ``StateDir``): ``prompts`` (a prompts file, embedded
    here) or ``embedded`` (an embeddings artifact of them made by graphdiff embed with the STATE's encoder,
    instruction and dimension), checked against the current prompt set. ``embeddings``: where the STATE's own
    embeddings are now, if they moved. ``cache_dir``, ``use_cache``: the embedding cache (``stages.encoding``)."""
    from ..backends.device import check_device_name
    from ..backends.embed import text_hash
    from ..io.artifacts import read_artifact
    from ..io.state_dir import check_lock_timeout
    from ..io.tables import read_file_once, read_prompts

    t0 = time.perf_counter()
    if (prompts is None) == (embedded is None):
        raise InvalidArgumentError(f"give the new prompts as {option('--prompts')} (a prompts file) or "
                                   f"{option('--embedded')} (their embeddings artifact), one of the two")
    check_device_name(device)
    check_lock_timeout(lock_timeout)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidArgumentError(f"{option('--batch-size')} must be >= 1, got {batch_size!r}")
    progress(0, 4)
    source = prompts if prompts is not None else embedded
    model = _Model(sd, embeddings)
    cov_entry, covariates = model.info.get(COVARIATES_KEY), None
    if prompts is not None:
        data, source_hash = read_file_once(prompts)  # what is parsed is what the log's hash names
        ids, texts = read_prompts(prompts, id_field=id_field, text_field=text_field, messages=messages, data=data)
        hashes = [text_hash(t) for t in texts]
        if cov_entry is not None:  # the same fields, encoded by the spec the STATE's prompts were
            covariates = encode_new(cov_entry, prompts, texts, data)
    else:
        ids, hashes, x_new = _embedded(model, embedded)
        if cov_entry is not None:  # the artifact's covariates, encoded again by the STATE's spec
            covariates = encode_embedded(cov_entry, embedded)
        source_hash = read_artifact(embedded, "embeddings").content_hash
    _check_new(model, source, ids, hashes)
    t_read = time.perf_counter()
    progress(1, 4)
    if prompts is not None:
        # the encoding has its own labelled line (its count of prompts, elapsed time and ETA from the first batch)
        # where the listener draws phases; a plain function listener keeps the stage's four steps alone
        labelled = getattr(progress, "phase", None) is not None
        phase(progress, f"embedding {len(texts):,} new prompts", unit="prompts")
        x_new, encoding, warnings = _embed_new(model, texts, device, batch_size,
                                               progress if labelled else no_progress, cache_dir=cache_dir,
                                               use_cache=use_cache)
        phase(progress, "extending the prompt set")
    else:
        encoding, warnings = None, []
    t_embed = time.perf_counter()
    progress(2, 4)
    return NewPrompts(source, source_hash, ids, hashes, x_new, embeddings, t0, t_read, t_embed, covariates,
                      encoding, warnings)


def current_model(sd, new: NewPrompts) -> _Model:
    """The current model of ``sd``, read under the lock (what another writer did meanwhile counts), with the new
    prompts checked against it again."""
    model = _Model(sd, new.embeddings)
    _check_new(model, new.source, new.ids, new.hashes)
    return model


@dataclasses.dataclass
class Extension:
    """What ``add_prompts`` made: the log ``entry`` of the revision, the prompt ids and model arrays and
    attributes it commits, the states of the new prompts and the new graph's degrees, and when it started."""

    entry: dict
    ids: list[str]
    model_arrays: dict
    model_attrs: dict
    new_labels: np.ndarray
    new_isolated: int
    t_graph_start: float
    t_graph: float


def add_prompts(est, model: _Model, new: NewPrompts, *, root, progress: Progress = no_progress,
                step: int) -> tuple[object, Extension]:
    """Grow the estimator of the current version (at ``step``; its model ``model``) by the new prompts: their
    neighbours among all prompts, their prior states, the old prompts' lists they enter. Returns the estimator
    (extended in place) and the ``Extension`` to commit as the next revision. Writes no file."""
    from ..core.graph import extend_mutual_knn, list_similarities, rebuild_mutual_knn
    from ..core.spectral import label_new_nodes

    ids, hashes, x_new = new.ids, new.hashes, new.x
    if est.n_nodes != len(model.ids):
        raise ArtifactError(f"{root}: the current state has {est.n_nodes} prompts but its model {len(model.ids)}")
    nbr = model.array(KNN_INDICES)
    if nbr is None or nbr.shape[0] != len(model.ids):
        raise ArtifactError(f"{model.art.path}: lacks the kNN lists of its prompts; re-create the STATE")
    nbr = nbr.astype(np.int64)
    x_old = model.embeddings()
    sims = model.array(KNN_SIMILARITIES)
    sims = list_similarities(x_old, nbr) if sims is None else sims.astype(np.float32)
    k_nn = int(model.info.get("k_nn") or nbr.shape[1])
    n, m = len(model.ids), len(ids)
    if (nbr < 0).any():
        raise StateError(f"{root}: its graph's kNN lists have holes (an approximate index missed hits); "
                         "rebuild the graph on all prompts instead")
    ts = time.perf_counter()
    if nbr.shape[1] < min(k_nn, n + m - 1):  # k was capped at N - 1 < k_nn: a rebuild's k grows with N
        ext = rebuild_mutual_knn(np.concatenate([x_old, x_new]), n, k_nn)
    else:
        ext = extend_mutual_knn(est.graph, nbr, sims, x_old, x_new)
    labels = label_new_nodes(ext.graph, est.labels, ext.neighbors, ext.similarities, est.n_states)
    t_graph = time.perf_counter()
    progress(3, 4)
    # the read-outs read every prompt's embedding and covariates: the new prompts' go with them (the model artifact
    # written with this revision keeps them all, as it keeps the estimator's embeddings)
    cov = new.covariates if est.covariates is not None else None
    changed = est.extend(ext.graph, labels, embeddings=None if est.embeddings is None else x_new,
                         covariates=None if cov is None else cov.features,
                         reference_rate=None if cov is None else cov.reference)
    added = model.array(ADDED_EMBEDDINGS)
    added_hashes = model.text_hashes(base=False)  # the added rows' only: no second read of the base
    joined = model.array(JOINED)
    joined = np.zeros(n, np.int64) if joined is None else joined.astype(np.int64)
    model_arrays = {
        KNN_INDICES: ext.neighbors.astype(np.int32 if n + m < 2**31 else np.int64),
        KNN_SIMILARITIES: ext.similarities,
        ADDED_EMBEDDINGS: x_new if added is None or not added.size else np.concatenate([added, x_new]),
        ADDED_TEXT_HASH: np.asarray(added_hashes + hashes, dtype=object),
        JOINED: np.concatenate([joined, np.full(m, step, np.int64)])}
    info = dict(model.info)
    if new.embeddings is not None:  # where the STATE's embeddings are now: later extends find them
        info["embeddings"] = {**info["embeddings"], "path": str(Path(new.embeddings).resolve())}
    entry = {"event": "extend", "prompts_file": str(Path(new.source).resolve()), "prompts_hash": new.source_hash,
             "prompts": m, "added": m, "n_prompts": n + m, "first_id": ids[0], "last_id": ids[-1],
             "exact": info.get("index") in (None, "flat-ip"),
             "changed_lists": int(ext.changed.size), "changed_rows": int(changed.size),
             "edges": int(ext.graph.nnz // 2)}
    if cov is not None:
        entry["covariate_notes"] = list(cov.notes)
    return est, Extension(entry, model.ids + ids, model_arrays, {PROMPT_SET: info}, labels[n:],
                          int((np.diff(ext.graph.indptr)[n:] == 0).sum()), ts, t_graph)


def extend_result(sd, version: tuple[int, int], new: NewPrompts, ext: Extension, pruned: list[int], *,
                  t_locked: float, t_write: float) -> dict:
    """The result of an extend of the STATE directory ``sd`` at ``version`` committed as its next revision."""
    step, rev = version
    return {"command": "extend", "state": str(sd.root), "step": step, "revision": rev + 1,
            "version": f"{step}.{rev + 1}", **ext.entry, "pruned": pruned, **sd.durability(),
            "states_of_new": {str(int(s)): int(c) for s, c in zip(*np.unique(ext.new_labels, return_counts=True))},
            "new_isolated": ext.new_isolated, "encoding": new.encoding,
            "warnings": sd.durability()["warnings"] + list(new.warnings),
            "undo": f"graphdiff rollback --state {sd.root} --to {step}.{rev}",
            "timings": {"read_s": new.t_read - new.t0, "embed_s": new.t_embed - new.t_read,
                        "lock_wait_s": t_locked - new.t_embed, "graph_s": ext.t_graph - ext.t_graph_start,
                        "load_s": ext.t_graph_start - t_locked, "write_s": t_write - ext.t_graph,
                        "total_s": time.perf_counter() - new.t0}}


# ------------------------------------------------------------------------------------------- retire

def read_ids(ids) -> tuple[object, object, str | None, str]:
    """(ids, the file's bytes, the file, the hash the log keeps) of the prompts to retire or restore: an ids file
    (read once, before the lock: the ids applied are the ones the hash names) or a list of ids."""
    from ..io.artifacts import hash_arrays
    from ..io.tables import read_file_once

    if isinstance(ids, (str, Path)):
        data, ids_hash = read_file_once(ids)
        return ids, data, str(Path(ids).resolve()), ids_hash
    ids = [str(x) for x in ids]
    return ids, None, None, hash_arrays(np.asarray(ids, dtype=object), extra="ids")


def retire_step(index, retired: np.ndarray, n_nodes: int, ids, data, *, source: str | None, ids_hash: str,
                restore: bool = False) -> tuple[np.ndarray, dict]:
    """(the retired node indices after retiring ``ids`` (``restore``: restoring them), the log entry) of a
    version whose prompts ``index`` holds (``n_nodes`` of them), ``retired`` of them retired. Writes no file."""
    from ..io.readers import id_nodes

    names, rows, where = id_nodes(ids, index, data=data)
    is_retired = np.isin(rows, retired)
    bad = np.flatnonzero(is_retired if not restore else ~is_retired)
    if bad.size:
        j = int(bad[0])
        raise DataError(f"{where}: prompt {names[j]!r} is {'already' if not restore else 'not'} retired"
                        + ("" if not restore else " (nothing to restore)"))
    new = np.union1d(retired, rows) if not restore else np.setdiff1d(retired, rows)
    if not restore and new.size == n_nodes:
        raise DataError(f"{where}: would retire every prompt of the STATE; none would be left to select")
    entry = {"event": "restore" if restore else "retire", "ids_file": source, "ids_hash": ids_hash,
             "prompts": len(names), "n_retired": int(new.size)}
    return new.astype(np.int64), entry


def retire_result(sd, version: tuple[int, int], entry: dict, active: int, pruned: list[int], t0: float) -> dict:
    """The result of a retire or restore of the STATE directory ``sd`` at ``version`` committed as its next
    revision, ``active`` prompts left as candidates."""
    step, rev = version
    return {"command": entry["event"], "state": str(sd.root), "step": step,
            "revision": rev + 1, "version": f"{step}.{rev + 1}", **entry, "active": active,
            "pruned": pruned, **sd.durability(), "undo": f"graphdiff rollback --state {sd.root} --to {step}.{rev}",
            "timings": {"total_s": time.perf_counter() - t0}}
