"""A trainer-shaped loop for bench/chaos.py's resume part: one integration (verl <= 0.7's sampler, TRL's
callback and reward wrapper, OpenRLHF's prompt chooser and recorder), steps 1..--steps, a checkpoint file per
step written as that trainer writes its checkpoint, and a resume from one of them (--resume C).

Objects are shaped like the trainers' as tests/test_verl_integration.py, test_trl_integration.py and
test_openrlhf_integration.py shape them (no trainer is installed or run). Rewards are a hash of (prompt, step,
rollout), so a run resumed correctly ends at the STATE of an uninterrupted one. A refused resume is one line on
stderr, exit 3.

    .venv/bin/python bench/_resume_trainer.py verl STATE CKPT --steps 6 --prompts 600 [--resume C] [--run ID]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROLLOUTS, BATCH = 2, 4


def reward(pid: str, step: int, j: int) -> float:
    return float(zlib.crc32(f"{pid}|{step}|{j}".encode()) % 3 == 0)


def save(ckpt: Path, step: int, doc: dict) -> None:
    """A checkpoint as trainers write them: complete or absent."""
    tmp = ckpt / f".ckpt-{step}.tmp"
    tmp.write_text(json.dumps(doc, default=lambda x: x.item() if hasattr(x, "item") else list(x)))
    os.replace(tmp, ckpt / f"ckpt-{step}.json")


def load(ckpt: Path, step: int) -> dict:
    return json.loads((ckpt / f"ckpt-{step}.json").read_text())


def verl(args, ids):
    import torch

    from graphdiff_cli.integrations.verl import GraphdiffCurriculumSampler

    ds = SimpleNamespace(dataframe={"extra_info": [{"index": pid} for pid in ids]})
    cfg = {"train_batch_size": BATCH, "gen_batch_size": None, "dataloader_num_workers": 0,
           "sampler": {"class_path": "pkg://graphdiff_cli.integrations.verl", "class_name": "GraphdiffCurriculumSampler",
                       "state": args.state, "pool_factor": 2, "seed": 4}}
    sampler = GraphdiffCurriculumSampler(ds, cfg)
    if args.resume:
        sampler.load_state_dict(load(args.ckpt, args.resume))
    it = iter(sampler)
    for t in range(args.resume + 1, args.steps + 1):
        rows = [next(it) for _ in range(BATCH)]
        save(args.ckpt, t, sampler.state_dict())  # verl <= 0.7: _save_checkpoint, then sampler.update
        index = [ids[r] for r in rows for _ in range(ROLLOUTS)]
        scores = torch.zeros(len(index), 3)
        scores[:, -1] = torch.tensor([reward(ids[r], t, j) for r in rows for j in range(ROLLOUTS)])
        sampler.update(SimpleNamespace(non_tensor_batch={"index": np.array(index, dtype=object)},
                                       batch={"token_level_scores": scores}))


def trl(args, ids):
    from graphdiff_cli.integrations.trl import GraphdiffTRL

    gd = GraphdiffTRL(args.state)
    wrapped = gd.reward(lambda prompts, completions, level, **kw: list(level))
    gd.check_resume(args.resume)  # on_train_begin, with the checkpoint's global_step (0: a fresh run)
    for t in range(args.resume + 1, args.steps + 1):
        chosen = np.random.default_rng(t).choice(len(ids), BATCH, replace=False)
        batch = [ids[r] for r in chosen for _ in range(ROLLOUTS)]
        level = [reward(ids[r], t, j) for r in chosen for j in range(ROLLOUTS)]
        wrapped(prompts=batch, completions=batch, id=batch, level=level,
                trainer_state=SimpleNamespace(global_step=t - 1))  # during step t, global_step is t - 1
        gd.apply_step(t)  # on_step_end
        save(args.ckpt, t, {"global_step": t})  # the Trainer saves after on_step_end


class _Prompts:
    """OpenRLHF's PromptDataset as the chooser reads it: a label per row and rows of one prompt."""

    def __init__(self, ids):
        self.labels = [json.dumps({"id": pid, "answer": "x"}) for pid in ids]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, r):
        return self.labels[r]

    @staticmethod
    def collate_fn(rows):
        return rows[0]


def openrlhf(args, ids):
    from graphdiff_cli.integrations.openrlhf import PromptChooser, StepRecorder, parse_label

    ds = _Prompts(ids)
    chooser = PromptChooser(ds, args.state, batch_size=BATCH, n_samples=ROLLOUTS, choose="target", filtering=False,
                            pool_factor=2.0, seed=4)
    recorder = StepRecorder(args.state, batch_size=BATCH, n_samples=ROLLOUTS, run=args.run,
                            episode_prompts=len(ds))
    if args.resume:
        chooser.load_state_dict(load(args.ckpt, args.resume))
    loader = iter(chooser)
    for t in range(args.resume + 1, args.steps + 1):
        wave = [parse_label(next(loader))[0] for _ in range(BATCH)]
        for pid in wave:
            for j in range(ROLLOUTS):
                recorder.record(pid, reward(pid, t, j))
        save(args.ckpt, t, chooser.state_dict())  # OpenRLHF checkpoints after training on the wave


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("integration", choices=["verl", "trl", "openrlhf"])
    ap.add_argument("state")
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, required=True)
    ap.add_argument("--resume", type=int, default=0)
    ap.add_argument("--run", default="run-0")
    args = ap.parse_args()
    args.ckpt.mkdir(parents=True, exist_ok=True)
    ids = [f"p{i:05d}" for i in range(args.prompts)]
    from graphdiff_cli.errors import StateError

    try:
        globals()[args.integration](args, ids)
    except StateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
