"""The on-disk layout of a STATE directory, declared in one place (specified in docs/reference/handoff.md).

::

    STATE/
      CURRENT               {"step": T, "path": "steps/0000000T.zarr"} (+ "revision": R)   replaced atomically
      model.zarr            estimator-model artifact written by init: W, labels, prompt ids, kNN lists, config
      models/T.R.zarr       the model after the prompt set changed (extend), written with its version
      steps/0000000T.zarr   estimator-step artifact of update T (steps/0000000T.R.zarr: revision R)
      log.jsonl             one JSON line per applied version (step 0 = init), with each input file's hash
      .lock                 flock'ed by every writer
      retention.json        {"keep": K, "keep_every": C}: the states pruning keeps (init, graphdiff retention)
    STATE.outcomes/         beside it: the outcomes files ``State.update`` writes for rows given in memory

Every module that reads or writes a STATE takes its names from here: ``io.estimator_store`` (the pointer and
step artifacts), ``io.state_dir`` (commits, log, pruning), the prompt-set stages (``extend``/``retire``),
``status`` and ``verify``.
"""

from __future__ import annotations

import re
from pathlib import Path

CURRENT = "CURRENT"      # the pointer to the current version
STEPS = "steps"          # the folder of step artifacts
MODEL = "model.zarr"     # init's model artifact
MODELS = "models"        # the models written by extend, named T.R.zarr
LOG = "log.jsonl"        # one line per applied version
LOCK = ".lock"           # held by every writer
RETENTION = "retention.json"  # {"keep": K, "keep_every": C}: which states pruning keeps (graphdiff retention)
LAYOUT_VERSION = 1       # stamped into the model's "handoff" attribute

# arrays of a model artifact that graphdiff extend reads and writes (absent in STATEs made before extend)
KNN_INDICES, KNN_SIMILARITIES = "knn_indices", "knn_similarities"
ADDED_EMBEDDINGS, ADDED_TEXT_HASH, JOINED = "added_embeddings", "added_text_hash", "joined"
PROMPT_SET = "prompt_set"  # the model attribute naming the base embeddings and the graph's k
# array of a step artifact: node indices of the retired prompts (graphdiff retire)
RETIRED = "retired"


def step_relpath(step: int, revision: int = 0) -> str:
    """Where a STATE directory keeps the state of ``step`` (revision 0: what its update wrote; revision r > 0:
    the r-th change of the prompt set after it, by extend or retire). The only paths CURRENT may name."""
    return f"{STEPS}/{step:08d}.zarr" if revision == 0 else f"{STEPS}/{step:08d}.{revision}.zarr"


_STEP_NAME = re.compile(r"^(\d{8})(?:\.([1-9]\d*))?\.zarr$")


def step_version(name: str) -> tuple[int, int] | None:
    """The version (step, revision) a step folder's name ``step_relpath`` gave it says, or None for any other name."""
    m = _STEP_NAME.match(name)
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def outcomes_dir(root) -> Path:
    """Where ``State.update`` keeps the outcomes files of steps given as rows: ``STATE.outcomes`` beside it."""
    root = Path(root)
    return root.parent / f"{root.name}.outcomes"
