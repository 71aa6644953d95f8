"""What verified reads cost: load time of an estimator-step-sized artifact with and without the checksum check.

    .venv/bin/python bench/verified_reads.py [--n 150000] [--k 320] [--repeats 5]

Writes one artifact with q (N x K float32) and the per-prompt arrays of a step, then reads every array
``repeats`` times verified (the stamp's checksums recomputed, as every graphdiff read does) and unverified
(the same Zarr reads without the check, ``Artifact.read_unchecked``: graphdiff itself never reads so), alternating,
and prints the medians and the overhead as a share of the unverified load. Also the write time with the
checksums taken.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from graphdiff_cli.io.artifacts import chunk_checksums, read_artifact, write_artifact


def load_all(path: Path, verified: bool = True) -> float:
    t = time.perf_counter()
    art = read_artifact(path, "bench-step")
    for name in ("q", "successes", "rollouts", "a", "b"):
        art.array(name) if verified else art.read_unchecked(name)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=150_000)
    ap.add_argument("--k", type=int, default=320)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    q = rng.random((a.n, a.k), dtype=np.float32)
    q /= q.sum(1, keepdims=True)
    arrays = {"q": q, "successes": rng.integers(0, 50, a.n), "rollouts": rng.integers(0, 80, a.n),
              "a": rng.random(a.k) + 1, "b": rng.random(a.k) + 1}
    root = Path(tempfile.mkdtemp(prefix="gd-verified-"))
    try:
        t = time.perf_counter()
        write_artifact(root / "v.zarr", "bench-step", arrays, attrs={"step": 1}, durable=False)
        write_s = time.perf_counter() - t
        shutil.copytree(root / "v.zarr", root / "u.zarr")  # a copy of its own: both read from the page cache
        load_all(root / "v.zarr"), load_all(root / "u.zarr", verified=False)  # warm the page cache for both
        ver, unv = [], []
        for _ in range(a.repeats):
            ver.append(load_all(root / "v.zarr"))
            unv.append(load_all(root / "u.zarr", verified=False))
        mv, mu = statistics.median(ver), statistics.median(unv)
        crc = []
        for _ in range(a.repeats):  # the check's own work: CRC-32C of every array just read
            t = time.perf_counter()
            for arr in arrays.values():
                chunk_checksums(arr, 13107)
            crc.append(time.perf_counter() - t)
        print(json.dumps({"n": a.n, "k": a.k, "q_mb": round(q.nbytes / 2**20, 1), "repeats": a.repeats,
                          "load_verified_s": round(mv, 4), "load_unverified_s": round(mu, 4),
                          "overhead_s": round(mv - mu, 4), "overhead_share": round((mv - mu) / mu, 4),
                          "crc_only_s": round(statistics.median(crc), 4),
                          "crc_share": round(statistics.median(crc) / mu, 4),
                          "write_s": round(write_s, 3), "machine": platform.machine(),
                          "python": platform.python_version()}))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
