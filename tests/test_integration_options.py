"""The trainer adapters' one options reader (integrations/options.py) and their one rule of success per reward."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.integrations.options import Option, as_flag, as_float, as_int, get, read_options

DECLARED = {"state": Option(env="GRAPHDIFF_STATE"), "seed": Option(0, as_int), "pool_factor": Option(4.0, as_float),
            "prefilter": Option(True, as_flag)}


@pytest.mark.parametrize("config", [{"seed": "3", "prefilter": "off"}, SimpleNamespace(seed=3, prefilter=False)])
def test_a_mapping_and_a_config_object_read_the_same(config):
    opts = read_options(DECLARED, config, lambda name: f"data.sampler.{name}", environ={})
    assert opts == {"state": None, "seed": 3, "pool_factor": 4.0, "prefilter": False}


def test_the_environment_fills_what_the_config_does_not_give():
    env = {"GRAPHDIFF_STATE": "runs/STATE"}
    assert read_options(DECLARED, None, environ=env)["state"] == "runs/STATE"
    assert read_options(DECLARED, {"state": ""}, environ=env)["state"] == "runs/STATE"
    assert read_options(DECLARED, {"state": "mine"}, environ=env)["state"] == "mine"
    assert read_options(DECLARED, {"state": None}, environ={})["state"] is None


@pytest.mark.parametrize("key, value, message", [
    ("seed", "1.5", "data.sampler.seed must be an integer, got '1.5'"),
    ("seed", True, "data.sampler.seed must be an integer, got True"),
    ("pool_factor", "many", "data.sampler.pool_factor must be a number, got 'many'"),
    ("pool_factor", float("nan"), "data.sampler.pool_factor must be a number, got nan"),
    ("prefilter", "maybe", "data.sampler.prefilter must be true or false, got 'maybe'")])
def test_a_value_that_cannot_be_read_is_refused_in_one_line_naming_the_option(key, value, message):
    with pytest.raises(InvalidArgumentError) as err:
        read_options(DECLARED, {key: value}, lambda name: f"data.sampler.{name}", environ={})
    assert str(err.value) == message


def test_a_bad_success_threshold_of_an_adapter_is_named_by_its_config_key():
    from graphdiff_cli.integrations import verl

    with pytest.raises(InvalidArgumentError) as err:
        read_options(verl.OPTIONS, {"success_threshold": "high"}, lambda name: f"data.sampler.{name}", environ={})
    assert str(err.value) == "data.sampler.success_threshold must be a number, got 'high'"


def test_a_group_has_signal_by_the_outcomes_files_rule_of_success():
    from graphdiff_cli.integrations.dynamic_sampling import has_signal

    assert has_signal([1.0, 0.0, float("nan")], None) and not has_signal([1.0, 1.0], None)
    assert has_signal([0.7, 0.2], 0.5) and not has_signal([0.7, 0.6], 0.5)
    assert not has_signal([1.5, 0.0], None)  # a reward the 0/1 rule refuses is no success


def test_get_reads_mappings_and_objects_and_treats_none_as_not_given():
    assert get({"a": 1}, "a") == 1 and get(SimpleNamespace(a=1), "a") == 1
    assert get(None, "a", 5) == 5 and get({"a": None}, "a", 5) == 5 and get(SimpleNamespace(), "a", 5) == 5


def test_the_integrations_count_success_by_the_outcomes_files_rule(tmp_path):
    """count_outcomes (the trainer integrations) and read_outcomes (graphdiff update) count the same rewards alike:
    both go through io.outcomes.succeeded."""
    from graphdiff_cli.integrations.tracking import count_outcomes
    from graphdiff_cli.io.outcomes import read_outcomes

    rewards = [("a", 0.2), ("a", 0.5), ("b", 0.9), ("b", 0.49)]
    path = tmp_path / "o.jsonl"
    path.write_text("".join(f'{{"id": "{pid}", "reward": {r}}}\n' for pid, r in rewards))
    ids, n, s = count_outcomes([(0, pid, r) for pid, r in rewards], 0.5)
    parsed = read_outcomes(path, success_threshold=0.5)
    assert ids == parsed.ids and n.tolist() == parsed.n.tolist() and s.tolist() == parsed.s.tolist() == [1, 1]
    with pytest.raises(DataError, match="got reward 0.5, not 0 or 1"):
        count_outcomes([(0, "a", 0.5)])
    assert count_outcomes([(0, "a", 1.0), (0, "a", 0.0), (0, "a", True)])[2].tolist() == [2]
