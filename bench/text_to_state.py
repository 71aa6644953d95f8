#!/usr/bin/env python3
"""From a JSONL of prompt text to a STATE ready for step 1, as one run: what a user pays before the first step.

Two subcommands:

``prompts``  writes a prompt file of ``--n`` distinct problems: every distinct problem text of ../shared/data
             (DeepScaleR's 29,095, MATH's 12,500, One-Shot's 1,209: 35,884 after removing repeats), then, to reach
             ``--n``, numeric variants of them in order (variant v of a problem adds v to each integer in its
             text; a problem with no integer is prefixed "Problem v: "). The variants keep the real problems'
             lengths, so the encoder's cost per prompt is the real one; they sit close to their source in the
             embedding, as the near-duplicates of augmented RL sets do. A synthetic set beyond the 35,884 real
             texts: say so beside every figure read from it.

``run``      runs, one after another in one process tree, the commands a user's script runs (and the workflow's
             rules: export_encoder, embed, build_graph, cluster, init_state): ``export-encoder`` (with
             ``--backend openvino-int8``; int8 calibrated on the file), ``embed`` (an empty cache of its own),
             ``build-graph --k-nn 80``, ``cluster --states 320``, ``init --preset default --embeddings``.
             Prints each stage's wall and CPU seconds (the child's rusage), its peak resident set, what it stamps
             (the export's cosine to the model, edges, the eigen-residual, k-means inertia), the total, and the
             load average before and after (a loaded machine inflates wall seconds; CPU seconds much less).

    .venv/bin/python bench/text_to_state.py prompts --n 150000 --out /tmp/t2s/prompts.jsonl
    .venv/bin/python bench/text_to_state.py run --prompts /tmp/t2s/prompts.jsonl --work /tmp/t2s/w \\
        --backend openvino-int8 --kmeans faiss
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import SHARED_DATA, emit, run_graphdiff  # noqa: E402

INTEGER = re.compile(r"\d+")


def real_problems(data: Path = SHARED_DATA) -> list[str]:
    """Every distinct problem text of the shared data sets, in a fixed order (DeepScaleR, MATH train, MATH test,
    One-Shot)."""
    files = [(data / "deepscaler_difficulty" / "problems.jsonl", "problem"),
             (data / "math" / "math_train.jsonl", "problem"), (data / "math" / "math_test.jsonl", "problem"),
             (data / "oneshot_rlvr" / "prompts.jsonl", "problem")]
    missing = [str(f) for f, _ in files if not f.exists()]
    if missing:
        raise SystemExit(f"the shared data is not here: {', '.join(missing)}")
    seen: dict[str, None] = {}
    for path, field in files:
        with open(path, encoding="utf-8") as f:
            for line in f:
                text = json.loads(line)[field].strip()
                if text:
                    seen.setdefault(text, None)
    return list(seen)


def variant(text: str, v: int) -> str:
    """Variant v >= 1 of a problem: each integer in it plus v, or "Problem v: " before a text with none."""
    out, n = INTEGER.subn(lambda m: str(int(m.group()) + v), text)
    return out if n else f"Problem {v}: {text}"


def prompts(args) -> dict:
    real = real_problems()
    texts: dict[str, None] = dict.fromkeys(real[: args.n])
    v = 1
    while len(texts) < args.n:
        for text in real:
            texts.setdefault(variant(text, v), None)
            if len(texts) == args.n:
                break
        v += 1
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out.parent, delete=False, encoding="utf-8") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": f"p{i:07d}", "problem": text}) + "\n")
    os.replace(f.name, out)
    lengths = sorted(len(t) for t in texts)
    return {"out": str(out), "prompts": len(texts), "real": min(len(real), args.n),
            "variants": max(0, len(texts) - len(real)), "max_variant": v - 1 if len(texts) > len(real) else 0,
            "chars_median": lengths[len(lengths) // 2], "chars_p99": lengths[int(0.99 * (len(lengths) - 1))]}


def _stamps(name: str, res: dict) -> dict:
    """What a stage's --json result says of its quality and size."""
    get = lambda d, *keys: [d := (d or {}).get(k) for k in keys][-1]  # noqa: E731  a nested key, or None
    picks = {
        "export-encoder": {"quantize": ("quantize",), "calibration_texts": ("calibration", "texts"),
                           "check_texts": ("check", "texts"), "check_of": ("check", "of"),
                           "cosine_min": ("check", "cosine_min"), "cosine_mean": ("check", "cosine_mean")},
        "embed": {"n_prompts": ("n_prompts",), "embedded": ("embedded",), "cached": ("cached",), "dim": ("dim",),
                  "prompts_per_s": ("prompts_per_s",)},
        "build-graph": {"n_nodes": ("summary", "n_nodes"), "n_edges": ("summary", "n_edges"),
                        "mean_degree": ("summary", "mean_degree"), "components": ("summary", "components"),
                        "isolated": ("summary", "isolated"), "index": ("index",), "recall": ("recall",)},
        "cluster": {"states": ("states",), "eigen_solver": ("spectral", "eigen_solver"),
                    "eigen_residual": ("spectral", "eigen_residual"), "kmeans": ("spectral", "kmeans"),
                    "kmeans_inertia": ("spectral", "kmeans_inertia"), "sizes": ("sizes",)},
        "init": {"n_prompts": ("n_prompts",), "states": ("states",), "edges": ("edges",), "readout": ("readout",)},
    }[name]
    return {k: v for k, path in picks.items() if (v := get(res, *path)) is not None}


MARKER = ".text_to_state"


def run(args) -> dict:
    work = Path(args.work)
    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            raise SystemExit(f"{work}: not empty and not a folder this script made; give an empty or new --work")
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by bench/text_to_state.py run; emptied by its next run\n")
    prompts_file = Path(args.prompts).resolve()
    n = sum(1 for _ in open(prompts_file, encoding="utf-8"))
    fields = ["--id-field", "id", "--text-field", "problem"]
    plan = []
    model = "bundled"
    if args.backend == "openvino-int8":
        model = str(work / "encoder")
        plan.append(("export-encoder", ["export-encoder", "--model", "bundled", "--out", model,
                                        "--calibration", str(prompts_file), *fields]))
    plan += [
        ("embed", ["embed", str(prompts_file), "--out", str(work / "embeddings.zarr"), "--model", model,
                   "--device", "cpu", "--cache-dir", str(work / "cache"), *fields]),
        ("build-graph", ["build-graph", str(work / "embeddings.zarr"), "--out", str(work / "graph.zarr"),
                         "--k-nn", str(args.k_nn), "--device", "cpu", "--index", args.index]),
        ("cluster", ["cluster", str(work / "graph.zarr"), "--out", str(work / "clusters.zarr"),
                     "--states", str(args.states), "--eigen-solver", args.eigen_solver, "--kmeans", args.kmeans]),
        ("init", ["init", "--graph", str(work / "graph.zarr"), "--clusters", str(work / "clusters.zarr"),
                  "--embeddings", str(work / "embeddings.zarr"), "--out", str(work / "STATE"),
                  "--preset", "default", "--device", "cpu"]),
    ]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    stages = []
    for name, argv in plan:
        res, wall = run_graphdiff(*argv)
        st = {"stage": name, "wall_s": round(wall, 1), "cpu_s": round(res["cpu_s"], 1),
              "peak_rss_mb": round(res["peak_rss_mb"]), "stamps": _stamps(name, res)}
        stages.append(st)
        print(f"{name}: {st['wall_s']} s wall, {st['cpu_s']} CPU s, {st['stamps']}", file=sys.stderr)
    total = time.perf_counter() - t0
    return {"date": date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
            "prompts": n, "backend": args.backend, "k_nn": args.k_nn, "states": args.states, "index": args.index,
            "eigen_solver": args.eigen_solver, "kmeans": args.kmeans, "stages": stages,
            "total_wall_s": round(total, 1), "total_wall_min": round(total / 60, 2),
            "total_cpu_s": round(sum(s["cpu_s"] for s in stages), 1),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prompts", help="write the prompt file")
    p.add_argument("--n", type=int, default=150_000)
    p.add_argument("--out", required=True)
    r = sub.add_parser("run", help="text -> STATE, timed by stage")
    r.add_argument("--prompts", required=True)
    r.add_argument("--work", required=True, help="folder for the artifacts: new, empty, or one an earlier run made "
                   "(emptied first)")
    r.add_argument("--backend", choices=["torch", "openvino-int8"], default="openvino-int8")
    r.add_argument("--k-nn", type=int, default=80)
    r.add_argument("--states", default="320")
    r.add_argument("--index", default="exact")
    r.add_argument("--eigen-solver", default="arpack")
    r.add_argument("--kmeans", default="lloyd")
    for q in (p, r):
        q.add_argument("--json-out", help="also write the result here")
    args = ap.parse_args()
    emit(prompts(args) if args.cmd == "prompts" else run(args), args.json_out)


if __name__ == "__main__":
    main()
