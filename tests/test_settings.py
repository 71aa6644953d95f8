"""Every estimator setting has one home (graphdiff_cli.settings); everything else derives from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from graphdiff_cli import Estimator
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.settings import (NAMES, PRESETS, EstimatorSettings, inert_settings, json_schema, parse_flag,
                                    preset_settings, resolve, resolve_layers)

ROOT = Path(__file__).resolve().parents[1]


def _graph(n=40, seed=0):
    from graphdiff_cli.core.graph import mutual_knn_graph

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    sim = x @ x.T
    nbr = np.argsort(-sim, axis=1)[:, 1:7]
    return mutual_knn_graph(nbr, np.take_along_axis(sim, nbr, axis=1)), np.arange(n) % 4


def test_the_paper_preset_is_the_field_defaults_and_default_differs_only_where_measured():
    assert PRESETS["paper"] == EstimatorSettings()
    diff = {k for k in NAMES if getattr(PRESETS["default"], k) != getattr(PRESETS["paper"], k)}
    assert diff == {"schedule", "mixing", "prior_strength", "belief_strength", "prompt_forgetting", "state_prior",
                    "neighbor_smoothing", "label_propagation", "time_forgetting", "readout", "covariate_readout",
                    "live_readout"}


def test_a_bare_estimator_gets_the_default_preset_and_keywords_override_a_preset():
    w, labels = _graph()
    assert Estimator(w, labels, n_states=4).settings == PRESETS["default"]
    est = Estimator(w, labels, n_states=4, preset="paper", beta=4.0, schedule="sequential")
    assert est.settings == PRESETS["paper"].model_copy(update={"beta": 4.0, "schedule": "sequential"})
    assert Estimator(w, labels, 4, settings=est.settings).settings == est.settings
    with pytest.raises(InvalidArgumentError, match="either settings or a preset"):
        Estimator(w, labels, 4, preset="paper", settings=est.settings)
    with pytest.raises(InvalidArgumentError, match="unknown preset 'fast'; choose one of default, paper"):
        Estimator(w, labels, 4, preset="fast")
    with pytest.raises(InvalidArgumentError, match="unknown setting 'bta'"):
        Estimator(w, labels, 4, bta=2.0)


@pytest.mark.parametrize("preset,key,value,why", [
    ("default", "tol", 1e-3, "residual schedule stops by residual_tol"),
    ("default", "gamma", 0.3, "only under mixing 'gamma'"),
    ("paper", "residual_tol", 1e-3, "only steers the residual schedule"),
    ("paper", "prior_strength", 2.0, "only under mixing 'evidence' or 'offset'"),
])
def test_a_setting_that_cannot_act_is_refused_in_one_line(preset, key, value, why):
    with pytest.raises(InvalidArgumentError, match=why) as info:
        resolve(preset, **{key: value})
    assert "\n" not in str(info.value) and f"{key} = {value!r} has no effect" in str(info.value)
    # the preset's own value is accepted (a full settings dict round-trips, onto either preset), and the
    # setting acts once the schedule or mixing that reads it is chosen
    for name in PRESETS:
        assert resolve(preset, **preset_settings(name)) == PRESETS[name]
    assert key in inert_settings(PRESETS[preset])


def test_inert_settings_follow_the_schedule_and_mixing():
    assert resolve("paper", schedule="sequential", device="cpu").device == "cpu"
    with pytest.raises(InvalidArgumentError, match="runs on the CPU only"):
        resolve("paper", schedule="sequential", device="cuda")
    with pytest.raises(InvalidArgumentError, match="prompt_forgetting = 0.5 has no effect"):
        resolve("paper", prompt_forgetting=0.5)
    assert resolve("paper", prompt_forgetting=0.5, neighbor_smoothing=2.0).prompt_forgetting == 0.5
    assert resolve("default", schedule="synchronous", tol=1e-3).tol == 1e-3
    assert resolve("default", mixing="gamma", gamma=0.3).gamma == 0.3
    assert resolve("paper", mixing="evidence", prior_strength=2.0).prior_strength == 2.0


@pytest.mark.parametrize("key,value,message", [
    ("beta", -1.0, "beta must be >= 0"),
    ("epsilon", 1.0, "epsilon must be < 1"),
    ("schedule", "jacobi", "unknown schedule 'jacobi'; choose one of residual, synchronous, sequential"),
    ("window", 0, "window must be >= 1"),
    ("max_iters", True, "max_iters must be an integer, got True"),
    ("prior_strength", 0.0, "prior_strength must be a number > 0 or 'auto'"),
    ("belief_strength", "best", "belief_strength must be a number > 0 or 'auto'"),
    ("neighbor_smoothing", float("inf"), "neighbor_smoothing must be finite"),
    ("device", "tpu", "device: unknown device 'tpu'"),
])
def test_bad_values_are_one_line_errors_naming_the_setting(key, value, message):
    with pytest.raises(InvalidArgumentError) as info:
        resolve("paper", **{key: value})
    assert message in str(info.value) and "\n" not in str(info.value)


def _layer(path, sections=()):
    from graphdiff_cli.io.readers import read_mapping
    from graphdiff_cli.settings import config_layer

    return config_layer(*read_mapping(path), path, sections=sections)


def test_layers_name_where_a_bad_value_came_from(tmp_path):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("preset: paper\nbeta: 3\nmixing: evidence\n")
    got = resolve_layers([_layer(cfg), ({"beta": 5.0}, lambda k: f"--{k}")])
    assert (got.beta, got.mixing, got.schedule) == (5.0, "evidence", "synchronous")  # flags win, preset paper
    with pytest.raises(InvalidArgumentError, match=r"s\.yaml:2: beta must be >= 0"):
        resolve_layers([({"preset": "paper", "beta": -2}, lambda k: f"{cfg}:2")])
    cfg.write_text("preset: paper\nmax_itres: 3\n")
    with pytest.raises(InvalidArgumentError, match=r"s\.yaml:2: unknown setting 'max_itres' \(the file has no "
                                                   r"'estimator' section"):
        _layer(cfg)


def test_init_and_evaluate_read_one_estimator_section_the_same_way(tmp_path):
    """One shape: a whole config's `estimator:` section, read alike by init --config and evaluate --config."""
    from graphdiff_cli.evaluation.methods import load_config
    from graphdiff_cli.stages.handoff import init_settings

    whole = tmp_path / "whole.yaml"
    whole.write_text("run: mine\nsource: {kind: simulate}\nestimator:\n  preset: paper\n  beta: 3\n"
                     "  window: 10\n  mixing: evidence\nevaluate:\n  enabled: true\n  settings:\n"
                     "    greso: {tau: 0.5}\n")
    by_init, keep = init_settings(whole)
    cfg = load_config(whole)
    assert by_init == cfg["estimator"] and cfg["estimator_preset"] == "paper"
    assert (by_init.beta, by_init.window, by_init.mixing, by_init.schedule) == (3.0, 10, "evidence", "synchronous")
    assert cfg["evaluate"]["greso"]["tau"] == 0.5 and keep.keep == 5
    # the same section written as a file of only its keys: the same settings, by both readers
    bare = tmp_path / "bare.yaml"
    bare.write_text("preset: paper\nbeta: 3\nwindow: 10\nmixing: evidence\n")
    flat = tmp_path / "flat.yaml"  # the older init --config file spelled keys as the flags
    flat.write_text("preset: paper\nbeta: 3\nwindow: 10\nmixing: evidence\nmax-iters: 50\n")
    assert init_settings(flat)[0] == load_config(flat)["estimator"] == by_init
    assert init_settings(bare)[0] == load_config(bare)["estimator"] == by_init
    # evaluate's older shape (baseline settings right under `evaluate`) still reads
    old = tmp_path / "old.yaml"
    old.write_text("estimator: {preset: paper, beta: 3, window: 10, mixing: evidence}\nevaluate:\n  greso: {tau: 0.5}\n")
    assert load_config(old) == cfg
    # flags override the file, in init
    assert init_settings(whole, beta="4", window="none")[0] == by_init.model_copy(update={"beta": 4.0, "window": None})


def test_paper_yaml_is_a_valid_init_config():
    from graphdiff_cli.stages.handoff import init_settings

    settings, _ = init_settings(ROOT / "configs/paper.yaml")
    section = yaml.safe_load((ROOT / "configs/paper.yaml").read_text())["estimator"]
    assert settings == resolve(**section) and settings.schedule == "synchronous" and settings.mixing == "gamma"
    assert (settings.beta, settings.gamma, settings.window) == (2.0, 0.5, None)


@pytest.mark.parametrize("text,message", [
    ("estimator:\n  preset: paper\n  keep: 3\n", r"c\.yaml:3: keep is the STATE's retention, not an estimator "
                                                   r"setting: give graphdiff init --keep N"),
    ("keep: 3\nbeta: 2\n", r"c\.yaml:1: keep is the STATE's retention"),
    ("estimator:\n  max-iters: 3\n", r"c\.yaml:2: unknown setting 'estimator\.max-iters' \(settings are spelled "
                                       r"with underscores: max_iters\)"),
    ("run: x\nsource: {kind: files}\n", r"c\.yaml:1: unknown setting 'run' \(the file has no 'estimator' section"),
    ("estimator: [1, 2]\n", r"c\.yaml:1: section 'estimator' must be a mapping"),
    ("estimator:\n  preset: fast\n", r"c\.yaml:2: unknown preset 'fast'; choose one of default, paper"),
    ("estimator:\n  preset: paper\n\n  beta: -1\n", r"c\.yaml:4: beta must be >= 0\.0, got -1\.0"),
    ("estimator:\n  tol: 0.01\n", r"c\.yaml:2: tol = 0\.01 has no effect here"),
])
def test_config_file_errors_are_one_line_naming_file_and_line_in_init_and_evaluate(tmp_path, text, message):
    from graphdiff_cli.evaluation.methods import load_config
    from graphdiff_cli.stages.handoff import init_settings

    path = tmp_path / "c.yaml"
    path.write_text(text)
    for read in (init_settings, load_config):
        with pytest.raises(InvalidArgumentError, match=message) as info:
            read(path)
        assert "\n" not in str(info.value)


def test_init_keep_is_a_flag_with_the_state_dir_default():
    from graphdiff_cli.io.state_dir import DEFAULT_KEEP, DEFAULT_KEEP_EVERY, Retention
    from graphdiff_cli.stages.handoff import init_settings

    assert init_settings()[1] == Retention(DEFAULT_KEEP, DEFAULT_KEEP_EVERY)
    assert init_settings(keep=7, keep_every=10)[1] == Retention(7, 10)
    with pytest.raises(InvalidArgumentError, match="^keep must be an integer >= 2"):
        init_settings(keep=1)


def test_parse_flag_reads_command_line_text():
    assert parse_flag("beta", "2.5") == 2.5
    assert parse_flag("max_iters", "7") == 7
    assert parse_flag("prior_strength", "auto") == "auto" and parse_flag("prior_strength", "3") == 3.0
    assert parse_flag("neighbor_smoothing", "none") is None and parse_flag("window", "null") is None
    assert parse_flag("window", "4") == 4
    with pytest.raises(InvalidArgumentError, match="--window"):
        resolve_layers([({"window": parse_flag("window", "x")}, lambda k: "--window")])


@pytest.mark.parametrize("flag,value,message", [
    ("--beta", "x", "--beta: beta must be a number, got 'x'"),
    ("--max-iters", "2.5", "--max-iters: max_iters must be an integer, got '2.5'"),
    ("--window", "x", "--window: window must be an integer or null, got 'x'"),
])
def test_bad_flag_text_is_refused_by_the_one_parser_in_one_line(tmp_path, flag, value, message):
    """Every setting flag is text read by settings.parse_flag: numbers and nullable settings alike are refused
    in resolve's words (not typer's), before any input is read."""
    res = subprocess.run([sys.executable, "-m", "graphdiff_cli.cli", "init", "--graph", str(tmp_path / "g"),
                          "--clusters", str(tmp_path / "c"), "--out", str(tmp_path / "s"), flag, value],
                         capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "",
                                                              "PYTHONPATH": str(ROOT)})
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_the_workflow_schema_is_generated_from_the_settings():
    committed = json.loads((ROOT / "workflow/schemas/estimator.schema.json").read_text())
    assert committed == json_schema(), ("workflow/schemas/estimator.schema.json is stale: regenerate it with "
                                        "`graphdiff settings --schema > workflow/schemas/estimator.schema.json`")
    assert set(committed["properties"]) == {"preset", *NAMES}  # keep is a STATE setting (init --keep)
    config_schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert config_schema["properties"]["estimator"]["$ref"] == "estimator.schema.json"


def test_the_schema_accepts_every_preset_and_refuses_bad_values():
    import jsonschema

    schema = json_schema()
    for name in PRESETS:
        jsonschema.validate({"preset": name, **preset_settings(name)}, schema)
    for bad in ({"beta": -1}, {"schedule": "jacobi"}, {"prior_strength": 0}, {"bta": 1}, {"window": 0}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_every_setting_is_an_init_flag_and_a_config_key(tmp_path):
    out = subprocess.run([sys.executable, "-m", "graphdiff_cli.cli", "init", "--help"], capture_output=True,
                         text=True, env={"COLUMNS": "200", "PATH": ""}, check=True).stdout
    for name in NAMES:
        assert f"--{name.replace('_', '-')}" in out, name
    # every setting is accepted by name in a config file's estimator section
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump({"estimator": preset_settings("paper")}))
    values, _ = _layer(path)
    assert set(values) == set(NAMES)


@pytest.mark.parametrize("name,text,message", [
    ("c.json", '{"estimator": {"beta": 2.0, "beta": 4.0}}', r"c\.json:1: duplicate key 'beta'"),
    ("c.yaml", "estimator:\n  window: 3\n  beta: 2\n  window: 5\n", r"c\.yaml:4: duplicate key 'window'"),
    ("c.json", '{"estimator": {"beta": 1' + "0" * 5000 + "}}", r"c\.json: a value the YAML loader cannot convert"),
    ("c.json", "[" * 50_000 + "]" * 50_000, r"c\.json: nested too deeply"),
])
def test_a_config_with_a_key_twice_a_huge_number_or_deep_nesting_is_one_line(tmp_path, name, text, message):
    """json and YAML loaders keep the last of two equal keys silently: refused, like an unreadable number or depth."""
    from graphdiff_cli.io.readers import read_mapping

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=message) as info:
        read_mapping(path)
    assert "\n" not in str(info.value)


def test_the_shipped_configs_have_no_key_twice():
    from graphdiff_cli.io.readers import read_mapping

    for path in sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")):
        read_mapping(path)


def test_a_yaml_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    """A 390-byte file of nested aliases took 29 s and 3.7 GB when its value was formatted
    into the refusal; the composed nodes are counted first, with a budget, so it stops at once."""
    import time

    from graphdiff_cli.io.readers import read_mapping

    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines + ["beta: *i"]) + "\n")
    t = time.perf_counter()
    with pytest.raises(DataError, match="expands to more than 100000 values through YAML aliases"):
        read_mapping(bomb)
    assert time.perf_counter() - t < 5
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: &b {beta: 2.0}\nestimator:\n  <<: *b\n  window: 4\n")
    assert read_mapping(ok)[0]["estimator"] == {"beta": 2.0, "window": 4}  # an ordinary anchor still reads
    big = tmp_path / "big.yaml"
    big.write_text("x: " + "1" * (1 << 20) + "\n")
    with pytest.raises(DataError, match="is no config file"):
        read_mapping(big)


def test_preset_of_names_the_closest_preset_and_what_differs():
    from graphdiff_cli.settings import preset_of, preset_settings

    assert preset_of(preset_settings("default")) == ("default", {})
    assert preset_of(preset_settings("paper")) == ("paper", {})
    assert preset_of({**preset_settings("paper"), "beta": 3.0, "n_states": 7}) == ("paper", {"beta": 3.0})
    assert preset_of({**preset_settings("default"), "device": "cpu"}) == ("default", {})  # where, not what
