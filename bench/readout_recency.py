#!/usr/bin/env python3
"""Issue 33, an experiment (not a product option): the read-out's rows weighted by recency, rho^(steps since the
prompt's last visit), so that its level follows an improving policy instead of the mean of the whole history
(bench/readout_bias.py measures that lag). The read-out's statistics are recomputed from every prompt with
evidence at each step (O(N d^2): fine for a replay, not the product's O(batch d^2) update). rho = 1 is today's
read-out (the same figures up to rounding). docs/results.md has the figures and the conclusion.

    .venv/bin/python bench/readout_recency.py artifacts/math 1.0,0.97,0.9
"""

import sys
import time
from pathlib import Path

import numpy as np

from _run import _one, run_inputs, run_log  # bench/ is on sys.path when a script runs
from graphdiff_cli.core import readout as ro
from graphdiff_cli.evaluation import metrics as M
from graphdiff_cli.evaluation.replay import replay
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.readers import embedding_matrix
from graphdiff_cli.evaluation.methods import GraphdiffMethod


class Recency(Estimator):
    rho = 1.0

    def update(self, ids, n, s):
        if not hasattr(self, "_last"):
            self._last, self._t = np.full(self.n_nodes, -1, np.int64), 0
        self._t += 1
        self._last[np.asarray(ids)] = self._t
        return super().update(ids, n, s)

    def _readout_stats(self, old, new, rows, rebuild):
        seen = np.flatnonzero(new[1] > 0)
        w, y = ro.rows_of(new[0][seen], new[1][seen])
        w = w * self.rho ** (self._t - self._last[seen])
        return ro.stats_of(ro.features(self._embeddings[seen]), w, y)


def main() -> None:
    run = Path(sys.argv[1])
    rhos = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1.0,0.97,0.9").split(",")]
    inp = run_inputs(run)
    emb = embedding_matrix(_one(run, "embeddings.zarr"), inp.graph)
    log = run_log(run, inp)
    methods = []
    for rho in rhos:
        cls = type(f"R{rho}", (Recency,), {"rho": rho})
        est = cls(inp.w, inp.labels, inp.k, embeddings=emb, device="cpu", beta=2.0, gamma=0.5, readout="auto")
        methods.append(GraphdiffMethod(est, name=f"rho {rho}"))
    t0 = time.time()
    res = replay(log["step"], log["id"], log["n"], log["s"], methods, n_nodes=len(inp.ids))
    print(f"{run}: replay {time.time()-t0:.0f}s")
    rate = res.rate
    for m in methods:
        p = res.predictions[m.name]
        ev = M.evaluate_predictions(res.step, p, res.n, res.s, res.seen)
        f = ev["full"]
        e = m.estimator
        print(f"{m.name}: settled r {e.readout_} ridge {e.readout_ridge_} w {e.propagation_} | all: MAE {f['all']['mae']:.4f} "
              f"within {f['all']['within_r']:.4f} batch {f['all']['batch_r']:.4f} ECE {f['all']['ece']:.4f} Brier {f['all']['brier']:.4f} "
              f"bias {p.mean()-rate.mean():+.4f} | seen batch {f['seen']['batch_r']:.4f} | first: batch {f['unseen']['batch_r']:.4f} "
              f"within {f['unseen']['within_r']:.4f} ECE {f['unseen']['ece']:.4f} bias {p[~res.seen].mean()-rate[~res.seen].mean():+.4f}")


if __name__ == "__main__":
    main()
