"""Write tests/data/legacy_79a4679: estimator states as graphdiff 79a4679 wrote them, and what it predicted.

Run once against a checkout of that commit (the last one before per-kind encoding versions), e.g.

    git archive 79a4679 | tar -x -C /tmp/gd_79a4679
    PYTHONPATH=/tmp/gd_79a4679 python tests/data/make_legacy_states.py tests/data/legacy_79a4679

It writes a STATE directory (``graphdiff init`` + three updates, the default preset), three standalone
saves (the default preset; kappa chosen alone with a window; the paper preset) and ``expected.npz``: for
each, every field of ``estimates()`` as loaded, and again after one more update with fixed outcomes.
tests/test_estimator_versions.py loads them with the current code and checks it predicts the same, to
rounding (the figures are this machine's: another BLAS kernel, thread count or SIMD width moves their last
bits).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for _handoff_fixtures

from _handoff_fixtures import make_inputs, step_rows, write_outcomes  # noqa: E402

STANDALONE = {
    "default": {},
    "kappa_alone": {"label_propagation": None, "time_forgetting": 1.0, "window": 3, "schedule": "synchronous"},
    "paper": {"preset": "paper"},
}
NEXT = step_rows([f"q{i:03d}" for i in range(40)], 9)  # the update every test applies after loading


def batch(ids, rows):
    index = {p: i for i, p in enumerate(ids)}
    return [index[r["id"]] for r in rows], [r["n"] for r in rows], [r["s"] for r in rows]


def record(out: dict, name: str, est, ids) -> None:
    for key, v in est.estimates().items():
        out[f"{name}/loaded/{key}"] = np.asarray(v, dtype=np.float64)
    est.update(*batch(ids, NEXT))
    for key, v in est.estimates().items():
        out[f"{name}/next/{key}"] = np.asarray(v, dtype=np.float64)


def main(dest: Path) -> None:
    import graphdiff_cli
    from graphdiff_cli.estimator import Estimator
    from graphdiff_cli.io.artifacts import read_artifact
    from graphdiff_cli.io.readers import read_graph
    from graphdiff_cli.stages import handoff

    print(f"writing with {graphdiff_cli.__file__}", file=sys.stderr)
    if dest.exists():
        shutil.rmtree(dest)
    work = dest.parent / (dest.name + ".work")
    work.mkdir(parents=True)
    graph, clusters, ids = make_inputs(work, n=40, k_states=4)
    expected = {}
    state = dest / "STATE"
    handoff.init_state(graph, clusters, state, device="cpu", durable=False)
    for t in (1, 2, 3):
        handoff.update_state(state, t, write_outcomes(work / f"o{t}.jsonl", step_rows(ids, t)), durable=False)
    record(expected, "STATE", Estimator.load(state, device="cpu"), ids)
    w, labels = read_graph(graph).w, read_artifact(clusters, "clusters").array("labels")
    for name, kw in STANDALONE.items():
        est = Estimator(w, labels, n_states=4, **{"device": "cpu", **kw})
        for t in (1, 2, 3):
            est.update(*batch(ids, step_rows(ids, t)))
        est.save(dest / f"{name}.zarr")
        record(expected, name, Estimator.load(dest / f"{name}.zarr", device="cpu"), ids)
    np.savez_compressed(dest / "expected.npz", **expected)
    shutil.rmtree(work)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
