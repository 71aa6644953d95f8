"""One reader of the trainer adapters' options (verl, verl v1, Trinity-RFT, OpenRLHF).

Each adapter declares its options once, as ``Option``s by name: the default, how a given value is read
(``as_int``, ``as_float``, ``as_flag`` or a checker of its own; None: as given) and, where the trainer passes
settings through the environment, the variable to read. ``read_options`` reads them all from whatever the trainer
hands over: a mapping, a config object (OmegaConf's ``DictConfig``, Trinity's dataclasses; ``get``), or nothing
but the environment; a value it cannot read is refused in one line that names the option the way the user sets it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import InvalidArgumentError

FLAG_WORDS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False,
              "off": False, "none": False}


def get(config, key: str, default=None):
    """``config``'s ``key``: a mapping's item or a config object's attribute; ``default`` when ``config`` is None or
    the value is missing or None."""
    if config is None:
        return default
    try:
        value = config.get(key, default)
    except AttributeError:  # a dataclass or namespace: no get
        value = getattr(config, key, default)
    return default if value is None else value


def as_int(value, name: str) -> int:
    """An integer option ("8" from a string setting or the environment); a bool, a fraction or text refused."""
    try:
        if not isinstance(value, bool) and float(value) == int(float(value)):
            return int(float(value))
    except (TypeError, ValueError, OverflowError):
        pass
    raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")


def as_float(value, name: str) -> float:
    """A finite number option ("0.5" from a string setting or the environment)."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(value, bool) or not math.isfinite(x):
        raise InvalidArgumentError(f"{name} must be a number, got {value!r}")
    return x


def as_flag(value, name: str) -> bool:
    """A true/false option: a bool, or one of ``FLAG_WORDS`` (any case)."""
    if isinstance(value, bool):
        return value
    flag = FLAG_WORDS.get(str(value).strip().lower())
    if flag is None:
        raise InvalidArgumentError(f"{name} must be true or false, got {value!r}")
    return flag


@dataclass(frozen=True)
class Option:
    """One option of an adapter: its ``default``, how a given value is read (``kind(value, name)``; None: as
    given) and the environment variable read when the config does not give it (``env``)."""

    default: object = None
    kind: Callable[[object, str], object] | None = None
    env: str | None = None


def read_options(declared: Mapping[str, Option], config=None, where: Callable[[str], str] = str, *,
                 environ: Mapping[str, str] | None = None) -> dict:
    """Every option of ``declared`` from ``config`` (a mapping or a config object; None: only the environment): the
    value given (None or missing: not given), else a non-empty value of its environment variable, else its
    default; a given value is read by the option's kind, which names it as ``where(name)`` in its error."""
    environ = os.environ if environ is None else environ
    out = {}
    for name, option in declared.items():
        value = get(config, name)
        if (value is None or value == "") and option.env and environ.get(option.env):
            value, label = environ[option.env], option.env
        else:
            label = where(name)
        if value is None:
            out[name] = option.default
        else:
            out[name] = option.kind(value, label) if option.kind is not None else value
    return out
