"""The prompt id each trainer integration will report for each row of a training file (``graphdiff ids``).

A trainer and graphdiff must agree on every prompt's id byte for byte; a mismatch shows up only during
training, as an unknown id (or, worse, as rows silently pooled). ``trainer_ids`` reads a prompts file the
way ``graphdiff embed`` does (``io.tables``: JSONL, CSV or Parquet; dotted fields; chat lists flattened) and
puts beside each row the id the trainer's adapter will derive from the same row:

* ``verl``: ``extra_info.index`` as ``str()`` (``verl.data_source_ids`` at start-up; each rollout's
  ``non_tensor_batch["index"]`` through ``verl._plain_id``): integer 7 -> "7";
* ``trl``: the ``id_column`` (default ``id``) as ``str()`` (``trl.GraphdiffTRL.row_nodes`` and ``.reward``);
  TRL hands reward functions top-level columns only, so a dotted path is refused;
* ``openrlhf``: the ``id`` of the JSON object in the label column (``openrlhf.parse_label``);
* ``trinity``: the selector's ``id_field`` (default ``id``; dotted paths read nested fields, as Trinity's
  Hugging Face rows hold them) as ``str()`` (``trinity.taskset_ids`` through ``trinity_id``);
* ``none``: graphdiff's own reading (``io.tables.as_id``), for shell loops.

It reports rows without an id, repeated ids, rows whose trainer id differs from the id ``graphdiff embed``
stores (``as_id`` writes 3.0 as "3", ``str()`` "3.0"; neither strips anything), and, given a
STATE, trainer ids the STATE does not have. Each row's text is checked as ``embed`` checks it
(``io.tables.prompt_row_text``): a row ``embed`` would refuse (no text field, an empty text, a chat without a
user turn) stops it with ``embed``'s one-line error, so that ``ids`` never passes a file ``embed`` refuses.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DataError, GraphdiffError, InvalidArgumentError
from ..io.tables import DEFAULT_MESSAGES, as_id, field_value, prompt_row_text, read_rows

TRAINERS = ("verl", "trl", "openrlhf", "trinity", "none")
DEFAULT_ID_FIELDS = {"verl": "extra_info.index", "trl": "id", "openrlhf": "label", "trinity": "id", "none": "id"}
LISTED = 10  # rows named per problem kind (the counts are complete)


def verl_id(value) -> str:
    """verl's id of an ``extra_info.index`` value: ``str()``, a numpy scalar as its value (the rule of
    ``verl.data_source_ids`` and of the batch's index in ``verl.outcomes_from_fields``; a test holds the two equal)."""
    if value is None:  # verl would silently substitute 0 (data_source_ids refuses it at start-up)
        raise DataError("no extra_info.index (verl would use 0)")
    return str(value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value)


def trinity_id(value) -> str:
    """The id graphdiff's Trinity-RFT selector reports for a row's ``id_field`` value: ``str()``, a numpy
    scalar as its value (``trinity.taskset_ids``); no value is refused."""
    if value is None:
        raise DataError("no id")
    return str(value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value)


def row_prompt_ids(values, rule, *, rows: str, field: str, missing: str, shared: str) -> list[str]:
    """Each data set row's prompt id as a trainer's adapter reports it: ``rule`` (``verl_id``, ``trinity_id``) of
    the row's id value (``values``: one per row, None where a row has none). A row without one and two rows with
    the same one are refused in one line naming the rows: ``rows`` (what the trainer calls its data set) "row r has
    no ``field``; ``missing``", and "rows a and b share ``shared``" (``{id}`` in it: the id)."""
    ids: list[str] = []
    first: dict[str, int] = {}
    for r, value in enumerate(values):
        if value is None:
            raise DataError(f"{rows} row {r} has no {field}; {missing}")
        pid = rule(value)
        if pid in first:
            raise DataError(f"{rows} rows {first[pid]} and {r} share {shared.format(id=repr(pid))}; ids must be unique")
        first[pid] = r
        ids.append(pid)
    return ids


def _trl_id(value) -> str:
    return str(value)


def _openrlhf_id(value) -> str:
    from .openrlhf import parse_label

    return parse_label(value)[0]


def _own_id(value) -> str:
    return as_id(value, "", 0, "id")


RULES = {"verl": verl_id, "trl": _trl_id, "openrlhf": _openrlhf_id, "trinity": trinity_id, "none": _own_id}


def _check_field(trainer: str, id_field: str) -> None:
    if trainer == "verl" and id_field != "extra_info.index":
        raise InvalidArgumentError(f"verl reports extra_info.index as the prompt id, not {id_field!r}: leave "
                                   "--id-field out with --trainer verl")
    if trainer == "trl" and "." in id_field:
        raise InvalidArgumentError(f"TRL passes reward functions top-level columns only: {id_field!r} cannot be "
                                   "GraphdiffTRL's id_column; add a top-level id column to the data set")


def trainer_ids(path, *, trainer: str = "none", id_field: str | None = None, text_field: str = "prompt",
                messages: str = DEFAULT_MESSAGES, state=None, head: int = 5) -> dict:
    """Every row's trainer id and graphdiff id, with the problems found (see the module docstring).
    ``state``: a STATE directory (or ``graphdiff_cli.State``) whose prompt ids the trainer ids must be."""
    if trainer not in TRAINERS:
        raise InvalidArgumentError(f"--trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    if isinstance(head, bool) or not isinstance(head, int) or head < 0:
        raise InvalidArgumentError(f"--head must be an integer >= 0, got {head!r}")
    id_field = DEFAULT_ID_FIELDS[trainer] if id_field is None else id_field
    _check_field(trainer, id_field)
    rule = RULES[trainer]
    known = None
    if state is not None:
        from ..state import State

        st = state if isinstance(state, State) else State.open(state)
        known = set(st.ids)
    path = Path(path)
    rows = 0
    first_rows: list[dict] = []
    missing: list[dict] = []  # {row, reason}
    first_row: dict[str, int] = {}
    duplicates: dict[str, list[int]] = {}
    mismatches: list[dict] = []
    unknown: list[dict] = []
    for line_no, row in read_rows(path):
        rows += 1
        found, value = field_value(row, id_field)
        tid = gid = None
        if not found:
            missing.append({"row": line_no, "reason": f"no {id_field!r} field"})
        else:
            try:
                tid = rule(value)
            except GraphdiffError as exc:
                missing.append({"row": line_no, "reason": str(exc).removeprefix(":0: ")})
            if trainer == "openrlhf":
                gid = tid  # the label's id is what a prompts file for OpenRLHF carries as its id
            else:
                try:
                    gid = as_id(value, path, line_no, id_field)
                except DataError:
                    gid = None
        if tid is not None:
            if tid in first_row:
                duplicates.setdefault(tid, [first_row[tid]]).append(line_no)
            else:
                first_row[tid] = line_no
            if gid is not None and gid != tid:
                mismatches.append({"row": line_no, "trainer_id": tid, "graphdiff_id": gid})
            if known is not None and tid not in known:
                unknown.append({"row": line_no, "id": tid})
        # the text embed would embed, checked as embed checks it (a row it would refuse stops here with its line)
        text = prompt_row_text(row, text_field, path, line_no, messages)
        if len(first_rows) < head:
            first_rows.append({"row": line_no, "id": tid, "text": text})
    if rows == 0:
        raise DataError(f"{path}: no rows")
    ok = not (missing or duplicates or mismatches or unknown)
    return {"command": "ids", "path": str(path), "trainer": trainer, "id_field": id_field, "rows": rows,
            "unique_ids": len(first_row), "first_rows": first_rows, "ok": ok,
            "missing": {"count": len(missing), "rows": missing[:LISTED]},
            "duplicates": {"count": len(duplicates),
                           "ids": [{"id": k, "rows": v} for k, v in list(duplicates.items())[:LISTED]]},
            "mismatches": {"count": len(mismatches), "rows": mismatches[:LISTED]},
            "not_in_state": None if known is None else {"count": len(unknown), "rows": unknown[:LISTED]}}
