"""Live features: per-prompt numbers a trainer observes at a step (the policy's next-token entropy and largest
probability at the prompt's last position, say), read by the estimator's live read-out
(``estimator.sources.live``).

They travel two ways:

- with a step's outcomes: an optional column ``live`` of the outcomes file (``io.outcomes``), the prompt's
  features observed at that step - a JSON list of numbers in JSONL and Parquet (``"live": [2.31, 0.42]``), the
  numbers separated by spaces in a CSV cell (``2.31 0.42``); a row without it, or with null, has none;
- with a read (predict, select, allocate): a live-features file of rows ``id, live`` (the same column, JSONL,
  CSV or Parquet), a mapping {id: features}, or, beside a list of ids, an array with one row per id.

Every prompt of one call has the same number of features f, and an estimator's live read-out keeps the f of the
first step that gave them. A candidate without features gets no live estimate (the read-out abstains: its
estimate is what it would be without live features); an id of a live-features file that is not among the
candidates is refused in one line (a file of another pool, or of another step's batch).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import DataError
from .tables import check_id_field, detect_format, read_rows, row_id

LIVE_COLUMN = "live"


def live_value(value, where: str, strict: bool = True) -> np.ndarray | None:
    """A row's ``live`` cell as a float64 vector (None: none given): a list of finite numbers, or in CSV
    (``strict`` False) their text separated by spaces."""
    if value is None or (not strict and isinstance(value, str) and not value.strip()):
        return None
    if not strict and isinstance(value, str):
        value = value.split()
    if hasattr(value, "tolist"):  # a Parquet list read as an array
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: live must be a non-empty list of numbers (the prompt's live features), got "
                        f"{value!r:.60}")
    out = []
    for x in value:
        if not strict and isinstance(x, str):
            try:
                x = float(x)
            except ValueError:
                raise DataError(f"{where}: live holds {x!r}, not a number") from None
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise DataError(f"{where}: live holds {x!r}; live features are finite numbers")
        out.append(float(x))
    return np.asarray(out)


def stack(vectors: list, where) -> np.ndarray | None:
    """One row per vector (None: a row of NaN), all of one length f; None when no vector is given.
    ``where(j, short=False)``: where vector j came from, for the message."""
    given = [j for j, v in enumerate(vectors) if v is not None]
    if not given:
        return None
    f = vectors[given[0]].size
    out = np.full((len(vectors), f), np.nan)
    for j in given:
        if vectors[j].size != f:
            raise DataError(f"{where(j)}: {vectors[j].size} live features, {f} for {where(given[0], True)} (every "
                            "prompt of a call has as many)")
        out[j] = vectors[j]
    return out


def read_live(path, id_field: str = "id") -> dict[str, np.ndarray]:
    """{id: features} of a live-features file (rows ``id``, ``live``; an id twice is refused)."""
    path = Path(path)
    id_field = check_id_field(id_field)
    if not path.is_file():
        raise DataError(f"{path}: no such live-features file")
    fmt = detect_format(path)
    out: dict[str, np.ndarray] = {}
    for line_no, row in read_rows(path, fmt):
        pid = row_id(row, id_field, path, line_no)
        if pid in out:
            raise DataError(f"{path}:{line_no}: id {pid!r} has live features on an earlier row too")
        if LIVE_COLUMN not in row:
            raise DataError(f"{path}:{line_no}: no {LIVE_COLUMN!r} column (rows of a live-features file: "
                            f"{id_field}, {LIVE_COLUMN})")
        value = live_value(row[LIVE_COLUMN], f"{path}:{line_no}", strict=fmt != "csv")
        if value is not None:
            out[pid] = value
    if not out:
        raise DataError(f"{path}: no live features (rows {id_field}, {LIVE_COLUMN})")
    return out


def as_mapping(live, ids=None) -> dict[str, np.ndarray] | None:
    """Live features given to a read as {id: features}: ``live`` a file, a mapping, or (with ``ids`` a list) an
    array with one row per id (a row of NaN: none); None stays None."""
    if live is None:
        return None
    if isinstance(live, (str, Path)):
        return read_live(live)
    if isinstance(live, dict):
        return {str(k): live_value(np.ravel(v).tolist() if isinstance(v, np.ndarray) else v, f"live features of {k!r}")
                for k, v in live.items()}
    if ids is None or isinstance(ids, (str, Path)):
        raise DataError("live features as an array need the ids as a list (one row per id); give a live-features "
                        "file or a mapping {id: features} with ids from a file")
    x = np.asarray(live)
    ids = [str(i) for i in ids]
    if x.ndim != 2 or x.shape[0] != len(ids) or x.dtype.kind not in "fiu":
        raise DataError(f"live features must be a numeric {len(ids)} x f array (one row per id), got dtype {x.dtype}, "
                        f"shape {x.shape}")
    x = x.astype(np.float64)
    return {pid: row for pid, row in zip(ids, x) if not np.isnan(row).all()}


def live_matrix(live: dict | None, ids: list[str]) -> np.ndarray | None:
    """One row per id of ``ids`` (the candidates) from the mapping ``live`` (a row of NaN for a candidate without
    features); an id of ``live`` that is not a candidate is refused."""
    if live is None:
        return None
    pos = {pid: j for j, pid in enumerate(ids)}
    stray = [pid for pid in live if pid not in pos]
    if stray:
        raise DataError(f"live features for {len(stray)} id(s) that are not among the {len(ids)} candidates (first "
                        f"{stray[0]!r}; retired prompts are not candidates)")
    names = list(live)
    vectors = [None] * len(ids)
    for pid in names:
        vectors[pos[pid]] = live[pid]
    return stack(vectors, lambda j, short=False: f"{'' if short else 'live features of '}{ids[j]!r}")
