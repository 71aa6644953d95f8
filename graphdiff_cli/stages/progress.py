"""The one progress type of the stages: ``progress(done, total)`` called as work advances.

The CLI draws it with rich (``cli.common.progress``); the Python API, tests and integrations pass nothing
and get ``no_progress``. A stage may call it with ``done`` alone when the total is unknown.
"""

from __future__ import annotations

from typing import Callable, Optional

Progress = Callable[[int, Optional[int]], None]


def no_progress(done=None, total=None) -> None:
    """The progress listener that ignores every report."""
    return None


def phase(progress: Progress, label: str, unit: str | None = None) -> None:
    """Start a new labelled phase of ``progress`` (its own count, clock and ETA): the CLI's listeners draw one
    line per label; a listener without a ``phase`` method (a plain function) ignores it. ``unit`` (what the count
    counts, "prompts"): the phase's clock starts at its ``progress(0, total)`` (after any loading), and a log
    reports the rate and the time left as soon as the first unit of work is done, then every so often."""
    start = getattr(progress, "phase", None)
    if start is not None:
        start(label, unit=unit)
