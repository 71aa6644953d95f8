"""``graphdiff evaluate``, ``simulate`` and ``diagnose-clusters`` end to end on tiny hand-built artifacts."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from graphdiff_cli.cli.app import app
from graphdiff_cli.evaluation import baselines as B
from graphdiff_cli.core.diagnostics import cluster_association, within_category_kruskal
from graphdiff_cli.evaluation.metrics import evaluate_replay
from graphdiff_cli.evaluation.replay import replay
from graphdiff_cli.io.artifacts import write_artifact
from _worlds import topic_world

runner = CliRunner()
K = 6


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A simulated log over 90 prompts with topic/level-shaped embeddings, and its artifacts."""
    d = tmp_path_factory.mktemp("world")
    made = topic_world(d, n_prompts=90, steps=9, batch_size=30, seed=5, k=K)
    sim = made["sim"]
    rows = sim.log_rows()
    for r, p in zip(rows, sim.p_true):
        r["p_true"] = float(p)
    (d / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"dir": d, "sim": sim, "w": made["w"], "labels": made["labels"], "x": made["x"], "rows": rows,
            "graph_hash": made["graph_hash"]}


def _eval(world, out, *extra):
    d = world["dir"]
    return invoke("evaluate", "--log", d / "log.jsonl", "--graph", d / "graph.zarr", "--clusters",
                  d / "clusters.zarr", "--out", out, "--device", "cpu", *extra)


@pytest.mark.slow  # every method, the discounted grid and three plots: ~10 s on 2 cores
def test_evaluate_writes_the_report_and_matches_a_direct_replay(world, tmp_path):
    out = tmp_path / "report"
    res = _eval(world, out, "--embeddings", world["dir"] / "emb.zarr", "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.md", "report.html", "metrics.json", "answer.png", "batch_mean.png", "mae_over_steps.png", "reliability.png"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging leftovers
    assert summary["methods"][:2] == ["graphdiff", "history"]
    assert {"vip", "dots", "ridge"} <= set(summary["methods"])
    assert summary["oracles"] == ["oracle-sbr", "oracle-sbs"]
    doc = json.loads((out / "metrics.json").read_text())  # strict JSON (NaN written as null)
    sim = world["sim"]
    ref = replay(sim.step, sim.id, sim.n, sim.s, [B.HistoryMean(90), B.MoPPS(90, 0.5), B.LabelPropagation(world["w"])])
    ev = evaluate_replay(ref)
    for name in ("history", "mopps(lam=0.5)", "labelprop"):
        for phase in ("early", "full"):
            for key in ("mae", "within_r", "brier", "auroc"):
                got = doc["metrics"]["methods"][name]["phases"][phase]["all"][key]
                assert got == pytest.approx(ev["methods"][name]["phases"][phase]["all"][key], nan_ok=True)
    assert summary["summary"]["history"]["mae"] == pytest.approx(ev["methods"]["history"]["phases"]["full"]["all"]["mae"])
    # graphdiff's figures are those of the estimator itself, replayed the same way
    from graphdiff_cli import Estimator
    from graphdiff_cli.evaluation.methods import GraphdiffMethod

    # evaluate was given the embeddings: graphdiff's read-out of them is on (readout auto), here too
    from graphdiff_cli import load_embeddings

    x = load_embeddings(world["dir"] / "emb.zarr", graph=world["dir"] / "graph.zarr")
    gd = GraphdiffMethod(Estimator(world["w"], world["labels"], K, embeddings=x, device="cpu"))
    ref_gd = replay(sim.step, sim.id, sim.n, sim.s, [gd])
    assert doc["metrics"]["methods"]["graphdiff"]["phases"]["full"]["all"]["mae"] == pytest.approx(
        float(np.mean(np.abs(ref_gd.predictions["graphdiff"] - ref_gd.rate))), rel=1e-5)
    # discounted: the grid's best, re-run under the name "discounted"
    best = doc["discounted_best"]
    assert best["mae"] == pytest.approx(min(g["mae"] for g in doc["discounted_grid"]))
    assert doc["metrics"]["methods"]["discounted"]["phases"]["full"]["all"]["mae"] == pytest.approx(best["mae"])
    assert doc["ground_truth"]["observed_vs_true_mae"] == pytest.approx(
        float(np.mean(np.abs(sim.p_true - sim.s / sim.n))), abs=1e-6)
    md = (out / "report.md").read_text()
    assert "Table 2" in md and "**" in md and "oracle-sbs †" in md and "![Reliability diagram](reliability.png)" in md
    assert "Is graphdiff better" in md
    # the headline: graphdiff against the strongest real baseline per question, the point estimates
    # equal to the tables' figures, the decision replay on by default
    h = doc["headline"]
    full = {n: m["phases"]["full"]["all"] for n, m in doc["metrics"]["methods"].items() if not m["oracle"]}
    rivals = {n: v for n, v in full.items() if n != "graphdiff"}
    assert h["estimate"]["baseline"] == min(rivals, key=lambda n: rivals[n]["mae"])
    assert h["estimate"]["difference"]["estimate"] == pytest.approx(
        full["graphdiff"]["mae"] - rivals[h["estimate"]["baseline"]]["mae"], abs=1e-9)
    assert h["ranking"]["baseline"] == max(rivals, key=lambda n: rivals[n]["within_r"])
    assert h["ranking"]["difference"]["estimate"] == pytest.approx(
        full["graphdiff"]["within_r"] - rivals[h["ranking"]["baseline"]]["within_r"], abs=1e-9)
    for q in ("estimate", "ranking", "selection"):
        d = h[q]["difference"]
        assert d["lo"] <= d["estimate"] <= d["hi"]
    target = {r["estimator"]: r for r in doc["counterfactual"]["selection"]["results"] if r["strategy"] == "target"}
    assert h["selection"]["difference"]["estimate"] == pytest.approx(
        target["graphdiff"]["effective_rate"] - target[h["selection"]["baseline"]]["effective_rate"], abs=1e-9)
    assert md.index("## The answer first") < md.index("## Is graphdiff better") < md.index("Table 2")
    # the first screen: the cost next to the answers, and its one plot before any table
    first = md[md.index("## The answer first"):md.index("## Is graphdiff better")]
    assert "- **Is it worth its cost?**" in first and "ms per step" in first
    assert "](answer.png)" in first and "A verdict needs at least 20 units" in first
    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4 and "<table>" in page and "The answer first" in page


def test_methods_subset_and_embedding_peers_need_embeddings(world, tmp_path):
    res = _eval(world, tmp_path / "r", "--methods", "history,mopps", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["methods"] == ["history", "mopps(lam=1)", "mopps(lam=0.5)"]
    for key in ("vip", "dots", "ridge"):  # named without embeddings: refused in one line, nothing written
        res = _eval(world, tmp_path / f"r2{key}", "--methods", f"history,{key}")
        assert res.exit_code == 2 and f"method {key} needs prompt embeddings" in res.output
        assert not (tmp_path / f"r2{key}").exists()
    res = _eval(world, tmp_path / "r3", "--methods", "oracle")
    assert res.exit_code == 2 and "unknown method" in res.output


def test_without_matplotlib_the_report_has_no_plots_and_says_why(world, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plots extra were not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    out = tmp_path / "r"
    res = _eval(world, out, "--methods", "history,graphdiff", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["files"] == ["report.md", "report.html", "metrics.json"]
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "report.html", "report.md"]
    md = (out / "report.md").read_text()
    why = "matplotlib is not installed (pip install 'graphdiff-rl[plots]' installs it)"
    assert f"## Plots\n\nNot drawn: {why}." in md and ".png" not in md
    assert f"The plot of this answer is not drawn: {why}." in md  # where the headline's plot would be
    assert ".png" not in (out / "report.html").read_text()


def test_embedding_peers_in_the_report_and_the_decisions_replay(world, tmp_path):
    """vip, dots and ridge: the report's figures are a direct replay's, and each drives the Decisions replay."""
    from graphdiff_cli.io.readers import embedding_matrix, read_graph

    d = world["dir"]
    out = tmp_path / "r"
    res = _eval(world, out, "--embeddings", d / "emb.zarr", "--methods", "history,vip,dots,ridge", "--counterfactual",
                "--pool-factor", "1.5", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["methods"] == ["history", "vip", "dots", "ridge"]
    doc = json.loads((out / "metrics.json").read_text())
    e = embedding_matrix(d / "emb.zarr", read_graph(d / "graph.zarr"))
    sim = world["sim"]
    ref = replay(sim.step, sim.id, sim.n, sim.s, [B.VIP(e), B.DOTS(e), B.RidgeReadout(e)])
    for name in ("vip", "dots", "ridge"):
        assert doc["metrics"]["methods"][name]["phases"]["full"]["all"]["mae"] == pytest.approx(
            float(np.mean(np.abs(ref.predictions[name] - ref.rate))), rel=1e-9)
    assert doc["settings"]["dots"]["ref_size"] == 256 and doc["settings"]["vip"]["recursive"] is True
    cf = doc["counterfactual"]
    assert cf["methods"] == ["history", "vip", "dots", "ridge"]
    for part in ("selection", "allocation"):
        assert {"vip", "dots", "ridge"} <= {r["estimator"] for r in cf[part]["results"]}
    md = (out / "report.md").read_text()
    assert "| dots |" in md and "| ridge |" in md and "| target | ridge |" in md
    # a setting of theirs comes from the config's evaluate.settings, checked like the others
    cfg = tmp_path / "c.yaml"
    cfg.write_text("evaluate:\n  settings:\n    dots: {ref_size: 16, top_k: 4}\n    vip: {recursive: false}\n")
    res = _eval(world, tmp_path / "r2", "--embeddings", d / "emb.zarr", "--methods", "dots,vip", "--config", cfg,
                "--no-counterfactual")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "r2" / "metrics.json").read_text())
    ref = replay(sim.step, sim.id, sim.n, sim.s, [B.DOTS(e, ref_size=16, top_k=4), B.VIP(e, recursive=False)])
    for name in ("dots", "vip"):
        assert doc["metrics"]["methods"][name]["phases"]["full"]["all"]["mae"] == pytest.approx(
            float(np.mean(np.abs(ref.predictions[name] - ref.rate))), rel=1e-9)
    cfg.write_text("evaluate:\n  settings:\n    vip: {recursive: 'no'}\n")
    res = _eval(world, tmp_path / "r3", "--embeddings", d / "emb.zarr", "--methods", "vip", "--config", cfg)
    assert res.exit_code == 2 and "evaluate.vip.recursive must be true or false" in res.output


def test_counterfactual_section_matches_the_stage_run_directly(world, tmp_path):
    from graphdiff_cli.stages.counterfactual import counterfactual

    d = world["dir"]
    out = tmp_path / "r"
    res = _eval(world, out, "--methods", "graphdiff,history,mopps,sbs", "--counterfactual", "--pool-factor", "1.5",
                "--seed", "3", "--explore", "2")
    assert res.exit_code == 0, res.output
    got = json.loads((out / "metrics.json").read_text())["counterfactual"]
    # the oracle sbs is an estimation reference only: it cannot drive decisions
    assert got["methods"] == ["graphdiff", "history", "mopps(lam=1)", "mopps(lam=0.5)"]
    want = counterfactual(d / "log.jsonl", d / "graph.zarr", d / "clusters.zarr",
                          methods=["graphdiff", "history", "mopps"], batch_size=30, pool_factor=1.5, seed=3,
                          explore=2.0, device="cpu")
    for part, key in (("selection", "effective_rate"), ("allocation", "expected_nondegenerate_per_step")):
        g = {(r["strategy"], r["estimator"]): r[key] for r in got[part]["results"]}
        w = {(r["strategy"], r["estimator"]): r[key] for r in want[part]["results"]}
        assert g.keys() == w.keys() and all(g[k] == pytest.approx(w[k]) for k in w)
    assert got["selection"]["batch_size"] == 30 and got["selection"]["pool_size"] == 45
    md = (out / "report.md").read_text()
    assert "## Decisions driven by each estimator (offline counterfactual)" in md
    assert "| skip-zero-variance | graphdiff |" in md and "out of reach" in md.lower()
    # the target rule at --explore 2 and, for the estimators with a belief spread, at 0
    assert got["selection"]["target_explore"] == [2.0, 0.0] and "after 2 pseudo-rollouts" in md
    assert "| target (explore 0) | graphdiff |" in md and "| target (explore 0) | history |" not in md
    # a bad --explore is refused before any replay, and nothing is written
    bad = _eval(world, tmp_path / "r3", "--methods", "history", "--counterfactual", "--explore", "-1")
    assert bad.exit_code == 2 and "explore must be a number of pseudo-rollouts >= 0" in bad.output
    assert not (tmp_path / "r3").exists()
    # --no-counterfactual: no section, and the headline says the selection question was not measured
    assert _eval(world, tmp_path / "r2", "--methods", "graphdiff,history", "--no-counterfactual").exit_code == 0
    md = (tmp_path / "r2" / "report.md").read_text()
    assert "Decisions driven" not in md and "Does it choose batches with more signal?** Not measured" in md
    # by default the replay runs where the log allows it; a pool larger than any round: the report says
    # so (no failure), while --counterfactual asked for by name refuses that log in one line
    assert _eval(world, tmp_path / "r4", "--methods", "history", "--pool-factor", "4").exit_code == 0
    md = (tmp_path / "r4" / "report.md").read_text()
    assert "Not replayed on this log: no round has 120 prompts" in md
    bad = _eval(world, tmp_path / "r5", "--methods", "history", "--counterfactual", "--pool-factor", "4")
    assert bad.exit_code != 0 and "no round has 120 prompts" in bad.output and not (tmp_path / "r5").exists()


def test_log_rows_are_sorted_by_step_and_unknown_ids_refused(world, tmp_path):
    rows = world["rows"]
    shuffled = rows[len(rows) // 2:] + rows[:len(rows) // 2]  # later steps first, within-step order kept
    log = tmp_path / "log.csv"
    log.write_text("step,id,n,s\n" + "".join(f"{r['step']},{r['id']},{r['n']},{r['s']}\n" for r in shuffled))
    d = world["dir"]
    a = invoke("evaluate", "--log", log, "--graph", d / "graph.zarr", "--clusters", d / "clusters.zarr",
               "--out", tmp_path / "a", "--methods", "history", "--json")
    b = _eval(world, tmp_path / "b", "--methods", "history", "--json")
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    sa, sb = json.loads(a.stdout)["summary"]["history"], json.loads(b.stdout)["summary"]["history"]
    sa.pop("seconds_per_step"), sb.pop("seconds_per_step")
    assert sa == sb
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n"
                   + json.dumps({"step": 1, "id": "nope", "n": 8, "s": 1}) + "\n")
    res = invoke("evaluate", "--log", bad, "--graph", d / "graph.zarr", "--clusters", d / "clusters.zarr",
                 "--out", tmp_path / "c")
    assert res.exit_code == 1 and "bad.jsonl:3" in res.output and "'nope'" in res.output
    assert not (tmp_path / "c").exists()


def test_report_folder_is_replaced_and_config_is_checked(world, tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("estimator:\n  beta: 1.0\nevaluate:\n  mopps:\n    lambdas: [0.8]\nother_tool:\n  x: 1\n")
    res = _eval(world, out, "--methods", "mopps,graphdiff", "--config", cfg, "--json")
    assert res.exit_code == 0, res.output
    assert not (out / "stale.txt").exists()
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["run"]["methods"] == ["graphdiff", "mopps(lam=0.8)"]
    assert doc["settings"]["graphdiff"]["beta"] == 1.0
    cfg.write_text("evaluate:\n  mopps:\n    lambda: [0.8]\n")
    res = _eval(world, tmp_path / "x", "--config", cfg)
    assert res.exit_code == 2 and "evaluate.mopps.lambda" in res.output


def test_clusters_from_other_prompts_or_another_graph_are_refused(world, tmp_path):
    d = world["dir"]
    ids = np.array([f"other-{i}" for i in range(90)], dtype=object)
    write_artifact(tmp_path / "cl.zarr", "clusters", {"ids": ids, "labels": world["labels"].astype(np.int64)},
                   params={"states": K}, inputs={"graph": world["graph_hash"]})
    res = invoke("evaluate", "--log", d / "log.jsonl", "--graph", d / "graph.zarr", "--clusters",
                 tmp_path / "cl.zarr", "--out", tmp_path / "r")
    assert res.exit_code == 1 and "prompt ids differ from" in res.output and not (tmp_path / "r").exists()
    ids = np.array([p["id"] for p in world["sim"].prompts], dtype=object)
    write_artifact(tmp_path / "cl2.zarr", "clusters", {"ids": ids, "labels": world["labels"].astype(np.int64)},
                   params={"states": K}, inputs={"graph": "0123456789abcdef"})
    res = invoke("evaluate", "--log", d / "log.jsonl", "--graph", d / "graph.zarr", "--clusters",
                 tmp_path / "cl2.zarr", "--out", tmp_path / "r")
    assert res.exit_code == 1 and "made from graph 0123456789abcdef, not from" in res.output


# -- simulate ----------------------------------------------------------------------------------------


def test_simulate_cli_is_deterministic(tmp_path):
    args = ["--prompts", 60, "--steps", 5, "--batch-size", 20, "--seed", 2, "--json"]
    r1 = invoke("simulate", "--out-prompts", tmp_path / "p1.jsonl", "--out-log", tmp_path / "l1.jsonl", *args)
    r2 = invoke("simulate", "--out-prompts", tmp_path / "p2.jsonl", "--out-log", tmp_path / "l2.jsonl", *args)
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output
    assert (tmp_path / "l1.jsonl").read_bytes() == (tmp_path / "l2.jsonl").read_bytes()
    assert (tmp_path / "p1.jsonl").read_bytes() == (tmp_path / "p2.jsonl").read_bytes()
    res = json.loads(r1.stdout)
    assert res["rows"] == 100 and res["prompts"] == 60
    first = json.loads((tmp_path / "l1.jsonl").read_text().splitlines()[0])
    assert set(first) == {"step", "id", "n", "s", "p_true"} and first["step"] == 1
    prompt = json.loads((tmp_path / "p1.jsonl").read_text().splitlines()[0])
    assert set(prompt) == {"id", "prompt", "topic", "level"}
    bad = invoke("simulate", "--out-prompts", tmp_path / "p.jsonl", "--out-log", tmp_path / "l.jsonl",
                 "--prompts", 10, "--batch-size", 20)
    assert bad.exit_code == 2 and "batch size" in bad.output


def test_simulate_cli_with_math_rows(tmp_path):
    subjects = ["Algebra", "Geometry", "Prealgebra"]
    math = tmp_path / "math.jsonl"
    math.write_text("".join(json.dumps({"unique_id": f"train/x/{i}.json", "problem": f"Problem {i}",
                                        "subject": subjects[i % 3], "level": 1 + i % 5}) + "\n" for i in range(50)))
    res = invoke("simulate", "--out-prompts", tmp_path / "p.jsonl", "--out-log", tmp_path / "l.jsonl",
                 "--math", math, "--prompts", 40, "--batch-size", 10, "--epochs", 2, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["prompts"] == 40 and out["steps"] == 8
    ids = [json.loads(line)["id"] for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(ids) == 40 and all(i.startswith("train/x/") for i in ids)


# -- diagnose-clusters -----------------------------------------------------------------------------------


def test_diagnose_clusters_matches_the_core(tmp_path):
    rng = np.random.default_rng(1)
    n = 60
    ids = np.array([f"train/{i}.json" for i in range(n)], dtype=object)
    labels = rng.integers(0, 4, size=n)
    subj = np.array(["alg", "geo", "num"])[(labels + rng.integers(0, 2, size=n)) % 3]
    level = 1 + (labels + rng.integers(0, 3, size=n)) % 5
    write_artifact(tmp_path / "cl.zarr", "clusters", {"ids": ids, "labels": labels.astype(np.int64)},
                   params={"states": 5})
    rows = [{"unique_id": ids[i], "subject": subj[i], "level": int(level[i])} for i in range(n)]
    rows[3]["level"] = None  # left out of the Kruskal-Wallis tests only
    rows.append({"unique_id": "train/extra.json", "subject": "alg", "level": 2})  # not clustered
    lab = tmp_path / "labels.jsonl"
    lab.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = invoke("diagnose-clusters", "--clusters", tmp_path / "cl.zarr", "--labels", lab, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    want = cluster_association(labels, subj)
    assert out["matched"] == n and out["unmatched_label_rows"] == 1
    assert out["association"]["chi2"] == pytest.approx(want["chi2"])
    assert out["association"]["cramers_v"] == pytest.approx(want["cramers_v"])
    lv = level.astype(float)
    lv[3] = np.nan
    kw = within_category_kruskal(labels, subj, lv)
    assert [r["category"] for r in out["within_category"]] == ["alg", "geo", "num"]
    for got, exp in zip(out["within_category"], kw):
        assert got["H"] == pytest.approx(exp["H"]) and got["p_bh"] == pytest.approx(exp["p_bh"])
    res = invoke("diagnose-clusters", "--clusters", tmp_path / "cl.zarr", "--labels", lab, "--id-field", "id")
    assert res.exit_code == 1 and "--id-field" in res.output


def test_a_verdict_needs_enough_units_and_the_cost_names_the_cheaper_buy():
    from graphdiff_cli.stages.report import _call, _cost_line

    assert _call({"lo": 0.01, "hi": 0.02, "units": 4}, False, "vip") == "no verdict from 4 units (a verdict needs 20)"
    assert _call({"lo": 0.01, "hi": 0.02, "units": 40}, False, "vip") == "**graphdiff better**"
    assert _call({"lo": -0.02, "hi": -0.01, "units": 40}, False, "vip") == "**vip better**"

    def method(mae, sec, oracle=False):
        return {"oracle": oracle, "phases": {"full": {"all": {"mae": mae, "seconds_per_step": sec}}}}

    h = {"estimate": {"baseline": "history", "difference": {"lo": -0.004, "hi": 0.002}}}  # half-width 0.003
    metrics = {"methods": {"graphdiff": method(0.100, 1.0), "history": method(0.101, 0.0006),
                           "labelprop": method(0.102, 0.035), "sbs": method(0.01, 0.0, oracle=True)}}
    line = _cost_line(h, metrics)
    assert line.startswith("- **Is it worth its cost?** history gives an estimate within noise of graphdiff's "
                           "(MAE 0.1010 vs 0.1000) for 0.6 ms per step against graphdiff's 1000.0 ms (1667x)")
    metrics["methods"]["history"] = method(0.2, 0.0006)  # every cheaper baseline clearly worse
    metrics["methods"]["labelprop"] = method(0.2, 0.035)
    assert "the cost buys accuracy" in _cost_line(h, metrics)


def test_progress_is_one_labelled_count_per_phase_with_an_eta(world, tmp_path, monkeypatch):
    """evaluate's progress in a log: each phase (the replay, the counterfactual's selection and allocation) under
    its own label with its own count and an ETA, not one unlabelled count that restarts (3/34 ... 34/34 ... 1/8)."""
    from graphdiff_cli.cli import common

    monkeypatch.setattr(common, "PROGRESS_LOG_SECONDS", 0.0)
    res = _eval(world, tmp_path / "r", "--methods", "history,mopps", "--counterfactual", "--pool-factor", "1.5")
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if "/" in ln.split(":")[-1].split(",")[0]]
    labels = list(dict.fromkeys(ln.split(":")[0] for ln in lines))
    assert labels == ["replaying the log (3 methods, steps)", "counterfactual selection (estimator x rule runs)",
                      "counterfactual allocation (estimators)"], lines
    for label in labels:
        mine = [ln for ln in lines if ln.startswith(label + ":")]
        counts = [ln.split(": ")[1].split()[0].rstrip(",") for ln in mine]
        total = counts[-1].split("/")[1]
        assert counts[-1] == f"{total}/{total}" and all(c.endswith((f"/{total}", "/?")) for c in counts), mine
        assert "ETA" not in mine[-1]  # done
    assert any(", ETA " in ln for ln in lines if ln.startswith("replaying the log"))
