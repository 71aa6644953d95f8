"""Covariates through the command line: embed reads them from a prompts file into the embeddings artifact, init
gives them to the STATE's estimator, extend encodes the new prompts' by the spec made at embed.

Real parts throughout: the bundled all-MiniLM-L6-v2, real Zarr artifacts, the real typer app in process
(CliRunner). Expected covariates come from ``core.covariates`` applied by hand to the prompt rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from _tolerances import FLOAT64
from conftest import PROMPT_ROWS, write_jsonl
from graphdiff_cli import State
from graphdiff_cli.core.covariates import ANSWER_STATISTICS, TEXT_STATISTICS, Raw, encode, make_spec, text_statistics
from graphdiff_cli.io.artifacts import hash_arrays, read_artifact
from graphdiff_cli.io.readers import covariate_inputs, read_graph
from graphdiff_cli.stages.prepare import ids_for_hash
from test_prepare_cli import gd  # the CLI in-process, its exit code checked

N_BASE = 34


def gd_json(*args) -> dict:
    res = gd(*args, "--json")
    return json.loads(res.stdout.splitlines()[-1])


def _rows() -> list[dict]:
    """The fixture prompts as a verl-like file: a pass rate and its attempts under extra_info, the answer under
    reward_model; the new prompts (the last six) bring a topic never seen, a missing level and a missing rate."""
    rows = [dict(r, extra_info={"index": k, "pass_rate": round(1 - r["level"] / 6, 3), "attempts": 16},
                 reward_model={"ground_truth": ["7", "\\frac{1}{2}", "x^2", "-3"][k % 4]})
            for k, r in enumerate(PROMPT_ROWS)]
    new = rows[N_BASE:]
    new[0]["topic"] = "a topic never seen"
    del new[1]["level"]
    del new[2]["extra_info"]["pass_rate"]
    return rows


OPTIONS = ("--covariate", "level", "--category", "topic", "--reference-rate", "extra_info.pass_rate:extra_info.attempts",
           "--answer-field", "reward_model.ground_truth")


def _raw(rows: list[dict]) -> dict:
    """The raw columns by hand, in the order embed gives them."""
    stats = text_statistics([r["prompt"] for r in rows], [r["reward_model"]["ground_truth"] for r in rows])
    raw = {k: Raw("text", v) for k, v in stats.items()}
    raw["level"] = Raw("numeric", [r.get("level") for r in rows])
    raw["topic"] = Raw("categorical", [r["topic"] for r in rows])
    raw["extra_info.pass_rate"] = Raw("reference", [r["extra_info"].get("pass_rate") for r in rows],
                                      attempts=[r["extra_info"]["attempts"] for r in rows],
                                      attempts_field="extra_info.attempts")
    return raw


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """embed (with covariates) -> build-graph -> cluster on the first 34 prompts: (folder, embed's result)."""
    d = tmp_path_factory.mktemp("covariates")
    rows = _rows()
    write_jsonl(d / "base.jsonl", rows[:N_BASE])
    write_jsonl(d / "new.jsonl", rows[N_BASE:])
    res = gd_json("embed", d / "base.jsonl", "--out", d / "emb.zarr", "--device", "cpu", *OPTIONS)
    gd("build-graph", d / "emb.zarr", "--out", d / "graph.zarr", "--k-nn", 8, "--device", "cpu")
    gd("cluster", d / "graph.zarr", "--out", d / "clusters.zarr", "--states", 4)
    return d, res


def test_embed_writes_the_encoded_covariates_beside_the_embeddings(pipeline):
    d, res = pipeline
    rows = _rows()[:N_BASE]
    spec = make_spec(_raw(rows))
    want = encode(spec, _raw(rows), N_BASE)
    art = read_artifact(d / "emb.zarr", "embeddings")
    assert np.allclose(art.array("covariates"), want.features, **FLOAT64)
    assert np.allclose(art.array("reference_rate"), (np.array([r["extra_info"]["pass_rate"] for r in rows]) * 16 + 1)
                       / 18, **FLOAT64)
    assert art.attr("covariate_spec") == json.loads(json.dumps(spec.as_dict()))
    assert art.params["covariates"] == {"numeric": ["level"], "categorical": ["topic"],
                                        "reference": "extra_info.pass_rate", "attempts": "extra_info.attempts",
                                        "answer": "reward_model.ground_truth", "text_statistics": True}
    # the content hash is still that of the ids and embeddings: graphs made before stay valid
    assert art.content_hash == hash_arrays(ids_for_hash(art.array("ids")), art.array("embeddings"))
    assert res["covariates"]["features"] == spec.names and res["covariates"]["reference"] == "extra_info.pass_rate"
    assert [c["name"] for c in res["covariates"]["columns"]][:len(TEXT_STATISTICS)] == list(TEXT_STATISTICS)
    # the reader aligns them to the graph built from the artifact
    cov = covariate_inputs(d / "emb.zarr", read_graph(d / "graph.zarr"))
    assert np.array_equal(cov.features, art.array("covariates")) and cov.spec == spec


def test_text_statistics_by_default_and_the_cache_still_reused(pipeline, tmp_path):
    d, _ = pipeline
    out = tmp_path / "emb.zarr"
    import shutil

    shutil.copytree(d / "emb.zarr", out)
    res = gd_json("embed", d / "base.jsonl", "--out", out, "--device", "cpu")
    assert res["cached"] == N_BASE and res["embedded"] == 0  # the covariates do not spoil the embedding cache
    assert res["covariates"]["features"] == list(TEXT_STATISTICS) and res["covariates"]["reference"] is None
    art = read_artifact(out, "embeddings")
    assert art.array("covariates").shape == (N_BASE, len(TEXT_STATISTICS)) and "reference_rate" not in art.names
    assert art.content_hash == read_artifact(d / "emb.zarr", "embeddings").content_hash
    res = gd_json("embed", d / "base.jsonl", "--out", out, "--device", "cpu", "--no-text-statistics")
    assert res["covariates"] is None and "covariates" not in read_artifact(out, "embeddings").names
    # the answer's statistics alone
    res = gd_json("embed", d / "base.jsonl", "--out", out, "--device", "cpu", "--no-text-statistics",
                  "--answer-field", "reward_model.ground_truth")
    assert res["covariates"]["features"] == list(ANSWER_STATISTICS) + ["answer_missing"]


def _refused(res, out: Path, *needles: str):
    assert res.exit_code != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("graphdiff: error:"), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not out.exists()


def test_bad_values_are_refused_in_one_line_and_nothing_is_written(tmp_path):
    rows = [dict(r, rate=0.5) for r in PROMPT_ROWS[:6]]
    rows[2]["level"] = "hard"
    rows[4]["rate"] = 57
    prompts = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "emb.zarr"
    _refused(gd("embed", prompts, "--out", out, "--covariate", "level", ok=False), out, "p.jsonl:3:", "'level'",
             "'hard'", "not a number")
    _refused(gd("embed", prompts, "--out", out, "--reference-rate", "rate", ok=False), out, "p.jsonl:5:", "'rate'",
             "57", "not a pass rate in [0, 1]")
    _refused(gd("embed", prompts, "--out", out, "--covariate", "level", "--category", "level", ok=False), out,
             "'level' is named twice")
    _refused(gd("embed", prompts, "--out", out, "--reference-rate", "rate:", ok=False), out, "--reference-rate")
    _refused(gd("embed", prompts, "--out", out, "--shard", "0/2", "--category", "topic", ok=False), out,
             "not one shard", "merge-embeddings")


def test_a_csv_empty_cell_is_a_missing_value(tmp_path):
    import csv

    prompts = tmp_path / "p.csv"
    with open(prompts, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["id", "prompt", "level", "topic"])
        w.writeheader()
        for k, r in enumerate(PROMPT_ROWS[:6]):
            w.writerow({"id": r["id"], "prompt": r["prompt"], "level": "" if k == 1 else r["level"],
                        "topic": "" if k == 2 else r["topic"]})
    res = gd_json("embed", prompts, "--out", tmp_path / "e.zarr", "--device", "cpu", "--covariate", "level",
                  "--category", "topic", "--no-text-statistics")
    assert res["covariates"]["notes"] == ["level: 1 prompt(s) without a value (the mean)",
                                          "topic: 1 prompt(s) without a value (no indicator: the baseline)"]
    assert res["covariates"]["features"][:2] == ["level", "level missing"]


def test_a_shard_has_no_covariates_and_the_merged_artifact_gets_them_from_the_whole_file(tmp_path):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS[:10])
    for i in range(2):
        res = gd_json("embed", prompts, "--out", tmp_path / f"s{i}.zarr", "--shard", f"{i}/2", "--device", "cpu")
        assert res["covariates"] is None
    merged = tmp_path / "merged.zarr"
    gd("merge-embeddings", tmp_path / "s0.zarr", tmp_path / "s1.zarr", "--out", merged)
    before = read_artifact(merged, "embeddings").content_hash
    res = gd_json("embed", prompts, "--out", merged, "--device", "cpu", "--category", "topic")
    assert res["embedded"] == 0 and res["cached"] == 10
    art = read_artifact(merged, "embeddings")
    assert art.content_hash == before and art.array("covariates").shape[0] == 10


def test_init_update_predict_extend_keep_every_prompts_covariates(pipeline, tmp_path):
    d, _ = pipeline
    rows = _rows()
    state = tmp_path / "STATE"
    res = gd_json("init", "--graph", d / "graph.zarr", "--clusters", d / "clusters.zarr", "--out", state)
    assert res["covariates"]["on"] and res["covariates"]["reference"] == "extra_info.pass_rate"
    est = State.open(state).estimator()
    spec = make_spec(_raw(rows[:N_BASE]))
    assert np.allclose(est.covariates, encode(spec, _raw(rows[:N_BASE]), N_BASE).features, **FLOAT64)
    # a prompt never rolled out starts from its reference rate (the covariates' read-out before any outcome)
    assert est.covariate_readout_ is not None
    outcomes = write_jsonl(tmp_path / "o.jsonl", [{"id": r["id"], "n": 8, "s": k % 9}
                                                  for k, r in enumerate(rows[:20])])
    gd("update", "--state", state, "--step", 1, "--outcomes", outcomes)
    gd("predict", "--state", state, "--out", tmp_path / "p.csv")
    res = gd_json("extend", "--state", state, "--prompts", d / "new.jsonl", "--device", "cpu")
    notes = " ".join(res["covariate_notes"])
    assert "topic: 1 prompt(s) with a category not among" in notes
    assert "level: 1 prompt(s) without a value" in notes and "extra_info.pass_rate: 1 prompt(s) without" in notes
    # the STATE read back has every prompt's covariates: the first 34 as embed encoded them, the 6 new ones by
    # the same spec (the unseen topic: no indicator; a missing value: the mean and its indicator)
    est = State.open(state).estimator()
    new = encode(spec, _raw(rows[N_BASE:]), len(rows) - N_BASE)
    assert est.covariates.shape == (len(rows), spec.width)
    assert np.allclose(est.covariates[N_BASE:], new.features, **FLOAT64)
    assert np.isnan(est.reference_rate[N_BASE + 2])
    assert np.allclose(est.reference_rate[N_BASE:], new.reference, **FLOAT64, equal_nan=True)
    topic = [j for j, name in enumerate(spec.names) if name.startswith("topic=")]
    assert not est.covariates[N_BASE, topic].any()
    gd("update", "--state", state, "--step", 2, "--outcomes",
       write_jsonl(tmp_path / "o2.jsonl", [{"id": r["id"], "n": 4, "s": 2} for r in rows[N_BASE:]]))
    assert State.open(state).estimator().covariates.shape == (len(rows), spec.width)
    # the new prompts as their embeddings artifact, embedded with the same covariate options: their covariates,
    # encoded by the artifact's own spec, are decoded and encoded again by the STATE's, as from the prompts file
    other = tmp_path / "OTHER"
    gd("init", "--graph", d / "graph.zarr", "--clusters", d / "clusters.zarr", "--out", other)
    gd("embed", d / "new.jsonl", "--out", tmp_path / "new_emb.zarr", "--device", "cpu", *OPTIONS)
    res = gd_json("extend", "--state", other, "--embedded", tmp_path / "new_emb.zarr")
    assert " ".join(res["covariate_notes"]) == notes
    got = State.open(other).estimator()
    assert np.allclose(got.covariates, est.covariates, **FLOAT64)
    assert np.allclose(got.reference_rate, est.reference_rate, **FLOAT64, equal_nan=True)
    # one embedded with other covariate options cannot be encoded by the STATE's spec
    gd("embed", d / "new.jsonl", "--out", tmp_path / "plain.zarr", "--device", "cpu")
    res = gd("extend", "--state", other, "--embedded", tmp_path / "plain.zarr", ok=False)
    _refused(res, tmp_path / "nothing", "not the ones the STATE's prompts were embedded with")


def test_no_covariates_and_the_paper_preset_leave_them_out(pipeline, tmp_path):
    d, _ = pipeline
    res = gd_json("init", "--graph", d / "graph.zarr", "--clusters", d / "clusters.zarr", "--out", tmp_path / "a",
                  "--no-covariates")
    assert res["covariates"] == {"on": False, "why": "--no-covariates was given"}
    assert State.open(tmp_path / "a").estimator().covariates is None
    res = gd_json("init", "--graph", d / "graph.zarr", "--clusters", d / "clusters.zarr", "--out", tmp_path / "p",
                  "--preset", "paper")
    assert not res["covariates"]["on"] and "covariate_readout is null" in res["covariates"]["why"]
    est = State.open(tmp_path / "p").estimator()
    assert est.covariates is None and est.reference_rate is None
    # and extending a STATE without covariates reads none
    res = gd_json("extend", "--state", tmp_path / "p", "--prompts", d / "new.jsonl", "--device", "cpu")
    assert "covariate_notes" not in res
    assert State.open(tmp_path / "p").estimator().covariates is None
