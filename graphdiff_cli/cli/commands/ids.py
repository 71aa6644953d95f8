"""``graphdiff ids``: the prompt id each trainer will report for each row of a training file; exit 1 on a problem."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import EXIT_ERROR, command, emit


def _cut(text, limit: int = 70) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@command("ids")
def ids(
    path: Path = typer.Argument(..., help="The training file as the trainer reads it (.parquet, .jsonl, .csv)."),
    trainer: str = typer.Option("none", "--trainer", help="verl (extra_info.index), trl (the id column), openrlhf "
                                "(the label's JSON id), trinity (the selector's id_field) or none (graphdiff's own reading)."),
    id_field: Optional[str] = typer.Option(None, "--id-field", help="Where the id is (default by --trainer: "
                                           "extra_info.index, id, label, id, id); a dotted path reads a nested field."),
    text_field: str = typer.Option("prompt", "--text-field", help="Column holding the prompt, checked on every "
                                   "row as embed checks it (a row embed refuses stops ids with embed's error) and "
                                   "shown for the first rows as embed would embed it."),
    messages: str = typer.Option("user", "--messages", help="How a chat-list prompt is flattened: user or all."),
    state: Optional[Path] = typer.Option(None, "--state", help="Also check that every id is a prompt of this "
                                         "STATE."),
    head: int = typer.Option(5, "--head", help="How many first rows to show."),
):
    """Print the id the trainer will report for each row (first rows, count, duplicates, rows without an id,
    ids that differ from what graphdiff embed stores, ids the STATE lacks); exit 1 when any is found."""
    from ...integrations.ids import trainer_ids

    res = trainer_ids(path, trainer=trainer, id_field=id_field, text_field=text_field, messages=messages,
                      state=state, head=head)
    lines = [f"{res['path']}: {res['rows']} rows, {res['unique_ids']} distinct ids as {res['trainer']} reports "
             f"them (from {res['id_field']}); " + ("ok" if res["ok"] else "problems below")]
    lines += [f"  row {r['row']}: id {r['id']!r}  {_cut(r['text'])}" for r in res["first_rows"]]
    m = res["missing"]
    if m["count"]:
        lines.append(f"problem: {m['count']} row(s) without an id: "
                     + "; ".join(f"row {r['row']} ({r['reason']})" for r in m["rows"]))
    d = res["duplicates"]
    if d["count"]:
        lines.append(f"problem: {d['count']} id(s) on several rows: "
                     + "; ".join(f"{x['id']!r} on rows {', '.join(map(str, x['rows']))}" for x in d["ids"]))
    mm = res["mismatches"]
    if mm["count"]:
        lines.append(f"problem: {mm['count']} row(s) whose trainer id is not the id graphdiff embed stores: "
                     + "; ".join(f"row {r['row']}: {r['trainer_id']!r} vs {r['graphdiff_id']!r}" for r in mm["rows"]))
    u = res["not_in_state"]
    if u is not None and u["count"]:
        lines.append(f"problem: {u['count']} id(s) not in the STATE: "
                     + "; ".join(f"row {r['row']}: {r['id']!r}" for r in u["rows"]))
    emit(res, "\n".join(lines), report=True)
    if not res["ok"]:
        raise typer.Exit(EXIT_ERROR)
