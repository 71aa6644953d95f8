#!/usr/bin/env python3
"""A trainer's between-steps call from Python, two ways.

``--mode inprocess`` (a Python trainer): the public ``State`` object, no subprocess; it keeps the
estimator in memory between steps::

    from graphdiff_cli import State
    st = State.open(STATE)
    st.update(step, rows)                                 # exactly one step; crash-safe (docs/reference/handoff.md)
    p = st.estimates()["p"]                               # p-hat of every candidate, for the sampler

``--mode inbox`` (a trainer that must not wait on graphdiff's imports, or runs elsewhere): the trainer
only drops one outcomes file per step into an inbox, ``step-<T>.jsonl``, written to a temporary name
and renamed into place; a ``graphdiff watch --state STATE --inbox INBOX --predictions preds-{step}.jsonl``
process (started here; in production a service or cron job) applies each file exactly once, in step
order, and writes that step's predictions, which the trainer reads before the next step.

The "trainer" is a stand-in: each prompt has a hidden success rate that rises a little every step;
replace ``rollout`` with your generation and reward code. Both modes resume after a crash at the
STATE's step + 1.

    bash scripts/demo.sh && cp -r artifacts/demo/STATE /tmp/STATE
    .venv/bin/python examples/python_loop.py --state /tmp/STATE --steps 3 --mode inbox
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np


def rollout(ids: list[str], step: int, n: int, rng) -> list[dict]:
    """Stand-in for generation + reward: n binary rewards per prompt, one row per rollout."""
    rows = []
    for pid in ids:
        p = min(1.0, 0.05 + 0.9 * (zlib.crc32(pid.encode()) % 1000) / 1000 + 0.01 * step)
        rows += [{"id": pid, "reward": float(r)} for r in rng.binomial(1, p, size=n)]
    return rows


def choose(ids: list[str], p: np.ndarray, batch_size: int) -> list[str]:
    """The scheduler's part: the prompts whose predicted success rate is closest to 1/2."""
    order = np.argsort(np.abs(p - 0.5), kind="stable")[:batch_size]
    return [ids[i] for i in order]


def write_atomically(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")  # not a step name: the watcher never reads it
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    os.replace(tmp, path)


def read_predictions(path: Path) -> tuple[list[str], np.ndarray]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [r["id"] for r in rows], np.array([r["p"] for r in rows])


def run_inprocess(args, rng) -> None:
    from graphdiff_cli import State

    st = State.open(args.state, device=args.device)
    start = st.step + 1
    est = st.estimates()
    for t in range(start, start + args.steps):
        batch = choose(est["id"], est["p"], args.batch_size)
        # the between-steps call: the rows are written to STATE.outcomes/ and applied as one step
        res = st.update(t, rollout(batch, t, args.rollouts, rng))
        est = st.estimates()
        print(f"step {t}: {res['successes']}/{res['rollouts']} rollouts succeeded; mean p-hat "
              f"{est['p'].mean():.3f} ({st.loads} read of the STATE)")


def run_inbox(args, rng) -> None:
    exe = shutil.which("graphdiff") or str(Path(sys.executable).with_name("graphdiff"))
    inbox = args.state.parent / f"{args.state.name}.inbox"
    inbox.mkdir(exist_ok=True)
    preds = args.state.parent / f"{args.state.name}.preds" / "preds-{step}.jsonl"
    status = json.loads(subprocess.run([exe, "status", "--state", str(args.state), "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    start = status["step"] + 1
    watcher = subprocess.Popen([exe, "watch", "--state", str(args.state), "--inbox", str(inbox), "--poll", "0.2",
                                "--predictions", str(preds), "--until-step", str(start + args.steps - 1), "-q"])
    try:
        for t in range(start, start + args.steps):
            ids, p = wait_for(Path(str(preds).replace("{step}", f"{t - 1:06d}")), watcher)
            batch = choose(ids, p, args.batch_size)
            write_atomically(inbox / f"step-{t:06d}.jsonl", rollout(batch, t, args.rollouts, rng))
            print(f"step {t}: trained on {len(batch)} prompts (mean p-hat before the step {p.mean():.3f})")
        ids, p = wait_for(Path(str(preds).replace("{step}", f"{start + args.steps - 1:06d}")), watcher)
        print(f"after step {start + args.steps - 1}: mean p-hat {p.mean():.3f}")
        if watcher.wait(timeout=120) != 0:
            sys.exit(f"graphdiff watch exited with {watcher.returncode}")
    finally:
        if watcher.poll() is None:
            watcher.terminate()  # graphdiff watch finishes the step in progress, then exits
            watcher.wait()


def wait_for(path: Path, watcher, timeout: float = 600.0):
    """The predictions of one step, once the watcher has written them (written atomically)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if watcher.poll() is not None and not path.exists():
            sys.exit(f"graphdiff watch exited ({watcher.returncode}) before writing {path}")
        if time.monotonic() > deadline:
            sys.exit(f"no {path} after {timeout:.0f} s")
        time.sleep(0.1)
    return read_predictions(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", required=True, type=Path, help="STATE directory from graphdiff init")
    ap.add_argument("--mode", choices=("inprocess", "inbox"), default="inprocess")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--rollouts", type=int, default=8, help="rollouts per prompt")
    ap.add_argument("--device", default="cpu", help="auto, cpu or cuda (in-process mode)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    (run_inprocess if args.mode == "inprocess" else run_inbox)(args, rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
