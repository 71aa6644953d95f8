#!/usr/bin/env python3
"""Any trainer, any language: drive graphdiff through its CLI between training steps.

The loop a trainer runs, once per step T = 1, 2, ...:

    graphdiff select --state STATE --candidates pool.txt --batch-size B --strategy target --out batch.txt
    ... roll out every prompt of batch.txt n times, score the rollouts ...
    write outcomes_T.jsonl: one row per rollout {"id": ..., "reward": ...} (or per prompt {"id", "n", "s"})
    graphdiff update --state STATE --step T --outcomes outcomes_T.jsonl

Here the "trainer" is a stand-in: each prompt has a hidden success probability (drawn from its id)
that rises a little every step, and a rollout succeeds with that probability. Replace ``rollout`` with
your generation and reward code. ``graphdiff update`` refuses a step twice or a gap, so after a crash
the loop resumes at ``graphdiff status``'s step + 1 (or roll back to your checkpoint's step).

    python examples/trainer_subprocess.py --state runs/STATE --steps 5 --batch-size 16
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np


def graphdiff(*args) -> dict:
    """Run one graphdiff command; its --json result, or exit with its one-line error."""
    exe = shutil.which("graphdiff") or str(Path(sys.executable).with_name("graphdiff"))
    res = subprocess.run([exe, *map(str, args), "--json"], capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"graphdiff {args[0]} failed ({res.returncode}): {res.stderr.strip()}")
    return json.loads(res.stdout)


def hidden_p(pid: str, step: int) -> float:
    base = (zlib.crc32(pid.encode()) % 1000) / 1000
    return min(1.0, 0.05 + 0.9 * base + 0.01 * step)


def rollout(pid: str, step: int, n: int, rng) -> list[float]:
    """Stand-in for generation + reward: n binary rewards."""
    return rng.binomial(1, hidden_p(pid, step), size=n).astype(float).tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, type=Path, help="STATE directory from graphdiff init")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--pool-factor", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=8, help="rollouts per prompt")
    ap.add_argument("--strategy", default="target")
    ap.add_argument("--work", type=Path, default=None, help="folder for the step files [STATE.work]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    work = args.work or args.state.parent / f"{args.state.name}.work"
    work.mkdir(parents=True, exist_ok=True)
    status = graphdiff("status", "--state", args.state)
    ids = [json.loads(x)["id"] for x in _predict_all(args.state, work).read_text().splitlines()]
    rng = np.random.default_rng(args.seed)
    start = status["step"] + 1  # resume after the last applied step
    for t in range(start, start + args.steps):
        pool = rng.choice(ids, size=min(len(ids), args.pool_factor * args.batch_size), replace=False)
        (work / "pool.txt").write_text("\n".join(pool) + "\n")
        sel = graphdiff("select", "--state", args.state, "--candidates", work / "pool.txt", "--batch-size",
                        args.batch_size, "--strategy", args.strategy, "--seed", t, "--group-size", args.rollouts,
                        "--out", work / "batch.txt")
        batch = (work / "batch.txt").read_text().split()
        rows = [{"id": pid, "reward": r} for pid in batch for r in rollout(pid, t, args.rollouts, rng)]
        outcomes = work / f"outcomes_{t:06d}.jsonl"
        outcomes.write_text("".join(json.dumps(r) + "\n" for r in rows))
        up = graphdiff("update", "--state", args.state, "--step", t, "--outcomes", outcomes)
        share = np.mean([0 < sum(r["reward"] for r in rows if r["id"] == pid) < args.rollouts for pid in batch])
        print(f"step {t}: predicted effective share {sel['predicted_effective_share']['chosen']:.2f}, "
              f"observed {share:.2f}; {up['successes']}/{up['rollouts']} rollouts succeeded")
    return 0


def _predict_all(state: Path, work: Path) -> Path:
    out = work / "all.jsonl"
    graphdiff("predict", "--state", state, "--out", out)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
