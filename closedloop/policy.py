"""The policy: a character-level tokenizer and a small Llama built from a config (no download), a short
supervised warm start, and batched greedy / sampled evaluation with the exact-match verifier.

Nothing here reads or writes files except ``save_policy`` / ``load_policy``.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .tasks import verify

PAD, EOS, BOS, UNK = "[PAD]", "[EOS]", "[BOS]", "[UNK]"
SPECIALS = (PAD, EOS, BOS, UNK)


def build_tokenizer(chars: str):
    """A character-level ``PreTrainedTokenizerFast``: one token per character, pad/eos/bos/unk specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # every character alone
    core.decoder = decoders.Fuse()  # join characters without spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS,
                                  unk_token=UNK)
    tok.padding_side = "left"
    return tok


def build_model(tok, hidden: int = 128, layers: int = 3, heads: int = 4, intermediate: int = 256,
                max_positions: int = 64, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max_positions, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def _sft_batch(tok, rows):
    """Left-padded prompt+answer+EOS sequences; labels only on the answer and EOS."""
    import torch

    seqs, masks = [], []
    for r in rows:
        p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        a = tok(r["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        seqs.append(p + a)
        masks.append([0] * len(p) + [1] * len(a))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        off = width - len(s)
        ids[i, off:] = torch.tensor(s)
        att[i, off:] = 1
        lab[i, off:] = torch.tensor([t if k else -100 for t, k in zip(s, m)])
    return ids, att, lab


def supervised_warmup(model, tok, rows, steps: int, batch_size: int = 64, lr: float = 2e-3, seed: int = 0,
                      log_every: int = 0) -> list[dict]:
    """Plain next-token SFT on (prompt, answer) pairs for ``steps`` optimiser steps; returns the loss log."""
    import torch

    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: min(1.0, (t + 1) / 20) * 0.5 * (1 + math.cos(math.pi * t / max(1, steps))))
    model.train()
    log = []
    t0 = time.perf_counter()
    for t in range(steps):
        idx = rng.choice(len(rows), size=batch_size, replace=False)
        ids, att, lab = _sft_batch(tok, [rows[i] for i in idx])
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        loss = model(input_ids=ids, attention_mask=att, position_ids=pos, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and (t % log_every == 0 or t == steps - 1):
            log.append({"step": t, "loss": float(loss.detach()), "seconds": time.perf_counter() - t0})
    model.eval()
    return log


def generate(model, tok, prompts: list[str], num_samples: int = 1, greedy: bool = True, max_new_tokens: int = 8,
             batch_size: int | None = None, temperature: float = 1.0, seed: int = 0) -> list[list[str]]:
    """Completions (decoded, specials dropped) for each prompt: ``num_samples`` each."""
    import torch

    out: list[list[str]] = []
    was_training = model.training
    model.eval()
    flat = [p for p in prompts for _ in range(num_samples)]
    if batch_size is None:  # a GPU takes a whole measurement at once; a CPU core works best on a few hundred
        batch_size = 8192 if model.device.type == "cuda" else 512
    texts: list[str] = []
    # the caller's RNG (GRPO's sampling) is left as it was: evaluation draws from a forked one
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        for i in range(0, len(flat), batch_size):
            chunk = flat[i:i + batch_size]
            enc = tok(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=not greedy,
                                 temperature=temperature if not greedy else None, top_k=0, top_p=1.0,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts += tok.batch_decode(gen[:, enc["input_ids"].shape[1]:].cpu(), skip_special_tokens=True)
    if was_training:
        model.train()
    for j in range(len(prompts)):
        out.append(texts[j * num_samples:(j + 1) * num_samples])
    return out


def greedy_accuracy(model, tok, rows, max_new_tokens: int = 8) -> tuple[float, np.ndarray]:
    """Held-out accuracy (greedy decoding, exact match) and the per-row 0/1 correctness."""
    comps = generate(model, tok, [r["prompt"] for r in rows], num_samples=1, greedy=True,
                     max_new_tokens=max_new_tokens)
    ok = np.array([verify(c[0], r["answer"]) for c, r in zip(comps, rows)])
    return float(ok.mean()), ok


def pass_counts(model, tok, rows, n: int = 8, max_new_tokens: int = 8, seed: int = 0) -> np.ndarray:
    """Successes out of ``n`` sampled completions (temperature 1) for each row."""
    comps = generate(model, tok, [r["prompt"] for r in rows], num_samples=n, greedy=False,
                     max_new_tokens=max_new_tokens, seed=seed)
    return np.array([sum(verify(c, r["answer"]) for c in cs) for cs, r in zip(comps, rows)], dtype=np.int64)


def save_policy(model, tok, path) -> None:
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))


def load_policy(path):
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.padding_side = "left"
    model = LlamaForCausalLM.from_pretrained(str(path))
    return model, tok
