"""``export-encoder``: a sentence-transformers model -> an OpenVINO model folder (float32, or int8 calibrated on the
user's own prompts) that ``embed --model FOLDER`` and ``extend`` load like any model folder (``backends.openvino``).

The calibration set is a deterministic sample of the prompts file: its distinct texts, formatted as ``embed``
formats them (the same instruction), ordered by the sha256 of the text and cut at ``calibration_size``, so it does
not depend on the file's row order. The export is checked against the model on prompts it was not calibrated on
before it appears, and it appears whole or not at all (``io.staging.staged_dir``: built under a temporary name
beside ``out``, fsynced, renamed into place; a killed export's leftovers are swept by the next).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from .progress import Progress, no_progress, phase


# The export is checked against the model it came from on prompts it was not calibrated on, before it appears:
# float32 must give the model's vectors (float32 rounding through other kernels: cosine within 1e-4 of 1; a
# pooling or preprocessing the export re-implements differently gives far less), int8 is refused where it breaks
# down and said where it falls short of the 0.99 measured with 300 in-domain calibration prompts.
FLOAT_MIN_COSINE = 1 - 1e-4
INT8_MIN_COSINE = 0.95
INT8_WARN_COSINE = 0.99
CHECK_TEXTS = 100
FEW_CALIBRATION = 100
# checked when no prompts file is given (--quantize none): short, long, and longer than max_seq_length
PROBES = ("What is 7 + 5?", "Find the number of ordered pairs (a, b) of positive integers with a + b = 100 "
          "such that gcd(a, b) = 1, and explain why your count is right.",
          " ".join(f"Step {i}: add {i} to the running total and write the result." for i in range(60)))


def sample_texts(prompts, *, instruction: str | None, id_field: str, text_field: str, messages: str) -> list[str]:
    """The prompts file's distinct texts, formatted as ``embed`` formats them, ordered by their sha256: the first
    ``calibration_size`` calibrate int8, the next ones check the export. Neither depends on the file's row order."""
    import hashlib

    from ..backends.embed import format_text
    from ..io.tables import read_prompts

    _ids, texts = read_prompts(prompts, id_field=id_field, text_field=text_field, messages=messages)
    distinct = {format_text(t, instruction) for t in texts}
    return sorted(distinct, key=lambda t: hashlib.sha256(t.encode("utf-8")).digest())


def export_encoder(out, *, model: str = "bundled", quantize: str = "int8", calibration=None,
                   calibration_size: int = 300, instruction: str | None = None, use_instruction: bool = True,
                   id_field: str = "id", text_field: str = "prompt", messages: str = "user",
                   progress: Progress = no_progress) -> dict:
    """Export ``model`` to the OpenVINO model folder ``out`` (which must not exist); int8 (``quantize``) is
    calibrated on ``calibration_size`` prompts of the file ``calibration``, formatted with the instruction
    ``embed`` would use (the paper's unless ``instruction`` replaces it or ``use_instruction`` is False). The
    export is checked against the model on up to 100 other prompts of the file (fixed probes without one) and
    refused, leaving nothing, if it does not reproduce it (see FLOAT_MIN_COSINE, INT8_MIN_COSINE)."""
    from ..backends import openvino
    from ..backends.embed import DEFAULT_INSTRUCTION, Encoder, encoder_identity, resolve_model
    from ..io.staging import staged_dir

    t0 = time.perf_counter()
    out = Path(out)
    if quantize not in openvino.QUANTIZE:
        raise InvalidArgumentError(f"--quantize must be one of {', '.join(openvino.QUANTIZE)}, got {quantize!r}")
    if calibration_size < 1:
        raise InvalidArgumentError(f"--calibration-size must be >= 1, got {calibration_size}")
    if instruction is not None and not use_instruction:
        raise InvalidArgumentError("--instruction and --no-instruction cannot be used together")
    if instruction is not None and not instruction.strip():
        raise InvalidArgumentError("--instruction is empty; use --no-instruction to embed the raw text")
    if quantize == "int8" and calibration is None:
        raise InvalidArgumentError("int8 quantization is calibrated on your prompts: pass --calibration FILE (the "
                                   "prompts file you will embed), or --quantize none")
    if os.path.lexists(out):
        raise InvalidArgumentError(f"--out {out} exists; remove it or choose another folder")
    target, local = resolve_model(model)
    if local and openvino.is_export(target):
        raise InvalidArgumentError(f"--model {model} is already an OpenVINO export; pass the model it was made from")
    openvino.import_openvino()  # the extra's one-line error before anything is read or loaded
    if quantize == "int8":
        openvino.import_nncf()
    instr = (instruction if instruction is not None else DEFAULT_INSTRUCTION) if use_instruction else None
    texts, check, check_kind = [], list(PROBES), "probes"
    warnings = []
    if calibration is not None:
        sample = sample_texts(calibration, instruction=instr, id_field=id_field, text_field=text_field,
                              messages=messages)
        if quantize == "int8":
            texts = sample[:calibration_size]
            held_out = sample[calibration_size:calibration_size + CHECK_TEXTS]
            check, check_kind = (held_out, "held-out prompts") if held_out else (texts[:CHECK_TEXTS], "calibration prompts")
            if len(texts) < FEW_CALIBRATION:
                warnings.append(f"int8 calibrated on {len(texts)} prompts only (300 measured): its vectors can "
                                "stray on prompts unlike them; give a larger --calibration file")
            if not held_out:
                warnings.append("every prompt of --calibration calibrated int8, so the export was checked on "
                                "those same prompts")
        else:
            check, check_kind = sample[:CHECK_TEXTS], "prompts"
    phase(progress, "loading the model")
    identity = encoder_identity(model, "cpu")
    source = Encoder(model, "cpu")
    try:
        with staged_dir(out, replace=False) as tmp:
            manifest = openvino.export(source.model_, tmp, quantize=quantize, calibration=texts,
                                       source={"model": identity["model"], "files": identity["files"]},
                                       log=lambda message: phase(progress, message))
            phase(progress, f"checking the export against the model on {len(check):,} prompts")
            cos = _cosines(openvino.OpenVinoEncoder(tmp, "cpu").encode(check), source.encode(check))
            floor = FLOAT_MIN_COSINE if quantize == "none" else INT8_MIN_COSINE
            if cos.min() < floor:
                raise BackendError(f"the {quantize if quantize == 'int8' else 'float32'} export does not reproduce "
                                   f"the model (cosine {cos.min():.4f} on the worst of {len(check)} prompts, below "
                                   f"{floor}); nothing written"
                                   + ("; calibrate on more of your prompts" if quantize == "int8" else ""))
            if quantize == "int8" and cos.min() < INT8_WARN_COSINE:
                warnings.append(f"the int8 export's worst cosine to the model is {cos.min():.4f} on {len(check)} "
                                "prompts (0.993 or more measured with 300 calibration prompts)")
            manifest["check"] = {"texts": len(check), "of": check_kind, "cosine_min": round(float(cos.min()), 6), "cosine_mean": round(float(cos.mean()), 6)}
            openvino.write_manifest(tmp, manifest)
    except OSError as exc:
        raise BackendError(f"cannot write {out} ({exc.__class__.__name__}: {exc})") from None
    return {"command": "export-encoder", "out": str(out), "model": identity["model"], "quantize": quantize,
            "calibration": None if quantize != "int8" else
            {"file": str(calibration), "texts": len(texts), "sha256": manifest["calibration"]["sha256"]},
            "check": manifest["check"], "dim": manifest["dim"], "pooling": manifest["pooling"],
            "normalize": manifest["normalize"], "warnings": warnings, "seconds": round(time.perf_counter() - t0, 1)}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
