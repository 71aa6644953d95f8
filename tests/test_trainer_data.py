"""Prompt sets from trainer data: a verl or TRL training file, as the trainer reads it,
through ``graphdiff embed`` (the real console script, the bundled encoder) and ``graphdiff ids``.

The files are written with pyarrow in the exact shapes of verl's preprocessing scripts
(``examples/data_preprocess/gsm8k.py``: ``prompt`` a chat list of one user turn, ``extra_info`` a struct with
an integer ``index``) and of TRL's datasets (a ``prompt`` column of text, or of conversational messages).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _handoff_fixtures import GRAPHDIFF, REPO
from graphdiff_cli.errors import DataError
from graphdiff_cli.integrations.ids import trainer_ids
from graphdiff_cli.io.artifacts import read_artifact
from graphdiff_cli.io.tables import read_prompts

QUESTIONS = ["Natalia sold clips to 48 of her friends in April. How many clips did she sell?",
             "Weng earns $12 an hour for babysitting. How much did she earn for 50 minutes?",
             "Betty is saving money for a new wallet which costs $100. How much more does she need?",
             "James writes a 3-page letter to 2 different friends twice a week. How many pages a year?"]
SUFFIX = ' Let\'s think step by step and output the final answer after "####".'


def verl_rows(indexes=None):
    """Rows as verl's gsm8k.py writes them (its ``process_fn``), the index as verl's ``with_indices`` gives it."""
    indexes = range(len(QUESTIONS)) if indexes is None else indexes
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": q + SUFFIX}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "72"},
             "extra_info": {"split": "train", "index": i, "answer": "...", "question": q}}
            for q, i in zip(QUESTIONS, indexes)]


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _cli(*argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run([str(GRAPHDIFF), *map(str, argv)], capture_output=True, text=True, timeout=600, env=env)


def test_the_verl_parquet_has_verls_types(tmp_path):
    """The fixture is what verl writes: a list<struct<role, content>> prompt, an int64 index in a struct."""
    schema = pq.read_schema(write_parquet(tmp_path / "train.parquet", verl_rows()))
    assert str(schema.field("prompt").type) == "list<element: struct<role: string, content: string>>"
    assert schema.field("extra_info").type.field("index").type == pa.int64()


def test_embed_reads_a_verl_parquet_as_it_is(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", verl_rows())
    res = _cli("embed", path, "--out", tmp_path / "emb.zarr", "--id-field", "extra_info.index", "--device", "cpu",
               "--json")
    assert res.returncode == 0, res.stderr
    art = read_artifact(tmp_path / "emb.zarr", "embeddings")
    assert [str(x) for x in art.array("ids")] == ["0", "1", "2", "3"]  # verl's int index, as its decimal text
    assert art.params["id_field"] == "extra_info.index" and art.params["messages"] == "user"
    # the chat list was flattened to the user turn's text: the same vectors as a plain-text file of it
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"id": str(i), "prompt": q + SUFFIX}) + "\n" for i, q in enumerate(QUESTIONS)))
    assert _cli("embed", plain, "--out", tmp_path / "plain.zarr", "--device", "cpu").returncode == 0
    np.testing.assert_array_equal(art.array("text_hash"), read_artifact(tmp_path / "plain.zarr", "embeddings")
                                  .array("text_hash"))
    np.testing.assert_allclose(art.array("embeddings"), read_artifact(tmp_path / "plain.zarr", "embeddings")
                               .array("embeddings"), atol=1e-6)
    # the ids are those verl's adapter reports for the same file, byte for byte
    from graphdiff_cli.integrations.verl import _plain_id, data_source_ids

    frame = pq.read_table(path).to_pandas()
    assert data_source_ids(frame) == ["0", "1", "2", "3"]
    from graphdiff_cli.integrations.ids import verl_id

    for value in (7, np.int64(7), np.array(7), "p7", 3.0, np.float64(3.0), " a"):  # the two rules agree
        assert verl_id(value) == _plain_id(value) == data_source_ids({"extra_info": [{"index": value}]})[0]


def test_embed_reads_trl_prompts_text_and_conversational(tmp_path):
    text = write_parquet(tmp_path / "text.parquet", [{"id": f"p{i}", "prompt": q} for i, q in enumerate(QUESTIONS)])
    chat = tmp_path / "chat.jsonl"
    chat.write_text("".join(json.dumps({"id": i, "prompt": [{"role": "system", "content": "Answer briefly."},
                                                            {"role": "user", "content": q}]}) + "\n"
                            for i, q in enumerate(QUESTIONS)))
    for f, extra in ((text, []), (chat, []), (chat, ["--messages", "all"])):
        res = _cli("embed", f, "--out", tmp_path / f"{f.stem}{len(extra)}.zarr", "--device", "cpu", *extra)
        assert res.returncode == 0, res.stderr
    ids, texts = read_prompts(chat)
    assert ids == ["0", "1", "2", "3"] and texts == QUESTIONS  # the user turn; the system prompt is the same everywhere
    _, texts = read_prompts(chat, messages="all")
    assert texts[0] == f"system: Answer briefly.\n\nuser: {QUESTIONS[0]}"
    h = {k: read_artifact(tmp_path / f"{k}.zarr", "embeddings").array("text_hash") for k in ("text0", "chat0", "chat2")}
    np.testing.assert_array_equal(h["text0"], h["chat0"])
    assert not set(h["chat2"]) & set(h["chat0"])


@pytest.mark.parametrize("rows, words", [
    ([{"id": 1, "prompt": [{"role": "system", "content": "x"}]}], "prompt has no user message (roles: system); use "
                                                                  "--messages all"),
    ([{"id": 1, "prompt": [{"content": "x"}]}], "prompt[0] is not a {role, content} message"),
    ([{"id": 1, "prompt": 5}], "prompt is neither text nor a chat list"),
    ([{"id": 1, "prompt": [{"role": "user", "content": "  "}]}], "prompt is empty"),
    ([{"extra_info": {"index": 1}, "prompt": "a"}, {"extra_info": {"split": "x"}, "prompt": "b"}],
     "no 'extra_info.index' field"),
    ([{"extra_info": {"index": 1}, "prompt": "a"}, {"extra_info": {"index": 1}, "prompt": "b"}],
     "duplicate id '1' (first on line 1)"),
])
def test_bad_trainer_rows_are_refused_with_the_row(tmp_path, rows, words):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    field = "extra_info.index" if "extra_info" in rows[0] else "id"
    with pytest.raises(DataError, match=rf"^{path}:{len(rows)}: "):
        try:
            read_prompts(path, id_field=field)
        except DataError as exc:
            assert words in str(exc), exc
            raise


def test_ids_prints_what_verl_reports_and_passes_a_clean_file(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", verl_rows())
    res = _cli("ids", path, "--trainer", "verl", "--head", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"{path}: 4 rows, 4 distinct ids as verl reports them (from extra_info.index); ok"
    assert lines[1].startswith(f"  row 1: id '0'  {QUESTIONS[0][:20]}") and len(lines) == 3


def test_ids_catches_duplicates_missing_ids_and_a_state_without_them(tmp_path):
    rows = verl_rows([0, 1, 1, None])  # train and test merged (indexes restart), one row without an index
    path = write_parquet(tmp_path / "train.parquet", rows)
    res = _cli("ids", path, "--trainer", "verl", "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["ok"] is False and out["rows"] == 4 and out["unique_ids"] == 2
    assert out["duplicates"] == {"count": 1, "ids": [{"id": "1", "rows": [2, 3]}]}
    assert out["missing"]["count"] == 1 and out["missing"]["rows"][0]["row"] == 4
    assert "verl would use 0" in out["missing"]["rows"][0]["reason"]
    # the same refusals, one line each, where a prompts file is read for embedding
    res = _cli("embed", path, "--out", tmp_path / "e.zarr", "--id-field", "extra_info.index")
    assert res.returncode == 1 and res.stderr == f"graphdiff: error: {path}:3: duplicate id '1' (first on line 2)\n"
    assert not (tmp_path / "e.zarr").exists()


def test_ids_shows_a_trainer_id_that_graphdiff_would_store_differently(tmp_path):
    """verl reports str() of its index, graphdiff writes 3.0 as "3": caught before training. Spaces are kept by both
    (ids are exact strings), so " a" is the same id on both sides."""
    path = write_parquet(tmp_path / "t.parquet", [{"id": " a", "prompt": "x"}, {"id": "b", "prompt": "y"}])
    out = trainer_ids(path, trainer="trl")
    assert out["ok"] is True and out["mismatches"]["count"] == 0 and out["first_rows"][0]["id"] == " a"
    floats = write_parquet(tmp_path / "f.parquet", [{"extra_info": {"index": 3.0}, "prompt": "x"}])
    assert trainer_ids(floats, trainer="verl")["mismatches"]["rows"] == [
        {"row": 1, "trainer_id": "3.0", "graphdiff_id": "3"}]


def test_ids_checks_the_state_and_the_openrlhf_label(tmp_path):
    from _handoff_fixtures import make_inputs
    from graphdiff_cli import State

    graph, clusters, ids = make_inputs(tmp_path, n=24, k_states=2, k_nn=4)
    State.init(graph, clusters, tmp_path / "S", device="cpu", durable=False)
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": "q", "label": json.dumps({"id": pid, "answer": "1"})}) + "\n"
                            for pid in (ids[0], ids[1], "nope")))
    out = trainer_ids(path, trainer="openrlhf", state=tmp_path / "S")
    assert out["not_in_state"] == {"count": 1, "rows": [{"row": 3, "id": "nope"}]} and not out["ok"]
    res = _cli("ids", path, "--trainer", "openrlhf", "--state", tmp_path / "S")
    assert res.returncode == 1 and "problem: 1 id(s) not in the STATE: row 3: 'nope'" in res.stdout


def test_ids_refuses_fields_the_trainer_cannot_report(tmp_path):
    path = write_parquet(tmp_path / "train.parquet", verl_rows())
    res = _cli("ids", path, "--trainer", "verl", "--id-field", "id")
    assert res.returncode == 2 and "verl reports extra_info.index as the prompt id" in res.stderr
    res = _cli("ids", path, "--trainer", "trl", "--id-field", "extra_info.index")
    assert res.returncode == 2 and "TRL passes reward functions top-level columns only" in res.stderr


@pytest.mark.parametrize("rows, args", [
    ([{"id": "a", "question": "q1"}, {"id": "b", "question": "q2"}], []),            # no text field at all
    ([{"id": "a", "prompt": "q1"}, {"id": "b", "prompt": "  "}], []),               # an empty text
    ([{"id": "a", "prompt": [{"role": "system", "content": "s"}]}], []),          # a chat without a user turn
    ([{"id": "a", "question": "q1"}], ["--text-field", "prompt.text"]),            # a dotted path that is not there
])
def test_ids_checks_the_text_field_as_embed_does(tmp_path, rows, args):
    """ids printed None as each text and said ok where embed, given the same file, refused it: now both say the same
    one line with the same exit code, and --json gives the same error object."""
    from typer.testing import CliRunner

    from graphdiff_cli.cli.app import app

    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    embed = runner.invoke(app, ["embed", str(path), "--out", str(tmp_path / "e.zarr"), *args])
    ids = runner.invoke(app, ["ids", str(path), *args])
    assert embed.exit_code == 1 and embed.stderr.startswith("graphdiff: error: ")
    assert (ids.exit_code, ids.stderr, ids.stdout) == (embed.exit_code, embed.stderr, "")
    as_json = runner.invoke(app, ["--json", "ids", str(path), *args])
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["error"] == embed.stderr.removeprefix(
        "graphdiff: error: ").rstrip("\n")
    assert not (tmp_path / "e.zarr").exists()
