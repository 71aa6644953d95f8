"""``export-encoder``: a sentence-transformers model -> an OpenVINO model folder (float32, or int8 calibrated on the
user's own prompts) that ``embed --model FOLDER`` and ``extend`` load like any model folder (``backends.openvino``).

The calibration set is a deterministic sample of the prompts file: its distinct texts, formatted as ``embed``
formats them (the same instruction), ordered by the sha256 of the text and cut at ``calibration_size``, so it does
not depend on the file's row order and every shard job of one file would pick the same. The folder appears whole or
not at all: it is built under a temporary name beside ``out`` and renamed into place.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ..errors import BackendError, InvalidArgumentError
from ..io.atomic import fsync_dir
from .progress import Progress, no_progress, phase


def calibration_texts(prompts, *, size: int, instruction: str | None, id_field: str, text_field: str,
                      messages: str) -> list[str]:
    """The ``size`` distinct formatted texts of ``prompts`` with the smallest sha256 (all of them if fewer)."""
    import hashlib

    from ..backends.embed import format_text
    from ..io.tables import read_prompts

    _ids, texts = read_prompts(prompts, id_field=id_field, text_field=text_field, messages=messages)
    distinct = {format_text(t, instruction) for t in texts}
    return sorted(distinct, key=lambda t: hashlib.sha256(t.encode("utf-8")).digest())[:size]


def export_encoder(out, *, model: str = "bundled", quantize: str = "int8", calibration=None,
                   calibration_size: int = 300, instruction: str | None = None, use_instruction: bool = True,
                   id_field: str = "id", text_field: str = "prompt", messages: str = "user",
                   progress: Progress = no_progress) -> dict:
    """Export ``model`` to the OpenVINO model folder ``out`` (which must not exist); int8 (``quantize``) is
    calibrated on ``calibration_size`` prompts of the file ``calibration``, formatted with the instruction
    ``embed`` would use (the paper's unless ``instruction`` replaces it or ``use_instruction`` is False)."""
    from ..backends import openvino
    from ..backends.embed import DEFAULT_INSTRUCTION, Encoder, encoder_identity, resolve_model

    t0 = time.perf_counter()
    out = Path(out)
    if quantize not in openvino.QUANTIZE:
        raise InvalidArgumentError(f"--quantize must be one of {', '.join(openvino.QUANTIZE)}, got {quantize!r}")
    if calibration_size < 1:
        raise InvalidArgumentError(f"--calibration-size must be >= 1, got {calibration_size}")
    if instruction is not None and not use_instruction:
        raise InvalidArgumentError("--instruction and --no-instruction cannot be used together")
    if quantize == "int8" and calibration is None:
        raise InvalidArgumentError("int8 quantization is calibrated on your prompts: pass --calibration FILE (the "
                                   "prompts file you will embed), or --quantize none")
    if os.path.lexists(out):
        raise InvalidArgumentError(f"--out {out} exists; remove it or choose another folder")
    target, local = resolve_model(model)
    if local and openvino.is_export(target):
        raise InvalidArgumentError(f"--model {model} is already an OpenVINO export; pass the model it was made from")
    openvino.import_openvino()  # the extra's one-line error before anything is read or loaded
    instr = (instruction if instruction is not None else DEFAULT_INSTRUCTION) if use_instruction else None
    texts = []
    if quantize == "int8":
        texts = calibration_texts(calibration, size=calibration_size, instruction=instr, id_field=id_field,
                                  text_field=text_field, messages=messages)
    phase(progress, "loading the model")
    identity = encoder_identity(model, "cpu")
    st = Encoder(model, "cpu").model_
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        manifest = openvino.export(st, tmp, quantize=quantize, calibration=texts,
                                   source={"model": identity["model"], "files": identity["files"],
                                           "instruction": instr},
                                   log=lambda message: phase(progress, message))
        for path in tmp.rglob("*"):  # durable before it appears under its name
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        os.rename(tmp, out)
        fsync_dir(out.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BackendError(f"cannot write {out} ({exc.__class__.__name__}: {exc})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"command": "export-encoder", "out": str(out), "model": identity["model"], "quantize": quantize,
            "calibration": None if calibration is None or quantize != "int8" else
            {"file": str(calibration), "texts": len(texts), "sha256": manifest["calibration"]["sha256"]},
            "dim": manifest["dim"], "pooling": manifest["pooling"], "normalize": manifest["normalize"],
            "seconds": round(time.perf_counter() - t0, 1)}
