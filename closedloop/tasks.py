"""Verifiable prompt families generated in code: several skills, graded levels, varied wording.

Every prompt is a dict ``{"id", "prompt", "answer", "skill", "level", "template"}``; the verifier is exact
match of the stripped completion against ``answer``. Prompts of one skill and level share wording
templates and answer shapes, so they end up neighbours in the embedding graph. No file I/O here.

Skills (level 1 = easiest):

* ``add``      - sum of two numbers of ``level`` digits
* ``compare``  - the larger of two numbers of ``level + 1`` digits that share a prefix
* ``reverse``  - a string of ``level + 2`` letters reversed
* ``sort``     - the letters of a ``level + 2``-letter string sorted
* ``count``    - how many times a letter occurs in a string of ``2 level + 3`` letters
* ``parity``   - even/odd number of 1s in a bit string of ``2 level + 4`` bits

The SFT data may carry *systematic* label noise (``sft_noise``): in each (skill, level) cell a share
rho_cell of the demonstrations gives the family's typical wrong answer (``wrong_answer``: the smaller
number, the word unchanged, the letters sorted backwards, the count plus one, the parity flipped, the sum
plus one) - a warm start that is confidently wrong on some families, as a policy fine-tuned on imperfect
demonstrations is. The verifier (and so RL) knows the right answer; which families RL can fix, and how
fast, depends on which prompts the scheduler rolls out. The rates are spread evenly over the cells in an
order drawn from the seed (``cell_noise``).
"""

from __future__ import annotations

import numpy as np

from graphdiff_cli.errors import InvalidArgumentError

SKILLS = ("add", "compare", "reverse", "sort", "count", "parity")
LEVELS = (1, 2, 3, 4)
LETTERS = "abcdefghij"  # a small alphabet keeps the character vocabulary (and the model) small

TEMPLATES = {
    "add": ("{a}+{b}=", "add {a} and {b}:", "sum of {a} and {b}?", "what is {a} plus {b}?"),
    "compare": ("max({a},{b})=", "larger of {a} and {b}:", "which is bigger, {a} or {b}?", "bigger: {a} {b}?"),
    "reverse": ("reverse {w}:", "{w} backwards:", "write {w} in reverse:", "flip {w}:"),
    "sort": ("sort {w}:", "{w} sorted:", "letters of {w} in order:", "order {w}:"),
    "count": ("count {c} in {w}:", "how many {c} in {w}?", "number of {c}s in {w}:", "{c} count of {w}:"),
    "parity": ("parity of {w}:", "ones in {w} even or odd?", "is the count of 1s in {w} even?", "{w} parity:"),
}


def _number(rng, digits: int) -> int:
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(lo, 10 ** digits))


def make_example(skill: str, level: int, rng: np.random.Generator) -> dict:
    """One random example (prompt text, answer) of a skill at a level."""
    t = int(rng.integers(len(TEMPLATES[skill])))
    tpl = TEMPLATES[skill][t]
    if skill == "add":
        a, b = _number(rng, level), _number(rng, level)
        text, ans = tpl.format(a=a, b=b), str(a + b)
    elif skill == "compare":
        d = level + 1
        a = _number(rng, d)
        # share a prefix of level - 1 digits so harder levels need more digits compared
        keep = max(0, level - 1)
        while True:
            b = _number(rng, d)
            if keep:
                b = int(str(a)[:keep] + str(b)[keep:])
            if b != a and len(str(b)) == len(str(a)):
                break
        text, ans = tpl.format(a=a, b=b), str(max(a, b))
    elif skill in ("reverse", "sort"):
        w = "".join(rng.choice(list(LETTERS), size=level + 2))
        text = tpl.format(w=w)
        ans = w[::-1] if skill == "reverse" else "".join(sorted(w))
    elif skill == "count":
        c = str(rng.choice(list(LETTERS[:4])))
        w = "".join(rng.choice(list(LETTERS[:4]), size=2 * level + 3))
        text, ans = tpl.format(c=c, w=w), str(w.count(c))
    elif skill == "parity":
        w = "".join(rng.choice(["0", "1"], size=2 * level + 4))
        even = w.count("1") % 2 == 0
        text = tpl.format(w=w)
        ans = ("yes" if even else "no") if t == 2 else ("even" if even else "odd")
    else:
        raise InvalidArgumentError(f"unknown skill {skill!r}")
    return {"prompt": text, "answer": ans, "skill": skill, "level": int(level), "template": t}


def wrong_answer(ex: dict) -> str:
    """The family's systematic wrong answer for one example (the right one where that error cannot show:
    a palindrome reversed, a word of one repeated letter sorted)."""
    skill, text, ans = ex["skill"], ex["prompt"], ex["answer"]
    if skill == "add":
        return str(int(ans) + 1)
    if skill == "compare":
        a, b = (int(x) for x in _numbers(text))
        return str(min(a, b))
    if skill == "reverse":
        return ans[::-1]  # the word as given
    if skill == "sort":
        return ans[::-1]  # descending
    if skill == "count":
        return str(int(ans) + 1)
    if skill == "parity":
        return {"even": "odd", "odd": "even", "yes": "no", "no": "yes"}[ans]
    raise InvalidArgumentError(f"unknown skill {skill!r}")


def _numbers(text: str) -> list[str]:
    import re

    return re.findall(r"\d+", text)


def cell_noise(lo: float, hi: float, seed: int, skills=SKILLS, levels=LEVELS) -> dict[tuple[str, int], float]:
    """rho for each (skill, level): ``lo`` .. ``hi`` evenly spaced, assigned to the cells in a seeded order."""
    if not 0.0 <= lo <= hi < 1.0:
        raise InvalidArgumentError(f"sft noise needs 0 <= lo <= hi < 1 (got {lo}, {hi})")
    cells = [(s, lv) for s in skills for lv in levels]
    rates = np.linspace(lo, hi, len(cells)) if len(cells) > 1 else np.array([lo])
    order = np.random.default_rng(seed).permutation(len(cells))
    return {cells[i]: float(rates[j]) for j, i in enumerate(order)}


def add_noise(rows: list[dict], rho: dict[tuple[str, int], float], seed: int) -> list[dict]:
    """Copies of ``rows`` whose answer is replaced by ``wrong_answer`` with probability rho of the row's cell
    (``noisy`` marks them)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in rows:
        wrong = wrong_answer(r)
        bad = rng.random() < rho.get((r["skill"], r["level"]), 0.0) and wrong != r["answer"]
        out.append({**r, "answer": wrong if bad else r["answer"], "noisy": bool(bad)})
    return out


def make_prompts(per_cell: int, seed: int, prefix: str, exclude: set | None = None,
                 skills=SKILLS, levels=LEVELS, distinct: bool = True) -> list[dict]:
    """``per_cell`` prompts for each (skill, level), ids ``{prefix}-{skill}{level}-{j}``.

    Prompts whose text is in ``exclude`` (e.g. the training pool, for the held-out set) are skipped;
    with ``distinct`` no text repeats (the pool and test sets), without it texts may (SFT data).
    """
    rng = np.random.default_rng(seed)
    seen = set(exclude or ())
    out = []
    for skill in skills:
        for level in levels:
            j, tries = 0, 0
            while j < per_cell:
                tries += 1
                if tries > 200 * per_cell:
                    raise InvalidArgumentError(f"cannot draw {per_cell} distinct {skill} level {level} prompts")
                ex = make_example(skill, level, rng)
                if ex["prompt"] in seen:
                    continue
                if distinct:
                    seen.add(ex["prompt"])
                out.append({"id": f"{prefix}-{skill}{level}-{j:04d}", **ex})
                j += 1
    return out


def make_splits(train_per_cell: int = 100, test_per_cell: int = 24, sft_per_cell: int = 200, seed: int = 0,
                sft_noise: tuple[float, float] = (0.0, 0.0), skills=SKILLS):
    """(train pool, held-out test, SFT data) of ``skills`` x every level: disjoint prompt texts, the same
    families; the SFT answers carry the per-cell systematic noise ``sft_noise = (lo, hi)`` (``cell_noise``),
    the pool and test set none."""
    skills = tuple(dict.fromkeys(skills))  # in order, each once
    unknown = [s for s in skills if s not in SKILLS]
    if unknown or not skills:
        raise InvalidArgumentError(f"skills must be some of {', '.join(SKILLS)} (got {', '.join(skills) or 'none'})")
    train = make_prompts(train_per_cell, seed, "tr", skills=skills)
    test = make_prompts(test_per_cell, seed + 1, "te", exclude={r["prompt"] for r in train}, skills=skills)
    taken = {r["prompt"] for r in train} | {r["prompt"] for r in test}
    sft = make_prompts(sft_per_cell, seed + 2, "sft", exclude=taken, distinct=False, skills=skills)
    if sft_noise[1] > 0:
        sft = add_noise(sft, cell_noise(*sft_noise, seed=seed + 3, skills=skills), seed=seed + 4)
    return train, test, sft


def normalize(completion: str) -> str:
    return completion.strip()


def verify(completion: str, answer: str) -> float:
    """1.0 on exact match of the stripped completion, else 0.0."""
    return float(normalize(completion) == answer)


def alphabet(rows) -> str:
    """Every character of the prompts and answers (the character tokenizer's vocabulary)."""
    chars = set()
    for r in rows:
        chars.update(r["prompt"])
        chars.update(r["answer"])
    return "".join(sorted(chars))
