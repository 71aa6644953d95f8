"""One training step's outcomes file: which prompts were rolled out and how many rollouts succeeded.

Two row schemas, fixed by the file's first row (CSV: its header):

- counts:   ``id, n, s``   n rollouts of prompt ``id``, s of them successful (0 <= s <= n);
- rollouts: ``id, reward`` one row per rollout; a rollout succeeds when reward >= ``success_threshold``.
  Without a threshold (``None``, the default) every reward must be 0 or 1 (JSON true/false count as 1/0)
  and passes through unchanged; any other reward is refused with its line: a threshold for continuous
  rewards must be chosen, never assumed. With a threshold, a file whose rewards all fall below it (or all
  at or above it) is read, with a one-line warning in ``Outcomes.warnings``.

Rows of one prompt are summed (a prompt rolled out in two groups; in the counts schema that is said in
``Outcomes.warnings``, since it is also what a file written twice over looks like). Extra columns are ignored, but
one: an optional ``live`` column holds the prompt's live features observed at that step (``io.live``: a list of
numbers; in CSV, numbers separated by spaces; a prompt's first row with them counts), read by the estimator's live
read-out; they are not part of the step's content hash (the same counts with other features are the same step). The file
is JSONL, CSV or Parquet (``io.tables.read_rows``; a UTF-8 byte order mark is dropped). Types: in JSONL
and Parquet counts and rewards are numbers (``"n": "8"`` is refused: a producer that writes numbers as
strings has a bug worth seeing); in CSV, text by nature, "8" and "8.0" are 8. Everything is checked
before anything is returned: an unknown id, s > n, a negative or fractional count, NaN, a malformed
line, a missing column, more than ``MAX_COUNT`` rollouts of one id in the step (summed over its rows)
or an empty file raises one ``DataError`` naming the file and the line (Parquet: the row, first row = 1).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError, InvalidArgumentError, option
from .live import LIVE_COLUMN, live_value, stack
from .tables import as_float, as_int, check_id_field, detect_format, field_value, id_field_hint, open_hashed, read_file_once, read_rows, row_id

COUNT_COLUMNS = ("id", "n", "s")
MAX_COUNT = 1_000_000  # rollouts of one prompt in one step: far above any real group (a sum of tokens or rewards is not)
ROLLOUT_COLUMNS = ("id", "reward")


@dataclass(frozen=True)
class Outcomes:
    """A step's outcomes aggregated per prompt id (ids unique, in order of first appearance)."""

    path: Path
    schema: str  # "counts" or "rollouts"
    ids: list[str]
    n: np.ndarray  # int64, rollouts per id
    s: np.ndarray  # int64, successes per id
    lines: list[int]  # line of each id's first row (for error messages after parsing)
    n_rows: int
    warnings: tuple[str, ...] = ()  # one line each: rewards all on one side of a chosen threshold
    hash: str = ""  # content hash of the bytes parsed (the file is read once)
    live: np.ndarray | None = None  # float64, ids x f: each id's live features (a row of NaN: none); None: no column

    @property
    def content_hash(self) -> str:
        """sha256 (16 hex digits) of what the step says, not how the file spells it: the set of (id, n, s) after
        summing each id's rows. The same rows reordered, their keys reordered, another format or id column, or
        one rollout per row instead of counts give the same hash; the threshold that made s is compared apart."""
        return content_hash(self.ids, self.n, self.s)

    def node_indices(self, index) -> np.ndarray:
        """Node indices of the ids by ``index`` (a ``readers.IdIndex``); an unknown id is refused with its line."""
        return index.nodes(self.ids, where=lambda j: f"{self.path}:{self.lines[j]}")


def content_hash(ids, n, s) -> str:
    """sha256 (16 hex digits) of the set of (id, n, s) triples (order-free; ids unique)."""
    triples = sorted(zip(map(str, ids), (int(x) for x in n), (int(x) for x in s)))
    return hashlib.sha256(json.dumps(triples, separators=(",", ":")).encode("utf-8")).hexdigest()[:16]


DEFAULT_SUCCESS_THRESHOLD = None  # none chosen: rewards must be 0/1 (they pass through); others are refused
THRESHOLD_REASON = "graphdiff does not guess a threshold for rewards that are not 0/1"


def threshold_hint() -> str:
    """How to choose a threshold, in the caller's terms (a flag on the command line, a keyword in Python)."""
    flag = option("--success-threshold")
    given = f"{flag} X" if flag.startswith("--") else f"{flag}=X"
    return f"pass {given} (a rollout with reward >= X is a success): {THRESHOLD_REASON}"


def check_threshold(success_threshold, name: str | None = None) -> float | None:
    """The threshold as a finite float, or None (not chosen: only 0/1 rewards are accepted). ``name``: what the
    caller calls it (a trainer's config key), else the ``--success-threshold`` option."""
    if success_threshold is None:
        return None
    what = name or option('--success-threshold')
    try:
        x = float(success_threshold)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{what} must be a number, got {success_threshold!r}") from None
    if not math.isfinite(x):
        raise InvalidArgumentError(f"{what} must be a finite number, got {success_threshold!r}")
    return x


def _has(row: dict) -> str:
    """What the first row (CSV: the header) holds, for a missing-column error."""
    names = ", ".join(repr(str(k)) for k in list(row)[:20]) + (", ..." if len(row) > 20 else "")
    return f"it has {names}" if names else "it has no columns"


def _schema_of(path: Path, line_no: int, row: dict, id_field: str = "id") -> str:
    if not field_value(row, id_field)[0]:
        hint = f"; {id_field_hint()}" if id_field == "id" else ""
        raise DataError(f"{path}:{line_no}: missing column {id_field!r} (outcomes need {id_field}, n, s or "
                        f"{id_field}, reward; {_has(row)}){hint}")
    if "n" in row or "s" in row:
        return "counts"
    if "reward" in row:
        return "rollouts"
    raise DataError(f"{path}:{line_no}: missing columns: need 'n' and 's' (counts) or 'reward' (one row per "
                    f"rollout); {_has(row)}")


def _reward(value, path, line_no: int, strict: bool) -> float:
    if isinstance(value, bool):  # JSON true/false and Parquet booleans: binary rewards
        return float(value)
    return as_float(value, path, line_no, "reward", strict=strict)


def is_binary(reward: float) -> bool:
    return reward == 0.0 or reward == 1.0


def succeeded(reward: float, threshold: float | None) -> bool | None:
    """Whether a rollout with ``reward`` succeeded: reward >= ``threshold``; with none chosen a 0/1 reward is its
    own answer and any other is None (the caller refuses it, naming where it came from). The one rule of every
    reader of rewards: outcomes files here, the trainer integrations' ``tracking.count_outcomes``."""
    if threshold is None:
        return reward == 1.0 if is_binary(reward) else None
    return reward >= threshold


def threshold_warning(rewards_low: float, rewards_high: float, count: int, threshold: float, where: str) -> str | None:
    """One line when ``count`` rewards in [low, high] all fall on one side of a chosen threshold, else None."""
    if rewards_high < threshold:
        return (f"{where}: all {count} rewards are below {option('--success-threshold')} {threshold:g} (the highest is "
                f"{rewards_high:g}): every rollout counts as a failure")
    if rewards_low >= threshold:
        return (f"{where}: all {count} rewards are at or above {option('--success-threshold')} {threshold:g} (the lowest is "
                f"{rewards_low:g}): every rollout counts as a success")
    return None


def _parse_row(path, line_no: int, row: dict, schema: str, threshold: float | None, strict: bool,
               id_field: str = "id") -> tuple[str, int, int, float | None]:
    """(id, n, s, reward or None) of one checked row (``strict``: numbers must not be strings)."""
    pid = row_id(row, id_field, path, line_no)
    if schema == "rollouts":
        reward = _reward(row["reward"], path, line_no, strict)
        ok = succeeded(reward, threshold)
        if ok is None:
            raise DataError(f"{path}:{line_no}: reward {reward:g} is not 0 or 1; {threshold_hint()}")
        return pid, 1, int(ok), reward
    n = as_int(row["n"], path, line_no, "n", strict=strict)
    s = as_int(row["s"], path, line_no, "s", strict=strict)
    if n < 0:
        raise DataError(f"{path}:{line_no}: n = {n} is negative")
    if s < 0:
        raise DataError(f"{path}:{line_no}: s = {s} is negative")
    if s > n:
        raise DataError(f"{path}:{line_no}: s = {s} successes is more than n = {n} rollouts")
    if n > MAX_COUNT:
        raise DataError(f"{path}:{line_no}: n = {n} is implausibly large (more than {MAX_COUNT:,} rollouts of one "
                        "prompt in one step: n counts rollouts, not tokens or summed rewards)")
    return pid, n, s, None


def read_outcomes(path, success_threshold: float | None = DEFAULT_SUCCESS_THRESHOLD, fmt: str | None = None,
                  id_field: str = "id", index=None) -> Outcomes:
    """Parse and check a whole outcomes file (see the module docstring for the contract). ``id_field``: the
    column holding the prompt id, or a dotted path into nested fields (``extra_info.index``). ``index``: the
    STATE's ``readers.IdIndex``, when given an id it does not know is refused at its line as it is read.

    JSONL and CSV are read as a stream, one line at a time, hashed as they are read: memory grows with the
    number of distinct ids (bounded by the STATE's prompts when ``index`` is given), not with the file."""
    path = Path(path)
    threshold = check_threshold(success_threshold)
    id_field = check_id_field(id_field)
    if not path.is_file():
        raise DataError(f"{path}: no such outcomes file")
    fmt = detect_format(path, fmt)
    if fmt == "parquet":  # random access: read whole (decoded one record batch at a time)
        data, digest = read_file_once(path)
        return _parse(path, fmt, read_rows(path, fmt, data), threshold, id_field, index, lambda: digest)
    read = {id_field, id_field.split(".")[0], *COUNT_COLUMNS[1:], *ROLLOUT_COLUMNS[1:], LIVE_COLUMN}
    with open_hashed(path) as (stream, digest):
        return _parse(path, fmt, read_rows(path, fmt, stream=stream, columns=read), threshold, id_field, index, digest)


def _parse(path: Path, fmt: str, rows, threshold: float | None, id_field: str, index, digest) -> Outcomes:
    """The outcomes of ``rows`` (line, row dict) aggregated per id; ``digest()``: the hash of the bytes read."""
    schema = None
    pos: dict[str, int] = {}
    ids: list[str] = []
    lines: list[int] = []
    n_acc: list[int] = []
    s_acc: list[int] = []
    n_rows = 0
    repeated: dict[str, tuple[int, int]] = {}  # counts rows of an id seen before: (its first line, this line)
    low, high = math.inf, -math.inf
    live: list = []  # per id: its first row's live features, or None
    for line_no, row in rows:
        if schema is None:
            schema = _schema_of(path, 1 if fmt == "csv" else line_no, row, id_field)
        columns = COUNT_COLUMNS if schema == "counts" else ROLLOUT_COLUMNS
        for c in columns[1:]:  # the id: row_id, which reads dotted paths too
            if c not in row:  # CSV: the header (line 1) lacks it
                raise DataError(f"{path}:{1 if fmt == 'csv' else line_no}: missing column {c!r} ({schema} rows need "
                                f"{', '.join((id_field, *columns[1:]))}; {_has(row)})")
        try:
            pid, n, s, reward = _parse_row(path, line_no, row, schema, threshold, strict=fmt != "csv",
                                           id_field=id_field)
        except DataError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:  # a cell the shared parsers do not foresee
            raise DataError(f"{path}:{line_no}: unreadable value ({exc.__class__.__name__}: {exc})") from None
        features = live_value(row.get(LIVE_COLUMN), f"{path}:{line_no}", strict=fmt != "csv")
        j = pos.get(pid)
        if j is None:
            live.append(features)
            if index is not None:
                index.nodes([pid], where=lambda _j: f"{path}:{line_no}")  # unknown: refused at its line
            pos[pid] = len(ids)
            ids.append(pid)
            lines.append(line_no)
            n_acc.append(n)
            s_acc.append(s)
        else:
            if live[j] is None:
                live[j] = features
            n_acc[j] += n
            s_acc[j] += s
            if schema == "counts":
                repeated.setdefault(pid, (lines[j], line_no))
            if n_acc[j] > MAX_COUNT:
                raise DataError(f"{path}:{line_no}: {n_acc[j]} rollouts of id {pid!r} in one step is implausibly "
                                f"large (more than {MAX_COUNT:,})")
        if reward is not None:
            low, high = min(low, reward), max(high, reward)
        n_rows += 1
    if n_rows == 0:
        raise DataError(f"{path}: no outcome rows (an empty file cannot be a training step)")
    warnings = [threshold_warning(low, high, n_rows, threshold, str(path))
                if schema == "rollouts" and threshold is not None else None]
    if repeated:
        pid, (first, again) = next(iter(repeated.items()))
        warnings.append(f"{path}: {len(repeated)} id(s) on more than one row (first {pid!r}, lines {first} and "
                        f"{again}); their n and s are summed, as for a prompt rolled out in several groups")
    return Outcomes(path=path, schema=schema, ids=ids, n=np.asarray(n_acc, dtype=np.int64),
                    s=np.asarray(s_acc, dtype=np.int64), lines=lines, n_rows=n_rows,
                    warnings=tuple(w for w in warnings if w), hash=digest(),
                    live=stack(live, lambda j, short=False: f"line {lines[j]}" if short else f"{path}:{lines[j]}"))
