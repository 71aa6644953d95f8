"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a broken link or anchor, a
page missing from the nav or a docstring mkdocstrings cannot render fails the build. Its reference pages
say what the code says: every command and option of the typer app, every key of the workflow's config
schema and of the estimator's settings, every exit code of graphdiff_cli.errors, State's and Estimator's
public methods. Outside the dated lab notebooks (docs/lab/), no page names an issue number or carries a
dated heading, and no command line in the docs or the README names a command or flag graphdiff lacks."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SCHEMAS = ROOT / "workflow" / "schemas"

# projects graphdiff integrates with: "TRL issue 3708" cites their tracker, not graphdiff's
UPSTREAM = ("TRL", "verl", "OpenRLHF", "Trinity-RFT", "prime-rl", "AReaL", "SkyRL", "NeMo-RL", "slime", "Snakemake",
            "PyTorch", "faiss", "zarr", "typer", "mkdocs")
ISSUE = re.compile(r"(?:(\S+)\s+)?(\bissues?\s+#?\d+|(?<![\w&/#])#\d+\b)", re.I)
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DATE = re.compile(rf"\b20\d\d-\d\d(-\d\d)?\b|\b({MONTHS}|(Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\.?)"
                  rf"\s+(\d{{1,2}},?\s+)?20\d\d\b|\b\d{{1,2}}\s+({MONTHS})\s+20\d\d\b", re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "DISABLE_MKDOCS_2_WARNING": "true", "NO_MKDOCS_2_WARNING": "1"}  # plugins' banners
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    warnings = [line for line in res.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert res.returncode == 0, "\n".join(warnings) or res.stderr[-3000:]
    return out


def _article(site: Path, page: str) -> str:
    """The HTML of a built page's content (no navigation, no table of contents)."""
    text = (site / page / "index.html").read_text(encoding="utf-8") if page else \
        (site / "index.html").read_text(encoding="utf-8")
    return text[text.index("<article"):text.index("</article>")]


def _text(fragment: str) -> str:
    """Visible text of an HTML fragment, whitespace collapsed."""
    fragment = re.sub(r"<(script|style)\b.*?</\1>", " ", fragment, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _pages(site: Path) -> dict[str, str]:
    """Each built page (``reference/cli``, ``lab/results``, ``""`` for the home page) -> its content's HTML."""
    pages = {}
    for p in site.rglob("index.html"):
        rel = p.parent.relative_to(site).as_posix()
        pages["" if rel == "." else rel] = _article(site, "" if rel == "." else rel)
    return pages


def _app():
    from typer.main import get_command

    from graphdiff_cli.cli.app import app

    return get_command(app)


def _opts(command) -> set[str]:
    """Every flag of a click command, --help included."""
    import click

    return {o for p in command.get_params(click.Context(command)) if p.param_type_name == "option"
            for o in (*p.opts, *p.secondary_opts)}


@pytest.mark.slow  # the site's build: about 10 s
def test_the_site_builds_every_page_of_the_nav(site):
    # the nav alone: the rest of mkdocs.yml has a python tag (the toc's slugify) that safe_load refuses
    nav = yaml.safe_load("nav:" + (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1])

    def files(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from files(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from files(value)

    pages = list(files(nav["nav"]))
    assert "reference/cli.md" in pages and "lab/index.md" in pages
    for page in pages:
        built = site / ("index.html" if page == "index.md" else page.removesuffix(".md").removesuffix("/index")
                        + "/index.html")
        assert built.is_file(), f"{page} was not built"
    # every page under docs/ is in the nav (validation.omitted_files is a warning, so --strict refuses it)
    assert {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} == set(pages)


@pytest.mark.slow  # the site's build: about 10 s
def test_the_cli_page_has_every_command_and_exactly_the_options_of_the_step_commands(site):
    group = _app()
    page = _article(site, "reference/cli")
    sections = {_text(m.group(1)).removesuffix("¶").strip(): m.group(2)
                for m in re.finditer(r"<h[23][^>]*>(.*?)</h[23]>(.*?)(?=<h[23]|\Z)", page, re.S)}
    assert {f"graphdiff {name}" for name in group.commands} <= set(sections), \
        sorted({f"graphdiff {name}" for name in group.commands} - set(sections))
    assert _opts(group) <= set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", _text(sections["graphdiff"])))
    for name in ("init", "update", "predict", "select", "allocate", "evaluate", "extend"):
        # the options list of the command's section: each item starts with its flags
        listed = set()
        for item in re.findall(r"<li>(.*?)</li>", sections[f"graphdiff {name}"], re.S):
            head = re.match(r"\s*<code>(.*?)</code>", item, re.S)
            if head:
                listed |= set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", html.unescape(head.group(1))))
        assert listed == _opts(group.commands[name]), (name, listed ^ _opts(group.commands[name]))


def _schema_keys(properties: dict, prefix: str = ""):
    for name, spec in properties.items():
        yield f"{prefix}{name}"
        yield from _schema_keys(spec.get("properties", {}), f"{prefix}{name}.")
        items = spec.get("items")
        if isinstance(items, dict):
            yield from _schema_keys(items.get("properties", {}), f"{prefix}{name}[].")


@pytest.mark.slow  # the site's build: about 10 s
def test_the_config_page_has_every_key_of_both_schemas(site):
    config = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text(encoding="utf-8"))
    estimator = json.loads((SCHEMAS / "estimator.schema.json").read_text(encoding="utf-8"))
    keys = [*_schema_keys(config["properties"]), *_schema_keys(estimator["properties"], "estimator.")]
    assert len(keys) > 100 and "estimator.readout" in keys and "replay.add_prompts[].step" in keys
    shown = set(re.findall(r"<code>([\w.\[\]-]+)</code>", _article(site, "reference/config")))
    assert not [k for k in keys if k not in shown], [k for k in keys if k not in shown]


@pytest.mark.slow  # the site's build: about 10 s
def test_the_exit_code_page_has_every_error_class_with_its_code_and_kind(site):
    from graphdiff_cli import errors

    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", _article(site, "reference/exit-codes"), re.S):
        cells = [_text(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells:
            rows[cells[2] or cells[1]] = cells
    classes = [c for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.GraphdiffError) and c is not errors.GraphdiffError]
    assert len(classes) >= 8
    for cls in classes:
        code, kind = rows[f"graphdiff_cli.errors.{cls.__name__}"][:2]
        assert (int(code), kind) == (cls.exit_code, cls.kind), cls
    assert rows["interrupted"][0] == "130" and rows["internal"][0] == "1"


@pytest.mark.slow  # the site's build: about 10 s
def test_the_api_page_documents_state_and_estimator(site):
    from graphdiff_cli import Estimator, State

    page = _article(site, "reference/api")
    for cls, path in ((State, "graphdiff_cli.state.State"), (Estimator, "graphdiff_cli.estimator.driver.Estimator")):
        public = [n for n, v in vars(cls).items() if not n.startswith("_") and not n.endswith("_")
                  and (callable(v) or isinstance(v, (classmethod, staticmethod, property)))]
        assert len(public) >= 8
        missing = [n for n in public if f'id="{path}.{n}"' not in page]
        assert not missing, (cls.__name__, missing)


def _markdown_sources() -> list[Path]:
    return [ROOT / "README.md", *(p for p in DOCS.rglob("*.md") if "lab" not in p.relative_to(DOCS).parts)]


def _code(text: str) -> list[str]:
    """The fenced blocks and inline code spans of a Markdown text, shell comments and line continuations out."""
    fenced = re.findall(r"```.*?```", text, re.S)
    spans = re.findall(r"`[^`\n]+`", re.sub(r"```.*?```", " ", text, flags=re.S))
    return [re.sub(r"(^|\s)#.*", "", re.sub(r"\\\n\s*", " ", c), flags=re.M) for c in (*fenced, *spans)]


def test_the_docs_command_lines_name_only_commands_and_flags_graphdiff_has():
    group = _app()
    glob = _opts(group)
    stale, checked = [], 0
    for path in _markdown_sources():
        for code in _code(path.read_text(encoding="utf-8")):
            # a command line: graphdiff at a line's start (after a prompt's $), after a path, a pipe, ; or &&
            for m in re.finditer(r"(?:^[ \t]*(?:\$[ \t]*)?|[|;&(][ \t]*|/)graphdiff +([a-z][\w-]*)([^\n|;&)]*)",
                                 code, re.M):
                name, rest = m.groups()
                if name not in group.commands:
                    stale.append(f"{path.relative_to(ROOT)}: graphdiff {name}")
                    continue
                for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest):
                    checked += 1
                    if flag not in _opts(group.commands[name]) | glob:
                        stale.append(f"{path.relative_to(ROOT)}: graphdiff {name} ... {flag}")
    assert checked > 50 and not stale, stale


@pytest.mark.slow  # the site's build: about 10 s
def test_no_issue_numbers_outside_the_lab_notebooks(site):
    texts = {f"site:{page or 'index'}": _text(body) for page, body in _pages(site).items()
             if not page.startswith("lab")}
    texts["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    found = [f"{where}: {m.group(0)}" for where, text in texts.items() for m in ISSUE.finditer(text)
             if (m.group(1) or "").strip("(") not in UPSTREAM]
    assert not found, found


@pytest.mark.slow  # the site's build: about 10 s
def test_no_dated_headings_outside_the_lab_notebooks_and_the_results_page(site):
    assert DATE.search("## The closed-loop grid of 2026-11-24") and DATE.search("### Nov 25, 2026: a re-run")
    assert not DATE.search("## 2,000 prompts in 150 steps")
    dated = [f"{page}: {_text(h)}" for page, body in _pages(site).items()
             if not page.startswith(("lab", "results"))
             for h in re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", body, re.S) if DATE.search(_text(h))]
    assert not dated, dated
