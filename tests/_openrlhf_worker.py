"""The engine side of tests/test_openrlhf_integration.py, in a module of its own so that spawned worker
processes import it without the test module (spawned, not forked: OpenRLHF's engines are processes of
their own, and a fork of a process that runs threads can deadlock)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "openrlhf" / "reward_func.py"
_reward_func = None


def load_reward_func(env: dict) -> None:
    """Pool initializer: what OpenRLHF's SingleTurnAgentExecutor does in each vLLM engine process."""
    global _reward_func
    os.environ.update(env)
    spec = importlib.util.spec_from_file_location("reward_func", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _reward_func = module.reward_func


def call(query: str, prompt: str, label: str) -> float:
    out = _reward_func([query], [prompt], [label])
    return float(out["rewards"][0])
