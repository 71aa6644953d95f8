"""Options that several commands share, declared once (``Annotated`` types: a command writes
``state: StateOption`` or ``lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT``). The global options
(``--json``, ``-q``, ``-v``) are added to every command by ``common.command``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core.beta import DEFAULT_GROUP_SIZE
from ..io.locks import DEFAULT_LOCK_TIMEOUT
from ..io.outcomes import DEFAULT_SUCCESS_THRESHOLD
from ..io.state_dir import DEFAULT_KEEP, DEFAULT_KEEP_EVERY, DEFAULT_SNAPSHOT_EVERY

__all__ = ["complete_from", "rules_help", "CacheDirOption", "NoCacheOption", "IdFieldOption", "StateOption", "LockTimeoutOption", "GroupSizeOption", "SuccessThresholdOption", "KeepOption",
           "KeepEveryOption", "SnapshotEveryOption", "DEFAULT_GROUP_SIZE", "DEFAULT_LOCK_TIMEOUT", "DEFAULT_SUCCESS_THRESHOLD"]

def complete_from(values):
    """Shell completion of an option's values (``autocompletion=``): the ones that start with what is typed.
    ``values``: the values, or a function giving them when completing (a registry's names)."""
    if not callable(values):
        values = tuple(values)
        return lambda incomplete: [v for v in values if v.startswith(incomplete)]
    return lambda incomplete: [v for v in values() if v.startswith(incomplete)]


def rules_help(rules, notes=None) -> str:
    """A --strategy help from the registered decision rules (``core.decisions``' name -> rule with its help line):
    "a (its help), b (its help), or c (its help)."; ``notes``: {name: text added to its help}."""
    notes = notes or {}
    parts = [f"{name} ({rule.help}{'; ' + notes[name] if name in notes else ''})" for name, rule in rules.items()]
    return (", ".join(parts[:-1]) + ", or " + parts[-1] if len(parts) > 1 else "".join(parts)) + "."


StateOption = Annotated[Path, typer.Option("--state", envvar="GRAPHDIFF_STATE",
                                           help="STATE directory (from init).")]
LockTimeoutOption = Annotated[float, typer.Option("--lock-timeout", help="Seconds to wait for another writer "
                                                                       "of this STATE (update, extend, retire, "
                                                                       "rollback) to finish.")]
GroupSizeOption = Annotated[int, typer.Option("--group-size", help="Rollouts per group, for p_zero_variance "
                                                                   "= P(all correct or all wrong).")]
SuccessThresholdOption = Annotated[Optional[float], typer.Option(  # noqa: UP007 - typer reads Optional
    "--success-threshold", help="A rollout with reward >= this is a success. Needed when rewards are not 0/1 "
    "(no default: a file with such rewards is refused without it); binary 0/1 rewards need none.")]
KeepOption = Annotated[Optional[int], typer.Option("--keep", help="How many of the last steps' states are kept "
                                                   f"(older ones are pruned after each update; default {DEFAULT_KEEP}).")]
KeepEveryOption = Annotated[Optional[int], typer.Option("--keep-every", help="Also keep every step that is a "
                                                        "multiple of this (set it to your checkpoint interval, or "
                                                        "a divisor of it; each is written whole; 0: none; default "
                                                        f"{DEFAULT_KEEP_EVERY}).")]
SnapshotEveryOption = Annotated[Optional[int], typer.Option("--snapshot-every", help="An update writes q whole at "
                                                           "every multiple of this (and of --keep-every), else only "
                                                           "its rows that changed; 1: always whole (default "
                                                           f"{DEFAULT_SNAPSHOT_EVERY}).")]
CacheDirOption = Annotated[Optional[Path], typer.Option(  # noqa: UP007 - typer reads Optional
    "--cache-dir", envvar="GRAPHDIFF_CACHE_DIR", show_default=False,
    help="The embedding cache: every text's vector, kept by the encoder's identity (its files' content, the "
    "libraries' versions, the device kind) and the exact text, so no text is embedded twice (default: "
    "$XDG_CACHE_HOME/graphdiff, else ~/.cache/graphdiff). Safe to delete; a damaged file in it is detected, "
    "removed with a warning and its texts embedded again.")]
NoCacheOption = Annotated[bool, typer.Option(
    "--no-cache", help="Embed every text (each distinct text still once), reading and writing no cache.")]
LiveFeaturesOption = Annotated[Optional[Path], typer.Option(  # noqa: UP007 - typer reads Optional
    "--live-features", help="Live features of the candidates observed at this step (rows id, live: a list of "
    "numbers; CSV: separated by spaces), for the live read-out; a candidate without a row gets no live estimate, "
    "an id that is not a candidate is refused.")]
IdFieldOption = Annotated[str, typer.Option("--id-field", help="Column holding the prompt id; a dotted path reads "
                                             "a nested field (extra_info.index in a verl parquet).")]
