"""The policy: a character-level tokenizer and a small Llama built from a config (no download), a short
supervised warm start, and batched greedy / sampled evaluation with the exact-match verifier.

Nothing here reads or writes files except ``save_policy`` / ``load_policy``.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

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


def _cache_name(model) -> str:
    """The keyword of a key/value cache in ``model``'s forward and ``generate``: ``cache`` from transformers
    5.24, ``past_key_values`` before it (trl >= 1.16 allows transformers >= 4.56)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prefix(model, ids, att):
    """The key/value cache of every prompt token but the last (positions numbered from the attention mask, as
    ``generate`` numbers left-padded prompts), or None for one-token prompts."""
    if ids.shape[1] < 2:
        return None
    pos = (att.cumsum(-1) - 1).masked_fill(att == 0, 0)
    out = model(input_ids=ids[:, :-1], attention_mask=att[:, :-1], position_ids=pos[:, :-1], use_cache=True,
                logits_to_keep=1)
    return getattr(out, _cache_name(model))


def _complete(model, tok, ids, att, cache, num_samples, greedy, max_new_tokens, temperature) -> list[str]:
    """``num_samples`` completions of each prompt row, generation going on from ``cache`` (consumed) if given."""
    kw = {}
    if cache is not None:
        cache.batch_repeat_interleave(num_samples)
        kw[_cache_name(model)] = cache
    if num_samples > 1:
        ids, att = ids.repeat_interleave(num_samples, 0), att.repeat_interleave(num_samples, 0)
    gen = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new_tokens, do_sample=not greedy,
                         temperature=temperature if not greedy else None, top_k=0, top_p=1.0,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **kw)
    return tok.batch_decode(gen[:, ids.shape[1]:].cpu(), skip_special_tokens=True)


def _default_batch(model) -> int:
    """Sequences per generation call: a GPU takes a whole measurement at once; a CPU core works best on a few
    hundred."""
    return 8192 if model.device.type == "cuda" else 512


def _chunks(model, tok, prompts, num_samples, batch_size):
    """(input ids, attention mask) of ``batch_size // num_samples`` prompts at a time, left-padded."""
    per_call = max(1, (batch_size or _default_batch(model)) // num_samples)
    for i in range(0, len(prompts), per_call):
        enc = tok(prompts[i:i + per_call], return_tensors="pt", padding=True, add_special_tokens=False)
        enc = enc.to(model.device)
        yield enc["input_ids"], enc["attention_mask"]


@contextmanager
def _inference(model, seed: int):
    """Evaluation mode, no gradients, and a forked RNG seeded with ``seed``: the caller's random stream (GRPO's
    sampling) and the model's training mode are left as they were."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(seed)
            yield
    finally:
        if was_training:
            model.train()


def _successes(texts: list[str], rows, n: int) -> np.ndarray:
    """Per row, how many of its ``n`` consecutive completions in ``texts`` are right."""
    return np.array([sum(verify(c, r["answer"]) for c in texts[j * n:(j + 1) * n]) for j, r in enumerate(rows)],
                    dtype=np.int64)


def generate(model, tok, prompts: list[str], num_samples: int = 1, greedy: bool = True, max_new_tokens: int = 8,
             batch_size: int | None = None, temperature: float = 1.0, seed: int = 0) -> list[list[str]]:
    """Completions (decoded, specials dropped) for each prompt: ``num_samples`` each.

    Each generation call takes ``batch_size`` sequences: ``batch_size // num_samples`` prompts, each repeated
    ``num_samples`` times. With several samples a prompt is read once: the model runs over every prompt token
    but the last, that key/value cache is repeated ``num_samples`` times, and generation goes on from it (the
    prompts' prefill was most of a sampled evaluation's and the oracle's cost on a CPU). Where ``batch_size``
    is a multiple of ``num_samples`` the calls hold the same sequences in the same order as repeating the
    prompts would, so the sampler draws the same numbers from probabilities equal up to rounding (the prefix
    and the last token are computed apart): the completions were identical on this project's CPU
    (tests/test_closedloop.py compares the two; bench/closedloop_generation.py on a real policy).
    """
    texts: list[str] = []
    with _inference(model, seed):
        for ids, att in _chunks(model, tok, prompts, num_samples, batch_size):
            cache = _prefix(model, ids, att) if num_samples > 1 else None
            texts += _complete(model, tok, ids, att, cache, num_samples, greedy, max_new_tokens, temperature)
    return [texts[j * num_samples:(j + 1) * num_samples] for j in range(len(prompts))]


def greedy_accuracy(model, tok, rows, max_new_tokens: int = 8) -> tuple[float, np.ndarray]:
    """Held-out accuracy (greedy decoding, exact match) and the per-row 0/1 correctness."""
    comps = generate(model, tok, [r["prompt"] for r in rows], num_samples=1, greedy=True,
                     max_new_tokens=max_new_tokens)
    ok = _successes([c[0] for c in comps], rows, 1).astype(np.float64)
    return float(ok.mean()), ok


def heldout(model, tok, rows, samples: int, max_new_tokens: int = 8, seed: int = 0,
            batch_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One evaluation: per row, greedy correctness (0/1) and successes out of ``samples`` completions at
    temperature 1. Each prompt is read once for both: its prefix cache is copied for the greedy completion
    and repeated for the samples. The samples are ``pass_counts(rows, n=samples, seed=seed)``'s (the same
    generation calls; greedy decoding draws no random number), the greedy completions ``greedy_accuracy``'s,
    up to rounding as in ``generate`` (tests/test_closedloop.py compares both)."""
    import copy

    if samples < 1:
        raise ValueError("heldout needs samples >= 1 (greedy alone: greedy_accuracy)")
    greedy_texts: list[str] = []
    sampled: list[str] = []
    with _inference(model, seed):
        for ids, att in _chunks(model, tok, [r["prompt"] for r in rows], samples, batch_size):
            cache = _prefix(model, ids, att)
            greedy_texts += _complete(model, tok, ids, att, copy.deepcopy(cache), 1, True, max_new_tokens, 1.0)
            sampled += _complete(model, tok, ids, att, cache, samples, False, max_new_tokens, 1.0)
    return _successes(greedy_texts, rows, 1).astype(np.float64), _successes(sampled, rows, samples)


def pass_counts(model, tok, rows, n: int = 8, max_new_tokens: int = 8, seed: int = 0) -> np.ndarray:
    """Successes out of ``n`` sampled completions (temperature 1) for each row."""
    comps = generate(model, tok, [r["prompt"] for r in rows], num_samples=n, greedy=False,
                     max_new_tokens=max_new_tokens, seed=seed)
    return _successes([c for cs in comps for c in cs], rows, n)


def save_policy(model, tok, path) -> None:
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))


def load_policy(path):
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    tok.padding_side = "left"
    model = LlamaForCausalLM.from_pretrained(str(path))
    return model, tok
