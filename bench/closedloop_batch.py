"""Run many closed-loop runs (scheduler x seed) of one regime in parallel, without Snakemake.

For a machine with many cores and no Snakemake (or a regime search that tries candidates before one is
written into configs/closedloop.yaml): each run is ``python -m closedloop run`` with one thread, ``--jobs``
at a time, in the order given (every seed of the first scheduler first: a run cut short by a time limit
leaves whole arms of the first schedulers). Data and the SFT policy come from the ``data`` and ``sft``
stages; every flag not listed by ``--help`` (``--steps``, ``--lr``, ``--eval-every``, ...) is passed on to
``python -m closedloop run`` as it is, with its defaults there, ``{seed}`` in them replaced by the run's seed
(the uncensored regime: ``--steps 240 --rollout-budget-from RUNS/ds/s{seed}`` once the ds runs have finished).
The report stage reads the runs folder as it reads the workflow's.

    python bench/closedloop_batch.py --data artifacts/rs/c4/data --policy artifacts/rs/c4/policy \\
        --runs artifacts/rs/c4/runs --schedulers uniform,ds,oracle-ds,oracle-thompson --seeds 0-5 \\
        --jobs 16 --steps 80 --batch-prompts 32 --lr 0.0003    # closedloop run's flags, passed on
    python -m closedloop report --runs artifacts/rs/c4/runs --out artifacts/rs/c4/report

Prints one JSON line per finished run (scheduler, seed, wall seconds, exit code) and a summary line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import ROOT, seeds_of  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True)
    p.add_argument("--policy", required=True)
    p.add_argument("--state", default=None, help="graphdiff STATE at step 0 (the gd-* arms)")
    p.add_argument("--runs", required=True)
    p.add_argument("--schedulers", required=True)
    p.add_argument("--seeds", default="0-5")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    a, run_flags = p.parse_known_args(argv)  # every other flag is closedloop run's (--steps, --lr, ...), passed on
    names = [s for s in a.schedulers.split(",") if s]
    jobs = [(s, seed) for s in names for seed in seeds_of(a.seeds)]
    runs = Path(a.runs)
    gpus = 0
    if a.device != "cpu":
        import torch

        gpus = torch.cuda.device_count()

    def one(job):
        k, (s, seed) = job
        out = runs / s / f"s{seed}"
        if (out / "summary.json").exists():
            return {"scheduler": s, "seed": seed, "seconds": 0.0, "rc": 0, "cached": True}
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "closedloop", "run", "--data", a.data, "--policy", a.policy,
               "--scheduler", s, "--seed", str(seed), "--out", str(out), "--threads", "1", "--device", a.device,
               *(f.replace("{seed}", str(seed)) for f in run_flags)]
        if a.state and s.startswith("gd-"):
            cmd += ["--state", a.state]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if gpus > 1:  # one GPU per run, round robin (a run sees one device, as closedloop run requires)
            env["CUDA_VISIBLE_DEVICES"] = str(k % gpus)
        t0 = time.perf_counter()
        with (out / "run.log").open("w") as log:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        return {"scheduler": s, "seed": seed, "seconds": round(time.perf_counter() - t0, 1), "rc": rc}

    t0 = time.perf_counter()
    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for fut in as_completed([pool.submit(one, j) for j in enumerate(jobs)]):
            r = fut.result()
            failed += r["rc"] != 0
            print(json.dumps(r), flush=True)
    print(json.dumps({"runs": len(jobs), "failed": failed, "wall_seconds": round(time.perf_counter() - t0, 1),
                      "jobs": a.jobs}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
