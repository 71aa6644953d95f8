"""Turn the One-Shot-RLVR accuracy history (shared/data/oneshot_rlvr) into a replayable log.

The trainer recorded, per prompt, the fraction correct of 8 rollouts each time the prompt was drawn,
but not the global step of later visits. The data README's replay protocol, implemented here:
visit k is round k; in round k every prompt with more than k visits is observed once, in batches of
``batch_size`` = 128; round 0 follows the recorded first-epoch order (the key order of
``acc_step_500.raw.json``), later rounds a seeded shuffle. A round's last, partial batch is its own
step, so no prompt appears twice in a batch and a batch never mixes two rounds. Steps are numbered
1, 2, ... across rounds. Counts come from ``acc_history.jsonl`` and are checked against the raw file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError, InvalidArgumentError
from ..io.tables import as_int, load_json, read_rows

FILES = ("prompts.jsonl", "acc_history.jsonl", "acc_step_500.raw.json")


@dataclass
class OneShotLog:
    """prompts: [{"id", "prompt"}] in first-draw order; log: [{"step", "id", "n", "s", "visit"}]."""

    prompts: list[dict]
    log: list[dict]

    def summary(self) -> dict:
        first = {}
        last = {}
        for row in self.log:
            rate = row["s"] / row["n"]
            first.setdefault(row["id"], rate)
            last[row["id"]] = rate
        return {"rows": len(self.log), "prompts": len(self.prompts),
                "steps": self.log[-1]["step"] if self.log else 0,
                "rounds": 1 + max((r["visit"] for r in self.log), default=-1),
                "mean_first_visit": float(np.mean(list(first.values()))) if first else float("nan"),
                "mean_last_visit": float(np.mean(list(last.values()))) if last else float("nan")}


def convert_oneshot(data_dir, seed: int = 0, batch_size: int = 128) -> OneShotLog:
    """Read ``data_dir`` (the oneshot_rlvr folder) and build the round-by-round replay log."""
    data_dir = Path(data_dir)
    if batch_size < 1:
        raise InvalidArgumentError(f"batch size must be >= 1, got {batch_size}")
    for name in FILES:
        if not (data_dir / name).is_file():
            raise DataError(f"{data_dir}: missing {name} (is this the oneshot_rlvr folder?)")

    texts: dict[str, str] = {}
    path = data_dir / "prompts.jsonl"
    for line, row in read_rows(path):
        pid = str(as_int(row.get("index"), path, line, "index"))
        if pid in texts:
            raise DataError(f"{path}:{line}: duplicate index {pid}")
        texts[pid] = row.get("problem") or ""

    visits: dict[str, list[tuple[int, int]]] = {}
    path = data_dir / "acc_history.jsonl"
    for line, row in read_rows(path):
        pid = str(as_int(row.get("index"), path, line, "index"))
        k = as_int(row.get("visit"), path, line, "visit")
        n = as_int(row.get("n_rollouts"), path, line, "n_rollouts")
        s = as_int(row.get("n_correct"), path, line, "n_correct")
        if n < 1 or not 0 <= s <= n:
            raise DataError(f"{path}:{line}: need n_rollouts >= 1 and 0 <= n_correct <= n_rollouts")
        lst = visits.setdefault(pid, [])
        if k != len(lst):
            raise DataError(f"{path}:{line}: visit {k} of prompt {pid} follows visit {len(lst) - 1}; "
                            "visits must be listed in order from 0")
        lst.append((n, s))

    raw_path = data_dir / "acc_step_500.raw.json"
    try:
        text = raw_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{raw_path}: cannot be read ({exc.__class__.__name__})") from None
    raw = load_json(text, raw_path)  # dicts keep the file's key order: the first-draw order
    order = list(raw)
    if set(order) != set(visits) or len(order) != len(visits):
        raise DataError(f"{raw_path}: its prompts differ from those in acc_history.jsonl")
    for pid in order:
        acc = raw[pid]
        hist = visits[pid]
        if len(acc) != len(hist) or any(abs(a - s / n) > 1e-9 for a, (n, s) in zip(acc, hist)):
            raise DataError(f"{raw_path}: prompt {pid}'s accuracies disagree with acc_history.jsonl")
        if pid not in texts:
            raise DataError(f"prompts.jsonl has no prompt with index {pid}")

    rng = np.random.default_rng(seed)
    log: list[dict] = []
    step = 0
    n_rounds = max(len(v) for v in visits.values())
    for k in range(n_rounds):
        members = [pid for pid in order if len(visits[pid]) > k]
        if k > 0:
            members = [members[i] for i in rng.permutation(len(members))]
        for start in range(0, len(members), batch_size):
            step += 1
            for pid in members[start:start + batch_size]:
                n, s = visits[pid][k]
                log.append({"step": step, "id": pid, "n": n, "s": s, "visit": k})
    prompts = [{"id": pid, "prompt": texts[pid]} for pid in order]
    return OneShotLog(prompts=prompts, log=log)


def write_oneshot(data_dir, out_prompts, out_log, seed: int = 0, batch_size: int = 128) -> dict:
    """Convert and write the prompts file (id, prompt) and the log (step, id, n, s) atomically."""
    from ..io.tables import write_rows

    conv = convert_oneshot(data_dir, seed=seed, batch_size=batch_size)
    write_rows(out_prompts, conv.prompts, columns=["id", "prompt"])
    write_rows(out_log, conv.log, columns=["step", "id", "n", "s"])
    return conv.summary()
