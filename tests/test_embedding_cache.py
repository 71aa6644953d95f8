"""The embedding cache: embed and extend never encode a text twice, and a log says the rate and the time left.

Real parts: the bundled all-MiniLM-L6-v2, real prompt files, real cache folders and the real typer app (in
process through CliRunner, whose stderr is not a terminal: the log's progress lines). What the encoder
embeds is counted by a forward hook on the loaded model itself, so a count is of texts that went through it.
A cache hit is a copy of stored bytes, so vectors read back are compared exactly.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import PROMPT_ROWS, write_jsonl
from graphdiff_cli.backends.embed import Encoder, bundled_model_path
from graphdiff_cli.cli.app import app
from graphdiff_cli.io.artifacts import read_artifact
from graphdiff_cli.io.embedding_cache import FOLDER
from graphdiff_cli.stages.prepare import embed_prompts

runner = CliRunner()


def gd(*args, code: int = 0):
    res = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == code, f"exit {res.exit_code}: {res.stderr}"
    return res


def gd_json(*args) -> dict:
    return json.loads(gd(*args, "--json").stdout)


@pytest.fixture(scope="module")
def seen():
    """The texts the bundled model encodes, counted by a forward pre-hook on its transformer (the model is
    loaded once per process and kept: every Encoder of it runs this module)."""
    counts: list[int] = []
    model = Encoder("bundled", "cpu").model_
    handle = model[0].register_forward_pre_hook(
        lambda _m, args, kwargs: counts.append(len((args[0] if args else kwargs["features"])["input_ids"])),
        with_kwargs=True)
    yield counts
    handle.remove()


def embedded_now(seen: list[int], since: int) -> int:
    return sum(seen[since:])


def vectors(path: Path) -> np.ndarray:
    return read_artifact(path, "embeddings").array("embeddings")


def shards(cache: Path) -> list[Path]:
    return sorted((cache / FOLDER).glob("*/*.npz"))


def test_a_second_embed_embeds_nothing_and_writes_the_same_vectors(tmp_path, seen):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS)
    cache = tmp_path / "cache"
    before = len(seen)
    first = embed_prompts(prompts, tmp_path / "a.zarr", cache_dir=cache, device="cpu", batch_size=8)
    assert embedded_now(seen, before) == 40 and (first["embedded"], first["from_cache"]) == (40, 0)
    before = len(seen)
    again = embed_prompts(prompts, tmp_path / "b.zarr", cache_dir=cache, device="cpu", batch_size=32)
    assert embedded_now(seen, before) == 0 and (again["embedded"], again["from_cache"]) == (0, 40)
    assert again["device"] is None  # the model was not even needed
    np.testing.assert_array_equal(vectors(tmp_path / "b.zarr"), vectors(tmp_path / "a.zarr"))  # a copy
    assert again["content_hash"] == first["content_hash"]
    # the cache holds the raw vectors: another --dim is served too, and equals a fresh run's truncation
    trunc = embed_prompts(prompts, tmp_path / "c.zarr", cache_dir=cache, device="cpu", dim=32)
    fresh = embed_prompts(prompts, tmp_path / "d.zarr", use_cache=False, device="cpu", dim=32, batch_size=8)
    assert (trunc["embedded"], trunc["from_cache"], fresh["embedded"]) == (0, 40, 40)
    np.testing.assert_array_equal(vectors(tmp_path / "c.zarr"), vectors(tmp_path / "d.zarr"))


def test_a_half_new_file_embeds_only_its_new_half_and_a_duplicate_once(tmp_path, seen):
    cache = tmp_path / "cache"
    old = write_jsonl(tmp_path / "old.jsonl", PROMPT_ROWS[:20])
    embed_prompts(old, tmp_path / "old.zarr", cache_dir=cache, device="cpu")
    dup = {"id": "dup", "prompt": PROMPT_ROWS[30]["prompt"]}  # a new text, twice in the file
    rows = PROMPT_ROWS + [dup]
    grown = write_jsonl(tmp_path / "all.jsonl", rows)
    before = len(seen)
    res = embed_prompts(grown, tmp_path / "all.zarr", cache_dir=cache, device="cpu")
    assert embedded_now(seen, before) == 20
    assert (res["embedded"], res["from_cache"], res["duplicates"], res["cached"]) == (20, 20, 1, 0)
    x = vectors(tmp_path / "all.zarr")
    np.testing.assert_array_equal(x[:20], vectors(tmp_path / "old.zarr"))
    np.testing.assert_array_equal(x[40], x[30])  # the duplicate's one vector
    ids = [r["id"] for r in rows]
    assert list(read_artifact(tmp_path / "all.zarr", "embeddings").array("ids")) == ids


def test_no_cache_embeds_everything_and_stores_nothing(tmp_path, seen):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS[:12])
    cache = tmp_path / "cache"
    out = tmp_path / "e.zarr"
    gd("embed", prompts, "--out", out, "--cache-dir", cache, "--device", "cpu", "-q")
    n_shards = len(shards(cache))
    before = len(seen)
    res = gd_json("embed", prompts, "--out", out, "--cache-dir", cache, "--device", "cpu", "--no-cache")
    assert embedded_now(seen, before) == 12  # neither --out's rows nor the cache were read
    assert (res["embedded"], res["from_cache"], res["cached"], res["embedding_cache"]) == (12, 0, 0, None)
    assert len(shards(cache)) == n_shards
    # and the summary line says where the vectors came from
    line = gd("embed", prompts, "--out", tmp_path / "f.zarr", "--cache-dir", cache, "--device", "cpu").stderr
    assert "embedded 0 prompts, 12 from the embedding cache" in line


def test_the_cache_dir_comes_from_the_environment(tmp_path, seen, monkeypatch):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS[:5])
    monkeypatch.setenv("GRAPHDIFF_CACHE_DIR", str(tmp_path / "env-cache"))
    res = gd_json("embed", prompts, "--out", tmp_path / "e.zarr", "--device", "cpu")
    assert res["embedding_cache"] == str(tmp_path / "env-cache") and len(shards(tmp_path / "env-cache")) == 1


@pytest.mark.parametrize("damage", ["truncated", "flipped", "not a zip"])
def test_a_damaged_shard_is_never_trusted(tmp_path, seen, damage):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS[:10])
    cache = tmp_path / "cache"
    gd("embed", prompts, "--out", tmp_path / "a.zarr", "--cache-dir", cache, "--device", "cpu", "-q")
    [shard] = shards(cache)
    data = bytearray(shard.read_bytes())
    if damage == "truncated":  # a write cut short (what atomic renames rule out, but a disk can still do)
        data = data[:len(data) // 2]
    elif damage == "flipped":  # one bit of a stored vector changed on disk
        data[len(data) // 2] ^= 0x01
    else:
        data = b"garbage" * 10
    shard.write_bytes(bytes(data))
    before = len(seen)
    res = gd("embed", prompts, "--out", tmp_path / "b.zarr", "--cache-dir", cache, "--device", "cpu")
    assert embedded_now(seen, before) == 10  # re-embedded, not read from the damaged shard
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("graphdiff: warning:")]
    assert len(warnings) == 1 and str(shard.name) in warnings[0] and "damaged" in warnings[0], res.stderr
    assert len(shards(cache)) == 1  # removed; the new vectors stored anew (a shard is named by its content)
    np.testing.assert_allclose(vectors(tmp_path / "b.zarr"), vectors(tmp_path / "a.zarr"), atol=1e-6)
    # the next run trusts the new shard, silently
    res = gd("embed", prompts, "--out", tmp_path / "c.zarr", "--cache-dir", cache, "--device", "cpu")
    assert "warning" not in res.stderr and "embedded 0 prompts, 10 from the embedding cache" in res.stderr


def test_a_killed_writers_temporary_is_never_read(tmp_path, seen):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS[:6])
    cache = tmp_path / "cache"
    gd("embed", prompts, "--out", tmp_path / "a.zarr", "--cache-dir", cache, "--device", "cpu", "-q")
    [shard] = shards(cache)
    # what a kill -9 mid-write leaves: the shard's bytes (some of them) under a temporary name, the shard gone
    tmp = shard.parent / f".{shard.name}.tmp-otherhost@1@0123abcd"
    tmp.write_bytes(shard.read_bytes()[:100])
    shard.unlink()
    before = len(seen)
    res = gd_json("embed", prompts, "--out", tmp_path / "b.zarr", "--cache-dir", cache, "--device", "cpu")
    assert embedded_now(seen, before) == 6 and res["warnings"] == [] and res["from_cache"] == 0


def _model_copy(folder: Path, max_seq_length: int | None = None) -> Path:
    """The bundled model's folder as another folder (files linked, not copied), its max_seq_length changed."""
    src = bundled_model_path()
    for p in src.rglob("*"):
        if p.is_file():
            (folder / p.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(p, folder / p.relative_to(src))
    if max_seq_length is not None:
        cfg = folder / "sentence_bert_config.json"
        body = json.loads(cfg.read_text())
        cfg.unlink()
        cfg.write_text(json.dumps({**body, "max_seq_length": max_seq_length}))
    return folder


def test_another_model_or_max_seq_length_does_not_hit_and_the_same_files_do(tmp_path, seen):
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS[:8])
    cache = tmp_path / "cache"
    embed_prompts(prompts, tmp_path / "a.zarr", cache_dir=cache, device="cpu")
    same = embed_prompts(prompts, tmp_path / "b.zarr", cache_dir=cache, device="cpu",
                         model=str(_model_copy(tmp_path / "same")))
    assert (same["embedded"], same["from_cache"]) == (0, 8)  # the same files elsewhere: the same vectors
    short = embed_prompts(prompts, tmp_path / "c.zarr", cache_dir=cache, device="cpu",
                          model=str(_model_copy(tmp_path / "short", max_seq_length=16)))
    assert (short["embedded"], short["from_cache"]) == (8, 0)
    assert len(list((cache / FOLDER).iterdir())) == 2  # one folder per encoder identity
    identity = json.loads(next(p for p in (cache / FOLDER).glob("*/encoder.json")
                               if json.loads(p.read_text())["max_seq_length"] == 16).read_text())
    assert identity["device"] == "cpu" and identity["libraries"]["sentence-transformers"]
    # truncated at 16 tokens, the longer prompts' vectors differ: a hit would have been wrong
    assert not np.allclose(vectors(tmp_path / "c.zarr"), vectors(tmp_path / "a.zarr"), atol=1e-3)


def test_the_log_says_the_rate_and_time_left_after_the_first_batch(tmp_path, seen, monkeypatch):
    monkeypatch.setenv("GRAPHDIFF_PROGRESS_SECONDS", "3600")  # no periodic line: the first batch's must come anyway
    prompts = write_jsonl(tmp_path / "p.jsonl", PROMPT_ROWS)
    res = gd("embed", prompts, "--out", tmp_path / "e.zarr", "--device", "cpu", "--batch-size", 2)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("embedding 40 prompts:")]
    # the encoder reports every 4 batches (8 prompts): a line at the first, then only the last
    assert re.fullmatch(r"embedding 40 prompts: 8/40 \(20%\), \d+ s, [\d.]+ prompts/s, ETA \d+( min \d+)? s",
                        lines[0]), res.stderr
    assert len(lines) == 2 and lines[-1].startswith("embedding 40 prompts: 40/40 (100%)"), res.stderr


def test_extend_embeds_only_texts_never_embedded(tmp_path, seen):
    """Prompts embed saw before come from the cache; a text the STATE already has is refused before anything is
    embedded (a duplicate would be its own nearest neighbour)."""
    from graphdiff_cli import State
    from graphdiff_cli.errors import DataError
    from graphdiff_cli.io.layout import ADDED_EMBEDDINGS
    from graphdiff_cli.io.state_dir import StateDir

    cache = tmp_path / "cache"
    old, new = PROMPT_ROWS[:32], PROMPT_ROWS[32:]
    write_jsonl(tmp_path / "old.jsonl", old)
    write_jsonl(tmp_path / "new.jsonl", new)
    write_jsonl(tmp_path / "all.jsonl", old + new)
    for name in ("all", "old"):  # the whole set embedded once (say, to look at it), then the STATE's part
        gd("embed", tmp_path / f"{name}.jsonl", "--out", tmp_path / f"{name}.zarr", "--cache-dir", cache,
           "--device", "cpu", "-q")
    gd("build-graph", tmp_path / "old.zarr", "--k-nn", 5, "--out", tmp_path / "g.zarr", "-q")
    gd("cluster", tmp_path / "g.zarr", "--out", tmp_path / "c.zarr", "--states", 4, "-q")
    gd("init", "--graph", tmp_path / "g.zarr", "--clusters", tmp_path / "c.zarr", "--out", tmp_path / "S", "-q")
    before = len(seen)
    res = gd_json("extend", "--state", tmp_path / "S", "--prompts", tmp_path / "new.jsonl", "--cache-dir", cache,
                  "--device", "cpu")
    assert embedded_now(seen, before) == 0
    assert res["encoding"] == {"rows": 8, "embedded": 0, "from_cache": 8, "duplicates": 0, "cache_dir": str(cache)}
    x = StateDir.open(tmp_path / "S").model()[0].array(ADDED_EMBEDDINGS)
    np.testing.assert_array_equal(x, vectors(tmp_path / "all.zarr")[32:])  # the cached raw vectors, normalized
    again = write_jsonl(tmp_path / "again.jsonl", [{"id": "z1", "prompt": PROMPT_ROWS[3]["prompt"]}])
    before = len(seen)
    with pytest.raises(DataError, match="same text"):
        State.open(tmp_path / "S").extend(again, cache_dir=cache, device="cpu")
    assert embedded_now(seen, before) == 0


def test_the_default_cache_dir_follows_xdg(tmp_path, monkeypatch):
    from graphdiff_cli.io.embedding_cache import default_cache_dir

    monkeypatch.delenv("GRAPHDIFF_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "graphdiff"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "graphdiff"
    monkeypatch.setenv("GRAPHDIFF_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
