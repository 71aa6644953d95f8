"""The encoder on OpenVINO's CPU runtime: a sentence-transformers model exported once to an OpenVINO model folder
(float32, or int8 by NNCF's static post-training quantization), then loaded by ``embed`` like any model folder.

An export folder holds ``openvino_model.xml`` / ``.bin`` (the transformer, its inputs the tokenizer's), the
tokenizer's files and ``graphdiff_encoder.json`` (what was exported from what: the source model's file digest, the
pooling and normalization it ends with, the quantization and its calibration texts' hash, the libraries' versions).
Encoding follows ``backends.embed.Encoder``: the same longest-first batches, the model's tokenizer with its
``max_seq_length``, then the source model's pooling (mean, CLS or max over the tokens) and its L2 normalization in
float32. OpenVINO runs with ``INFERENCE_PRECISION_HINT=f32`` (its CPU default is bf16 where the CPU has it, which
would move the vectors by far more than rounding on some CPUs and not others) and ``OMP_NUM_THREADS`` threads where that is set.

Why: on a 2-core CPU the int8 export of the bundled MiniLM embeds 3.8-4.1x as many prompts per CPU second as the
torch float32 model, with cosine >= 0.993 to the float vectors on MATH and DeepScaleR samples and 0.986 at worst
on One-Shot's prompts, each calibrated on 300 of its own set (docs/results.md). f32 kernels still round differently across instruction sets (AVX2, AVX-512, VNNI), so vectors
agree across CPUs to rounding, as torch's do. openvino and nncf are an optional extra
(``pip install 'graphdiff-rl[openvino]'``); without them an export folder is refused with that line, never run by
another backend (its vectors would differ).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import BackendError, InvalidArgumentError

MANIFEST = "graphdiff_encoder.json"
FORMAT = "graphdiff-openvino-encoder"
FORMAT_VERSION = 1
IR = "openvino_model.xml"
QUANTIZE = ("int8", "none")
POOLINGS = ("mean", "cls", "max")
PRECISION = "f32"
CHUNK_BATCHES = 4  # as backends.embed.CHUNK_BATCHES: progress every 4 batches
EXTRA = "pip install 'graphdiff-rl[openvino]'"


def is_export(folder) -> bool:
    """Whether ``folder`` is an OpenVINO export made by ``export`` (its manifest is there)."""
    return (Path(folder) / MANIFEST).is_file()


def read_manifest(folder) -> dict:
    """The export's manifest, checked; a one-line BackendError if it is not one this version reads."""
    path = Path(folder) / MANIFEST
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BackendError(f"{path}: unreadable ({exc.__class__.__name__}); export the encoder again") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BackendError(f"{path} is not a graphdiff OpenVINO encoder manifest")
    missing = [k for k in ("inputs", "pooling", "normalize", "max_seq_length", "dim") if k not in meta]
    if missing:
        raise BackendError(f"{path}: no {', '.join(missing)}; export the encoder again")
    if meta.get("version") != FORMAT_VERSION:
        raise BackendError(f"{path}: format version {meta.get('version')}, this graphdiff reads {FORMAT_VERSION}; "
                           "export the encoder again")
    if not (Path(folder) / IR).is_file() or not (Path(folder) / IR).with_suffix(".bin").is_file():
        raise BackendError(f"{folder}: the OpenVINO model ({IR} and its .bin) is missing; export the encoder again")
    return meta


def import_openvino():
    """The openvino module, or the one-line error naming the extra."""
    try:
        import openvino
    except ImportError:
        raise BackendError(f"the OpenVINO encoder needs the openvino package: {EXTRA}") from None
    return openvino


def import_nncf():
    """The nncf module (int8 quantization), or the one-line error naming the extra."""
    try:
        import nncf
    except ImportError:
        raise BackendError(f"int8 quantization needs the nncf package: {EXTRA}") from None
    return nncf


def texts_digest(texts: Sequence[str]) -> str:
    """sha256 over the texts (each's UTF-8 sha256, in order): the calibration set's identity."""
    h = hashlib.sha256()
    for t in texts:
        h.update(hashlib.sha256(t.encode("utf-8")).digest())
    return h.hexdigest()


def pipeline_of(st) -> tuple[str, bool]:
    """(pooling mode, normalize) of a loaded SentenceTransformer whose modules are Transformer -> Pooling ->
    [Normalize]; a BackendError for any other pipeline (a Dense layer, last-token pooling, ...)."""
    names = [type(m).__name__ for m in st]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise BackendError(f"the OpenVINO export supports models made of Transformer, Pooling and Normalize "
                           f"modules; this one has {', '.join(names)}")
    mode = st[1].get_config_dict().get("pooling_mode")
    if mode not in POOLINGS:
        raise BackendError(f"the OpenVINO export supports {', '.join(POOLINGS)} pooling; this model pools by {mode!r}")
    return mode, len(names) == 3


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """Sentence vectors from token states (batch x tokens x dim) and the attention mask, as sentence-transformers'
    Pooling and Normalize modules compute them, in float32."""
    hidden = hidden.astype(np.float32, copy=False)
    m = mask.astype(np.float32)[..., None]
    if mode == "mean":
        out = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    elif mode == "cls":
        out = hidden[:, 0]
    else:  # max over the real tokens
        out = np.where(m > 0, hidden, np.float32(-1e9)).max(1)
    if normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return np.ascontiguousarray(out, dtype=np.float32)


def export(st, folder, *, quantize: str, calibration: Sequence[str], source: dict,
           log: Callable[[str], None] = lambda _m: None) -> dict:
    """Write the OpenVINO export of the loaded SentenceTransformer ``st`` into the (empty, existing) ``folder``:
    the transformer converted with ``openvino.convert_model`` (dynamic batch and length), quantized to int8 by
    ``nncf.quantize`` on ``calibration`` (one unpadded text per sample, transformer model type) when ``quantize``
    is "int8", saved uncompressed; the tokenizer; the manifest last. ``source``: the source model's name and
    file digest, recorded. Returns the manifest."""
    if quantize not in QUANTIZE:
        raise InvalidArgumentError(f"--quantize must be one of {', '.join(QUANTIZE)}, got {quantize!r}")
    if quantize == "int8" and not calibration:
        raise InvalidArgumentError("int8 quantization needs calibration prompts (--calibration FILE)")
    ov = import_openvino()
    mode, normalize = pipeline_of(st)
    tokenizer, max_len = st.tokenizer, int(st.max_seq_length)
    example = tokenizer(["an example prompt"], padding=True, truncation=True, max_length=max_len,
                        return_tensors="pt")
    import transformers

    transformers.utils.logging.set_verbosity_error()  # its notes on the config, on graphdiff's stderr
    log("converting the transformer to OpenVINO")
    with warnings.catch_warnings():  # torch.jit's TracerWarnings on shape checks: the shapes stay dynamic
        warnings.simplefilter("ignore")
        model = ov.convert_model(st[0].auto_model, example_input=dict(example))
    inputs = sorted(p.get_any_name() for p in model.inputs)
    if quantize == "int8":
        nncf = import_nncf()
        log(f"quantizing to int8 on {len(calibration):,} calibration prompts")
        items = []
        for text in calibration:
            enc = tokenizer([text], truncation=True, max_length=max_len, return_tensors="np")
            items.append({k: v for k, v in enc.items() if k in inputs})
        import contextlib
        import io
        import logging

        logging.getLogger("nncf").setLevel(logging.ERROR)
        with contextlib.redirect_stdout(io.StringIO()):  # NNCF draws progress bars on stdout, graphdiff's JSON's
            model = nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(items))
    folder = Path(folder)
    ov.save_model(model, str(folder / IR), compress_to_fp16=False)
    tokenizer.save_pretrained(str(folder))
    dim = int(st.get_embedding_dimension() if hasattr(st, "get_embedding_dimension")
              else st.get_sentence_embedding_dimension())
    from importlib.metadata import PackageNotFoundError, version

    libraries = {}
    for name in ("openvino", "nncf", "torch", "transformers", "sentence-transformers"):
        try:
            libraries[name] = version(name)
        except PackageNotFoundError:
            libraries[name] = None
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "source": source, "quantize": quantize,
                "calibration": ({"texts": len(calibration), "sha256": texts_digest(calibration)}
                                if quantize == "int8" else None),
                "inputs": inputs, "pooling": mode, "normalize": normalize, "max_seq_length": max_len, "dim": dim,
                "inference_precision": PRECISION, "exported_with": libraries}
    write_manifest(folder, manifest)
    return manifest


def write_manifest(folder, manifest: dict) -> None:
    """The manifest, written last: a folder without it is not an export."""
    (Path(folder) / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def runtime_libraries() -> dict:
    """Versions of what runs an export (part of the encoder's identity)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("openvino", "tokenizers", "transformers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def threads() -> int | None:
    """OMP_NUM_THREADS where it is set to a positive integer (the workflow's rules set it), else None (OpenVINO's
    own choice: every core)."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return None
    return n if n > 0 else None


class OpenVinoEncoder:
    """An export folder loaded on OpenVINO's CPU runtime; the interface of ``backends.embed.Encoder``."""

    def __init__(self, folder, device: str = "auto"):
        folder = Path(folder)
        if device == "cuda" or device.startswith("cuda:"):
            raise BackendError(f"{folder} is an OpenVINO export, which runs on the CPU: use --device cpu (or auto), "
                               "or embed with the model it was exported from on the GPU")
        self.meta = read_manifest(folder)
        ov = import_openvino()
        import logging

        import transformers

        transformers.utils.logging.disable_progress_bar()
        logging.getLogger("transformers").setLevel(logging.ERROR)
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - one line instead of a traceback
            raise BackendError(f"{folder}: cannot load its tokenizer ({exc.__class__.__name__}); export the encoder "
                               "again") from None
        config = {"INFERENCE_PRECISION_HINT": self.meta.get("inference_precision", PRECISION)}
        if threads():
            config["INFERENCE_NUM_THREADS"] = str(threads())
        try:
            self.model_ = ov.Core().compile_model(str(folder / IR), "CPU", config)
        except Exception as exc:  # noqa: BLE001 - OpenVINO's first line is its source location: the last says why
            last = ([line.strip() for line in str(exc).splitlines() if line.strip()] or [""])[-1][:200]
            raise BackendError(f"cannot load the OpenVINO model in {folder} ({exc.__class__.__name__}: {last}); "
                               "export the encoder again") from None
        self.name = str(folder)
        self.device = "cpu"
        self.dim_ = int(self.meta["dim"])
        self._inputs = set(self.meta["inputs"])

    def encode(self, texts: Sequence[str], batch_size: int = 64,
               progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        """Embed ``texts`` (already formatted) -> float32 array len(texts) x dim, in input order (longest first in
        batches of ``batch_size``, as ``Encoder.encode``)."""
        if batch_size < 1:
            raise InvalidArgumentError(f"--batch-size must be >= 1, got {batch_size}")
        n = len(texts)
        out = np.empty((n, self.dim_), dtype=np.float32)
        if n == 0:
            return out
        order = np.argsort([-len(t) for t in texts], kind="stable")
        max_len, mode, normalize = int(self.meta["max_seq_length"]), self.meta["pooling"], self.meta["normalize"]
        if progress:
            progress(0, n)
        done = 0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_len,
                                 return_tensors="np")
            hidden = self.model_({k: v for k, v in enc.items() if k in self._inputs})[0]
            out[idx] = pool(np.asarray(hidden), enc["attention_mask"], mode, normalize)
            done += len(idx)
            if progress and (done == n or (start // batch_size + 1) % CHUNK_BATCHES == 0):
                progress(done, n)
        return out
