"""The estimator-setting flags, generated from ``graphdiff_cli.settings`` (one per setting, same names).

``@with_settings`` adds ``--beta``, ``--schedule``, ... (and ``--preset``) to a command and hands the
given ones to it as ``settings_flags`` (a dict of the flags' text; flags not given are left out), for
``settings.parse_flag`` to read. Help texts are each
setting's description with its value in every preset, so ``--help`` cannot drift from the code.
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional

import typer

from ..settings import NAMES, NULLABLE, PRESET_HELP, PRESETS, EstimatorSettings, show_value
from .options import complete_from


def _option(name: str):
    field = EstimatorSettings.model_fields[name]
    values = "; ".join(f"preset {p}: {show_value(getattr(s, name))}" for p, s in PRESETS.items())
    extra = " Give 'none' for null." if name in NULLABLE else ""
    help_text = f"{field.description}{extra} ({values})"
    # every setting flag is text, read by settings.parse_flag (the one parser of flag text, so "--beta x"
    # and "--window x" are refused alike, in resolve's words); the metavar still says what it takes
    metavar = {float: "<number>", int: "<int>"}.get(field.annotation, "<value>")
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                             default=typer.Option(None, f"--{name.replace('_', '-')}", help=help_text,
                                                  metavar=metavar),
                             annotation=Optional[str])


PRESET_OPTION = typer.Option(None, "--preset", help=f"{PRESET_HELP} (default: default)",
                             autocompletion=complete_from(PRESETS))


def with_settings(fn):
    """Give ``fn`` one flag per estimator setting plus ``--preset``; it receives ``settings_flags``."""
    sig = inspect.signature(fn, eval_str=True)
    own = [p for p in sig.parameters.values() if p.name != "settings_flags"]
    params = [*own, inspect.Parameter("preset", inspect.Parameter.KEYWORD_ONLY, default=PRESET_OPTION,
                                      annotation=Optional[str]),
              *(_option(name) for name in NAMES)]

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        flags = {name: kw.pop(name) for name in ("preset", *NAMES)}
        return fn(*args, **kw, settings_flags={k: v for k, v in flags.items() if v is not None})

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not p.empty}
    return wrapper
