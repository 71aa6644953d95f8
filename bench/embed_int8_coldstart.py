#!/usr/bin/env python3
"""The cold start with the int8 encoder: bench/cold_start.py's figures of the default preset (first-visit and
round-0 within-batch r, against label propagation) on two workflow runs of one log that differ only in their
embeddings, float32 (the torch encoder) and int8 (its OpenVINO export by `graphdiff export-encoder`), with the
95% circular block-bootstrap interval over steps of each figure and of the paired difference int8 - float32.

The pairing: both runs replay the same log (the script checks that the rows, step, id, n, s, are the same), so a
batch's first visits are the same rows in both and their within-batch r differs only through the embedding, the
mutual-kNN graph and the spectral states built from it. A step's difference is its r under int8 minus its r under
float32; the interval is ``evaluation.metrics.ratio_bootstrap`` over steps, the scheme of cold_start.py
(``within_r_difference``). Also: each prompt's cosine between its two embeddings, how many graph edges the two
graphs share, the adjusted Rand index of the two clusterings, and the last line of each run's embed log (its
prompts/s, when the workflow wrote one under logs/<run>/).

    .venv/bin/python bench/embed_int8_coldstart.py artifacts/oneshot-f32 artifacts/oneshot-int8 \\
        artifacts/math-f32 artifacts/math-int8 artifacts/demo-f32 artifacts/demo-int8
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import ROOT, adjusted_rand, emit, round0_steps, run_file, run_inputs, run_log, step_scores  # noqa: E402



def interval(d: dict) -> dict:
    return {"estimate": round(d["estimate"], 4), "lo": round(d["lo"], 4), "hi": round(d["hi"], 4),
            "steps": d["weighted_units"]}


def embed_line(run: Path) -> str | None:
    """The last line of logs/<run name>/embed.log (what embed says of its prompts/s), if the workflow wrote one."""
    log = ROOT / "logs" / Path(run).name / "embed.log"
    if not log.exists():
        return None
    lines = [ln for ln in log.read_text(encoding="utf-8").splitlines() if ln.strip()]
    return lines[-1] if lines else None


def replayed(run: Path):
    """The run's inputs, its log's rows with prompt ids as text, and the replay of label propagation and the
    default preset (exactly as cold_start.py replays them)."""
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.evaluation import baselines as B
    from graphdiff_cli.evaluation.methods import GraphdiffMethod
    from graphdiff_cli.evaluation.replay import replay

    inp = run_inputs(run)
    log = run_log(run, inp)
    res = replay(log["step"], log["id"], log["n"], log["s"],
                 [B.LabelPropagation(inp.w),
                  GraphdiffMethod(Estimator(inp.w, inp.labels, inp.k, preset="default", device="cpu"), name="default")],
                 n_nodes=len(inp.ids))
    ids = np.asarray([str(i) for i in inp.ids])
    return inp, ids, res


def structure(run_f: Path, inp_f, ids_f, run_q: Path, inp_q, ids_q) -> dict:
    """How far apart the two runs' embeddings, graphs and states are."""
    from graphdiff_cli import load_embeddings

    pos_q = {p: j for j, p in enumerate(ids_q)}
    order = np.asarray([pos_q[p] for p in ids_f])  # node j of float32 is node order[j] of int8
    e_f = load_embeddings(run_file(run_f, "embeddings.zarr"), run_file(run_f, "graph/*.zarr"))
    e_q = load_embeddings(run_file(run_q, "embeddings.zarr"), run_file(run_q, "graph/*.zarr"))[order]
    cos = np.sum(e_f * e_q, axis=1) / (np.linalg.norm(e_f, axis=1) * np.linalg.norm(e_q, axis=1))
    w_f = inp_f.w.tocoo()
    w_q = inp_q.w.tocoo()
    inv = np.argsort(order)  # int8 node -> float32 node
    edges_f = set(zip(w_f.row.tolist(), w_f.col.tolist()))
    edges_q = set(zip(inv[w_q.row].tolist(), inv[w_q.col].tolist()))
    shared = len(edges_f & edges_q)
    return {"cosine": {"min": round(float(cos.min()), 5), "p01": round(float(np.quantile(cos, 0.01)), 5),
                       "median": round(float(np.median(cos)), 5), "below_0.99": int(np.sum(cos < 0.99))},
            "graph_edges": {"float32": w_f.nnz // 2, "int8": w_q.nnz // 2, "shared": shared // 2,
                            "jaccard": round(shared / len(edges_f | edges_q), 4)},
            "states": {"float32": int(inp_f.k), "int8": int(inp_q.k),
                       "adjusted_rand": round(adjusted_rand(np.asarray(inp_f.labels),
                                                            np.asarray(inp_q.labels)[order]), 4)}}


def compare(run_f: Path, run_q: Path) -> dict:
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap, within_batch_scores, within_r_difference

    for name in ("data/log.jsonl", "data/prompts.jsonl"):
        a, b = (hashlib.sha256((r / name).read_bytes()).hexdigest() for r in (run_f, run_q))
        if a != b:
            raise SystemExit(f"{run_f}/{name} and {run_q}/{name} differ: the two runs are not a pair")
    inp_f, ids_f, res_f = replayed(run_f)
    inp_q, ids_q, res_q = replayed(run_q)
    rows_f = (res_f.step, ids_f[res_f.ids], res_f.n, res_f.s)
    rows_q = (res_q.step, ids_q[res_q.ids], res_q.n, res_q.s)
    if not all(np.array_equal(a, b) for a, b in zip(rows_f, rows_q)):
        raise SystemExit(f"{run_f} and {run_q}: the replayed rows differ")
    first, rate, step = ~res_f.seen, res_f.rate, res_f.step
    r0 = np.isin(step, round0_steps(res_f.step, res_f.ids))
    out = {"float32": str(run_f), "int8": str(run_q), "first_visits": int(first.sum()),
           "embed_log": {"float32": embed_line(run_f), "int8": embed_line(run_q)}}
    for label, sel in (("first visits", first), ("round 0", r0)):
        st, r = step[sel], rate[sel]
        p = {(v, m): res.predictions[m][sel] for v, res in (("float32", res_f), ("int8", res_q))
             for m in ("default", "labelprop")}
        fig = {}
        for v in ("float32", "int8"):
            r_d, mae_d = step_scores(step, res_f.predictions["default"] if v == "float32" else
                                     res_q.predictions["default"], rate, sel)
            r_l, _ = step_scores(step, res_f.predictions["labelprop"] if v == "float32" else
                                 res_q.predictions["labelprop"], rate, sel)
            fig[v] = {"default r": interval(r_d), "labelprop r": interval(r_l), "default MAE": interval(mae_d),
                      "default - labelprop": interval(within_r_difference(st, p[v, "default"], p[v, "labelprop"], r))}
        # paired: int8 - float32, step by step on the same rows
        rd_q, _, ok = within_batch_scores(st, p["int8", "default"], r)
        rd_f, _, _ = within_batch_scores(st, p["float32", "default"], r)
        rl_q, _, _ = within_batch_scores(st, p["int8", "labelprop"], r)
        rl_f, _, _ = within_batch_scores(st, p["float32", "labelprop"], r)
        gap = np.where(ok, (rd_q - rl_q) - (rd_f - rl_f), 0.0)
        starts = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
        err = np.add.reduceat(np.abs(p["int8", "default"] - r) - np.abs(p["float32", "default"] - r), starts)
        rows = np.diff(np.r_[starts, st.size]).astype(np.float64)
        fig["int8 - float32"] = {
            "default r": interval(within_r_difference(st, p["int8", "default"], p["float32", "default"], r)),
            "labelprop r": interval(within_r_difference(st, p["int8", "labelprop"], p["float32", "labelprop"], r)),
            "default - labelprop": interval(ratio_bootstrap(gap, ok.astype(np.float64))),
            "default MAE": interval(ratio_bootstrap(err, rows)),
        }
        d = fig["int8 - float32"]["default r"]
        own = fig["float32"]["default r"]
        fig["verdict"] = {
            "paired interval of default r holds 0": bool(d["lo"] <= 0 <= d["hi"]),
            "int8 default r inside float32's interval": bool(own["lo"] <= fig["int8"]["default r"]["estimate"]
                                                             <= own["hi"]),
        }
        out[label] = fig
    out["structure"] = structure(run_f, inp_f, ids_f, run_q, inp_q, ids_q)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="pairs of run folders: FLOAT32 INT8 [FLOAT32 INT8 ...]")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if len(args.runs) % 2:
        ap.error("give the runs in pairs: FLOAT32 INT8")
    pairs = list(zip(args.runs[::2], args.runs[1::2]))
    emit({f"{a.name} / {b.name}": compare(a, b) for a, b in pairs}, args.out)


if __name__ == "__main__":
    main()
