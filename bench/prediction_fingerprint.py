"""Replay a log through the estimator's presets and record every prediction, to show a refactor changed none.

    python bench/prediction_fingerprint.py ART_DIR --out before.npz            # graph, clusters and log of a run
    python bench/prediction_fingerprint.py ART_DIR --out after.npz --compare before.npz

ART_DIR is a workflow run folder (artifacts/demo, artifacts/oneshot, artifacts/math): its first
``graph/*.zarr``, ``clusters/*.zarr`` and ``data/log.jsonl`` are read with plain zarr and json, so
the script runs unchanged against any version of graphdiff. For each preset the log is replayed step
by step; before each step's update every field of ``Estimator.estimates`` for that step's prompts is
recorded, and after the last step the estimates of every prompt. ``--embeddings`` also hands the estimator
the run's ``embeddings.zarr`` (rows matched by id), so the default preset's read-out of the embedding is in the
replay (without it the read-out is off). ``--compare`` prints the largest
absolute difference per preset and field and exits 1 when any exceeds ``--atol`` (1e-9).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _read(art: Path):
    import scipy.sparse as sp
    import zarr

    graph = sorted((art / "graph").glob("*.zarr"))[0]
    clusters = sorted((art / "clusters").glob("*.zarr"))[0]
    g = zarr.open_group(str(graph), mode="r")
    ids = [str(x) for x in g["ids"][:]]
    n = len(ids)
    w = sp.csr_matrix((g["data"][:], g["indices"][:], g["indptr"][:]), shape=(n, n))
    c = zarr.open_group(str(clusters), mode="r")
    pos = {pid: i for i, pid in enumerate(str(x) for x in c["ids"][:])}
    labels = np.asarray(c["labels"][:])[[pos[i] for i in ids]].astype(np.int64)
    k = int(c.attrs["graphdiff"]["params"]["states"])
    index = {pid: i for i, pid in enumerate(ids)}
    rows = [json.loads(line) for line in (art / "data" / "log.jsonl").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: int(r["step"]))
    return w, labels, k, index, rows, graph.name, clusters.name


def _embeddings(art: Path, index: dict) -> np.ndarray:
    import zarr

    e = zarr.open_group(str(art / "embeddings.zarr"), mode="r")
    pos = {str(pid): i for i, pid in enumerate(e["ids"][:])}
    return np.asarray(e["embeddings"][:])[[pos[pid] for pid in index]]


def fingerprint(art: Path, presets=("default", "paper"), embeddings: bool = False) -> dict[str, np.ndarray]:
    from graphdiff_cli.estimator import Estimator, preset_settings

    w, labels, k, index, rows, gname, cname = _read(art)
    emb = _embeddings(art, index) if embeddings else None
    print(f"{art}: graph {gname}, clusters {cname}, N={w.shape[0]}, K={k}, {len(rows)} log rows", file=sys.stderr)
    steps = np.array([int(r["step"]) for r in rows])
    node = np.array([index[str(r["id"])] for r in rows])
    n = np.array([int(r["n"]) for r in rows])
    s = np.array([int(r["s"]) for r in rows])
    cuts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1], True])
    out = {}
    for preset in presets:
        est = Estimator(w, labels, n_states=k, embeddings=emb, **preset_settings(preset))
        per_step: dict[str, list] = {}
        for a, b in zip(cuts[:-1], cuts[1:]):
            e = est.estimates(node[a:b])
            for key, v in e.items():
                per_step.setdefault(key, []).append(np.asarray(v, dtype=np.float64))
            est.update(node[a:b], n[a:b], s[a:b])
        for key, parts in per_step.items():
            out[f"{preset}/step/{key}"] = np.concatenate(parts)
        for key, v in est.estimates().items():
            out[f"{preset}/final/{key}"] = np.asarray(v, dtype=np.float64)
        print(f"  {preset}: {len(cuts) - 1} steps replayed", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("art", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", type=Path)
    ap.add_argument("--atol", type=float, default=1e-9)
    ap.add_argument("--presets", default="default,paper")
    ap.add_argument("--embeddings", action="store_true", help="replay with ART_DIR/embeddings.zarr (the read-out)")
    args = ap.parse_args()
    fp = fingerprint(args.art, tuple(args.presets.split(",")), args.embeddings)
    np.savez_compressed(args.out, **fp)
    if args.compare is None:
        return 0
    ref = np.load(args.compare)
    worst = 0.0
    for key in sorted(ref.files):
        if key not in fp or fp[key].shape != ref[key].shape:
            print(f"{key}: missing or shape changed", file=sys.stderr)
            return 1
        d = float(np.max(np.abs(fp[key] - ref[key]))) if ref[key].size else 0.0
        worst = max(worst, d)
        if key.endswith(("/p", "/mean", "/p_zero_variance")):
            print(f"{key}: max |diff| {d:.3g} over {ref[key].size} values")
    print(f"largest difference over {len(ref.files)} arrays: {worst:.3g} (atol {args.atol:g})")
    return 0 if worst <= args.atol else 1


if __name__ == "__main__":
    sys.exit(main())
