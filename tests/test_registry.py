"""Methods and decision rules register themselves: a new peer is one class, a new rule one function, and
every list of them (evaluate's --methods and report, the counterfactual replay, the config's defaults,
select's and allocate's strategies, the workflow schema) reads the registries."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from _handoff_fixtures import make_inputs, step_rows
from graphdiff_cli.cli.app import app
from graphdiff_cli.core import decisions as dec
from graphdiff_cli.errors import InvalidArgumentError
from graphdiff_cli.evaluation import methods
from graphdiff_cli.evaluation.baselines import HistoryMean, OnlineEstimator
from graphdiff_cli.evaluation.registry import METHODS, register

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_the_registry_lists_the_methods_in_report_order():
    assert methods.METHOD_KEYS == ("graphdiff", "history", "discounted", "mopps", "greso", "vip", "dots", "ridge",
                                   "covariates", "reference", "labelprop", "sbr", "sbs")
    assert methods.ORACLE_KEYS == ("sbr", "sbs")
    assert methods.EMBEDDING_METHODS == ("vip", "dots", "ridge")
    assert methods.COVARIATE_METHODS == ("covariates", "reference")
    assert methods.COUNTERFACTUAL_METHODS == methods.METHOD_KEYS[:-2]
    assert list(methods.DEFAULT_CONFIG["evaluate"]) == ["discounted", "mopps", "greso", "vip", "dots", "ridge",
                                                        "covariates", "reference", "oracles"]
    assert dec.SELECT_STRATEGIES == ("target", "thompson", "skip-zero-variance", "uniform")
    assert dec.ALLOCATE_STRATEGIES == ("uniform", "variance", "vip")


def test_the_workflow_schema_lists_the_registered_methods():
    """workflow/schemas/config.schema.yaml is written by hand: its method lists must be the registry's."""
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())["properties"]
    keys = methods.method_keys()
    ev = schema["evaluate"]["properties"]["methods"]
    assert ev["items"]["enum"] == ["all", *keys]
    assert ev["description"] == f"Methods to compare ({', '.join(keys)}, or all)."
    peers = [k for k in keys if k != "graphdiff" and not METHODS[k].oracle]
    assert schema["grid"]["properties"]["baselines"]["items"]["enum"] == peers


@pytest.fixture
def toy_peer():
    """A peer in a few lines: one class, registered; removed again after the test."""

    @register("toy", help="a constant guess", settings={"guess": 0.25})
    class Toy(HistoryMean):
        def __init__(self, n_nodes, guess):
            super().__init__(n_nodes, name="toy")
            self.guess = guess

        @classmethod
        def build(cls, inputs, settings):
            return [(cls(inputs.n_nodes, float(settings["guess"])), {"method": "toy", **settings})]

        def predict(self, ids):
            return np.full(len(ids), self.guess)

    yield Toy
    del METHODS["toy"]


def test_a_new_peer_is_one_class(toy_peer, tmp_path):
    assert isinstance(toy_peer(3, 0.5), OnlineEstimator)
    assert methods.METHOD_KEYS[-3:] == ("toy", "sbr", "sbs")  # before the oracles
    assert "toy" in methods.COUNTERFACTUAL_METHODS and "toy" not in methods.EMBEDDING_METHODS
    assert methods.DEFAULT_CONFIG["evaluate"]["toy"] == {"guess": 0.25}
    assert methods.parse_methods(["history,toy"]) == ["history", "toy"]
    assert "toy: a constant guess" in methods.methods_help()
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("evaluate:\n  settings:\n    toy: {guess: 0.75}\n")
    cfg = methods.load_config(cfg_file)
    built, described = methods.build_methods(["toy"], cfg, None, None, 1, None, 4)
    assert [m.name for m in built] == ["toy"] and described["toy"] == {"method": "toy", "guess": 0.75}
    (tmp_path / "bad.yaml").write_text("evaluate:\n  settings:\n    toy: {gues: 1}\n")
    with pytest.raises(InvalidArgumentError, match="unknown key evaluate.toy.gues"):
        methods.load_config(tmp_path / "bad.yaml")

    # evaluate end to end: in its report, and driving decisions in the counterfactual replay
    graph, clusters, ids = make_inputs(tmp_path, n=24)
    rows = [{"step": t, **r} for t in range(1, 7) for r in step_rows(ids, t, batch=8)]
    (tmp_path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["evaluate", "--log", str(tmp_path / "log.jsonl"), "--graph", str(graph), "--clusters",
                              str(clusters), "--out", str(tmp_path / "report"), "--methods", "history,toy",
                              "--config", str(cfg_file), "--counterfactual", "--pool-factor", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["methods"] == ["history", "toy"]
    assert out["summary"]["toy"]["mae"] == pytest.approx(np.mean([abs(0.75 - r["s"] / r["n"]) for r in rows]))
    report = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert report["settings"]["toy"] == {"method": "toy", "guess": 0.75}
    chosen_by = {r["estimator"] for r in report["counterfactual"]["selection"]["results"]}
    assert "toy" in chosen_by


@pytest.fixture
def toy_rules():
    """A selection rule and an allocation rule in a few lines each; removed again after the test."""

    @dec.select_rule("lowest-p", "the lowest p first")
    def lowest_p(c, batch_size, rng):
        key = np.asarray(c.p, dtype=np.float64)
        return dec.Selection("lowest-p", np.argsort(key, kind="stable")[:batch_size], key)

    @dec.allocation_rule("all-to-first", "as much as the bounds allow to the first prompts")
    def all_to_first(a):
        x = np.full(a.p.size, float(a.min_count))
        left = a.budget - x.sum()
        for i in range(a.p.size):
            add = min(a.max_count - x[i], left)
            x[i] += add
            left -= add
        return x

    yield
    del dec.SELECT_RULES["lowest-p"], dec.ALLOCATE_RULES["all-to-first"]


def test_a_new_decision_rule_is_one_function(toy_rules):
    from graphdiff_cli.cli.options import rules_help
    from graphdiff_cli.evaluation.counterfactual import selection_replay

    assert dec.SELECT_STRATEGIES[-1] == "lowest-p" and dec.ALLOCATE_STRATEGIES[-1] == "all-to-first"
    assert "lowest-p (the lowest p first)" in rules_help(dec.SELECT_RULES)
    sel = dec.select("lowest-p", 2, p=np.array([0.9, 0.1, 0.5]))
    np.testing.assert_array_equal(sel.chosen, [1, 2])
    np.testing.assert_array_equal(dec.allocate("all-to-first", np.full(3, 0.5), 12, 2, 6), [6, 4, 2])
    with pytest.raises(InvalidArgumentError, match="lowest-p"):  # the refusal lists it among the choices
        dec.select("nearest", 2, p=np.array([0.9, 0.1, 0.5]))
    # the counterfactual replay takes it by name, like the built-in rules
    step, ids = np.repeat([1, 2], 4), np.tile(np.arange(4), 2)
    n, s = np.full(8, 4), np.array([0, 1, 2, 4, 0, 2, 2, 4])
    res = selection_replay(step, ids, n, s, {"history": lambda: HistoryMean(4)}, strategies=("lowest-p",),
                           batch_size=2, pool_factor=2.0)
    assert [r["strategy"] for r in res["results"]] == ["uniform", "oracle", "lowest-p"]


def test_a_state_selects_and_allocates_by_a_registered_rule(toy_rules, tmp_path):
    """The product path (`graphdiff select`/`allocate` on a STATE) dispatches by the registry too."""
    from graphdiff_cli.state import State

    graph, clusters, ids = make_inputs(tmp_path, n=24)
    State.init(graph, clusters, tmp_path / "STATE", device="cpu", durable=False)
    (tmp_path / "cands.txt").write_text("\n".join(ids[:10]) + "\n")
    for args in (["select", "--candidates", str(tmp_path / "cands.txt"), "--batch-size", "3", "--strategy",
                  "lowest-p", "--out", str(tmp_path / "chosen.txt")],
                 ["allocate", "--ids", str(tmp_path / "cands.txt"), "--budget", "40", "--strategy", "all-to-first",
                  "--out", str(tmp_path / "alloc.jsonl")]):
        res = runner.invoke(app, [*args, "--state", str(tmp_path / "STATE")])
        assert res.exit_code == 0, res.output
    assert len((tmp_path / "chosen.txt").read_text().split()) == 3
    counts = [json.loads(line)["n"] for line in (tmp_path / "alloc.jsonl").read_text().splitlines()]
    assert counts == [22] + [2] * 9
