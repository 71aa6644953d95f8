"""``graphdiff export-encoder``: a model -> an OpenVINO model folder (int8 by default) for ``embed --model``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import command, emit, progress, warn
from ..options import IdFieldOption


@command("export-encoder")
def export_encoder(
    out: Path = typer.Option(..., "--out", "-o", help="The model folder to write (must not exist); then embed "
                             "with --model FOLDER."),
    model: str = typer.Option("bundled", "--model", help="The model to export: 'bundled', a local model folder, or "
                              "a hub name already in the local Hugging Face cache."),
    quantize: str = typer.Option("int8", "--quantize", help="int8 (NNCF static quantization, calibrated on "
                                 "--calibration: ~3.9x the torch encoder's prompts per CPU second here) or none "
                                 "(OpenVINO float32, ~1.5x)."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", help="Prompts file (.jsonl, .csv or .parquet) "
                                               "to calibrate int8 on: the one you will embed."),
    calibration_size: int = typer.Option(300, "--calibration-size", help="Calibration prompts: the file's distinct "
                                         "texts with the smallest sha256, so row order does not matter."),
    instruction: Optional[str] = typer.Option(None, "--instruction", help="The instruction embed will use (as "
                                              "embed --instruction); calibration texts are formatted with it."),
    no_instruction: bool = typer.Option(False, "--no-instruction", help="Calibrate on the raw prompt text (for "
                                        "embed --no-instruction)."),
    id_field: IdFieldOption = "id",
    text_field: str = typer.Option("prompt", "--text-field", help="Column holding the prompt text (as embed's)."),
    messages: str = typer.Option("user", "--messages", help="How a chat-list prompt becomes text (as embed's)."),
):
    """Export an embedding model to OpenVINO's CPU runtime, int8 by default, for embed --model FOLDER (needs the
    openvino extra of graphdiff-rl). Its vectors differ slightly from the torch model's (int8: cosine 0.986 or
    more measured on MATH, DeepScaleR and One-Shot prompts), so the embedding cache keeps them apart."""
    from ...stages.export_encoder import export_encoder as run

    with progress("exporting the encoder") as update:
        res = run(out, model=model, quantize=quantize, calibration=calibration, calibration_size=calibration_size,
                  instruction=instruction, use_instruction=not no_instruction, id_field=id_field,
                  text_field=text_field, messages=messages, progress=update)
    for line in res["warnings"]:
        warn(line)
    cal, check = res["calibration"], res["check"]
    kind = f"int8 calibrated on {cal['texts']:,} prompts" if cal else "float32"
    emit(res, f"{res['model']} -> {res['out']} (OpenVINO, {kind}, {res['dim']}-d; cosine to the model >= "
              f"{check['cosine_min']:.4f} on {check['texts']} {check['of']}; {res['seconds']:.1f} s); embed with "
              f"--model {res['out']}")
