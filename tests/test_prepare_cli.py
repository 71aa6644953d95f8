"""The preparation commands end to end: embed, merge-embeddings, build-graph, cluster.

Real parts throughout: the bundled all-MiniLM-L6-v2, real Zarr artifacts, the real typer app (in process
through CliRunner for speed, and as a real subprocess where the process boundary is the point).
Expected values come from the core functions applied by hand to the artifacts' own arrays.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from _tolerances import assert_same_neighbours, float32_dot_error
from conftest import PROMPT_ROWS, write_jsonl
from graphdiff_cli.backends.device import cuda_works
from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION, text_hash
from graphdiff_cli.cli.app import app
from graphdiff_cli.core.graph import exact_knn, mutual_knn_graph, normalize_rows
from graphdiff_cli.core.spectral import spectral_clustering
from graphdiff_cli.io.artifacts import hash_arrays, hash_file, read_artifact
from graphdiff_cli.stages.prepare import auto_k_nn, auto_states, shard_rows

GRAPHDIFF = Path(sys.executable).parent / "graphdiff"
runner = CliRunner()


def gd(*args, ok: bool = True):
    res = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert res.exit_code == 0, f"exit {res.exit_code}: {res.stderr}"
    return res


def gd_json(*args) -> dict:
    res = gd(*args, "--json")
    lines = res.stdout.splitlines()
    assert len(lines) == 1, res.stdout  # exactly one JSON object on stdout
    return json.loads(lines[0])


def assert_refused(res, out: Path, code: int, *needles: str):
    """Non-zero exit with the given code, one error line naming the problem, nothing written."""
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("graphdiff: error:"), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    # nothing on stdout, or with --json the same error as one object
    if res.stdout:
        obj = json.loads(res.stdout)
        assert {k: obj[k] for k in ("error", "exit_code")} == {"error": lines[0][len("graphdiff: error: "):],
                                                               "exit_code": code}, res.stdout
        assert obj["kind"] in ("bad-input", "usage", "damaged", "conflict", "backend"), res.stdout
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if ".staging-" in p.name or ".old-" in p.name]


def ids_str(ids) -> np.ndarray:
    return np.asarray([str(x) for x in ids], dtype=str)


# ------------------------------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """The 40 fixture prompts embedded once with the defaults: (prompts path, artifact path, --json result).
    Its own embedding cache: the session's may already hold these texts from another module's fixture."""
    d = tmp_path_factory.mktemp("embedded")
    prompts = write_jsonl(d / "prompts.jsonl", PROMPT_ROWS)
    out = d / "emb.zarr"
    return prompts, out, gd_json("embed", prompts, "--out", out, "--batch-size", 16, "--cache-dir", d / "cache")


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Nine prompts (three per level, mixed topics) embedded without sharding."""
    d = tmp_path_factory.mktemp("small")
    prompts = write_jsonl(d / "prompts.jsonl", PROMPT_ROWS[::4][:9])
    out = d / "emb.zarr"
    gd("embed", prompts, "--out", out)
    return prompts, out


@pytest.fixture(scope="module")
def graph40(embedded, tmp_path_factory):
    _, emb, _ = embedded
    out = tmp_path_factory.mktemp("graph") / "graph.zarr"
    return out, gd_json("build-graph", emb, "--out", out, "--k-nn", 8)


# ---------------------------------------------------------------------------------------- pipeline

def test_embed_artifact_schema(embedded):
    prompts, path, res = embedded
    art = read_artifact(path, "embeddings")
    ids, emb, th = art.array("ids"), art.array("embeddings"), art.array("text_hash")
    assert list(ids) == [r["id"] for r in PROMPT_ROWS]  # file order
    assert emb.dtype == np.float32 and emb.shape == (40, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)
    assert list(th) == [text_hash(r["prompt"]) for r in PROMPT_ROWS]
    from graphdiff_cli.backends.embed import encoder_identity

    assert art.params == {"model": "bundled", "encoder_files": encoder_identity("bundled", "cpu")["files"],
                          "instruction": DEFAULT_INSTRUCTION, "dim": 384, "batch_size": 16,
                          "shard": None, "id_field": "id", "text_field": "prompt",
                          "messages": "user",
                          "covariates": {"numeric": [], "categorical": [], "reference": None, "attempts": None,
                                         "answer": None, "text_statistics": True}}
    assert art.inputs == {"prompts": hash_file(prompts)}
    assert art.content_hash == hash_arrays(ids_str(ids), emb) == res["content_hash"]
    assert art.attr("shard") is None
    assert res["shape"] == [40, 384] and res["embedded"] == 40 and res["cached"] == 0
    assert res["device"] == "cpu" and set(res["timings"]) >= {"encode_s", "total_s"}


def test_embeddings_carry_topic_structure(embedded):
    """Sanity of the real model: each prompt's nearest neighbour is mostly of its own topic."""
    emb = read_artifact(embedded[1], "embeddings").array("embeddings")
    nbr, _ = exact_knn(emb, 1)
    topics = np.array([r["topic"] for r in PROMPT_ROWS])
    assert np.mean(topics[nbr[:, 0]] == topics) >= 0.75


def test_build_graph_equals_brute_force(embedded, graph40):
    _, emb_path, _ = embedded
    path, res = graph40
    emb_art = read_artifact(emb_path, "embeddings")
    g = read_artifact(path, "graph")
    emb = emb_art.array("embeddings")
    nbr, sim = exact_knn(emb, 8)
    w = mutual_knn_graph(nbr, sim)
    # the same edges: each prompt's 8th and 9th neighbours differ by >= 5e-4 in similarity, beyond float32 rounding
    # of 384 products (float32_dot_error(384) = 4.6e-5) in faiss or BLAS; the lists' order is that of the
    # similarities, some of which lie 3.4e-6 apart, within it
    np.testing.assert_array_equal(g.array("indptr"), w.indptr)
    np.testing.assert_array_equal(g.array("indices"), w.indices)
    np.testing.assert_allclose(g.array("data"), w.data, atol=1e-5)
    assert_same_neighbours(g.array("knn_indices"), nbr, sim, float32_dot_error(emb.shape[1]))
    assert g.array("indptr").dtype == np.int64 and g.array("data").dtype == np.float32
    assert list(g.array("ids")) == list(emb_art.array("ids"))
    assert g.params == {"k_nn": 8, "device": "cpu", "index": "flat-ip"}
    assert g.inputs == {"embeddings": emb_art.content_hash}
    summary = g.attr("summary")
    assert summary["n_nodes"] == 40 and summary["n_edges"] == w.nnz // 2 == res["summary"]["n_edges"]
    assert res["k"] == 8 and res["search_backend"] == "faiss-cpu"
    # prompts left without a mutual neighbour are named with the fix (a larger --k-nn)
    small = gd("build-graph", emb_path, "--out", path.parent / "k1.zarr", "--k-nn", 1)
    isolated = read_artifact(path.parent / "k1.zarr", "graph").attr("summary")["isolated"]
    assert isolated > 0 and (f"graphdiff: warning: {isolated} of 40 prompts have no mutual neighbour at k = 1 "
                             "(they learn only from their own outcomes and their cluster's state); a larger "
                             "--k-nn joins more of them") in small.stderr


def test_build_graph_with_an_approximate_index_stamps_its_recall(embedded, tmp_path):
    out = tmp_path / "g.zarr"
    res = gd_json("build-graph", embedded[1], "--out", out, "--k-nn", 8, "--index", "hnsw", "--recall-sample", 40)
    g = read_artifact(out, "graph")
    assert g.params["index"] == "hnsw" and g.params["index_params"]["ef_search"] >= 18
    assert g.attr("recall") == res["recall"] and res["recall"]["sample"] == 40 and res["recall"]["k"] == 9
    assert res["recall"]["recall"] >= 0.95  # 40 prompts: HNSW finds (nearly) everything
    bad = gd("build-graph", embedded[1], "--out", tmp_path / "h.zarr", "--index", "annoy", ok=False)
    assert_refused(bad, tmp_path / "h.zarr", 2, "--index must be one of exact, hnsw, ivf")


def test_k_nn_capped_at_n_minus_1(small, tmp_path):
    out = tmp_path / "g.zarr"
    res = gd_json("build-graph", small[1], "--out", out, "--k-nn", 80)
    g = read_artifact(out, "graph")
    assert res["k"] == 8 and g.array("knn_indices").shape == (9, 8) and g.params["k_nn"] == 80
    # with k = N - 1 every pair is mutual: W is the positive part of the full cosine matrix
    emb = read_artifact(small[1], "embeddings").array("embeddings")
    c = emb @ emb.T
    np.fill_diagonal(c, 0)
    assert g.attr("summary")["n_edges"] == int(np.sum(c > 0) // 2)


def test_cluster_auto_and_explicit(graph40, tmp_path):
    gpath, _ = graph40
    g = read_artifact(gpath, "graph")
    import scipy.sparse as sp

    w = sp.csr_matrix((g.array("data"), g.array("indices"), g.array("indptr")), shape=(40, 40))
    out = tmp_path / "c.zarr"
    res = gd_json("cluster", gpath, "--out", out)
    c = read_artifact(out, "clusters")
    assert auto_states(40) == 2 and res["states"] == 2 and res["requested"] == "auto"
    assert c.params == {"states": 2, "seed": 0, "requested": "auto", "eigen_solver": "arpack", "kmeans": "lloyd"}
    assert c.inputs == {"graph": g.content_hash}
    labels = c.array("labels")
    assert labels.dtype == np.int64 and list(c.array("ids")) == list(g.array("ids"))
    np.testing.assert_array_equal(labels, spectral_clustering(w, 2, seed=0, fallback_neighbors=g.array("knn_indices")))
    assert c.attr("sizes") == np.bincount(labels, minlength=2).tolist()

    out4 = tmp_path / "c4.zarr"
    res4 = gd_json("cluster", gpath, "--out", out4, "--states", 4, "--seed", 3)
    c4 = read_artifact(out4, "clusters")
    assert c4.params == {"states": 4, "seed": 3, "requested": 4, "eigen_solver": "arpack", "kmeans": "lloyd"}
    assert res4["states"] == 4
    lab4 = c4.array("labels")
    assert lab4.min() >= 0 and lab4.max() < 4
    np.testing.assert_array_equal(lab4, spectral_clustering(w, 4, seed=3, fallback_neighbors=g.array("knn_indices")))
    # the history prompts share no vocabulary with the maths ones: one state holds all of them
    hist = [i for i, r in enumerate(PROMPT_ROWS) if r["topic"] == "history"]
    assert len(set(lab4[hist])) == 1 and np.sum(lab4 == lab4[hist[0]]) == len(hist)


def test_progress_in_a_log_file_is_plain_lines(embedded, graph40, tmp_path):
    """With stderr a file (Snakemake, SLURM), embed and cluster log plain progress lines: the start, the
    end, and (GRAPHDIFF_PROGRESS_SECONDS=0 here) every batch in between; no terminal escapes."""
    prompts = embedded[0]
    env = {**os.environ, "GRAPHDIFF_PROGRESS_SECONDS": "0"}
    log = tmp_path / "embed.log"
    with open(log, "w") as err:
        subprocess.run([str(GRAPHDIFF), "embed", str(prompts), "--out", str(tmp_path / "e.zarr"), "--batch-size",
                        "4"], stderr=err, env=env, check=True)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("embedding 40 prompts:")]
    # 40 prompts in encoder calls of 4 batches x 4: 0, 16, 32, 40, each line with the rate since the first call
    assert [ln.split()[3] for ln in lines] == ["0/40", "16/40", "32/40", "40/40"], log.read_text()
    assert lines[-1].startswith("embedding 40 prompts: 40/40 (100%), ") and lines[-1].endswith(" prompts/s")
    assert "\x1b" not in log.read_text()
    log = tmp_path / "cluster.log"
    with open(log, "w") as err:
        subprocess.run([str(GRAPHDIFF), "cluster", str(graph40[0]), "--out", str(tmp_path / "c.zarr"), "--states",
                        "4"], stderr=err, env=env, check=True)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("spectral clustering:")]
    assert lines[0].startswith("spectral clustering: 0/40 (0%)") and lines[-1].startswith(
        "spectral clustering: 40/40 (100%)"), log.read_text()
    # with the default 30 s, a command that takes less prints no progress at all: only its summary line
    with open(log, "w") as err:
        subprocess.run([str(GRAPHDIFF), "cluster", str(graph40[0]), "--out", str(tmp_path / "c2.zarr"), "--states",
                        "4"], stderr=err, env={k: v for k, v in os.environ.items()
                                               if k != "GRAPHDIFF_PROGRESS_SECONDS"}, check=True)
    assert len(log.read_text().splitlines()) == 1 and "40 prompts in K = 4 states" in log.read_text()


def test_log_progress_reports_every_phase_of_one_callback(capsys):
    """evaluate reuses one callback for its replay and then its counterfactual: both reach the log."""
    from graphdiff_cli.cli.common import _LogLines

    update = _LogLines("evaluating", 0)
    for phase_total in (3, 2):
        for done in range(phase_total + 1):
            update(done, phase_total)
    update(2, 2)  # a repeated last call prints nothing more
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split()[1] for ln in lines] == ["0/3", "1/3", "2/3", "3/3", "0/2", "1/2", "2/2"]


def test_auto_states_rule():
    assert [auto_states(n) for n in (2, 49, 50, 75, 1000, 8000, 8025, 10**6)] == [2, 2, 2, 3, 40, 320, 320, 320]


def test_build_graph_chooses_k_nn_from_n(tmp_path):
    """Without --k-nn, build-graph takes k_nn = min(80, max(10, N // 10)) (the paper's 80 from 800 prompts on, a
    tenth of a smaller set) and says so; --k-nn still wins. (It was 80 for any N: 60 prompts got a nearly complete
    graph.)"""
    from graphdiff_cli.io.artifacts import write_artifact

    assert [auto_k_nn(n) for n in (2, 50, 150, 250, 799, 800, 3000, 29095, 10**6)] == \
        [10, 10, 15, 25, 79, 80, 80, 80, 80]
    rng = np.random.default_rng(0)
    x = normalize_rows(rng.standard_normal((250, 12))).astype(np.float32)
    emb = write_artifact(tmp_path / "emb.zarr", "embeddings",
                         {"ids": np.asarray([f"p{i}" for i in range(250)], dtype=object), "embeddings": x})
    res = gd_json("build-graph", emb, "--out", tmp_path / "g.zarr")
    g = read_artifact(tmp_path / "g.zarr", "graph")
    assert res["k_nn"] == res["k"] == 25 == g.params["k_nn"] == g.attr("k")
    assert res["k_nn_rule"] == g.attr("k_nn_rule") == "k_nn = min(80, max(10, N // 10)) = 25 for N = 250"
    assert g.array("knn_indices").shape == (250, 25)
    text = gd("build-graph", emb, "--out", tmp_path / "g2.zarr").stderr
    assert "k_nn = min(80, max(10, N // 10)) = 25 for N = 250 (--k-nn sets it)" in text
    assert "graph of 250 prompts at k = 25," in text
    res = gd_json("build-graph", emb, "--out", tmp_path / "g3.zarr", "--k-nn", 12)
    assert res["k_nn"] == res["k"] == 12 and res["k_nn_rule"] is None
    assert read_artifact(tmp_path / "g3.zarr", "graph").attr("k_nn_rule") is None
    # tiny sets: k = min(k_nn, N - 1) as before
    small = write_artifact(tmp_path / "e5.zarr", "embeddings",
                           {"ids": np.asarray([f"p{i}" for i in range(5)], dtype=object), "embeddings": x[:5]})
    res = gd_json("build-graph", small, "--out", tmp_path / "g5.zarr")
    assert res["k_nn"] == 10 and res["k"] == 4


def test_cluster_help_documents_auto():
    res = runner.invoke(app, ["cluster", "--help"], env={"COLUMNS": "250"})
    text = " ".join(res.stdout.replace("│", " ").split())
    assert "min(320, max(2, N // 25))" in text


# ------------------------------------------------------------------------------------------- cache

def test_cache_second_run_embeds_nothing(embedded, tmp_path):
    prompts, path, first = embedded
    out = tmp_path / "emb.zarr"
    shutil.copytree(path, out)
    res = gd_json("embed", prompts, "--out", out, "--batch-size", 16)
    assert res["embedded"] == 0 and res["cached"] == 40 and res["device"] is None  # model not even loaded
    a, b = read_artifact(path, "embeddings"), read_artifact(out, "embeddings")
    np.testing.assert_array_equal(a.array("embeddings"), b.array("embeddings"))
    assert a.content_hash == b.content_hash == res["content_hash"]


def test_cache_grown_file_embeds_only_new_and_changed(embedded, tmp_path):
    prompts, path, _ = embedded
    out = tmp_path / "emb.zarr"
    shutil.copytree(path, out)
    rows = [dict(r) for r in PROMPT_ROWS if r["id"] != "a10"]  # one removed
    rows[4]["prompt"] = "What is 1001 divided by 7?"  # a05 changed
    new = [{"id": "n1", "prompt": "Find the area of a triangle with base 10 and height 7."},
           {"id": "n2", "prompt": "Who wrote the Magna Carta and in which year was it sealed?"},
           {"id": "n3", "prompt": "What is 15 percent of 80?"}]
    rows = rows[:10] + [new[0]] + rows[10:] + new[1:]
    grown = write_jsonl(tmp_path / "grown.jsonl", rows)
    res = gd_json("embed", grown, "--out", out, "--batch-size", 16)
    assert res["embedded"] == 4 and res["cached"] == 38 and res["n_prompts"] == 42
    art = read_artifact(out, "embeddings")
    assert list(art.array("ids")) == [r["id"] for r in rows]
    assert art.inputs == {"prompts": hash_file(grown)}
    old = read_artifact(path, "embeddings")
    old_by_id = dict(zip(old.array("ids"), old.array("embeddings")))
    emb = art.array("embeddings")
    fresh_ids = {"a05", "n1", "n2", "n3"}
    for i, r in enumerate(rows):
        if r["id"] not in fresh_ids:
            np.testing.assert_array_equal(emb[i], old_by_id[r["id"]])  # reused bit for bit
    assert not np.allclose(emb[[r["id"] for r in rows].index("a05")], old_by_id["a05"], atol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-6)


def test_dim_truncates_and_changed_settings_miss_the_cache(small, tmp_path):
    prompts, full_path = small
    out = tmp_path / "emb.zarr"
    shutil.copytree(full_path, out)
    res = gd_json("embed", prompts, "--out", out, "--dim", 32)
    assert res["embedded"] == 9 and res["cached"] == 0 and "dim changed" in res["cache"]
    art = read_artifact(out, "embeddings")
    full = read_artifact(full_path, "embeddings").array("embeddings")
    assert art.array("embeddings").shape == (9, 32) and art.params["dim"] == 32
    np.testing.assert_allclose(art.array("embeddings"), normalize_rows(full[:, :32]), atol=1e-5)
    # same dim again: full reuse
    assert gd_json("embed", prompts, "--out", out, "--dim", 32)["embedded"] == 0


def test_no_instruction_embeds_raw_text(small, tmp_path):
    prompts, full_path = small
    out = tmp_path / "raw.zarr"
    res = gd_json("embed", prompts, "--out", out, "--no-instruction")
    assert res["instruction"] is None and read_artifact(out, "embeddings").params["instruction"] is None
    from graphdiff_cli.backends.embed import Encoder

    texts = [r["prompt"] for r in PROMPT_ROWS[::4][:9]]
    ref = normalize_rows(Encoder("bundled", "cpu").encode(texts))
    np.testing.assert_allclose(read_artifact(out, "embeddings").array("embeddings"), ref, atol=1e-5)
    with_instr = read_artifact(full_path, "embeddings").array("embeddings")
    assert not np.allclose(with_instr, ref, atol=1e-2)


# ------------------------------------------------------------------------------------------ shards

def test_shard_rows_rule():
    assert [shard_rows(9, i, 4) for i in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 9)]
    assert [shard_rows(40, i, 3) for i in range(3)] == [(0, 14), (14, 28), (28, 40)]
    assert shard_rows(5, 0, 1) == (0, 5)


def test_shards_merge_equal_unsharded(small, tmp_path):
    prompts, full_path = small
    shards = []
    for i in range(4):
        p = tmp_path / f"shard{i}.zarr"
        res = gd_json("embed", prompts, "--out", p, "--shard", f"{i}/4")
        a = read_artifact(p, "embeddings")
        start, stop = shard_rows(9, i, 4)
        assert a.params["shard"] == f"{i}/4" and res["shape"][0] == stop - start
        assert a.attr("shard") == {"index": i, "count": 4, "start": start, "stop": stop, "total": 9}
        shards.append(p)
    out = tmp_path / "merged.zarr"
    res = gd_json("merge-embeddings", shards[2], shards[0], shards[3], shards[1], "--out", out)
    assert res["n_shards"] == 4 and res["shape"] == [9, 384]
    m, full = read_artifact(out, "embeddings"), read_artifact(full_path, "embeddings")
    assert list(m.array("ids")) == list(full.array("ids"))
    assert list(m.array("text_hash")) == list(full.array("text_hash"))
    # other batch compositions round differently in the last float bits, nothing more
    np.testing.assert_allclose(m.array("embeddings"), full.array("embeddings"), atol=1e-6)
    # the covariates are made over every row: the shards and so the merged artifact have none
    assert m.params == {**full.params, "covariates": None} and m.inputs == full.inputs and m.attr("shard") is None
    assert m.content_hash == hash_arrays(ids_str(m.array("ids")), m.array("embeddings"))

    # refusals: missing, duplicated, not a shard, different prompts file; nothing written
    bad = tmp_path / "bad.zarr"
    assert_refused(gd("merge-embeddings", *shards[:3], "--out", bad, ok=False), bad, 6, "3/4 missing")
    assert_refused(gd("merge-embeddings", *shards, shards[1], "--out", bad, ok=False), bad, 6,
                   "shard 1/4 given twice")
    assert_refused(gd("merge-embeddings", *shards[1:], full_path, "--out", bad, ok=False), bad, 6,
                   "is not a shard")
    other_rows = [dict(r) for r in PROMPT_ROWS[::4][:9]]
    other_rows[-1]["prompt"] = "A different last prompt."
    other = write_jsonl(tmp_path / "other.jsonl", other_rows)
    o0 = tmp_path / "other0.zarr"
    gd("embed", other, "--out", o0, "--shard", "0/4")
    assert_refused(gd("merge-embeddings", o0, *shards[1:], "--out", bad, ok=False), bad, 6,
                   "different prompts file")

    # a shard is not a whole embedding set: build-graph refuses it
    g = tmp_path / "g.zarr"
    assert_refused(gd("build-graph", shards[0], "--out", g, ok=False), g, 6, "merge all shards first")


# --------------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("rows,needles", [
    ([{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}],
     ["prompts.jsonl:3", "duplicate id 'a'", "first on line 1"]),
    ([{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "  "}], ["prompts.jsonl:2", "prompt is empty"]),
    ([{"id": "a", "prompt": "x"}, {"id": "b", "text": "y"}], ["prompts.jsonl:2", "no 'prompt' field"]),
    ([{"id": "a", "prompt": "x"}, {"prompt": "y"}], ["prompts.jsonl:2", "no 'id' field"]),
])
def test_bad_prompts_refused_with_line(tmp_path, rows, needles):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", rows)
    out = tmp_path / "emb.zarr"
    assert_refused(gd("embed", prompts, "--out", out, "--json", ok=False), out, 1, *needles)


@pytest.mark.parametrize("args,needle", [
    (["--shard", "4/4"], "--shard 4/4"),
    (["--shard", "two"], "I/N"),
    (["--dim", "0"], "--dim must be >= 1"),
    (["--batch-size", "0"], "--batch-size"),
    (["--instruction", "x", "--no-instruction"], "cannot be used together"),
    (["--device", "tpu"], "unknown device"),
])
def test_bad_embed_options_are_usage_errors(tmp_path, args, needle):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", PROMPT_ROWS[:3])
    out = tmp_path / "emb.zarr"
    assert_refused(gd("embed", prompts, "--out", out, *args, ok=False), out, 2, needle)


def test_dim_larger_than_model_refused(small, tmp_path):
    out = tmp_path / "emb.zarr"
    assert_refused(gd("embed", small[0], "--out", out, "--dim", 1000, ok=False), out, 2,
                   "--dim 1000", "384")


def test_missing_model_refused_in_one_line(small, tmp_path):
    out = tmp_path / "emb.zarr"
    assert_refused(gd("embed", small[0], "--out", out, "--model", "graphdiff-tests/not-cached", ok=False),
                   out, 8, "not in the local Hugging Face cache", "--model /local/path")


def test_wrong_artifact_kinds_refused(embedded, graph40, tmp_path):
    _, emb, _ = embedded
    graph, _ = graph40
    out = tmp_path / "x.zarr"
    assert_refused(gd("build-graph", graph, "--out", out, ok=False), out, 6, "is a graph artifact",
                   "embeddings")
    assert_refused(gd("cluster", emb, "--out", out, ok=False), out, 6, "is an embeddings artifact", "graph")
    assert_refused(gd("build-graph", tmp_path / "missing.zarr", "--out", out, ok=False), out, 6, "no such")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert_refused(gd("cluster", plain, "--out", out, ok=False), out, 6, "not a graphdiff artifact")


def test_embed_will_not_overwrite_another_kind(embedded, graph40, tmp_path):
    prompts, _, _ = embedded
    graph, _ = graph40
    target = tmp_path / "graph.zarr"
    shutil.copytree(graph, target)
    res = gd("embed", prompts, "--out", target, ok=False)
    assert res.exit_code == 6 and "is a graph artifact" in res.stderr
    assert read_artifact(target, "graph").content_hash == read_artifact(graph, "graph").content_hash


@pytest.mark.parametrize("states,code,needle", [
    ("41", 2, "more than the 40 prompts"),
    ("0", 2, "--states must be >= 1"),
    ("many", 2, "'auto' or an integer"),
])
def test_bad_states_refused(graph40, tmp_path, states, code, needle):
    out = tmp_path / "c.zarr"
    assert_refused(gd("cluster", graph40[0], "--out", out, "--states", states, ok=False), out, code, needle)


def test_bad_graph_options(embedded, tmp_path):
    out = tmp_path / "g.zarr"
    assert_refused(gd("build-graph", embedded[1], "--out", out, "--k-nn", 0, ok=False), out, 2, "--k-nn")
    if not cuda_works():
        assert_refused(gd("build-graph", embedded[1], "--out", out, "--device", "cuda", ok=False), out, 8,
                       "no working CUDA GPU")


# ------------------------------------------------------------------------------- real subprocesses

def run_cli(*args, env=None):
    return subprocess.run([str(GRAPHDIFF), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_subprocess_json_is_one_object_and_errors_one_line(graph40, tmp_path):
    out = tmp_path / "c.zarr"
    proc = run_cli("cluster", graph40[0], "--out", out, "--json", "--states", 3)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 1
    obj = json.loads(proc.stdout)
    assert obj["states"] == 3 and obj["out"] == str(out) and obj["n_prompts"] == 40
    assert read_artifact(out, "clusters").params["states"] == 3

    bad = write_jsonl(tmp_path / "dup.jsonl", [{"id": 1, "prompt": "a"}, {"id": "1", "prompt": "b"}])
    out2 = tmp_path / "e.zarr"
    proc = run_cli("--json", "embed", bad, "--out", out2)
    message = f"{bad}:2: duplicate id '1' (first on line 1)"
    assert proc.returncode == 1 and json.loads(proc.stdout) == {"error": message, "exit_code": 1,
                                                                "kind": "bad-input"}  # one object
    assert proc.stderr.strip().splitlines() == [f"graphdiff: error: {message}"]
    assert not out2.exists()


@pytest.mark.slow
def test_subprocess_pipeline(prompts_file, tmp_path):
    """The four commands as a user runs them, each its own process, chained through the artifacts."""
    emb, graph, clusters = tmp_path / "e.zarr", tmp_path / "g.zarr", tmp_path / "c.zarr"
    steps = [("embed", prompts_file, "--out", emb, "--json", "--dim", 128),
             ("--json", "build-graph", emb, "--out", graph, "--k-nn", 10),
             ("cluster", graph, "--out", clusters, "--json", "-q")]
    results = []
    for step in steps:
        proc = run_cli(*step)
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.splitlines()) == 1
        results.append(json.loads(proc.stdout))
    assert results[0]["shape"] == [40, 128] and results[1]["k"] == 10 and results[2]["states"] == 2
    e, g, c = (read_artifact(emb, "embeddings"), read_artifact(graph, "graph"), read_artifact(clusters, "clusters"))
    assert g.inputs["embeddings"] == e.content_hash and c.inputs["graph"] == g.content_hash
    assert list(c.array("ids")) == [r["id"] for r in PROMPT_ROWS]


def test_real_math_prompts(shared_data, tmp_path):
    """A slice of the real MATH test set through embed/build-graph/cluster with its own field names."""
    rows = []
    with open(shared_data / "math" / "math_test.jsonl", encoding="utf-8") as f:
        for line in f:
            rows.append(json.loads(line))
            if len(rows) == 16:
                break
    prompts = write_jsonl(tmp_path / "math.jsonl", rows)
    emb, graph, cl = tmp_path / "e.zarr", tmp_path / "g.zarr", tmp_path / "c.zarr"
    res = gd_json("embed", prompts, "--out", emb, "--id-field", "unique_id", "--text-field", "problem",
                  "--no-instruction")
    assert res["shape"] == [16, 384]
    art = read_artifact(emb, "embeddings")
    assert list(art.array("ids")) == [r["unique_id"] for r in rows]
    assert art.params["id_field"] == "unique_id" and art.params["text_field"] == "problem"
    gd_json("build-graph", emb, "--out", graph, "--k-nn", 5)
    assert gd_json("cluster", graph, "--out", cl, "--states", 3)["states"] == 3


@pytest.mark.gpu
def test_gpu_pipeline_matches_cpu(embedded, graph40, tmp_path):
    if not cuda_works():
        pytest.skip("no working CUDA GPU")
    prompts, emb_cpu, _ = embedded
    emb_gpu = tmp_path / "e.zarr"
    res = gd_json("embed", prompts, "--out", emb_gpu, "--device", "cuda", "--batch-size", 16)
    assert res["device"].startswith("cuda")
    e_gpu = read_artifact(emb_gpu, "embeddings").array("embeddings")
    np.testing.assert_allclose(e_gpu, read_artifact(emb_cpu, "embeddings").array("embeddings"), atol=1e-4)
    g_gpu = tmp_path / "g.zarr"
    r = gd_json("build-graph", emb_cpu, "--out", g_gpu, "--k-nn", 8, "--device", "cuda")
    assert r["device"] == "cuda"
    a, b = read_artifact(g_gpu, "graph"), read_artifact(graph40[0], "graph")
    np.testing.assert_array_equal(a.array("indices"), b.array("indices"))
    np.testing.assert_allclose(a.array("data"), b.array("data"), atol=1e-5)
