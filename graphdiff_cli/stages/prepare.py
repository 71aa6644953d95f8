"""Preparation stages: prompts -> embeddings -> mutual-kNN graph W -> K spectral clusters (Sections 3.3-3.4).

Each function reads its inputs, calls the core/backends, writes one stamped Zarr artifact atomically
(``io.artifacts.write_artifact``) and returns a JSON-able result dict (paths, shapes, counts, timings).
Everything is checked before anything is written, so a refused input leaves ``out`` untouched.
Progress is reported through ``progress(done, total)``; nothing here prints.

Content hashes (``stamp.content_hash``) identify an artifact's content for downstream input checks:

- embeddings: ``hash_arrays(ids, embeddings)``
- graph:      ``hash_arrays(ids, indptr, indices, data, knn_indices, extra="graph")``
- clusters:   ``hash_arrays(ids, labels, extra="clusters")``

with ``ids`` as a numpy unicode array (``np.asarray(ids, dtype=str)``), never an object array (whose
bytes are pointers). The on-disk format is specified in docs/reference/artifact-format.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ArtifactError, DataError, InvalidArgumentError
from ..io.artifacts import Artifact, hash_arrays, hash_file, read_artifact, write_artifact
from .encoding import TextBatch
from .progress import Progress, no_progress, phase


AUTO_STATES_MAX = 320
AUTO_STATES_PER = 25  # "auto" K: one latent state per ~25 prompts, at least 2, at most 320
AUTO_KNN_MAX = 80  # the paper's k_nn; build-graph's fixed default before auto_k_nn
AUTO_KNN_MIN = 10
AUTO_KNN_SHARE = 10  # a prompt's list holds at most ~1/10 of the set
EIGEN_SOLVER_CHOICES = ("arpack", "lobpcg-amg")
KMEANS_CHOICES = ("lloyd", "faiss")


def auto_k_nn(n: int) -> int:
    """build-graph's k_nn when --k-nn is not given: min(80, max(10, N // 10)); the search then uses
    k = min(k_nn, N - 1). 80 (the paper's) from 800 prompts on; below, a tenth of the set, so a small set's
    graph is not nearly complete. Why not smaller at a few thousand prompts: docs/lab/results.md, "build-graph's
    default k" (fewer neighbours left more prompts isolated and predicted first visits worse on the real log)."""
    return int(min(AUTO_KNN_MAX, max(AUTO_KNN_MIN, n // AUTO_KNN_SHARE)))


def auto_k_nn_rule(n: int) -> str:
    """The rule in words, with its value at ``n`` (build-graph prints it)."""
    return (f"k_nn = min({AUTO_KNN_MAX}, max({AUTO_KNN_MIN}, N // {AUTO_KNN_SHARE})) = {auto_k_nn(n)} "
            f"for N = {n:,}")


def ids_for_hash(ids: Sequence[str]) -> np.ndarray:
    """Ids as a fixed-width unicode array: the representation content hashes are taken over."""
    return np.asarray(list(ids), dtype=str)


# --------------------------------------------------------------------------------------------- embed

def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """"I/N" -> (I, N) with 0 <= I < N; None -> None."""
    if spec is None:
        return None
    try:
        i_text, n_text = str(spec).split("/")
        index, count = int(i_text), int(n_text)
    except ValueError:
        raise InvalidArgumentError(f"--shard must look like I/N (e.g. 0/4), got {spec!r}") from None
    if count < 1 or not 0 <= index < count:
        raise InvalidArgumentError(f"--shard {spec}: need N >= 1 and 0 <= I < N")
    return index, count


def shard_rows(total: int, index: int, count: int) -> tuple[int, int]:
    """Rows [I*ceil(M/N), min(M, (I+1)*ceil(M/N))) of M rows (possibly empty for the last shards)."""
    size = math.ceil(total / count)
    return min(total, index * size), min(total, (index + 1) * size)


def _model_key(model: str) -> str:
    """The model as recorded in params: "bundled", an absolute folder, or the hub name."""
    if model == "bundled":
        return model
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def _encoder_files(model: str, device: str) -> str | None:
    """The digest of the encoder's files (``backends.embed.encoder_identity``'s "files"), recorded in every
    embeddings artifact so that rows are reused, and ``extend`` embeds, only with the same model files even when a
    folder is replaced in place (a re-exported encoder); None where the model cannot be found here (an embed that
    needs it fails on loading it, in its own words)."""
    from ..backends.embed import encoder_identity
    from ..errors import BackendError

    try:
        return encoder_identity(model, device)["files"]
    except BackendError:
        return None


def _open_cache(out: Path, model: str, instruction: str | None, dim: int | None, files: str | None = None):
    """(cached artifact or None, why not) for --out; refuses to overwrite something that is not embeddings.
    ``files``: the encoder's files digest now (``_encoder_files``); rows made with other files are not reused."""
    if not out.exists():
        return None, "no previous artifact"
    if not out.is_dir() or not (out / "zarr.json").is_file():
        raise ArtifactError(f"--out {out} exists and is not a graphdiff artifact; remove it or choose another path")
    try:
        art = read_artifact(out, "embeddings")
    except ArtifactError as exc:
        raise ArtifactError(f"{exc}; remove it or choose another --out") from None
    p = art.params
    native = art.attr("native_dim")
    if p.get("model") != model:
        return None, f"model changed ({p.get('model')} -> {model})"
    if files is not None and p.get("encoder_files") not in (None, files):
        return None, f"the model's files changed since {out} was made (a model folder replaced in place)"
    if p.get("instruction") != instruction:
        return None, "instruction changed"
    want_dim = native if dim is None or (native is not None and dim >= native) else dim
    if native is None or p.get("dim") != want_dim:
        return None, f"dim changed ({p.get('dim')} -> {dim})"
    return art, "reusing rows with unchanged text"


def embed_prompts(prompts, out, *, model: str = "bundled", instruction: str | None = None,
                  use_instruction: bool = True, dim: int | None = None, batch_size: int = 64,
                  device: str = "auto", shard: str | None = None, id_field: str = "id",
                  text_field: str = "prompt", messages: str = "user", covariates: Sequence[str] = (),
                  categories: Sequence[str] = (), reference_rate: str | None = None, answer_field: str | None = None,
                  text_statistics: bool = True, cache_dir=None, use_cache: bool = True,
                  progress: Progress = no_progress) -> dict:
    """Embed a prompts file into an "embeddings" artifact, reusing unchanged rows of ``out`` and the embedding
    cache.

    phi_i = normalize(first_dim(f_emb("Instruction: {I}\\nPrompt: {x_i}"))), with I the paper's
    difficulty-aware instruction unless ``instruction`` replaces it or ``use_instruction`` is False
    (raw text). Rows of an existing embeddings artifact at ``out`` made with the same model,
    instruction and dim are reused wherever the prompt's text hash matches. Of the others, each distinct
    text is looked up in the embedding cache at ``cache_dir`` (None: ``io.embedding_cache.default_cache_dir()``)
    and only the ones it lacks go through the model, once each, and into the cache (with none to embed, the model is not even loaded). ``use_cache=False``: neither ``out`` nor
    the cache is read or written, and every distinct text is embedded (still once).

    The prompts' covariates (``stages.covariates``: numeric ``covariates`` and categorical ``categories`` fields,
    a ``reference_rate`` field "FIELD[:ATTEMPTS_FIELD]", the text statistics of the ``answer_field`` and, unless
    ``text_statistics`` is False, of the prompt) are encoded by a spec made over all the prompts and written
    beside the embeddings; the content hash stays that of the ids and embeddings. A shard has none: the spec
    needs every row (the merged artifact gets them from an embed of the whole file onto it, every row reused).
    """
    from ..backends.device import check_device_name
    from ..backends.embed import DEFAULT_INSTRUCTION, format_text, open_encoder, text_hash
    from ..core.graph import truncate_matryoshka
    from ..io.tables import read_file_once, read_prompts
    from .covariates import CovariateFields, artifact_parts, embed_covariates
    from .covariates import summary as covariate_summary

    t0 = time.perf_counter()
    prompts, out = Path(prompts), Path(out)
    if dim is not None and dim < 1:
        raise InvalidArgumentError(f"--dim must be >= 1, got {dim}")
    if batch_size < 1:
        raise InvalidArgumentError(f"--batch-size must be >= 1, got {batch_size}")
    if instruction is not None and not use_instruction:
        raise InvalidArgumentError("--instruction and --no-instruction cannot be used together")
    if instruction is not None and not instruction.strip():
        raise InvalidArgumentError("--instruction is empty; use --no-instruction to embed the raw text")
    check_device_name(device)
    shard_spec = parse_shard(shard)
    fields = CovariateFields.of_options(covariates, categories, reference_rate, answer_field, text_statistics)
    if shard_spec is not None:
        if fields.explicit:
            raise InvalidArgumentError("covariates are encoded over all the prompts, not one shard: embed the shards "
                                       "without them, merge them (graphdiff merge-embeddings), then run graphdiff "
                                       "embed on the whole file with --out the merged artifact and the covariate "
                                       "options (every row's embedding is reused from it)")
        fields = CovariateFields(text_statistics=False)
    instr = (instruction if instruction is not None else DEFAULT_INSTRUCTION) if use_instruction else None
    model_key = _model_key(model)

    if fields.any:  # read once: the covariates' fields come from the rows the prompts came from
        data, prompts_hash = read_file_once(prompts)
        ids, texts = read_prompts(prompts, id_field=id_field, text_field=text_field, messages=messages, data=data)
        spec, enc = embed_covariates(prompts, fields, texts, data)  # before the model: a bad value writes nothing
        del data
    else:
        ids, texts = read_prompts(prompts, id_field=id_field, text_field=text_field, messages=messages)
        prompts_hash = hash_file(prompts)
        spec = enc = None
    total = len(ids)
    start, stop = 0, total
    if shard_spec is not None:
        start, stop = shard_rows(total, *shard_spec)
        ids, texts = ids[start:stop], texts[start:stop]
    hashes = [text_hash(t) for t in texts]
    t_read = time.perf_counter()

    files = _encoder_files(model, device)
    cache, cache_note = _open_cache(out, model_key, instr, dim, files)
    if not use_cache:
        cache, cache_note = None, "the cache is off (--no-cache)"
    cached_rows: dict[str, int] = {}
    if cache is not None:
        for row, h in enumerate(cache.array("text_hash")):
            cached_rows.setdefault(str(h), row)
    src = np.array([cached_rows.get(h, -1) for h in hashes], dtype=np.int64)
    need = np.flatnonzero(src < 0)

    batch = TextBatch.plan([format_text(texts[i], instr) for i in need], model=model, device=device,
                           cache_dir=cache_dir, use_cache=use_cache)
    native_dim = cache.attr("native_dim") if cache is not None else None
    encoder_dim = batch.load()
    if native_dim is None:
        native_dim = encoder_dim if encoder_dim is not None else open_encoder(model, device).dim_
    if dim is not None and dim > native_dim:
        raise InvalidArgumentError(f"--dim {dim} is larger than the model's embedding size {native_dim}")
    out_dim = native_dim if dim is None else dim
    new_emb = None
    if need.size:
        if batch.missing.size:  # its own line, with the rate and the time left from the first batch on
            phase(progress, f"embedding {batch.missing.size:,} prompts", unit="prompts")
        new_emb = truncate_matryoshka(batch.encode(batch_size, progress), out_dim)

    emb = np.empty((len(ids), out_dim), dtype=np.float32)
    if need.size:
        emb[need] = new_emb
    reuse = np.flatnonzero(src >= 0)
    if reuse.size:
        emb[reuse] = cache.array("embeddings")[src[reuse]]

    ids_arr = ids_for_hash(ids)
    if files is None and cache is not None:
        files = cache.params.get("encoder_files")
    params = {"model": model_key, "encoder_files": files, "instruction": instr, "dim": int(out_dim),
              "batch_size": int(batch_size),
              "shard": None if shard_spec is None else f"{shard_spec[0]}/{shard_spec[1]}",
              "id_field": id_field, "text_field": text_field, "messages": messages,
              "covariates": fields.as_dict() if spec is not None else None}
    attrs = {"native_dim": int(native_dim)}
    cov_arrays = {}
    if spec is not None and spec.width:
        cov_arrays, cov_attrs = artifact_parts(spec, enc)
        attrs.update(cov_attrs)
    if shard_spec is not None:
        attrs["shard"] = {"index": shard_spec[0], "count": shard_spec[1], "start": start, "stop": stop,
                          "total": total}
    content_hash = hash_arrays(ids_arr, emb)
    tw = time.perf_counter()
    write_artifact(out, "embeddings", {"ids": ids_arr.astype(object), "embeddings": emb,
                                       "text_hash": np.asarray(hashes, dtype=object), **cov_arrays},
                   params=params, inputs={"prompts": prompts_hash}, content_hash=content_hash, attrs=attrs)
    t_end = time.perf_counter()
    return {
        "command": "embed", "prompts": str(prompts), "out": str(out), "n_prompts": len(ids),
        "shape": [len(ids), int(out_dim)], "model": model_key, "instruction": instr, "dim": int(out_dim),
        "native_dim": int(native_dim), "device": batch.device_used,
        "shard": attrs.get("shard"), "cached": int(reuse.size), "embedded": batch.encoded,
        "from_cache": batch.from_cache, "duplicates": batch.duplicates, "embedding_cache": batch.cache_dir,
        "warnings": list(batch.warnings),
        "cache": cache_note, "content_hash": content_hash, "covariates": covariate_summary(spec, enc),
        "prompts_per_s": (batch.encoded / batch.encode_s) if batch.encode_s > 0 else None,
        "timings": {"read_s": t_read - t0, "load_model_s": batch.load_s, "encode_s": batch.encode_s,
                    "write_s": t_end - tw, "total_s": t_end - t0},
    }


# ---------------------------------------------------------------------------------- merge-embeddings

_SAME_KEYS = ("model", "encoder_files", "instruction", "dim", "id_field", "text_field", "messages")


def merge_embeddings(shards: Sequence, out, progress: Progress = no_progress) -> dict:
    """Concatenate shard artifacts (``embed --shard I/N``) in index order into one embeddings artifact.

    All shards must come from the same prompts file (hash), model, instruction and dim, and every
    index 0..N-1 must be present exactly once; the result equals an unsharded run up to batch
    composition (float rounding of order 1e-7).
    """
    t0 = time.perf_counter()
    if not shards:
        raise InvalidArgumentError("give at least one shard artifact")
    out = Path(out)
    arts: list[Artifact] = []
    for path in shards:
        art = read_artifact(path, "embeddings")
        if not art.params.get("shard") or not isinstance(art.attr("shard"), dict):
            raise ArtifactError(f"{path}: is not a shard (it was made without --shard); nothing to merge")
        arts.append(art)
    first = arts[0]
    for art in arts[1:]:
        if art.inputs.get("prompts") != first.inputs.get("prompts"):
            raise ArtifactError(f"{art.path}: made from a different prompts file than {first.path} "
                                f"(hash {art.inputs.get('prompts')} vs {first.inputs.get('prompts')})")
        for key in _SAME_KEYS:
            if art.params.get(key) != first.params.get(key):
                raise ArtifactError(f"{art.path}: {key} {art.params.get(key)!r} differs from {first.path}'s "
                                    f"{first.params.get(key)!r}")
    count = int(first.attr("shard")["count"])
    by_index: dict[int, Artifact] = {}
    for art in arts:
        info = art.attr("shard")
        if int(info["count"]) != count or int(info["total"]) != int(first.attr("shard")["total"]):
            raise ArtifactError(f"{art.path}: is shard {info['index']}/{info['count']} of {info['total']} rows, "
                                f"but {first.path} is one of {count} shards of {first.attr('shard')['total']}")
        i = int(info["index"])
        if i in by_index:
            raise ArtifactError(f"shard {i}/{count} given twice: {by_index[i].path} and {art.path}")
        by_index[i] = art
    missing = [f"{i}/{count}" for i in range(count) if i not in by_index]
    if missing:
        raise ArtifactError(f"shard(s) {', '.join(missing)} missing; give all {count} shards")
    ids, embs, hashes = [], [], []
    expect = 0
    for i in range(count):
        art = by_index[i]
        info = art.attr("shard")
        if int(info["start"]) != expect:
            raise ArtifactError(f"{art.path}: shard {i}/{count} starts at row {info['start']}, expected {expect}")
        a_ids, a_emb, a_hash = art.array("ids"), art.array("embeddings"), art.array("text_hash")
        if not (len(a_ids) == a_emb.shape[0] == len(a_hash) == int(info["stop"]) - int(info["start"])):
            raise ArtifactError(f"{art.path}: shard arrays disagree with its row range; re-run that shard")
        ids.extend(str(x) for x in a_ids)
        embs.append(a_emb)
        hashes.extend(str(x) for x in a_hash)
        expect = int(info["stop"])
        progress(i + 1, count)
    total = int(first.attr("shard")["total"])
    if expect != total:
        raise ArtifactError(f"the shards cover rows 0..{expect} of {total}; re-run the shards")
    emb = np.concatenate(embs, axis=0).astype(np.float32, copy=False)
    ids_arr = ids_for_hash(ids)
    params = {key: first.params.get(key) for key in _SAME_KEYS}
    params.update(batch_size=first.params.get("batch_size"), shard=None)
    params = {k: params[k] for k in ("model", "encoder_files", "instruction", "dim", "batch_size", "shard", "id_field",
                                     "text_field", "messages")}
    params["covariates"] = None  # a shard has none: embed the whole file onto the merged artifact to add them
    content_hash = hash_arrays(ids_arr, emb)
    write_artifact(out, "embeddings", {"ids": ids_arr.astype(object), "embeddings": emb,
                                       "text_hash": np.asarray(hashes, dtype=object)},
                   params=params, inputs={"prompts": first.inputs.get("prompts")}, content_hash=content_hash,
                   attrs={"native_dim": first.attr("native_dim"),
                          "merged_from": [by_index[i].content_hash for i in range(count)]})
    return {"command": "merge-embeddings", "shards": [str(by_index[i].path) for i in range(count)],
            "out": str(out), "n_shards": count, "n_prompts": len(ids), "shape": list(emb.shape),
            "content_hash": content_hash, "timings": {"total_s": time.perf_counter() - t0}}


# ------------------------------------------------------------------------------------------- graph

def build_graph(embeddings, out, *, k_nn: int | None = None, device: str = "auto", index: str = "exact",
                nprobe: int | None = None, ef_search: int | None = None, recall_sample: int = 1000,
                progress: Progress = no_progress) -> dict:
    """The mutual-kNN sample graph W of Section 3.3 as a "graph" artifact.

    W_ij = c_ij if j in N_k(i), i in N_k(j) and c_ij > 0, else 0, with c_ij = phi_i . phi_j and
    k = min(k_nn, N - 1); the search asks for k + 1 hits and drops self. ``k_nn`` None: ``auto_k_nn(N)``. ``index`` "exact" (the
    paper's) or an approximate faiss index ("hnsw", "ivf"; backends.knn), whose recall against exact
    search is measured on ``recall_sample`` random prompts and stamped in the artifact.
    """
    from ..backends.device import check_device_name
    from ..backends.knn import INDEXES, knn_search, sampled_recall
    from ..core.graph import drop_self, mutual_knn_graph, normalize_rows, summarize_graph

    t0 = time.perf_counter()
    out = Path(out)
    if k_nn is not None and (isinstance(k_nn, bool) or not isinstance(k_nn, (int, np.integer)) or k_nn < 1):
        raise InvalidArgumentError(f"--k-nn must be an integer >= 1 (or left out: chosen from N), got {k_nn!r}")
    check_device_name(device)
    if index not in INDEXES:
        raise InvalidArgumentError(f"--index must be one of {', '.join(INDEXES)}, got {index!r}")
    for name, v in (("--nprobe", nprobe), ("--ef-search", ef_search)):
        if v is not None and v < 1:
            raise InvalidArgumentError(f"{name} must be >= 1, got {v}")
    if recall_sample < 1:
        raise InvalidArgumentError(f"--recall-sample must be >= 1, got {recall_sample}")
    from ..io.readers import read_embeddings

    art = read_embeddings(embeddings)
    ids = [str(x) for x in art.array("ids")]
    x = art.array("embeddings")
    if x.ndim != 2 or x.shape[0] != len(ids):
        raise ArtifactError(f"{embeddings}: embeddings shape {x.shape} does not match {len(ids)} ids")
    n = x.shape[0]
    if n < 2:
        raise DataError(f"{embeddings}: a graph needs at least 2 prompts, this artifact has {n}")
    x = normalize_rows(x)  # idempotent on stored rows; guards against hand-made artifacts
    rule = None
    if k_nn is None:
        k_nn, rule = auto_k_nn(n), auto_k_nn_rule(n)
    k = min(k_nn, n - 1)
    ts = time.perf_counter()
    res = knn_search(x, k + 1, device=device, progress=progress, index=index, nprobe=nprobe, ef_search=ef_search)
    t_search = time.perf_counter() - ts
    recall = None if index == "exact" else sampled_recall(x, res.neighbors, sample=recall_sample)
    nbr, sim = drop_self(res.neighbors, res.similarities, k)
    w = mutual_knn_graph(nbr, sim)
    summary = summarize_graph(w)
    ids_arr = ids_for_hash(ids)
    arrays = {"ids": ids_arr.astype(object), "indptr": w.indptr.astype(np.int64),
              "indices": w.indices.astype(np.int64), "data": w.data.astype(np.float32),
              "knn_indices": nbr.astype(np.int64), "knn_similarities": sim.astype(np.float32)}
    content_hash = hash_arrays(ids_arr, arrays["indptr"], arrays["indices"], arrays["data"],
                               arrays["knn_indices"], extra="graph")
    params = {"k_nn": int(k_nn), "device": res.device, "index": "flat-ip" if index == "exact" else index}
    if res.params:
        params["index_params"] = res.params
    # where the embeddings were (graphdiff init records it for graphdiff extend, which checks the hash)
    attrs = {"summary": asdict(summary), "k": int(k), "k_nn_rule": rule, "search_backend": res.backend,
             "embeddings_path": str(Path(embeddings).resolve())}
    if recall is not None:
        attrs["recall"] = recall
    write_artifact(out, "graph", arrays, params=params, inputs={"embeddings": art.content_hash},
                   content_hash=content_hash, attrs=attrs)
    t_end = time.perf_counter()
    return {"command": "build-graph", "embeddings": str(embeddings), "out": str(out), "n_prompts": n,
            "dim": int(x.shape[1]), "k_nn": int(k_nn), "k_nn_rule": rule, "k": int(k), "device": res.device,
            "search_backend": res.backend, "index": index, "index_params": res.params, "recall": recall,
            "summary": asdict(summary), "content_hash": content_hash,
            "timings": {"search_s": t_search, "total_s": t_end - t0}}


# ---------------------------------------------------------------------------------------- clusters

def auto_states(n: int) -> int:
    """K for ``--states auto``: min(320, max(2, N // 25))."""
    return min(AUTO_STATES_MAX, max(2, n // AUTO_STATES_PER))


def parse_states(states) -> int | None:
    """"auto" -> None; an integer (int or text) -> it, refused below 1."""
    if states is None or (isinstance(states, str) and states.strip().lower() == "auto"):
        return None
    try:
        k = int(str(states).strip())
    except ValueError:
        raise InvalidArgumentError(f"--states must be 'auto' or an integer, got {states!r}") from None
    if k < 1:
        raise InvalidArgumentError(f"--states must be >= 1, got {k}")
    return k


def eigen_solver_for(requested: str) -> tuple[str, str | None]:
    """The eigen-solver ``cluster`` runs for ``--eigen-solver requested``, and the line said when it is not the
    one asked: lobpcg-amg without pyamg falls back to arpack. (No size picks lobpcg-amg by itself: at K = 320
    it took more CPU time than ARPACK on every graph measured, bench/cluster.py.)"""
    from ..backends.cluster import amg_available

    if requested not in EIGEN_SOLVER_CHOICES:
        raise InvalidArgumentError(f"--eigen-solver must be one of {', '.join(EIGEN_SOLVER_CHOICES)}, got {requested!r}")
    want = requested
    if want == "lobpcg-amg" and not amg_available():
        return "arpack", ("pyamg is not installed (pip install 'graphdiff-rl[amg]'): "
                          f"--eigen-solver {requested} falls back to arpack")
    return want, None


def cluster(graph, out, *, states="auto", seed: int = 0, eigen_solver: str = "arpack", kmeans: str = "lloyd",
            progress: Progress = no_progress) -> dict:
    """Static spectral clusters c_i in [0, K) of W (Section 3.4) as a "clusters" artifact; ``eigen_solver``
    "arpack" (the paper's) or "lobpcg-amg" (``eigen_solver_for``), ``kmeans`` "lloyd" (the core's) or "faiss"."""
    from ..backends.cluster import amg_preconditioner, faiss_kmeans
    from ..core.spectral import spectral_states

    t0 = time.perf_counter()
    out = Path(out)
    requested = parse_states(states)
    if seed < 0:
        raise InvalidArgumentError(f"--seed must be >= 0, got {seed}")
    if kmeans not in KMEANS_CHOICES:
        raise InvalidArgumentError(f"--kmeans must be one of {', '.join(KMEANS_CHOICES)}, got {kmeans!r}")
    from ..io.readers import read_graph

    g = read_graph(graph)
    art, ids, w, knn = g.art, g.ids, g.w, g.knn_indices()
    n = len(ids)
    k = auto_states(n) if requested is None else requested
    if k > n:
        raise InvalidArgumentError(f"--states {k} is more than the {n} prompts in {graph}; choose at most {n}")
    solver, note = eigen_solver_for(eigen_solver)
    how = {"eigen_solver": "arpack"} if solver == "arpack" else {"eigen_solver": "lobpcg",
                                                                 "preconditioner": amg_preconditioner}
    res = spectral_states(w, k, seed=seed, fallback_neighbors=knn, progress=progress,
                          assign=faiss_kmeans if kmeans == "faiss" else None, **how)
    labels = res.labels.astype(np.int64)
    sizes = np.bincount(labels, minlength=k)
    ids_arr = ids_for_hash(ids)
    content_hash = hash_arrays(ids_arr, labels, extra="clusters")
    spectral = {"eigen_solver": solver, "solvers": res.solvers, "eigen_residual": res.eigen_residual,
                "kmeans": kmeans, "kmeans_inertia": res.inertia}
    write_artifact(out, "clusters", {"ids": ids_arr.astype(object), "labels": labels},
                   params={"states": int(k), "seed": int(seed),
                           "requested": "auto" if requested is None else int(requested),
                           "eigen_solver": eigen_solver, "kmeans": kmeans},
                   inputs={"graph": art.content_hash}, content_hash=content_hash,
                   attrs={"sizes": sizes.tolist(), "spectral": spectral})
    t_end = time.perf_counter()
    return {"command": "cluster", "graph": str(graph), "out": str(out), "n_prompts": n, "states": int(k),
            "requested": "auto" if requested is None else int(requested), "seed": int(seed),
            "sizes": {"min": int(sizes.min()), "max": int(sizes.max()), "empty": int(np.sum(sizes == 0))},
            "spectral": spectral, "warnings": [note] if note else [],
            "content_hash": content_hash, "timings": {"total_s": t_end - t0}}
