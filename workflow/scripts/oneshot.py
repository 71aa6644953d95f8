"""Snakemake script: convert the One-Shot-RLVR folder into a prompts file and a replayable log.

Uses graphdiff's converter (graphdiff_cli.evaluation.oneshot.write_oneshot: visit k = round k, rounds in
shuffled batches, round 0 in the recorded first-draw order); see shared/data/README.md.
Errors become one line in the rule's log and a failed job.
"""

import json
import sys
from pathlib import Path

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

with open(sm.log[0], "w", encoding="utf-8") as log:
    try:
        from graphdiff_cli.errors import GraphdiffError
        from graphdiff_cli.evaluation.oneshot import write_oneshot

        summary = write_oneshot(Path(sm.input.prompts).parent, sm.output.prompts, sm.output.log,
                                seed=int(sm.params.seed), batch_size=int(sm.params.batch_size))
    except GraphdiffError as exc:
        log.write(f"graphdiff: error: {exc}\n")
        sys.exit(1)
    log.write(json.dumps(summary, sort_keys=True) + "\n")
