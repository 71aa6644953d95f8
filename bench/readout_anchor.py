#!/usr/bin/env python3
"""Issue 33, two experiments (not product options) on the MATH/demo losses of the read-out (bench/readout_bias.py:
a level bias that grows with the read-out's weight, its level the mean of the whole history's rates):

- anchored: the read-out's level anchored to the states': the read-out of every prompt shifted by
  mean_i(states' estimate) - mean_i(read-out) over all N prompts (O(N K) a step here; the product would keep the
  column sums of q), so the read-out brings its ranking and the states their level;
- squared: the joint online choice (propagation weight, read-out weight, kappa, time forgetting) by summed
  squared instead of absolute error (what ECE and Brier score).

Rows: no embeddings (the default before the read-out), readout auto (today's default), and the two variants.
Every prediction is made before its outcomes; nothing is tuned on the log.

    .venv/bin/python bench/readout_anchor.py artifacts/math      # artifacts/demo, artifacts/oneshot
"""

import sys
import time
from pathlib import Path

import numpy as np

from _run import _one, run_inputs, run_log  # bench/ is on sys.path when a script runs
from ablation import round0_steps
from graphdiff_cli.core import readout as ro
from graphdiff_cli.evaluation import metrics as M
from graphdiff_cli.evaluation.replay import replay
from graphdiff_cli.estimator import Estimator, choices as C
from graphdiff_cli.io.readers import embedding_matrix
from graphdiff_cli.evaluation.methods import GraphdiffMethod


class Anchored(Estimator):
    """The read-out shifted to the states' mean level over all prompts."""

    def update(self, ids, n, s):
        self._shift = None
        return super().update(ids, n, s)

    def _readout_estimates(self, rows, ridges):
        out = super()._readout_estimates(rows, ridges)
        if self._theta.get(float(self.choices.ridge)) is None:
            return out
        if getattr(self, "_shift", None) is None:
            every = np.arange(self.n_nodes)
            states = self._states_estimate(every, self._model_prediction(every)[0]).mean()
            self._shift = {}
            for ridge in ro.RIDGE_GRID:
                theta = self._theta.get(float(ridge))
                if theta is None:
                    theta = self._theta[float(ridge)] = ro.solve(self.readout_gram_, self.readout_moment_, ridge)
                self._shift[float(ridge)] = states - ro.predict_embeddings(theta, self._embeddings, 0.0).mean()
        return [np.clip(o + self._shift.get(float(r), 0.0), 0.0, 1.0) for o, r in zip(out, ridges)]


class _Squared:
    """numpy with abs replaced by square: the choices module's summed absolute errors become squared ones."""

    def __getattr__(self, name):
        return getattr(np, name)

    abs = staticmethod(np.square)


def figures(res, name, r0):
    p = res.predictions[name]
    ev = M.evaluate_predictions(res.step, p, res.n, res.s, res.seen)
    f, rate = ev["full"], res.rate
    sel = np.isin(res.step, r0)
    return (f"MAE {f['all']['mae']:.4f} within {f['all']['within_r']:.4f} batch {f['all']['batch_r']:.4f} "
            f"ECE {f['all']['ece']:.4f} Brier {f['all']['brier']:.4f} AUROC {f['all'].get('auroc', float('nan')):.4f} "
            f"bias {p.mean() - rate.mean():+.4f} | first-visit batch {f['unseen']['batch_r']:.4f} | "
            f"round-0 within {M.within_batch(res.step[sel], p[sel], rate[sel])['pearson']:.4f}")


def main() -> None:
    run = Path(sys.argv[1])
    inp = run_inputs(run)
    emb = embedding_matrix(_one(run, "embeddings.zarr"), inp.graph)
    log = run_log(run, inp)
    r0 = round0_steps(log["step"], log["id"])
    kw = dict(device="cpu", beta=2.0, gamma=0.5)
    rows = [("no embeddings", Estimator, dict(embeddings=None), False),
            ("readout auto", Estimator, dict(embeddings=emb, readout="auto"), False),
            ("readout auto, anchored", Anchored, dict(embeddings=emb, readout="auto"), False),
            ("readout auto, squared choice", Estimator, dict(embeddings=emb, readout="auto"), True),
            ("readout auto, anchored, squared choice", Anchored, dict(embeddings=emb, readout="auto"), True)]
    for name, cls, extra, squared in rows:
        est = cls(inp.w, inp.labels, inp.k, **kw, **extra)
        m = GraphdiffMethod(est, name=name)
        t0 = time.time()
        C.np = _Squared() if squared else np
        try:
            res = replay(log["step"], log["id"], log["n"], log["s"], [m], n_nodes=len(inp.ids))
        finally:
            C.np = np
        print(f"{name:40s} {figures(res, name, r0)} | settled r {est.readout_} w {est.propagation_} "
              f"ridge {est.readout_ridge_} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
