"""The handoff commands end to end: JSON output, exit codes, predict's table, a real kill -9 of a
running update, concurrent updates, and a trainer-loop shell script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from _handoff_fixtures import GRAPHDIFF, make_inputs, step_rows, tree_hash, write_outcomes
from graphdiff_cli.cli.app import app
from graphdiff_cli.estimator import Estimator
from graphdiff_cli.io.state_dir import StateDir
from graphdiff_cli.stages.handoff import PREDICT_COLUMNS

runner = CliRunner()


def gd(*args, code=0):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)
    return res


def gd_json(*args) -> dict:
    res = gd(*args, "--json")
    assert res.stdout.count("\n") == 1, res.stdout  # exactly one JSON object, one line
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli-inputs")
    graph, clusters, ids = make_inputs(folder, n=40)
    for t in range(1, 5):
        write_outcomes(folder / f"o{t}.jsonl", step_rows(ids, t))
    return folder, ids


@pytest.fixture
def state(tmp_path, inputs):
    folder, _ = inputs
    out = tmp_path / "STATE"
    res = gd_json("init", "--graph", folder / "graph.zarr", "--clusters", folder / "clusters.zarr", "--out", out,
                  "--device", "cpu", "--keep", "2")
    assert res["step"] == 0 and res["n_prompts"] == 40 and res["states"] == 4 and res["keep"] == 2
    return out


def test_every_command_prints_one_json_object(state, inputs, tmp_path):
    folder, ids = inputs
    up = gd_json("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl")
    assert up["step"] == 1 and up["rollouts"] == 96 and set(up["timings"]) >= {"load_s", "inference_s", "write_s"}
    pr = gd_json("predict", "--state", state, "--out", tmp_path / "p.jsonl")
    assert pr["rows"] == 40 and pr["step"] == 1 and pr["columns"] == PREDICT_COLUMNS
    st = gd_json("status", "--state", state)
    assert st["step"] == 1 and st["n_prompts"] == 40 and st["states"] == 4 and st["retained"] == [0, 1]
    assert [e["step"] for e in st["applied"]] == [0, 1] and st["applied"][1]["outcomes_hash"] == up["outcomes_hash"]
    assert st["config"]["beta"] == 2.0 and st["keep"] == 2
    # the preset the STATE's settings are (a STATE stores them whole), and which of them are inert under it
    assert st["preset"] == "default" and st["overrides"] == {} and {"gamma", "tol"} <= set(st["inert"])
    assert st["readout_on"] is False  # readout auto, but this graph names no embeddings artifact (no read-out)
    rb = gd_json("rollback", "--state", state, "--to", 0)
    assert rb == {**rb, "step": 0, "previous_step": 1, "removed": [1], "next_step": 1}
    # the global --json before the command name works as well
    res = runner.invoke(app, ["--json", "status", "--state", str(state)])
    assert res.exit_code == 0 and json.loads(res.stdout)["step"] == 0
    # without --json the summary is status's answer: plain text on stdout (so `status | grep step` works),
    # never wrapped when piped, nothing on stderr
    res = gd("status", "--state", state)
    assert res.stderr == "" and res.stdout.startswith(f"STATE {state}: step 0, 40 prompts")
    config_line = next(line for line in res.stdout.splitlines() if line.startswith("config:"))
    assert len(config_line) > 80 and "device" in config_line  # one line however long
    assert config_line.startswith("config: preset default; beta 2.0") and "mixing evidence" in config_line
    assert "gamma" not in config_line and " tol " not in config_line  # no effect under the default preset


@pytest.mark.parametrize("args,code,words", [
    (["update", "--step", 1, "--outcomes", "{f}/o2.jsonl"], 3, "step 1 is already applied from other outcomes"),
    (["update", "--step", 3, "--outcomes", "{f}/o3.jsonl"], 4, "would skip step 2"),
    (["update", "--step", 2, "--outcomes", "{f}/missing.jsonl"], 1, "no such outcomes file"),
    (["update", "--step", 2, "--outcomes", "{f}/o2.jsonl", "--lock-timeout", -1], 2, "--lock-timeout"),
    (["update", "--step", "two", "--outcomes", "{f}/o2.jsonl"], 2, ""),
    (["rollback", "--to", 5], 7, "step 5 has not been applied"),
    (["predict", "--out", "{t}/p.xml"], 2, "cannot tell the format"),
    (["predict", "--out", "{t}/p.csv", "--format", "xml"], 2, "unknown format"),
    (["predict", "--out", "{t}/p.csv", "--group-size", 0], 2, "--group-size"),
])
def test_refusals_exit_codes_and_one_line(state, inputs, tmp_path, args, code, words):
    folder, _ = inputs
    gd("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl")
    before = tree_hash(state)
    argv = [a.format(f=folder, t=tmp_path) if isinstance(a, str) else a for a in args]
    res = gd(argv[0], "--state", state, *argv[1:], code=code)
    assert words in res.stderr
    if code != 2:
        assert res.stderr.startswith("graphdiff: error: ") and res.stderr.count("\n") == 1
    assert tree_hash(state) == before
    assert not (tmp_path / "p.csv").exists() and not (tmp_path / "p.xml").exists()


def test_init_usage_errors(tmp_path, inputs):
    folder, _ = inputs
    base = ["init", "--graph", folder / "graph.zarr", "--clusters", folder / "clusters.zarr", "--out", tmp_path / "S"]
    assert "--keep" in gd(*base, "--keep", 0, code=2).stderr
    assert "concurrent predict" in gd(*base, "--keep", 1, code=2).stderr  # readers need the previous state
    assert "schedule" in gd(*base, "--schedule", "chaotic", code=2).stderr
    assert "no such graph artifact" in gd("init", "--graph", tmp_path / "g.zarr", "--clusters",
                                          folder / "clusters.zarr", "--out", tmp_path / "S", code=6).stderr
    assert not (tmp_path / "S").exists()


def test_prior_strength_is_a_number_or_auto_from_flags_and_config(tmp_path, inputs):
    folder, _ = inputs
    base = ["init", "--graph", folder / "graph.zarr", "--clusters", folder / "clusters.zarr"]
    assert gd_json(*base, "--out", tmp_path / "A")["config"]["prior_strength"] == "auto"  # the default preset
    assert gd_json(*base, "--out", tmp_path / "B", "--prior-strength", "2.5")["config"]["prior_strength"] == 2.5
    (tmp_path / "c.yaml").write_text("preset: paper\nmixing: evidence\nprior-strength: auto\n")
    cfg = gd_json(*base, "--out", tmp_path / "C", "--config", tmp_path / "c.yaml")["config"]
    assert cfg["prior_strength"] == "auto" and cfg["mixing"] == "evidence" and cfg["schedule"] == "synchronous"
    res = gd(*base, "--out", tmp_path / "D", "--prior-strength", "strong", code=2)
    assert "--prior-strength: prior_strength must be a number > 0 or 'auto', got 'strong'" in res.stderr
    (tmp_path / "bad.yaml").write_text("prior-strength: [1]\n")
    res = gd(*base, "--out", tmp_path / "E", "--config", tmp_path / "bad.yaml", code=2)
    assert "bad.yaml:1: prior_strength must be a number > 0 or 'auto'" in res.stderr
    assert not (tmp_path / "D").exists() and not (tmp_path / "E").exists()


def test_belief_strength_from_flags_and_config(tmp_path, inputs):
    folder, _ = inputs
    base = ["init", "--graph", folder / "graph.zarr", "--clusters", folder / "clusters.zarr"]
    assert gd_json(*base, "--out", tmp_path / "A")["config"]["belief_strength"] == "auto"  # the default preset
    assert gd_json(*base, "--out", tmp_path / "B", "--belief-strength", "3")["config"]["belief_strength"] == 3.0
    (tmp_path / "c.yaml").write_text("preset: paper\n")
    assert gd_json(*base, "--out", tmp_path / "C", "--config", tmp_path / "c.yaml")["config"]["belief_strength"] is None
    res = gd(*base, "--out", tmp_path / "D", "--belief-strength", "-1", code=2)
    assert res.stderr.count("\n") == 1 and "belief_strength must be a number > 0 or 'auto' or null" in res.stderr
    assert not (tmp_path / "D").exists()


def test_predict_columns_values_ids_and_formats(state, inputs, tmp_path):
    folder, ids = inputs
    gd("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl")
    est = Estimator.load(state)
    want = est.estimates(None, group_size=4)
    gd("predict", "--state", state, "--out", tmp_path / "all.jsonl", "--group-size", 4)
    rows = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert [list(r) for r in rows] == [PREDICT_COLUMNS] * 40 and [r["id"] for r in rows] == ids
    for col in PREDICT_COLUMNS[1:]:
        np.testing.assert_allclose([r[col] for r in rows], want[col], rtol=0, atol=1e-12, err_msg=col)
    assert {r["id"]: r["n_seen"] for r in rows if r["n_seen"]} == {r["id"]: r["n"] for r in step_rows(ids, 1)}
    np.testing.assert_allclose([r["difficulty"] for r in rows], 1 - want["p"], atol=1e-12)
    # --ids as plain text (one per line) and as a CSV table; --format overrides the extension
    (tmp_path / "ids.txt").write_text(f"{ids[7]}\n\n{ids[2]}\n")
    gd("predict", "--state", state, "--ids", tmp_path / "ids.txt", "--out", tmp_path / "sel.out", "--format", "csv")
    lines = (tmp_path / "sel.out").read_text().splitlines()
    assert lines[0] == ",".join(PREDICT_COLUMNS) and [ln.split(",")[0] for ln in lines[1:]] == [ids[7], ids[2]]
    assert float(lines[1].split(",")[1]) == pytest.approx(want["p"][7], abs=1e-12)
    (tmp_path / "ids.csv").write_text(f"id,other\n{ids[5]},x\n")
    gd("predict", "--state", state, "--ids", tmp_path / "ids.csv", "--out", tmp_path / "sel.parquet",
       "--group-size", 4)
    table = pq.read_table(tmp_path / "sel.parquet").to_pylist()
    assert table == [{c: (ids[5] if c == "id" else pytest.approx(float(want[c][5]), abs=1e-12))
                      for c in PREDICT_COLUMNS}]


def test_predict_help_lists_every_column():
    res = gd("predict", "--help")
    text = " ".join(res.stdout.replace("│", " ").split())
    assert f"Write {', '.join(PREDICT_COLUMNS)} for each prompt." in text


def test_help_shows_flags_as_flags_and_values_with_their_type():
    import re

    text = gd("watch", "--help").stdout
    rows = {m.group(1): m.group(2) or "" for m in re.finditer(r"(?m)^│\s+(?:\*\s+)?(--[a-z-]+)(?:\s+-\w)?\s+(<\w+>)?",
                                                             text)}
    assert rows["--once"] == rows["--json"] == rows["--help"] == ""  # take no value: no <bool>
    assert rows["--poll"] == "<float>" and rows["--until-step"] == "<int>"
    assert "<bool>" not in gd("--help").stdout


def test_shell_completion_completes_commands_and_options():
    import os
    import subprocess

    from _handoff_fixtures import GRAPHDIFF

    def complete(words: str) -> list[str]:
        env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1),
               "_GRAPHDIFF_COMPLETE": "complete_bash"}
        return subprocess.run([str(GRAPHDIFF)], env=env, capture_output=True, text=True).stdout.split()

    assert complete("graphdiff upd") == ["update"]
    assert complete("graphdiff update --st") == ["--state", "--step"]
    # the values of --strategy and --preset
    assert complete("graphdiff select --strategy t") == ["target", "thompson"]
    assert complete("graphdiff allocate --strategy v") == ["variance", "vip"]
    assert complete("graphdiff init --preset p") == ["paper"]
    script = subprocess.run([str(GRAPHDIFF), "--show-completion", "bash"], capture_output=True, text=True)
    assert script.returncode == 0 and "_GRAPHDIFF_COMPLETE=complete_bash" in script.stdout


def test_shared_options_after_the_command_name(state):
    """@command adds --json/-q/-v to every command; they add to the global ones and keep the exit codes."""
    res = gd("status", "--state", state, "-q", "--json")
    assert json.loads(res.stdout)["step"] == 0 and res.stderr == ""
    res = gd("status", "--state", state.parent / "missing", "--json", code=6)
    assert json.loads(res.stdout) == {"error": res.stderr[len("graphdiff: error: "):].strip(), "exit_code": 6,
                                      "kind": "damaged"}
    assert "graphdiff: error:" in res.stderr


def test_predict_is_atomic(state, inputs, tmp_path):
    _, ids = inputs
    out = tmp_path / "pred.csv"
    out.write_text("previous predictions\n")
    (tmp_path / "ids.txt").write_text(f"{ids[0]}\nnot-a-prompt\n")
    res = gd("predict", "--state", state, "--ids", tmp_path / "ids.txt", "--out", out, code=1)
    assert "ids.txt:2: unknown prompt id 'not-a-prompt'" in res.stderr
    assert out.read_text() == "previous predictions\n"
    gd("predict", "--state", state, "--out", out)
    assert out.read_text().startswith("id,p,") and len(out.read_text().splitlines()) == 41
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp files left


# ------------------------------------------------------------------------------- real processes

def _spawn_update(state, step, outcomes, pause=None, release=None, extra=()):
    env = dict(os.environ)
    if pause:
        env.update(GRAPHDIFF_TEST_PAUSE_AFTER=pause, GRAPHDIFF_TEST_PAUSE_FILE=str(release))
    return subprocess.Popen([str(GRAPHDIFF), "update", "--state", str(state), "--step", str(step), "--outcomes",
                             str(outcomes), "--json", *extra], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"update exited early: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the update never reached its pause point")
        time.sleep(0.05)


@pytest.mark.slow
def test_kill_9_while_update_writes(state, inputs, tmp_path):
    """A real SIGKILL between the step artifact and the log (every other point: test_state_dir.py)."""
    folder, ids = inputs
    gd("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl")
    at_one = Estimator.load(state).predict()
    release = tmp_path / "release"
    proc = _spawn_update(state, 2, folder / "o2.jsonl", pause="artifact", release=release)
    _wait_for(Path(f"{release}.reached"), proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # the debris of the killed writer is there, yet the state reads as step 1
    assert (state / "steps/00000002.zarr").is_dir()
    assert gd_json("status", "--state", state)["step"] == 1
    np.testing.assert_array_equal(Estimator.load(state).predict(), at_one)
    # re-running the same step completes (the lock died with the process)
    assert gd_json("update", "--state", state, "--step", 2, "--outcomes", folder / "o2.jsonl",
                   "--lock-timeout", 5)["step"] == 2
    assert StateDir.open(state).retained_steps() == [0, 1, 2]
    assert [e["step"] for e in StateDir.open(state).log_entries()] == [0, 1, 2]


@pytest.mark.slow
def test_a_second_update_waits_for_the_lock_and_never_applies_twice(state, inputs, tmp_path):
    folder, _ = inputs
    release = tmp_path / "release"
    proc = _spawn_update(state, 1, folder / "o1.jsonl", pause="artifact", release=release)
    _wait_for(Path(f"{release}.reached"), proc)
    before = tree_hash(state)
    res = gd("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl", "--lock-timeout", 0.3,
             code=5)
    assert "another update or rollback has held .lock for more than 0.3 s" in res.stderr
    assert tree_hash(state) == before
    release.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["step"] == 1
    # the same outcomes again, after the waiting writer committed them: a no-op that says so
    assert json.loads(gd("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl",
                         "--json").stdout)["noop"]
    assert "step 1 is already applied" in gd("update", "--state", state, "--step", 1, "--outcomes",
                                             folder / "o2.jsonl", code=3).stderr


@pytest.mark.slow
def test_two_racing_updates_apply_the_step_once(state, inputs):
    folder, _ = inputs
    procs = [_spawn_update(state, 1, folder / "o1.jsonl") for _ in range(2)]
    results = [p.communicate(timeout=180) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], results
    # the loser found the step applied from the very same file: a no-op, not a second application
    assert sorted(bool(json.loads(r[0]).get("noop")) for r in results) == [False, True], results
    assert [e["step"] for e in StateDir.open(state).log_entries()] == [0, 1]
    assert StateDir.open(state).retained_steps() == [0, 1]


TRAINER_LOOP = r"""
set -euo pipefail
G="$1"; W="$2"
"$G" -q init --graph "$W/graph.zarr" --clusters "$W/clusters.zarr" --out "$W/STATE" --device cpu
for t in 1 2 3; do
  # the trainer writes one outcomes file per step, then hands it over
  "$G" -q update --state "$W/STATE" --step "$t" --outcomes "$W/o$t.jsonl"
done
"$G" predict --state "$W/STATE" --out "$W/predictions.csv" --json > "$W/predict.json"
"$G" status --state "$W/STATE" --json > "$W/status.json"
"""


@pytest.mark.slow
def test_a_trainer_loop_shell_script(tmp_path):
    graph, clusters, ids = make_inputs(tmp_path, n=40)
    for t in (1, 2, 3):
        write_outcomes(tmp_path / f"o{t}.jsonl", step_rows(ids, t))
    script = tmp_path / "loop.sh"
    script.write_text(TRAINER_LOOP)
    res = subprocess.run(["bash", str(script), str(GRAPHDIFF), str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # -q: nothing but errors
    status = json.loads((tmp_path / "status.json").read_text())
    assert status["step"] == 3 and [e["step"] for e in status["applied"]] == [0, 1, 2, 3]
    pred = json.loads((tmp_path / "predict.json").read_text())
    assert pred["step"] == 3 and pred["rows"] == 40
    lines = (tmp_path / "predictions.csv").read_text().splitlines()
    assert lines[0] == ",".join(PREDICT_COLUMNS) and len(lines) == 41
    seen = {r["id"] for t in (1, 2, 3) for r in step_rows(ids, t)}
    col = PREDICT_COLUMNS.index("n_seen")
    n_seen = {ln.split(",")[0]: int(ln.split(",")[col]) for ln in lines[1:]}
    assert {i for i, n in n_seen.items() if n > 0} == seen


@pytest.mark.parametrize("bad_id", ["[/bold]x", "[red]mine[/red]", "é" * 200_000, "a\nb"])
def test_errors_are_plain_text_one_line_and_bounded(state, tmp_path, bad_id):
    """User text in an error is echoed as text (never read as rich markup), on one line, cut to a sane length;
    with --json the same line comes on stdout as {"error", "exit_code"}."""
    out = write_outcomes(tmp_path / "o.jsonl", [{"id": bad_id, "n": 8, "s": 3}])
    before = tree_hash(state)
    res = gd("update", "--state", state, "--step", 1, "--outcomes", out, code=1)
    err = res.stderr
    assert err.startswith("graphdiff: error: ") and err.count("\n") == 1, err[:300]
    assert len(err) < 800
    if len(bad_id) < 100:
        assert repr(bad_id)[1:-1] in err  # markup-like text kept as it is, not stripped or interpreted
    else:
        assert "characters cut" in err
    res = gd("update", "--state", state, "--step", 1, "--outcomes", out, "--json", code=1)
    obj = json.loads(res.stdout)
    assert obj["exit_code"] == 1 and obj["kind"] == "bad-input" and obj["error"] == err[len("graphdiff: error: "):].rstrip("\n")
    assert tree_hash(state) == before


@pytest.mark.parametrize("argv,words", [
    (["status", "--stat", "x"], "No such option: --stat"),
    (["update", "--state", "S", "--step", "two", "--outcomes", "o.jsonl"], "Invalid value for '--step'"),
    (["update", "--state", "S"], "Missing option '--step'"),
    (["nosuch"], "No such command 'nosuch'"),
])
def test_usage_errors_of_the_real_command_are_one_line(argv, words):
    """The console script (not CliRunner): click's usage errors come as the same one line as every other error,
    exit 2, with the command's --help named; with --json also as an error object on stdout."""
    res = subprocess.run([GRAPHDIFF, *argv], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res
    assert res.stderr.startswith("graphdiff: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert words in res.stderr and "--help)" in res.stderr and res.stdout == ""
    res = subprocess.run([GRAPHDIFF, *argv, "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and json.loads(res.stdout)["exit_code"] == 2 and words in json.loads(res.stdout)["error"]


def test_init_reads_the_estimator_section_of_the_papers_workflow_config(tmp_path, inputs):
    """configs/paper.yaml, a whole Snakemake config, is an init --config file as it is: its estimator
    section (the paper preset, synchronous, cumulative) is what the STATE gets; --keep is init's own."""
    from pathlib import Path

    from graphdiff_cli.settings import PRESETS

    folder, _ = inputs
    paper = Path(__file__).resolve().parents[1] / "configs" / "paper.yaml"
    res = gd_json("init", "--graph", folder / "graph.zarr", "--clusters", folder / "clusters.zarr",
                  "--out", tmp_path / "P", "--config", paper, "--keep", "3")
    assert {k: v for k, v in res["config"].items() if k != "n_states"} == PRESETS["paper"].as_dict()
    assert res["keep"] == 3


def test_state_from_the_environment_select_default_and_verify_state(state, inputs, tmp_path):
    """GRAPHDIFF_STATE names the STATE for every command (as the integrations honour it), select has a
    default strategy (target), and verify takes --state like the other commands."""
    folder, ids = inputs
    env = {**os.environ, "GRAPHDIFF_STATE": str(state)}
    res = subprocess.run([str(GRAPHDIFF), "status", "--json"], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and json.loads(res.stdout)["state"] == str(state)
    pool = tmp_path / "pool.txt"
    pool.write_text("".join(f"{i}\n" for i in ids[:10]))
    res = subprocess.run([str(GRAPHDIFF), "select", "--candidates", str(pool), "-B", "3", "--out",
                          str(tmp_path / "batch.txt"), "--json"], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["strategy"] == "target"
    res = subprocess.run([str(GRAPHDIFF), "verify", "--json"], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and json.loads(res.stdout)["intact"]
    assert json.loads(gd("verify", "--state", state, "--json").stdout)["intact"]


def test_sigterm_is_an_interruption_exit_130(state, inputs):
    """A scheduler's kill (SIGTERM) ends a command as ctrl-C does: exit 130, kind interrupted, and a write in
    progress is undone (the STATE stays at its step)."""
    folder, _ = inputs
    release = folder.parent / "release-sigterm"
    proc = _spawn_update(state, 1, folder / "o1.jsonl", pause="artifact", release=release)
    _wait_for(Path(f"{release}.reached"), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert json.loads(out)["kind"] == "interrupted"
    assert StateDir.open(state).current_step == 0
    gd("update", "--state", state, "--step", 1, "--outcomes", folder / "o1.jsonl")  # the retry completes


def test_no_help_text_is_cut_when_piped():
    """Help read through a pipe or a log (not a terminal) is 100 columns wide: no option name or word of any
    command's help is cut with an ellipsis (at rich's 80 columns evaluate's were)."""
    names = sorted(c.name for c in app.registered_commands)
    assert {"evaluate", "init", "serve", "update"} <= set(names)
    for name in names:
        res = runner.invoke(app, [name, "--help"])
        assert res.exit_code == 0 and "…" not in res.stdout, name


def test_id_field_for_update_predict_and_select(state, inputs, tmp_path):
    """update, predict, select (and allocate) read the id where embed does: --id-field names a column or a dotted
    path into nested fields (a verl parquet's extra_info.index), by the same reader; a re-send with the same
    --id-field is the no-op, a plain id list with --id-field and a file without that field are refused in one line."""
    import pyarrow as pa

    folder, ids = inputs
    rows = step_rows(ids, 1)
    nested = tmp_path / "o1.parquet"
    pq.write_table(pa.table({"extra_info": [{"index": r["id"], "split": "train"} for r in rows],
                             "n": [r["n"] for r in rows], "s": [r["s"] for r in rows]}), nested)
    res = gd("update", "--state", state, "--step", 1, "--outcomes", nested, "--json", code=1)
    err = json.loads(res.stdout)
    assert err["kind"] == "bad-input" and "missing column 'id'" in err["error"] and "--id-field" in err["error"]
    res = gd_json("update", "--state", state, "--step", 1, "--outcomes", nested, "--id-field", "extra_info.index")
    assert res["step"] == 1 and res["prompts"] == len(rows) and res["successes"] == sum(r["s"] for r in rows)
    assert res["id_field"] == "extra_info.index"
    again = gd_json("update", "--state", state, "--step", 1, "--outcomes", nested, "--id-field", "extra_info.index")
    assert again["noop"] is True
    # a flat column of another name, in JSONL
    flat = tmp_path / "o2.jsonl"
    flat.write_text("".join(json.dumps({"prompt_id": r["id"], "n": r["n"], "s": r["s"]}) + "\n"
                            for r in step_rows(ids, 2)))
    assert gd_json("update", "--state", state, "--step", 2, "--outcomes", flat, "--id-field", "prompt_id")["step"] == 2

    pool = ids[3:15]
    cand = tmp_path / "cand.jsonl"
    cand.write_text("".join(json.dumps({"extra_info": {"index": i}, "prompt": "x"}) + "\n" for i in pool))
    res = gd_json("select", "--state", state, "--candidates", cand, "-B", 4, "--id-field", "extra_info.index",
                  "--out", tmp_path / "chosen.txt")
    assert res["pool"] == len(pool) and set(res["ids"]) <= set(pool)
    txt = tmp_path / "cand.txt"
    txt.write_text("\n".join(pool) + "\n")
    same = gd_json("select", "--state", state, "--candidates", txt, "-B", 4, "--out", tmp_path / "chosen2.txt")
    assert same["ids"] == res["ids"]  # the same pool however its ids are read
    res = gd_json("predict", "--state", state, "--ids", cand, "--id-field", "extra_info.index",
                  "--out", tmp_path / "pred.jsonl")
    assert res["rows"] == len(pool)
    assert [json.loads(x)["id"] for x in (tmp_path / "pred.jsonl").read_text().splitlines()] == pool
    res = gd_json("allocate", "--state", state, "--ids", cand, "--id-field", "extra_info.index", "--budget", 96,
                  "--strategy", "uniform", "--out", tmp_path / "alloc.jsonl")
    assert sorted(res["counts_by_id"]) == sorted(pool)

    # refusals, one line each
    res = gd("select", "--state", state, "--candidates", txt, "-B", 4, "--id-field", "extra_info.index",
             "--out", tmp_path / "c3.txt", code=2)
    assert "plain list of ids" in res.stderr and res.stderr.count("\n") == 1
    res = gd("predict", "--state", state, "--ids", cand, "--id-field", "extra_info.idx",
             "--out", tmp_path / "p2.jsonl", code=1)
    assert "cand.jsonl:1: no 'extra_info.idx' field" in res.stderr and res.stderr.count("\n") == 1
    res = gd("predict", "--state", state, "--id-field", "a..b", "--out", tmp_path / "p3.jsonl", code=2)
    assert "--id-field" in res.stderr and res.stderr.count("\n") == 1
