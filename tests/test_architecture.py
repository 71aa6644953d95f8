"""The layout the docs describe (docs/explanation/architecture.md) is the layout the code has."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "graphdiff_cli"


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_import_contracts_hold():
    """layers, a pure core, no cycles: the contracts of pyproject.toml (also run by scripts/test.sh)."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("lint-imports is not installed (pip install import-linter; the test extra has it)")
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]


def test_no_module_uses_another_modules_private_names():
    """`from .x import _name` and `mod._name` across modules of graphdiff_cli are refused: a name that
    another module needs is made public where it lives (its one home)."""
    offences = []
    for path, tree in _modules():
        rel = path.relative_to(ROOT)
        project_aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("graphdiff_cli")):
                for alias in node.names:
                    if _is_private(alias.name) and alias.name != "_version":
                        offences.append(f"{rel}:{node.lineno}: imports {alias.name} from {node.module or '.'}")
                    project_aliases.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("graphdiff_cli"):
                        project_aliases.add(alias.asname or alias.name.split(".")[0])
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _is_private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in project_aliases):
                offences.append(f"{rel}:{node.lineno}: uses {node.value.id}.{node.attr}")
    assert not offences, "\n".join(offences)


def test_one_group_size_default():
    """A ``group_size`` parameter of graphdiff_cli defaults to ``core.beta.DEFAULT_GROUP_SIZE``, never to a number of
    its own (the rollouts per group where a caller does not say: one default, one place to change it)."""
    offences = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            a = node.args
            positional = a.posonlyargs + a.args
            pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
            pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            offences += [f"{path.relative_to(ROOT)}:{node.lineno}: group_size defaults to {ast.unparse(d)}"
                         for arg, d in pairs if arg.arg == "group_size" and isinstance(d, ast.Constant)
                         and isinstance(d.value, (int, float))]  # None: not given (the trainer's own)
    assert not offences, "\n".join(offences)


def test_benchmarks_use_no_private_names():
    """bench/ and closedloop/ reach graphdiff_cli (and each other) through public names only: no
    `from x import _name`, no `obj._name` on anything but the script's own objects (self, cls). What import-linter
    cannot see, stated here; the one exception is TRL's own trainer hook that the closed loop replaces."""
    allowed = {("closedloop/loop.py", "trainer", "_get_train_sampler")}  # TRL's GRPOTrainer hook, not graphdiff's
    offences = []
    for folder in ("bench", "closedloop"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.ImportFrom):
                    offences += [f"{rel}:{node.lineno}: imports {a.name} from {node.module or '.'}"
                                 for a in node.names if _is_private(a.name)]
                elif (isinstance(node, ast.Attribute) and _is_private(node.attr) and isinstance(node.value, ast.Name)
                      and node.value.id not in ("self", "cls") and (rel, node.value.id, node.attr) not in allowed):
                    offences.append(f"{rel}:{node.lineno}: uses {node.value.id}.{node.attr}")
    assert not offences, "\n".join(offences)


def test_importing_the_core_pulls_in_no_framework():
    code = ("import sys, graphdiff_cli.core.meanfield, graphdiff_cli.core.belief, graphdiff_cli.evaluation.baselines, "
            "graphdiff_cli.core.decisions, graphdiff_cli.evaluation.counterfactual, graphdiff_cli.evaluation.metrics; "
            "print(sorted(m for m in ('torch', 'typer', 'rich', 'zarr', 'faiss', 'pydantic', 'yaml', "
            "'sentence_transformers', 'graphdiff_cli.estimator', 'graphdiff_cli.settings') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_docs_list_every_init_flag():
    """docs/reference/handoff.md's init row names one flag per estimator setting, exactly the ones init has."""
    import re

    from graphdiff_cli.settings import NAMES

    text = (ROOT / "docs" / "reference" / "handoff.md").read_text(encoding="utf-8")
    m = re.search(r"\(one flag per estimator setting: (.*?); `graphdiff settings` lists", text)
    assert m, "docs/reference/handoff.md lost the init row's list of setting flags"
    listed = re.findall(r"`--([a-z-]+)`", m.group(1))
    assert listed == [n.replace("_", "-") for n in NAMES], "regenerate the list from graphdiff_cli.settings.NAMES"


def test_examples_and_integrations_use_only_public_names():
    """What lint-imports checks (pyproject's contracts), stated for a reader: examples import only
    graphdiff_cli, graphdiff_cli.errors and graphdiff_cli.integrations.*; integrations reach a STATE only
    through graphdiff_cli.state."""
    allowed = ("graphdiff_cli", "graphdiff_cli.errors", "graphdiff_cli.integrations")
    for path in sorted((ROOT / "examples").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                if name.startswith("graphdiff_cli"):
                    assert name in allowed or name.startswith("graphdiff_cli.integrations."), f"{path}: {name}"
