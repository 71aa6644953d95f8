"""The generated part of the reference pages, run by mkdocs-gen-files at every `mkdocs build` / `mkdocs serve`.

Each page's prose is its file under docs/reference/; this script appends what the code itself says:

- reference/cli.md: every command, argument and option of the typer app, with its help text (typer's own
  Markdown generator, the one behind `typer ... utils docs`);
- reference/config.md: every key of workflow/schemas/config.schema.yaml and of the estimator's settings
  (workflow/schemas/estimator.schema.json, itself generated from graphdiff_cli/settings.py);
- reference/exit-codes.md: the exit-code table of graphdiff_cli/errors.py, checked against the exception
  classes (a class missing from the table, or a row whose code or kind differs from its class's, fails the
  build).
"""

from __future__ import annotations

import html
import inspect
import json
import re
import sys
from pathlib import Path

import mkdocs_gen_files
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout's graphdiff_cli, also when it is not installed
    sys.path.insert(0, str(ROOT))
SCHEMAS = ROOT / "workflow" / "schemas"


# ---------------------------------------------------------------------------------------------- the CLI

def cli_markdown() -> str:
    """Every command of ``graphdiff`` as Markdown, from the registered typer app (app.py registers them)."""
    import typer
    from typer.cli import MARKUP_MODE_KEY, get_docs_for_click
    from typer.main import get_command

    from graphdiff_cli.cli.app import app

    group = get_command(app)
    ctx = typer.Context(group, info_name="graphdiff", obj={MARKUP_MODE_KEY: app.rich_markup_mode})
    return _literal_stars(get_docs_for_click(obj=group, ctx=ctx, name="graphdiff", indent=1).strip()) + "\n"


def _literal_stars(markdown: str) -> str:
    """Help texts are plain text: a ``*`` in them (``I*ceil(M/N)``) is a character, not emphasis. Escaped
    outside code blocks, code spans and the list markers the generator writes."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith("```"):
            marker, body = ("* ", line[2:]) if line.startswith("* ") else ("", line)
            parts = re.split(r"(`[^`]*`)", body)
            line = marker + "".join(p if p.startswith("`") else p.replace("*", r"\*") for p in parts)
        out.append(line)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------- the config

def _cell(text) -> str:
    """``text`` as one Markdown table cell: no line breaks; outside its `code spans` no raw HTML, emphasis
    markers or brackets; no unescaped pipe anywhere."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(p.replace("|", r"\|") if p.startswith("`") else
                   re.sub(r"([|*\[\]])", r"\\\1", html.escape(p, quote=False)) for p in parts)


def _type(spec: dict) -> str:
    """A schema's type with its constraints, in a few words (``integer ≥ 1``, ``one of a, b``)."""
    if "anyOf" in spec:
        return " or ".join(_type(s) for s in spec["anyOf"])
    if "const" in spec:
        return json.dumps(spec["const"])
    if "enum" in spec:
        return "one of " + ", ".join(json.dumps(v) for v in spec["enum"])
    kind = spec.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    bounds = [f"{sym} {spec[key]}" for key, sym in (("minimum", "≥"), ("exclusiveMinimum", ">"),
                                                    ("maximum", "≤"), ("exclusiveMaximum", "<"))
              if key in spec]
    if kind == "array" and "items" in spec and "properties" not in spec["items"]:
        kind = f"list of ({_type(spec['items'])})"
    if "minItems" in spec:
        bounds.append(f"at least {spec['minItems']} items")
    if "pattern" in spec:
        bounds.append(f"matching `{spec['pattern']}`")
    return ", ".join([kind, *bounds])


def config_rows(properties: dict, prefix: str = ""):
    """(key, type, default, description) of every key under ``properties``, depth first, dotted; the fields of
    a list's items as ``key[].field``."""
    for name, spec in properties.items():
        key = f"{prefix}{name}"
        default = json.dumps(spec["default"]) if "default" in spec else "required"
        yield key, _type(spec), default, spec.get("description", "")
        if "properties" in spec:
            yield from config_rows(spec["properties"], f"{key}.")
        items = spec.get("items")
        if isinstance(items, dict) and "properties" in items:
            yield from config_rows(items["properties"], f"{key}[].")


def _table(rows) -> str:
    lines = ["| key | type | default | what it is |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {_cell(kind)} | `{default}` | {_cell(text)} |" for key, kind, default, text in rows]
    return "\n".join(lines) + "\n"


def config_markdown() -> str:
    """Each top-level section of the workflow config as a table of its keys; the estimator's settings (a
    ``$ref`` to their own schema) as one more table."""
    config = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text(encoding="utf-8"))
    estimator = json.loads((SCHEMAS / "estimator.schema.json").read_text(encoding="utf-8"))
    out = []
    for name, spec in config["properties"].items():
        if "properties" not in spec and "$ref" not in spec:  # a key of its own: its row says it all
            out.append(f"## `{name}`\n\n" + _table(config_rows({name: spec})))
            continue
        out.append(f"## `{name}`\n\n{_cell(spec.get('description', ''))}\n")
        if spec.get("$ref") == "estimator.schema.json":
            out.append(f"{_cell(estimator['description'])} The same keys are `graphdiff init --config`'s and "
                       "`graphdiff evaluate --config`'s `estimator` section; `graphdiff settings` lists them "
                       "with both presets' values.\n")
            out.append(_table(config_rows(estimator["properties"], f"{name}.")))
        else:
            out.append(_table(config_rows(spec["properties"], f"{name}.")))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------- the exit codes

def _error_classes(base) -> list[type]:
    found = []
    for sub in base.__subclasses__():
        if sub.__module__.startswith("graphdiff_cli"):
            found.append(sub)
        found += _error_classes(sub)
    return found


def exit_codes_markdown() -> str:
    """errors.py's table (exit | kind | class | a loop should), each class's row checked against the class and
    given its docstring."""
    from graphdiff_cli import errors

    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in inspect.getdoc(errors).splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    classes = {c.__name__: c for c in _error_classes(errors.GraphdiffError)}
    named = {row[2]: row for row in rows if row[2] in classes}
    missing = sorted(set(classes) - set(named))
    wrong = [f"{name}: table says exit {row[0]} kind {row[1]}, the class {classes[name].exit_code} "
             f"{classes[name].kind}" for name, row in named.items()
             if (int(row[0]), row[1]) != (classes[name].exit_code, classes[name].kind)]
    if missing or wrong:
        raise SystemExit(f"graphdiff_cli/errors.py's exit-code table and its classes differ: missing {missing}, "
                         f"wrong {wrong}")
    out = ["| exit | `kind` | Python class | what it means | a loop should |", "|---|---|---|---|---|"]
    for code, kind, cls, advice in rows:
        if cls in classes:
            doc = inspect.getdoc(classes[cls]).split("\n\n")[0]
            cls_cell = f"`graphdiff_cli.errors.{cls}`"
        else:
            doc, cls_cell = (cls.strip("()") if cls not in ("", "-") else ""), ""
        kind_cell = f"`{kind}`" if kind not in ("", "-") else ""
        out.append(f"| {code} | {kind_cell} | {cls_cell} | {_cell(doc)} | {_cell(advice)} |")
    return "\n".join(out) + "\n"


for page, body in (("reference/cli.md", cli_markdown), ("reference/config.md", config_markdown),
                   ("reference/exit-codes.md", exit_codes_markdown)):
    with mkdocs_gen_files.open(page, "a") as f:
        f.write("\n" + body())
