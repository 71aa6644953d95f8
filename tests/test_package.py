"""graphdiff as people install it (``pip install graphdiff-rl``): the wheel and the sdist built from this
checkout hold what they should and say what they are, and the wheel installed on its own runs its command.

The build is offline: ``python -m build --no-isolation`` with the setuptools and build of the test extra (so
nothing is downloaded at test time), on a copy of the checkout (no build/ or egg-info lands in the working tree),
the sdist first and the wheel from the sdist (so the sdist is complete enough to build). The wheel is installed
with ``--no-deps`` into a scratch target: its dependencies are the test environment's own, because installing
torch and the rest again on every CI run is out of reach on the machines CI runs on. So this checks the package,
its metadata and its entry point, not the resolution of its dependencies from the index.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytest.importorskip("build", reason="build is not installed (the test extra brings it)")
from packaging.requirements import Requirement  # noqa: E402  (build depends on packaging)
from packaging.specifiers import SpecifierSet  # noqa: E402

from graphdiff_cli._version import __version__  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME, STEM = "graphdiff-rl", "graphdiff_rl"
# what a checkout holds beside the package that no distribution of it may carry
NOT_COPIED = (".git", ".venv", "artifacts", "logs", ".snakemake", "*.egg-info", "__pycache__", ".hypothesis",
              ".pytest_cache", "build", "dist")
NOT_PACKAGED = ("tests/", "bench/", "artifacts/", "closedloop/", "examples/", "workflow/", "configs/", "scripts/", "results/")

pytestmark = pytest.mark.slow  # a build and an install: ~5 s, a few more on a loaded machine


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The sdist and the wheel of this checkout, built offline from a copy of it."""
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*NOT_COPIED))
    res = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    wheels, sdists = sorted((tmp / "dist").glob("*.whl")), sorted((tmp / "dist").glob("*.tar.gz"))
    assert [p.name for p in wheels] == [f"{STEM}-{__version__}-py3-none-any.whl"]
    assert [p.name for p in sdists] == [f"{STEM}-{__version__}.tar.gz"]
    modules = sorted(p.relative_to(src).as_posix() for p in (src / "graphdiff_cli").rglob("*.py"))
    return {"wheel": wheels[0], "sdist": sdists[0], "modules": modules, "tmp": tmp}


def _metadata(wheel: Path) -> tuple[dict, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = Parser().parsestr(z.read(f"{STEM}-{__version__}.dist-info/METADATA").decode())
        entry = configparser.ConfigParser()
        entry.read_string(z.read(f"{STEM}-{__version__}.dist-info/entry_points.txt").decode())
    return {"meta": meta, "entry_points": entry}, names


def test_the_wheel_says_what_it_is_and_holds_the_package_alone(dists):
    info, names = _metadata(dists["wheel"])
    meta = info["meta"]
    assert meta["Name"] == NAME and meta["Version"] == __version__
    assert SpecifierSet(meta["Requires-Python"]) == SpecifierSet(">=3.10,<3.14")
    assert {f"Programming Language :: Python :: 3.{m}" for m in (10, 11, 12, 13)} <= set(meta.get_all("Classifier"))
    assert meta["License-Expression"] == "Apache-2.0"
    # the command keeps its name: `graphdiff`, from the import package graphdiff_cli
    assert dict(info["entry_points"]["console_scripts"]) == {"graphdiff": "graphdiff_cli.cli.client:main"}
    # every module of the checkout's package, and nothing else of the checkout
    dist_info = f"{STEM}-{__version__}.dist-info/"
    assert sorted(n for n in names if n.endswith(".py")) == dists["modules"]
    assert all(n.startswith(("graphdiff_cli/", dist_info)) for n in names), \
        [n for n in names if not n.startswith(("graphdiff_cli/", dist_info))]
    assert not [n for n in names if n.startswith(NOT_PACKAGED)]
    assert f"{dist_info}licenses/LICENSE" in names


def test_snakemake_and_matplotlib_come_only_with_their_extras(dists):
    meta = _metadata(dists["wheel"])[0]["meta"]
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    base = {r.name for r in reqs if r.marker is None}
    assert {"numpy", "torch", "typer", "zarr"} <= base and not base & {"snakemake", "matplotlib"}

    def extra(name):
        return {r.name for r in reqs if r.marker is not None and r.marker.evaluate({"extra": name})}

    assert set(meta.get_all("Provides-Extra")) >= {"plots", "workflow", "slurm", "all", "test", "gpu", "trl"}
    assert extra("plots") == {"matplotlib"}
    assert "snakemake" in extra("workflow")
    assert {"snakemake", "snakemake-executor-plugin-slurm"} <= extra("slurm")
    assert extra("all") >= extra("plots") | extra("workflow") | extra("slurm")
    # the test extra brings what the suite and this offline build need
    assert {"pytest", "snakemake", "matplotlib", "build", "setuptools"} <= extra("test")


def test_the_sdist_holds_the_sources_and_no_artifacts(dists):
    top = f"{STEM}-{__version__}/"
    with tarfile.open(dists["sdist"]) as t:
        names = [m.name for m in t.getmembers()]
    assert all(n.startswith(top) or n + "/" == top for n in names)
    rel = {n[len(top):] for n in names if n.startswith(top)}
    assert {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO", "graphdiff_cli/_version.py"} <= rel
    assert set(dists["modules"]) <= rel
    assert not [n for n in rel if n.startswith(("artifacts/", "bench/", ".venv/", "logs/", ".git/"))]


def test_the_installed_wheel_runs_its_own_command(dists, tmp_path):
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
                          "--disable-pip-version-check", "--target", str(target), str(dists["wheel"])],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    script = target / "bin" / "graphdiff"
    assert script.is_file()
    # the installed copy first on the path, run from a folder outside the checkout: the editable install of the
    # test environment stays behind it (and gives the dependencies)
    env = {**os.environ, "PYTHONPATH": str(target), "GRAPHDIFF_STATE": ""}
    env.pop("PYTHONHOME", None)

    def run(*args):
        res = subprocess.run([*args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
        return res.stdout

    where = run(sys.executable, "-c", "import graphdiff_cli, graphdiff_cli.cli.client as c; "
                                      "print(graphdiff_cli.__file__); print(c.__file__)").split()
    assert all(Path(p).resolve().is_relative_to(target.resolve()) for p in where), where
    assert run(str(script), "--version").strip() == f"graphdiff {__version__}"
    assert "Usage: graphdiff" in run(str(script), "--help")
    doc = json.loads(run(str(script), "settings", "--json"))
    paper = {s["name"]: s["paper"] for s in doc["settings"]}
    assert doc["presets"] == ["default", "paper"]
    assert paper["beta"] == 2.0 and paper["gamma"] == 0.5 and paper["window"] is None  # Sections 3.3-3.6
