#!/usr/bin/env python3
"""GRPO with TRL's ``GRPOTrainer`` and graphdiff's dynamic sampling (DS), on the CPU in about a minute.

What a TRL user copies (replace the three marked parts with their own):

1. a prompt set with a stable id per row -> a graphdiff STATE, once, with the CLI
   (``graphdiff embed / build-graph / cluster / init``: ``build_state`` below);
2. a reward function with TRL's signature; graphdiff needs the data set's ``id`` column, which TRL
   passes to every reward function as a keyword argument (``correctness`` below);
3. ``GraphdiffTRL(STATE, dynamic_sampling=True)`` wrapping that reward function, then ``gd.attach(trainer)``.

With ``dynamic_sampling=True`` each optimiser step trains on B groups whose rewards are not all equal
(0 < successes < n): graphdiff's pre-filter skips candidates it predicts all-correct or all-wrong before
they are generated, the groups that come back all-equal are dropped and the batch is refilled (at most
``max_generation_rounds`` generation rounds a step), and every generated group, dropped or not, is applied
to the STATE at the end of the step. ``dynamic_sampling="uniform"`` is plain DS (no pre-filter).

The toy task: four families of prompts ("write any word" is nearly always solved, "write the number
twelve" never - its answer is not in the tiny vocabulary -, "write an even digit" sometimes, "write the
digit 7" rarely), a randomly initialised 1-layer Llama and a word-level tokenizer built here (no download).

    .venv/bin/python examples/trl/grpo_dynamic_sampling.py --out /tmp/trl-ds --steps 6
    .venv/bin/python examples/trl/grpo_dynamic_sampling.py --out /tmp/trl-ds-uniform --ds uniform
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

FAMILIES = [  # (instruction, the words that count as right; "*" = any word)
    ("write any word", ["*"]),
    ("write the number twelve", ["12"]),
    ("write an even digit", ["0", "2", "4", "6", "8"]),
    ("write the digit 7", ["7"]),
]


def prompt_rows(n: int) -> list[dict]:
    """The prompt set: one row per prompt, a stable ``id`` (what graphdiff and the reward function see)."""
    rows = []
    for i in range(n):
        text, answers = FAMILIES[i % len(FAMILIES)]
        rows.append({"id": f"q{i:03d}", "prompt": f"Problem {i} : {text} .", "answers": answers})
    return rows


# -- 1. the STATE, built once from the prompts (the same four commands on a real prompt set) -----------

def graphdiff_command() -> list[str]:
    exe = Path(sys.executable).with_name("graphdiff")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("graphdiff")
    return [found] if found else [sys.executable, "-m", "graphdiff_cli.cli"]


def build_state(rows: list[dict], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "STATE"
    if state.exists():
        return state
    prompts = folder / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": r["id"], "prompt": r["prompt"]}) + "\n" for r in rows),
                       encoding="utf-8")
    gd = graphdiff_command()
    for args in (["embed", str(prompts), "--out", str(folder / "emb.zarr")],  # the bundled MiniLM encoder
                 ["build-graph", str(folder / "emb.zarr"), "--out", str(folder / "graph.zarr"), "--k-nn", "8"],
                 ["cluster", str(folder / "graph.zarr"), "--out", str(folder / "clusters.zarr"), "--states", "4"],
                 ["init", "--graph", str(folder / "graph.zarr"), "--clusters", str(folder / "clusters.zarr"),
                  "--out", str(state)]):
        subprocess.run([*gd, *args, "-q"], check=True)
    return state


# -- 2. the reward function (TRL's signature; replace the body with your checker) ----------------------

def correctness(prompts: list[str], completions: list[str], id: list[str], answers: list[list[str]],
                trainer_state=None, **kwargs) -> list[float]:
    """TRL calls every reward function with the prompts, the completions and every data set column as
    lists of equal length (one entry per completion), plus ``trainer_state`` and a few helpers in
    ``kwargs``. Return one float per completion; graphdiff counts reward >= success_threshold (1.0) as a
    success. ``id`` is unused here but graphdiff's wrapper reads it: keep an ``id`` column."""
    return [float(any(w in ans or "*" in ans for w in completion.split())) for completion, ans in
            zip(completions, answers)]


# -- the tiny policy (replace with AutoModelForCausalLM.from_pretrained(...) and its tokenizer) ---------

def tokenizer(rows: list[dict]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[BOS]", "[EOS]", *[str(d) for d in range(10)]]
    for r in rows:
        words += [w for w in r["prompt"].split() if w not in words]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def tiny_lm(tok, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(cfg)


# -- 3. the trainer with graphdiff's dynamic sampling ---------------------------------------------------

def no_checkpointing(config_class) -> dict:
    """Activation checkpointing off (a one-layer model has no activations worth recomputing). TRL's configs turn
    it on by default through ``gradient_checkpointing``, which transformers 5 deprecated in favour of
    ``activation_checkpointing`` (a FutureWarning at every config); the new name where the config has it."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(config_class)}
    return {"activation_checkpointing": False} if "activation_checkpointing" in names else \
        {"gradient_checkpointing": False}


def train(out: Path, steps: int = 6, ds="prefilter", max_rounds: int = 6, n_prompts: int = 48,
          groups: int = 4, generations: int = 4, seed: int = 0):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from graphdiff_cli.integrations.trl import GraphdiffTRL

    rows = prompt_rows(n_prompts)
    state = build_state(rows, out)
    dataset = Dataset.from_list(rows)  # columns id, prompt, answers: each reaches the reward function
    gd = GraphdiffTRL(state, dynamic_sampling=ds, max_generation_rounds=max_rounds, seed=seed)
    tok = tokenizer(rows)
    args = GRPOConfig(output_dir=str(out / "trainer"), per_device_train_batch_size=groups * generations,
                      num_generations=generations, max_completion_length=6, max_steps=steps, learning_rate=1e-3,
                      beta=0.0, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, seed=seed,
                      dataloader_num_workers=0, disable_tqdm=True, **no_checkpointing(GRPOConfig))
    trainer = GRPOTrainer(model=tiny_lm(tok, seed), processing_class=tok, args=args, train_dataset=dataset,
                          reward_funcs=[gd.reward(correctness)])
    gd.attach(trainer)  # graphdiff's sampler, the step callback, and DS around TRL's generation
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        # TRL itself (trl/models/utils.py, 1.16) reads model.is_gradient_checkpointing around every generation,
        # a name transformers 5 deprecated for is_activation_checkpointing: a FutureWarning per generation that no
        # argument of ours can avoid (the ones our config caused are gone, see no_checkpointing); only that one
        # is hidden, and only here
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        trainer.train()
    seconds = time.perf_counter() - t0
    return gd, trainer, seconds


def summary(gd, seconds: float) -> dict:
    recs = gd.ds_log
    kept = sum(len(r.kept) for r in recs)
    return {"steps": len(recs), "generation_rounds": sum(r.rounds for r in recs),
            "groups_generated": sum(len(g) for r in recs for g in r.generated), "groups_trained_with_signal": kept,
            "groups_padded": sum(len(r.padded) for r in recs), "groups_filtered": sum(len(r.filtered) for r in recs),
            "skipped_before_generation": sum(len(r.skipped) for r in recs),
            "rollouts_generated": sum(r.rollouts for r in recs),
            "rollouts_per_trained_group": sum(r.rollouts for r in recs) / max(kept, 1),
            "cap_hit_steps": sum(r.cap_hit for r in recs), "seconds_per_step": seconds / max(len(recs), 1),
            "state_step": gd.target.step}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the STATE and the trainer's output")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--ds", choices=["prefilter", "uniform"], default="prefilter")
    ap.add_argument("--max-rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    gd, _, seconds = train(a.out, steps=a.steps, ds=a.ds, max_rounds=a.max_rounds, seed=a.seed)
    print(json.dumps(summary(gd, seconds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
