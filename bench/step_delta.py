#!/usr/bin/env python3
"""Issue 32, item 1's design figure: what a delta step would write. A workflow run's log is replayed through the
default preset (the workflow's evaluate settings, with the read-out when the run has embeddings); after every
step the estimator's ``state_dict`` is compared with the previous step's, and for each per-prompt array the
rows (prompts) that changed are counted. Reported per array: the median and maximum share of rows changed per
step and the bytes a step writes as (index, row) pairs, against the bytes of the full arrays, which is what a
step writes today. An array that changes on every row (the forgotten counts under a per-step decay, the
harmonic field) is what a delta layout cannot shrink without a different representation.

    .venv/bin/python bench/step_delta.py artifacts/math        # artifacts/oneshot, artifacts/demo
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from _run import _one, run_inputs, run_log  # bench/ is on sys.path when a script runs
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.estimator_layout import PROMPT, STATE_ARRAYS
from graphdiff_cli.io.estimator_store import _STATIC  # what the model artifact holds, not a step
from graphdiff_cli.io.readers import embedding_matrix


def main() -> None:
    run = Path(sys.argv[1])
    inp = run_inputs(run)
    try:
        emb = embedding_matrix(_one(run, "embeddings.zarr"), inp.graph)
    except Exception:  # noqa: BLE001 - a run without embeddings: the preset without the read-out
        emb = None
    log = run_log(run, inp)
    est = Estimator(inp.w, inp.labels, inp.k, embeddings=emb, device="cpu", beta=2.0, gamma=0.5)
    per_prompt = {a.name: a.prompt_axis for a in STATE_ARRAYS if a.axis == PROMPT}
    n = len(inp.ids)
    prev = est.state_dict()
    changed = {name: [] for name in per_prompt}
    moved = {name: [] for name in per_prompt}  # rows that moved by more than 1e-6 (absolute)
    delta_bytes, full_bytes, fixed = [], [], []
    row_bytes = {}
    steps = np.unique(log["step"])
    for t in steps:
        sel = log["step"] == t
        est.update(log["id"][sel], log["n"][sel], log["s"][sel])
        cur = est.state_dict()
        db = fb = 0
        for name, ax in per_prompt.items():
            a, b = prev.get(name), cur.get(name)
            if b is None or np.size(b) == 0:
                continue
            b = np.asarray(b)
            fb += b.nbytes
            row_bytes[name] = b.nbytes // n
            if a is None or np.shape(a) != b.shape:
                rows = np.arange(n)
            else:
                diff = np.moveaxis(np.asarray(a) != b, ax, 0).reshape(n, -1)
                rows = np.flatnonzero(diff.any(axis=1))
                big = np.abs(np.asarray(a, dtype=np.float64) - b) > 1e-6
                moved[name].append(np.moveaxis(big, ax, 0).reshape(n, -1).any(axis=1).mean())
            changed[name].append(rows.size / n)
            db += rows.size * 8 + rows.size * b.nbytes // n
        others = sum(np.asarray(v).nbytes for k, v in cur.items()
                     if k not in per_prompt and k not in _STATIC and isinstance(v, np.ndarray))
        fixed.append(others)
        delta_bytes.append(db + others)
        full_bytes.append(fb + others)
        prev = cur
    q_bytes = np.asarray(cur["q"]).nbytes
    print(f"{run}: N {n}, K {inp.k}, {steps.size} steps, read-out {'on' if emb is not None else 'off'}; "
          f"settled: time forgetting {est.time_forgetting_}, w {est.propagation_}, r {est.readout_}")
    print(f"{'array':22s} {'bytes a row':>12s} {'median share of rows changed':>29s} {'max':>8s} "
          f"{'by > 1e-6: median':>18s}")
    for name, fr in changed.items():
        if fr:
            mv = f"{np.median(moved[name]):18.4f}" if moved[name] else ""
            print(f"{name:22s} {row_bytes[name]:12d} {np.median(fr):29.4f} {np.max(fr):8.4f} {mv}")
    print(f"arrays without a prompt axis (written whole): median {np.median(fixed) / 2**20:.3f} MiB")
    d, f = np.array(delta_bytes), np.array(full_bytes)
    print(f"bytes a step writes: full {np.median(f) / 2**20:.2f} MiB; as deltas median {np.median(d) / 2**20:.3f} MiB "
          f"(max {d.max() / 2**20:.3f}) = {np.median(d) / q_bytes:.1%} of one full q (max {d.max() / q_bytes:.1%})")


if __name__ == "__main__":
    main()
