"""Covariates: what the user already knows about each prompt, as features of a linear read-out (beyond the paper).

A prompt file often carries more than the text: a reference model's pass rate (DeepScaleR_Difficulty, Big-Math's
``llama8b_solve_rate``, guru's ``qwen2.5_7b_pass_rate``), annotations (MATH's subject and level, a
``data_source`` column) and, in every verl/TRL file, the reference answer. On the real logs these rank first visits
as well as or better than the graph (docs/lab/results.md), so the estimator takes them in as one more source
(``estimator.sources.covariates``): a ridge read-out of each prompt's forgotten success rate on the features here,
fitted online, its weight in the estimate chosen online like every other source's.

Kinds of column (``Column.kind``):

- ``text``: plain statistics of the prompt's text and, when an answer field is named, of its reference answer
  (``TEXT_STATISTICS``, ``ANSWER_STATISTICS``): lengths, digits, LaTeX, the form of the answer;
- ``numeric``: a field's number;
- ``categorical``: a field's value, one indicator per category seen when the spec was made (the
  ``MAX_CATEGORIES`` most frequent), every other value and a missing one none of them;
- ``reference``: a reference model's pass rate in [0, 1] (with the number of attempts behind it when a field
  gives it: then (rate n + 1) / (n + 2)); besides its feature it is each prompt's estimate before any outcome
  is known (``reference_rates``).

A numeric, text or reference column is centred and scaled by the mean and standard deviation seen when the spec
was made (so one ridge strength fits every column); a missing value (absent, null, NaN) is the mean, and when the
spec saw missing values the column has a missing indicator too. The spec is made once (``make_spec``, by
``graphdiff embed``) and kept: new prompts (``graphdiff extend``) are encoded by it, so a feature keeps its
meaning and the read-out's fit stays valid; a category first seen there gets no indicator (the baseline), and
the encoding says how many did (``Encoded.notes``).

Pure: no files, no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import DataError

KINDS = ("text", "numeric", "categorical", "reference")
MAX_CATEGORIES = 50

_LATEX = re.compile(r"\\[A-Za-z]+")
_INTEGER = re.compile(r"^[+-]?\d+$")
_FRACTION = re.compile(r"\\d?frac|^[+-]?\d+\s*/\s*\d+$")


def _answer_core(answer: str) -> str:
    """The answer without surrounding whitespace, dollar signs and a \\boxed{...} wrapper."""
    a = answer.strip().strip("$").strip()
    m = re.fullmatch(r"\\boxed\{(.*)\}", a, flags=re.S)
    return (m.group(1) if m else a).strip()


# name -> statistic of the prompt's text (counts enter as log(1 + count))
TEXT_STATISTICS = {
    "prompt_chars": lambda t: math.log1p(len(t)),
    "prompt_words": lambda t: math.log1p(len(t.split())),
    "prompt_digits": lambda t: math.log1p(sum(c.isdigit() for c in t)),
    "prompt_math": lambda t: math.log1p(t.count("$")),
    "prompt_latex": lambda t: math.log1p(len(_LATEX.findall(t))),
    "prompt_lines": lambda t: math.log1p(t.count("\n")),
}
# name -> statistic of the reference answer (its form: what kind of object the problem asks for)
ANSWER_STATISTICS = {
    "answer_chars": lambda a: math.log1p(len(_answer_core(a))),
    "answer_integer": lambda a: float(bool(_INTEGER.match(_answer_core(a).replace(",", "")))),
    "answer_magnitude": lambda a: (math.log10(1.0 + abs(int(_answer_core(a).replace(",", ""))))
                                   if _INTEGER.match(_answer_core(a).replace(",", "")) else 0.0),
    "answer_fraction": lambda a: float(bool(_FRACTION.search(_answer_core(a)))),
    "answer_radical": lambda a: float(any(s in a for s in ("\\sqrt", "\\pi", "^"))),
    "answer_latex": lambda a: float(bool(_LATEX.search(_answer_core(a)))),
    "answer_several": lambda a: float("," in _answer_core(a) and not
                                      _INTEGER.match(_answer_core(a).replace(",", ""))),
    "answer_negative": lambda a: float(_answer_core(a).startswith("-")),
}


def text_statistics(prompts, answers=None) -> dict[str, list[float]]:
    """{statistic: one value per prompt} of ``TEXT_STATISTICS`` and, when ``answers`` is given (one string or None
    per prompt), ``ANSWER_STATISTICS`` (None where the answer is missing: the mean, once encoded) and
    ``answer_missing`` (1 where it is: one indicator for them all)."""
    out = {name: [f(t) for t in prompts] for name, f in TEXT_STATISTICS.items()}
    if answers is not None:
        for name, f in ANSWER_STATISTICS.items():
            out[name] = [None if a is None else f(str(a)) for a in answers]
        out["answer_missing"] = [float(a is None) for a in answers]
    return out


@dataclass(frozen=True)
class Column:
    """One covariate column as the spec keeps it: ``name`` (a field path, or a text statistic's name), ``kind``
    (``KINDS``), the centre and scale of its values when the spec was made, whether it then had missing values
    (``missing``: it has an indicator), its ``categories`` (categorical) and its ``attempts`` field (reference)."""

    name: str
    kind: str
    center: float = 0.0
    scale: float = 1.0
    missing: bool = False
    categories: tuple[str, ...] = ()
    attempts: str | None = None

    def features(self) -> list[str]:
        """The names of the features it gives."""
        if self.kind == "categorical":
            return [f"{self.name}={c}" for c in self.categories]
        return [self.name] + ([f"{self.name} missing"] if self.missing else [])


@dataclass(frozen=True)
class CovariateSpec:
    """How prompts' raw covariates become features: the columns, in order."""

    columns: tuple[Column, ...] = ()

    @property
    def names(self) -> list[str]:
        return [f for c in self.columns for f in c.features()]

    @property
    def width(self) -> int:
        return len(self.names)

    @property
    def reference(self) -> Column | None:
        return next((c for c in self.columns if c.kind == "reference"), None)

    def as_dict(self) -> dict:
        return {"columns": [asdict(c) for c in self.columns]}

    @classmethod
    def from_dict(cls, d: dict) -> "CovariateSpec":
        try:
            return cls(tuple(Column(**{**c, "categories": tuple(c.get("categories", ()))}) for c in d["columns"]))
        except (KeyError, TypeError) as exc:
            raise DataError(f"unreadable covariate spec: {exc}") from None


@dataclass(frozen=True)
class Raw:
    """One column of some prompts' raw covariates: its ``kind``, one value per prompt (None where missing) and,
    for a reference rate, the number of attempts behind each (``attempts``, from the field ``attempts_field``)."""

    kind: str
    values: list
    attempts: list | None = None
    attempts_field: str | None = None


@dataclass(frozen=True)
class Encoded:
    """Encoded covariates of some prompts: ``features`` (n x width float64, finite), ``reference`` (n, the
    reference pass rate, NaN where none; None without a reference column) and ``notes`` (what was filled in)."""

    features: np.ndarray
    reference: np.ndarray | None
    notes: tuple[str, ...] = field(default=())


def _numbers(name: str, kind: str, values) -> np.ndarray:
    """Float values of a numeric column (NaN for missing: None or NaN); anything else is refused in one line."""
    out = np.empty(len(values))
    for i, v in enumerate(values):
        if v is None:
            out[i] = np.nan
        elif isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating, str)):
            raise DataError(f"covariate {name!r} ({kind}): row {i} holds {v!r}, not a number")
        else:
            try:
                x = float(v)
            except ValueError:
                raise DataError(f"covariate {name!r} ({kind}): row {i} holds {v!r}, not a number") from None
            if math.isinf(x):
                raise DataError(f"covariate {name!r} ({kind}): row {i} is infinite")
            out[i] = x
    return out


def _reference(col_name: str, values, attempts) -> np.ndarray:
    """The reference rate per prompt (NaN: none), smoothed by its attempts when given: (r n + 1) / (n + 2)."""
    r = _numbers(col_name, "reference", values)
    has = ~np.isnan(r)
    if (has & ((r < 0) | (r > 1))).any():
        i = int(np.flatnonzero(has & ((r < 0) | (r > 1)))[0])
        raise DataError(f"reference rate {col_name!r}: row {i} is {r[i]:g}, not a pass rate in [0, 1]")
    if attempts is not None:
        n = _numbers(col_name + " attempts", "reference", attempts)
        bad = has & ~(np.isnan(n) | ((n >= 1) & (n == np.round(n))))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DataError(f"reference rate {col_name!r}: row {i} has {n[i]:g} attempts, not a whole number >= 1")
        known = has & ~np.isnan(n)
        r = np.where(known, (r * np.where(known, n, 0.0) + 1.0) / (np.where(known, n, 0.0) + 2.0), r)
    return r


def _category(v) -> str | None:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, (dict, list)):
        raise DataError(f"a categorical covariate holds {type(v).__name__} {v!r:.60}, not a value")
    return str(v)


def make_spec(raw: dict) -> CovariateSpec:
    """The spec of these prompts' raw covariates: ``raw`` maps a column name to its ``Raw`` values, in the order
    the columns should have."""
    cols = []
    for name, entry in raw.items():
        kind, values = entry.kind, entry.values
        if kind not in KINDS:
            raise DataError(f"covariate {name!r}: unknown kind {kind!r} (one of {', '.join(KINDS)})")
        if kind == "categorical":
            cats = [c for c in (_category(v) for v in values) if c is not None]
            uniq, counts = np.unique(np.array(cats, dtype=object).astype(str), return_counts=True) if cats else \
                (np.array([]), np.array([]))
            order = sorted(range(len(uniq)), key=lambda i: (-counts[i], uniq[i]))[:MAX_CATEGORIES]
            cols.append(Column(name, kind, categories=tuple(str(uniq[i]) for i in order)))
            continue
        if kind == "reference":
            x = _reference(name, values, entry.attempts)
            attempts = entry.attempts_field
        else:
            x, attempts = _numbers(name, kind, values), None
        seen = x[~np.isnan(x)]
        center = float(seen.mean()) if seen.size else 0.0
        scale = float(seen.std()) if seen.size > 1 else 0.0
        # a text statistic has no indicator of its own: the answer's are missing together (``answer_missing``)
        cols.append(Column(name, kind, center=center, scale=scale if scale > 0 else 1.0,
                           missing=kind != "text" and bool(np.isnan(x).any()), attempts=attempts))
    return CovariateSpec(tuple(cols))


def encode(spec: CovariateSpec, raw: dict, n: int) -> Encoded:
    """The features of n prompts' raw covariates (``raw``: name -> ``Raw``, every column of the spec there) by
    ``spec``."""
    parts, notes, reference = [], [], None
    for col in spec.columns:
        if col.name not in raw:
            raise DataError(f"covariate {col.name!r} ({col.kind}) is missing: the prompts' covariates must have "
                            "every column they were first made with")
        entry = raw[col.name]
        values = entry.values
        if entry.kind != col.kind:
            raise DataError(f"covariate {col.name!r} is {entry.kind} here, {col.kind} when first made")
        if len(values) != n:
            raise DataError(f"covariate {col.name!r}: {len(values)} values for {n} prompts")
        if col.kind == "categorical":
            cats = [_category(v) for v in values]
            index = {c: j for j, c in enumerate(col.categories)}
            block = np.zeros((n, len(col.categories)))
            hit = [(i, index[c]) for i, c in enumerate(cats) if c in index]
            if hit:
                rows, js = np.array(hit).T
                block[rows, js] = 1.0
            unseen = sum(1 for c in cats if c is not None and c not in index)
            missing = sum(1 for c in cats if c is None)
            if unseen:
                notes.append(f"{col.name}: {unseen} prompt(s) with a category not among the {len(col.categories)} "
                             "kept when the covariates were first made (no indicator: the baseline)")
            if missing:
                notes.append(f"{col.name}: {missing} prompt(s) without a value (no indicator: the baseline)")
            parts.append(block)
            continue
        if col.kind == "reference":
            x = _reference(col.name, values, entry.attempts)
            reference = x
        else:
            x = _numbers(col.name, col.kind, values)
        miss = np.isnan(x)
        if miss.any() and col.kind != "text":
            notes.append(f"{col.name}: {int(miss.sum())} prompt(s) without a value (the mean)")
        z = np.where(miss, 0.0, (np.where(miss, col.center, x) - col.center) / col.scale)
        parts.append(z[:, None])
        if col.missing:
            parts.append(miss.astype(np.float64)[:, None])
    features = np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))
    return Encoded(features, reference, tuple(notes))
