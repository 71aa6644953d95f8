"""bench/README.md lists the maintained benchmarks: every script it names is in bench/, every script in bench/ is
named there, and each answers ``--help`` (what the README promises: "`--help` lists its options")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SHARED = {"__init__.py", "common.py"}  # the package marker and the shared helpers: not benchmarks


def _listed() -> list[str]:
    return re.findall(r"^\| `([A-Za-z0-9_]+\.py)` \|", (BENCH / "README.md").read_text(encoding="utf-8"), re.M)


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if p.name not in SHARED)


def test_the_readme_lists_exactly_the_scripts_in_bench():
    listed = _listed()
    assert len(listed) == len(set(listed)), "a script is listed twice"
    assert sorted(listed) == _scripts()


@pytest.mark.slow
@pytest.mark.parametrize("script", _scripts())
def test_each_benchmark_answers_help(script):
    res = subprocess.run([sys.executable, str(BENCH / script), "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.strip(), "--help printed nothing"
