"""Are two closed-loop grids' runs the same runs? Compares every finished run that both folders hold.

    python bench/closedloop_identical.py artifacts/closedloop/runs artifacts/cl-cpu/runs

A run is ``<runs>/<scheduler>/s<seed>/`` with ``summary.json`` (written last, so only finished runs count). Two
runs are identical when their ``outcomes.jsonl`` (every prompt generated for and its successes) are byte for byte
the same and their ``metrics.jsonl`` records are equal in every field except wall-clock timings (keys ending in
``seconds``). Prints one JSON object: runs compared, identical, and for each that differs the first record and
fields where it does. Exit status 1 when any compared run differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _untimed(x):
    if isinstance(x, dict):
        return {k: _untimed(v) for k, v in x.items() if not k.endswith("seconds")}
    if isinstance(x, list):
        return [_untimed(v) for v in x]
    return x


def _records(path: Path) -> list:
    return [_untimed(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def compare_run(a: Path, b: Path) -> dict | None:
    """None when the two runs are identical (up to timings), else where they first differ."""
    if (a / "outcomes.jsonl").read_bytes() != (b / "outcomes.jsonl").read_bytes():
        return {"file": "outcomes.jsonl"}
    ra, rb = _records(a / "metrics.jsonl"), _records(b / "metrics.jsonl")
    if len(ra) != len(rb):
        return {"file": "metrics.jsonl", "records": [len(ra), len(rb)]}
    for i, (x, y) in enumerate(zip(ra, rb)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            return {"file": "metrics.jsonl", "record": i, "fields": keys}
    return None


def main() -> None:
    if len(sys.argv) == 2 and sys.argv[1] in ("-h", "--help"):  # as every bench script answers --help
        print(__doc__.strip())
        return
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    root_a, root_b = Path(sys.argv[1]), Path(sys.argv[2])
    compared, differ = [], {}
    for summary in sorted(root_a.glob("*/s*/summary.json")):
        run = summary.parent.relative_to(root_a)
        if not (root_b / run / "summary.json").exists():
            continue
        compared.append(str(run))
        where = compare_run(root_a / run, root_b / run)
        if where is not None:
            differ[str(run)] = where
    print(json.dumps({"compared": len(compared), "identical": len(compared) - len(differ), "differ": differ,
                      "runs": compared}))
    raise SystemExit(1 if differ else 0)


if __name__ == "__main__":
    main()
