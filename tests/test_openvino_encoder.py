"""The OpenVINO encoder: ``export-encoder`` writes a model folder that ``embed`` loads like any other.

Real parts: the bundled all-MiniLM-L6-v2 exported by OpenVINO's converter and NNCF (the ``openvino`` extra, in
the ``test`` extra: skipped with the reason where it is not installed), real prompt files, real cache folders and
the typer app. Tolerances: the float32 export runs the same float32 arithmetic through other kernels (OpenVINO's
CPU plugin, pinned to f32 inference precision), so a vector moves by float32 rounding over six transformer
layers: cosine to the torch vector within 1e-5 of 1 (measured: 1 - 1e-7). The int8 export's vectors are
approximations by design: cosine >= 0.98 on these prompts (0.9938 the worst of 1,000 MATH problems,
docs/results.md); a wrong pooling, a lost normalization or a scrambled batch order gives cosines far below
(about 0.2-0.6 between different prompts here).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import PROMPT_ROWS, write_jsonl
from graphdiff_cli.backends import openvino as ovb
from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION, Encoder, encoder_identity, format_text, open_encoder
from graphdiff_cli.cli.app import app
from graphdiff_cli.errors import BackendError
from graphdiff_cli.io.artifacts import read_artifact

pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install 'graphdiff-rl[openvino]')")
pytest.importorskip("nncf", reason="the openvino extra is not installed (pip install 'graphdiff-rl[openvino]')")

runner = CliRunner()
TEXTS = [format_text(r["prompt"], DEFAULT_INSTRUCTION) for r in PROMPT_ROWS]


def gd(*args, code: int = 0):
    res = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == code, f"exit {res.exit_code}: {res.stderr}"
    return res


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", PROMPT_ROWS)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, prompts) -> dict:
    base = tmp_path_factory.mktemp("exports")
    gd("export-encoder", "--out", base / "float", "--quantize", "none")
    res = gd("export-encoder", "--out", base / "int8", "--calibration", prompts, "--calibration-size", 30)
    return {"float": base / "float", "int8": base / "int8", "int8_stderr": res.stderr}


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return Encoder("bundled", "cpu").encode(TEXTS)


def cosines(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_the_float_export_gives_the_torch_models_vectors(exports, torch_vectors):
    got = open_encoder(str(exports["float"]), "cpu").encode(TEXTS, batch_size=7)  # batches cut across lengths
    assert got.dtype == np.float32 and got.shape == torch_vectors.shape
    assert cosines(got, torch_vectors).min() >= 1 - 1e-5
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # the model's Normalize module


def test_the_int8_export_is_quantized_and_close(exports, torch_vectors):
    manifest = json.loads((exports["int8"] / ovb.MANIFEST).read_text())
    assert manifest["quantize"] == "int8" and manifest["calibration"]["texts"] == 30
    assert manifest["pooling"] == "mean" and manifest["normalize"] is True and manifest["inference_precision"] == "f32"
    # checked on the 10 prompts it was not calibrated on; 30 calibration prompts are said to be few
    assert manifest["check"]["texts"] == 10 and manifest["check"]["of"] == "held-out prompts"
    assert manifest["check"]["cosine_min"] >= 0.98
    assert "calibrated on 30 prompts only" in exports["int8_stderr"]
    # int8 weights: the model file is about a quarter of the float one's
    assert (exports["int8"] / "openvino_model.bin").stat().st_size < 0.5 * (exports["float"] / "openvino_model.bin").stat().st_size
    got = open_encoder(str(exports["int8"]), "cpu").encode(TEXTS)
    cos = cosines(got, torch_vectors)
    assert cos.min() >= 0.98
    assert cos.min() < 1 - 1e-5  # not the float model: quantization moved the vectors


def test_the_calibration_sample_does_not_depend_on_row_order(tmp_path, prompts):
    rows = list(PROMPT_ROWS)
    random.Random(3).shuffle(rows)
    shuffled = write_jsonl(tmp_path / "shuffled.jsonl", rows)
    kw = dict(instruction=DEFAULT_INSTRUCTION, id_field="id", text_field="prompt", messages="user")
    from graphdiff_cli.stages.export_encoder import sample_texts

    a, b = sample_texts(prompts, **kw)[:12], sample_texts(shuffled, **kw)[:12]  # the first 12 calibrate
    assert a == b and len(a) == 12 and set(a) <= set(TEXTS)


def test_embed_with_an_export_keeps_its_vectors_apart_in_the_cache(tmp_path, exports, prompts):
    cache = tmp_path / "cache"
    first = json.loads(gd("embed", prompts, "--out", tmp_path / "a.zarr", "--model", exports["int8"],
                          "--cache-dir", cache, "--json").stdout)
    assert first["embedded"] == len(PROMPT_ROWS) and first["device"] == "cpu"
    again = json.loads(gd("embed", prompts, "--out", tmp_path / "b.zarr", "--model", exports["int8"],
                          "--cache-dir", cache, "--json").stdout)
    assert again["embedded"] == 0 and again["from_cache"] == len(PROMPT_ROWS)
    torch_run = json.loads(gd("embed", prompts, "--out", tmp_path / "c.zarr", "--cache-dir", cache,
                              "--json").stdout)
    assert torch_run["embedded"] == len(PROMPT_ROWS)  # the torch model's vectors are not the export's
    a, b = (read_artifact(tmp_path / n, "embeddings").array("embeddings") for n in ("a.zarr", "b.zarr"))
    np.testing.assert_array_equal(a, b)  # a cache hit is a copy of the stored bytes
    assert read_artifact(tmp_path / "a.zarr", "embeddings").params["model"] == str(exports["int8"].resolve())
    ids = {k: encoder_identity(m, "cpu") for k, m in (("int8", str(exports["int8"])), ("float", str(exports["float"])),
                                                       ("torch", "bundled"))}
    assert ids["int8"]["backend"] == "openvino" and "backend" not in ids["torch"]
    assert len({ids[k]["files"] for k in ids}) == 3


def test_check_encoder_accepts_an_export(exports):
    out = json.loads(gd("check-encoder", "--model", exports["int8"], "--json").stdout)
    assert out["path"] == str(exports["int8"].resolve())


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_pooling_matches_sentence_transformers(pooling):
    import torch
    from sentence_transformers.models import Pooling

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((5, 9, 16)).astype(np.float32)
    mask = np.ones((5, 9), dtype=np.int64)
    for i, n in enumerate((9, 1, 4, 6, 2)):
        mask[i, n:] = 0
    ref = Pooling(16, pooling_mode=pooling)({"token_embeddings": torch.from_numpy(hidden),
                                             "attention_mask": torch.from_numpy(mask)})["sentence_embedding"].numpy()
    np.testing.assert_allclose(ovb.pool(hidden, mask, pooling, normalize=False), ref, rtol=1e-5, atol=1e-6)
    unit = ovb.pool(hidden, mask, pooling, normalize=True)
    np.testing.assert_allclose(unit, ref / np.linalg.norm(ref, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_another_pipeline_is_refused_in_one_line():
    class Transformer: pass  # noqa: E701
    class Pooling: pass  # noqa: E701
    class Dense: pass  # noqa: E701
    with pytest.raises(BackendError, match="Transformer, Pooling, Dense"):
        ovb.pipeline_of([Transformer(), Pooling(), Dense()])


def test_bad_requests_are_refused_in_one_line_and_write_nothing(tmp_path, exports, prompts):
    res = gd("export-encoder", "--out", exports["float"], "--quantize", "none", code=2)
    assert "exists" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = gd("export-encoder", "--out", tmp_path / "x", code=2)
    assert "--calibration" in res.stderr
    res = gd("export-encoder", "--out", tmp_path / "y", "--model", exports["float"], "--quantize", "none", code=2)
    assert "already an OpenVINO export" in res.stderr
    res = gd("export-encoder", "--out", tmp_path / "z", "--quantize", "int4", code=2)
    assert "--quantize" in res.stderr
    res = gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", exports["float"], "--device", "cuda",
             "--no-cache", code=8)
    assert "runs on the CPU" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_without_openvino_the_error_names_the_extra(tmp_path, exports, prompts, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    res = gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", exports["float"], "--no-cache", code=8)
    assert "graphdiff-rl[openvino]" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = gd("export-encoder", "--out", tmp_path / "f", "--quantize", "none", code=8)
    assert "graphdiff-rl[openvino]" in res.stderr
    assert not (tmp_path / "e.zarr").exists() and not (tmp_path / "f").exists()


def test_an_export_that_does_not_reproduce_the_model_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    """The check before the export appears: a pooling re-implemented wrongly (CLS for mean) is caught."""
    real = ovb.pool
    monkeypatch.setattr(ovb, "pool", lambda hidden, mask, mode, normalize: real(hidden, mask, "cls", normalize))
    res = gd("export-encoder", "--out", tmp_path / "bad", "--quantize", "none", code=8)
    assert "does not reproduce the model" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_rows_are_not_reused_from_an_export_replaced_in_place(tmp_path, exports, prompts):
    """embed records the encoder's files: the same path holding another export is another encoder."""
    import shutil

    here = tmp_path / "encoder"
    shutil.copytree(exports["int8"], here)
    gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", here, "--no-cache")
    first = read_artifact(tmp_path / "e.zarr", "embeddings")
    assert first.params["encoder_files"] == encoder_identity(str(exports["int8"]), "cpu")["files"]
    again = json.loads(gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", here, "--json").stdout)
    assert again["cached"] == len(PROMPT_ROWS)  # the same files: every row reused
    shutil.rmtree(here)
    shutil.copytree(exports["float"], here)  # re-exported in place
    res = json.loads(gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", here, "--no-cache",
                        "--json").stdout)
    assert res["embedded"] == len(PROMPT_ROWS)  # --no-cache: the rows are embedded again whatever the files
    res = json.loads(gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", here, "--json",
                        "--cache-dir", tmp_path / "c").stdout)
    assert res["cached"] == len(PROMPT_ROWS)  # made just now with these files
    shutil.rmtree(here)
    shutil.copytree(exports["int8"], here)
    res = json.loads(gd("embed", prompts, "--out", tmp_path / "e.zarr", "--model", here, "--json",
                        "--cache-dir", tmp_path / "c").stdout)
    assert res["cached"] == 0 and "files changed" in res["cache"]


def test_an_interrupted_export_leaves_nothing(tmp_path, monkeypatch):
    def boom(st, folder, **kw):
        (Path(folder) / ovb.IR).write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(ovb, "export", boom)
    from graphdiff_cli.stages.export_encoder import export_encoder

    with pytest.raises(KeyboardInterrupt):
        export_encoder(tmp_path / "m", quantize="none")
    assert list(tmp_path.iterdir()) == []


def test_extend_refuses_an_export_replaced_in_place_and_uses_the_one_it_was_built_with(tmp_path, exports):
    """A STATE embedded with an export: extend embeds new prompts with it, and refuses another export put at its
    path (its vectors would not be the STATE's), leaving the STATE as it was."""
    import shutil

    here = tmp_path / "encoder"
    shutil.copytree(exports["int8"], here)
    old, new = PROMPT_ROWS[:32], PROMPT_ROWS[32:]
    write_jsonl(tmp_path / "old.jsonl", old)
    write_jsonl(tmp_path / "new.jsonl", new)
    gd("embed", tmp_path / "old.jsonl", "--out", tmp_path / "e.zarr", "--model", here, "--no-cache", "-q")
    gd("build-graph", tmp_path / "e.zarr", "--k-nn", 5, "--out", tmp_path / "g.zarr", "-q")
    gd("cluster", tmp_path / "g.zarr", "--out", tmp_path / "c.zarr", "--states", 4, "-q")
    gd("init", "--graph", tmp_path / "g.zarr", "--clusters", tmp_path / "c.zarr", "--out", tmp_path / "S", "-q")
    before = sorted(p.relative_to(tmp_path / "S") for p in (tmp_path / "S").rglob("*"))
    shutil.rmtree(here)
    shutil.copytree(exports["float"], here)
    res = gd("extend", "--state", tmp_path / "S", "--prompts", tmp_path / "new.jsonl", "--no-cache", code=1)
    assert "not the export the STATE's prompts were embedded with" in res.stderr
    assert sorted(p.relative_to(tmp_path / "S") for p in (tmp_path / "S").rglob("*")) == before
    shutil.rmtree(here)
    shutil.copytree(exports["int8"], here)
    out = json.loads(gd("extend", "--state", tmp_path / "S", "--prompts", tmp_path / "new.jsonl", "--no-cache",
                        "--json").stdout)
    assert out["added"] == len(new) and out["encoding"]["embedded"] == len(new)
