"""Snakemake script: split a training log (rows step, id, n, s) into one outcomes file per step.

Writes ``step-<T>.jsonl`` (rows id, n, s) into the output folder, each to a temporary name first and
then renamed into place: the convention ``graphdiff watch`` relies on to never read a half-written
file (docs/reference/workflow.md). The files of replay.add_prompts and replay.retire go in beside them as
``prompts-<T>.<ext>`` and ``retire-<T>.<ext>``. Steps keep the log's numbers; a log whose steps do not run 1, 2, ... without
gaps is refused, because the STATE applies steps one after another.
"""

import json
import os
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with open(sm.log[0], "w", encoding="utf-8") as log:
    try:
        from graphdiff_cli.errors import DataError, GraphdiffError
        from graphdiff_cli.io.tables import as_id, as_int, read_rows
        from graphdiff_cli.stages.watch import step_file_name

        src = Path(sm.input[0])
        steps: dict[int, list[dict]] = {}
        for line, row in read_rows(src):
            for field in ("step", "id", "n", "s"):
                if field not in row:
                    raise DataError(f"{src}:{line}: no {field!r} field (a log row needs step, id, n, s)")
            t = as_int(row["step"], src, line, "step")
            steps.setdefault(t, []).append({"id": as_id(row["id"], src, line, "id"),
                                            "n": as_int(row["n"], src, line, "n"),
                                            "s": as_int(row["s"], src, line, "s")})
        if not steps:
            raise DataError(f"{src}: the log has no rows")
        order = sorted(steps)
        if order != list(range(1, len(order) + 1)):
            gap = next((t for i, t in enumerate(order, start=1) if t != i), order[-1])
            raise DataError(f"{src}: steps must run 1, 2, ... without gaps (first offending step: {gap})")
        out = Path(sm.output[0])
        out.mkdir(parents=True, exist_ok=True)
        for t in order:
            final = out / step_file_name(t)
            tmp = out / (final.name + ".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in steps[t]), encoding="utf-8")
            os.replace(tmp, final)
        # prompt set changes: prompts-<T>.<ext> / retire-<T>.<ext>, applied by watch before step T
        seen = {}
        for kind, t, path in sm.params.changes:
            key = f"replay.{'add_prompts' if kind == 'prompts' else 'retire'}"
            src_change = Path(path)
            if not src_change.is_file():
                raise DataError(f"{src_change}: no such file ({key})")
            suffix = src_change.suffix.lower()
            if kind == "prompts" and suffix not in (".jsonl", ".ndjson", ".json", ".csv", ".tsv", ".parquet", ".pq"):
                raise DataError(f"{src_change}: {key} needs a prompts table (.jsonl, .csv, .tsv or .parquet)")
            if (kind, int(t)) in seen:
                raise DataError(f"{key}: two files for step {t} ({seen[kind, int(t)]}, {path}); merge them into one")
            seen[kind, int(t)] = path
            final = out / f"{kind}-{int(t):06d}{suffix or '.txt'}"
            tmp = out / (final.name + ".tmp")
            tmp.write_bytes(src_change.read_bytes())
            os.replace(tmp, final)
    except GraphdiffError as exc:
        log.write(f"graphdiff: error: {exc}\n")
        sys.exit(1)
    log.write(f"{len(order)} step files ({sum(len(v) for v in steps.values())} rows) -> {out}\n")
