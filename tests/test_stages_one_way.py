"""The handoff flows one way: ``State`` (graphdiff_cli/state.py) holds the lock, reads the estimator and commits;
the stages under graphdiff_cli/stages/ get the parts they need (the estimator, the id index, the parsed input, the
``StateDir``) and never see a ``State`` or its ``Transaction``. The layers contract of pyproject.toml already keeps
the stages from importing graphdiff_cli.state; this holds that no stage takes one in by the back door either: a
parameter named or annotated as a State, or a call back into one (``state.``, ``txn.``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

STAGES = Path(__file__).resolve().parents[1] / "graphdiff_cli" / "stages"
BACK_NAMES = {"state", "st", "txn", "transaction"}
BACK_TYPES = {"State", "Transaction"}


def _modules():
    return sorted(STAGES.glob("*.py"))


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module in ("state", "graphdiff_cli.state") or module.endswith(".state") or (
                    any(a.name in BACK_TYPES for a in node.names)):
                found.append(f"line {node.lineno}: imports {module or '.'}: {[a.name for a in node.names]}")
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name == "graphdiff_cli.state"]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
                if arg.arg in BACK_NAMES:
                    found.append(f"line {node.lineno}: a parameter named {arg.arg!r}")
                if arg.annotation is not None and any(
                        isinstance(n, ast.Name) and n.id in BACK_TYPES or
                        isinstance(n, ast.Constant) and isinstance(n.value, str) and
                        any(t in n.value for t in BACK_TYPES) for n in ast.walk(arg.annotation)):
                    found.append(f"line {node.lineno}: parameter {arg.arg!r} annotated as a State")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in BACK_NAMES:
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_no_stage_takes_or_calls_a_state(path):
    assert _problems(path) == []


def test_the_check_sees_a_state_passed_in(tmp_path):
    """The check itself finds each way back (else the test above could not fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("from ..state import State\n"
                   "def a(state):\n    return state.estimator()\n"
                   "def b(x: 'State', *, y: State = None):\n    return x\n"
                   "def c(est, txn=None):\n    txn.commit_step({})\n", encoding="utf-8")
    problems = _problems(bad)
    assert any("imports ..state" in p or "imports state" in p for p in problems), problems
    assert sum("parameter named" in p for p in problems) == 2
    assert sum("annotated as a State" in p for p in problems) == 2
    assert any("state.estimator" in p for p in problems) and any("txn.commit_step" in p for p in problems)
