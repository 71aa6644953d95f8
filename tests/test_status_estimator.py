"""graphdiff status --estimator: what the estimator believes - the distribution of p over the candidates, the
states' rates and sizes, each source's weight in p, and the online choices - in text and --json, read through
the Estimator's public accessors (checked here against the estimator's own numbers)."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from typer.testing import CliRunner

from _handoff_fixtures import GRAPHDIFF, make_inputs, step_rows, write_outcomes
from graphdiff_cli.cli.app import app
from graphdiff_cli.core.beta import mean_variance
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.state import State

runner = CliRunner()


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    folder = tmp_path_factory.mktemp("status-estimator")
    graph, clusters, ids = make_inputs(folder, n=40)
    out = folder / "STATE"
    State.init(graph, clusters, out, device="cpu", durable=False, label_propagation=0.3, time_forgetting="auto")
    for t in (1, 2, 3):
        State.open(out, durable=False).update(t, write_outcomes(folder / f"o{t}.jsonl", step_rows(ids, t, batch=16)))
    (folder / "bad.txt").write_text(ids[0] + "\n")
    State.open(out, durable=False).retire(folder / "bad.txt")
    return out, ids


def test_status_estimator_json(state):
    root, ids = state
    res = runner.invoke(app, ["status", "--state", str(root), "--estimator", "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    est = Estimator.load(root)
    summary = doc["estimator"]
    assert summary["step"] == 3 and summary["candidates"] == 39 and summary["retired"] == 1
    rows = np.arange(1, 40)  # prompt 0 is retired
    p = est.predict(rows)
    q = summary["p"]
    assert q["mean"] == pytest.approx(p.mean())
    assert [q["min"], q["p05"], q["p25"], q["median"], q["p75"], q["p95"], q["max"]] == pytest.approx(
        np.quantile(p, [0, 0.05, 0.25, 0.5, 0.75, 0.95, 1]).tolist())
    assert summary["seen"] == int((est.rollouts_[rows] > 0).sum())
    # the states: Beta means, evidence, and how many candidates each holds
    mu, _ = mean_variance(est.a_, est.b_)
    states = summary["states"]
    assert [s["state"] for s in states] == list(range(est.n_states))
    assert [s["rate"] for s in states] == pytest.approx(mu.tolist())
    assert [s["a"] for s in states] == pytest.approx(est.a_.tolist())
    qrows = est.q_[rows]
    assert [s["expected_prompts"] for s in states] == pytest.approx(qrows.sum(axis=0).tolist())
    assert [s["prompts"] for s in states] == np.bincount(qrows.argmax(axis=1), minlength=est.n_states).tolist()
    # each source's weight in p: the parts of the graph's estimate and the prompt's own history sum to one
    w = est.source_weights(rows)
    assert np.allclose(sum(v for v in w.values() if v is not None), 1.0)
    src = summary["sources"]
    assert src["history"] == pytest.approx(w["history"].mean()) and src["readout"] is None
    assert src["label_propagation"] == pytest.approx(w["label_propagation"].mean()) and src["label_propagation"] > 0
    assert src["states"] + src["label_propagation"] + src["history"] == pytest.approx(1.0)
    # the online choices: what is set, what is in use
    ch = summary["online_choices"]
    assert ch["prior_strength"] == {"setting": "auto", "value": pytest.approx(est.kappa_), "online": True,
                                    "inert": False}
    assert ch["label_propagation"] == {"setting": 0.3, "value": 0.3, "online": False, "inert": False}
    assert ch["time_forgetting"]["online"] and ch["time_forgetting"]["setting"] == "auto"
    assert ch["time_forgetting"]["value"] == pytest.approx(est.time_forgetting_)
    assert ch["belief_strength"]["value"] == pytest.approx(est.nu_)
    # the default preset's read-out is "auto", but this STATE has no embeddings: off, not chosen online
    assert ch["readout"] == {"setting": "auto", "value": None, "online": False, "inert": False}
    # without --estimator, status is as it was (the estimator is not even loaded)
    plain = json.loads(runner.invoke(app, ["status", "--state", str(root), "--json"]).stdout)
    assert "estimator" not in plain


def test_status_estimator_text(state):
    root, _ = state
    res = runner.invoke(app, ["status", "--state", str(root), "--estimator"])
    assert res.exit_code == 0, res.stderr
    text = res.stdout
    assert "estimator at step 3: 39 candidates" in text
    for words in ("p over the candidates: mean", "median", "weight of each source in p", "label propagation",
                  "own outcomes", "online choices:", "prior strength", "states (K = 4"):
        assert words in text, (words, text)
    assert all(len(line) < 200 for line in text.splitlines())


def test_the_python_api_gives_the_same_summary(state):
    """State.status(estimator=True) is what `status --estimator --json` prints (the same function)."""
    state = state[0]
    res = State.open(state, durable=False).status(estimator=True)
    out = json.loads(subprocess.run([str(GRAPHDIFF), "status", "--state", str(state), "--estimator", "--json"],
                                    capture_output=True, text=True, check=True, timeout=300).stdout)
    assert res["estimator"].keys() == out["estimator"].keys()
    assert res["estimator"]["p"] == pytest.approx(out["estimator"]["p"], rel=1e-12)
    assert "estimator" not in State.open(state, durable=False).status()
