"""What every command shares: output modes, the progress display, the error boundary, and ``@command``.

Results go to stdout (with ``--json`` exactly one JSON object), everything for humans to stderr, so
``2> {log}`` in Snakemake captures logs cleanly. Library exceptions become one line and an exit code
here and nowhere else; ``GRAPHDIFF_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import sys
from dataclasses import dataclass

import typer

from ..errors import GraphdiffError, command_line

# the typer app every command registers on (app.py adds the global options, registers the command
# modules and runs it; defined here so that commands and app.py import this module and not each other)
app = typer.Typer(
    name="graphdiff",
    help="Online graph-based estimates of each RL prompt's success probability under the current policy.",
    no_args_is_help=True,
    add_completion=True,  # graphdiff --install-completion / --show-completion [bash|zsh|fish|powershell]
    pretty_exceptions_enable=False,
)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2

# what an update that used all its rounds says (docs/explanation/estimator.md, "When a step does not converge")
NOT_CONVERGED = ("not converged: committed as reached, the next update goes on from it; init --max-iters 200 "
                 "converges within a step")


@dataclass
class Output:
    """Per-invocation output settings (set by the global options)."""

    json: bool = False
    quiet: bool = False
    verbose: bool = False


OUT = Output()


def stderr_console():
    """rich's console on stderr; lines are never wrapped when stderr is not a terminal (a log file, a pipe:
    rich would otherwise break them at 80 columns)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())


def info(message: str) -> None:
    """A line for humans on stderr (hidden by -q). Messages may use rich markup; user input in them is
    escaped by the caller (``rich.markup.escape``) or the message is plain."""
    if not OUT.quiet:
        stderr_console().print(message)


def warn(message: str) -> None:
    """``graphdiff: warning: ...`` on stderr as one line (hidden by -q; with --json it is in the result too).
    Printed as text, never parsed as rich markup."""
    if not OUT.quiet:
        from rich.text import Text

        stderr_console().print(Text.assemble(("graphdiff: warning: ", "bold yellow"), plain_line(message)),
                               soft_wrap=True)


def debug(message: str) -> None:
    if OUT.verbose and not OUT.quiet:
        stderr_console().print(f"[dim]{message}[/dim]")


def emit(result: dict, human: str | None = None, *, report: bool = False) -> None:
    """Print the command's result: one JSON object on stdout with --json; else the human summary, on stderr
    for commands that act (init, update, ...: their output is a log), on stdout as plain unwrapped text for
    commands whose output *is* the answer (``report=True``: status, verify, check-encoder), so that
    ``graphdiff status --state S | grep step`` works."""
    if OUT.json:
        sys.stdout.write(json.dumps(result, default=_default, sort_keys=True) + "\n")
        sys.stdout.flush()
    elif human is not None and report:
        sys.stdout.write(human.rstrip("\n") + "\n")
        sys.stdout.flush()
    elif human is not None:
        info(human)


def _default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# with stderr not a terminal (Snakemake and SLURM logs), a plain progress line at most this often
def _progress_seconds(default: float = 30.0) -> float:
    try:
        return max(0.0, float(os.environ.get("GRAPHDIFF_PROGRESS_SECONDS", default)))
    except ValueError:  # "30s": not worth failing a command over
        return default


PROGRESS_LOG_SECONDS = _progress_seconds()


def _eta(elapsed: float, done, total) -> str:
    """", ETA 1 min 5 s" from the rate so far, or "" before the first unit of work is done."""
    if not total or not done or done >= total:
        return ""
    left = int(round(elapsed / done * (total - done)))
    return f", ETA {left // 60} min {left % 60} s" if left >= 60 else f", ETA {left} s"


class _LogLines:
    """A progress callback for a log file: a plain line (``embedding prompts: 2048/7500 (27%), 41 s, ETA 1 min
    50 s``) once ``interval`` seconds have passed and then at most every ``interval`` seconds, and the last one
    when the work is done if any was printed before. A command that takes less than ``interval`` prints none: a
    trainer's `update` and `predict` keep their one summary line (or their one error line). ``phase(label)``
    (``stages.progress.phase``) starts a new labelled count with its own clock and ETA (evaluate: the replay,
    then the counterfactual's selection and allocation). A phase with a ``unit`` (embedding: "prompts") starts
    its clock at its first ``(0, total)`` and also prints as soon as its first unit of work is done, with the
    rate: ``embedding 29,095 prompts: 256/29095 (1%), 5 s, 47.2 prompts/s, ETA 10 min 12 s``."""

    def __init__(self, description: str, interval: float):
        import time

        self._clock = time.monotonic
        self.description, self.interval = description, interval
        self.start = self.last = self._clock()
        self.printed, self.finished, self.total = interval <= 0, False, None
        self.unit, self.early = None, False

    def phase(self, label: str, unit: str | None = None) -> None:
        self.description, self.start, self.finished, self.total = label, self._clock(), False, None
        self.unit, self.early = unit, unit is not None

    def __call__(self, done, total=None):
        now = self._clock()
        if self.unit is not None and not done:  # the work starts now (a model was loaded before): its clock too
            self.start = now
        finished = total is not None and done >= total
        if total != self.total or not finished:  # a new count on the same callback (without phase): report it too
            self.finished, self.total = False, total
        if self.finished:
            return
        first = self.early and bool(done) and not finished
        if not (first or now - self.last >= self.interval or (finished and self.printed)):
            return
        self.early = self.early and not first
        self.last, self.printed, self.finished = now, True, finished
        share = f" ({100.0 * done / total:.0f}%)" if total else ""
        elapsed = now - self.start
        rate = f", {done / elapsed:.1f} {self.unit}/s" if self.unit is not None and done and elapsed > 0 else ""
        sys.stderr.write(f"{self.description}: {done}/{total if total is not None else '?'}{share}, "
                         f"{elapsed:.0f} s{rate}{_eta(elapsed, done, total)}\n")
        sys.stderr.flush()


class _RichPhases:
    """The terminal's progress callback: one rich line per label (``phase``), each with its own count, elapsed
    time and ETA; a finished label's line stays (full) above the next one."""

    def __init__(self, bar, description: str):
        self.bar, self.task = bar, bar.add_task(description, total=None)
        self.used = False

    def phase(self, label: str, unit: str | None = None) -> None:
        if not self.used:  # nothing counted under the first label yet: rename it
            self.bar.update(self.task, description=label)
            return
        t = self.bar.tasks[-1]
        if t.total is not None:
            self.bar.update(self.task, completed=t.total)
        self.bar.stop_task(self.task)
        self.task, self.used = self.bar.add_task(label, total=None), False

    def __call__(self, done, total=None):
        self.used = self.used or bool(done) or total is not None
        self.bar.update(self.task, completed=done, total=total)


@contextlib.contextmanager
def progress(description: str):
    """Yield a callback ``update(done, total)`` for a stage's progress: a rich progress bar on a terminal,
    plain lines at most every ``GRAPHDIFF_PROGRESS_SECONDS`` (30) when stderr is a file or a pipe, nothing
    with -q or --json; each with an ETA once a unit of work is done, and ``phase(label)`` (called through
    ``stages.progress.phase``) starts a new labelled line. Stages receive the callback and never import rich."""
    if OUT.quiet or OUT.json:
        yield lambda done, total=None: None
        return
    if not sys.stderr.isatty():
        yield _LogLines(description, PROGRESS_LOG_SECONDS)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=stderr_console(), transient=True) as bar:
        yield _RichPhases(bar, description)


MAX_ERROR_CHARS = 600  # an error line echoes user input (ids, paths, values): cut beyond this


def plain_line(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` as one line of plain text: every run of whitespace (newlines included) one space, and
    beyond ``limit`` characters the middle cut out (the start says what failed, the end how to fix it)."""
    line = " ".join(str(message).split())
    if len(line) > limit:
        half = limit // 2
        line = f"{line[:half]} ...[{len(line) - 2 * half} characters cut]... {line[-half:]}"
    return line


def fail(message: str, code: int = EXIT_ERROR, kind: str = "error") -> None:
    """Print ``graphdiff: error: ...`` on stderr as one line and exit; with --json also ``{"error": ...,
    "exit_code": ..., "kind": ...}`` on stdout, so a pipe into jq gets an object either way (``kind`` is the
    stable name a loop branches on: the table in ``graphdiff_cli.errors``).

    The message is printed as text, never parsed as rich markup: an id or path with ``[/bold]`` in it is
    echoed as it is."""
    from rich.text import Text

    line = plain_line(message)
    if OUT.json:
        sys.stdout.write(json.dumps({"error": line, "exit_code": int(code), "kind": kind}) + "\n")
        sys.stdout.flush()
    stderr_console().print(Text.assemble(("graphdiff: error: ", "bold red"), line), soft_wrap=True)
    raise typer.Exit(code)


def run_guarded(fn, *args, **kwargs):
    """The one error boundary: GraphdiffError -> one line + its exit code; anything else -> exit 1."""
    try:
        with command_line():  # messages name flags and commands, not keywords and calls
            return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except GraphdiffError as exc:
        if os.environ.get("GRAPHDIFF_DEBUG"):
            raise
        fail(str(exc), exc.exit_code, exc.kind)
    except KeyboardInterrupt:
        fail("interrupted (a write in progress either committed or left nothing: send the same call again, a "
             "no-op if it had committed)", 130, "interrupted")
    except Exception as exc:  # noqa: BLE001 - the boundary: no traceback for users unless asked
        if os.environ.get("GRAPHDIFF_DEBUG"):
            raise
        fail(f"{exc.__class__.__name__}: {exc} (set GRAPHDIFF_DEBUG=1 for the traceback)", EXIT_ERROR, "internal")


# The output options: global ones (before the command name, see app.py) and the same on every command
# (``graphdiff embed ... --json``), which add to the global ones.
JSON_OPTION = typer.Option(False, "--json", help="Print exactly one JSON object with the result on stdout.")
QUIET_OPTION = typer.Option(False, "-q", "--quiet", help="Print nothing on stderr but errors.")
VERBOSE_OPTION = typer.Option(False, "-v", "--verbose", help="Print more detail on stderr.")
_SHARED = (("json_out", JSON_OPTION), ("quiet", QUIET_OPTION), ("verbose", VERBOSE_OPTION))


def configure(json_out: bool = False, quiet: bool = False, verbose: bool = False) -> None:
    OUT.json = OUT.json or json_out
    OUT.quiet = OUT.quiet or quiet
    OUT.verbose = OUT.verbose or verbose


def command(name: str, **kwargs):
    """Register ``fn`` as ``graphdiff NAME``: it gets --json/-q/-v and runs inside the error boundary.

    ``fn`` declares only its own options; the wrapper typer sees has those plus the three shared ones
    (appended to its signature), applies them with ``configure``, then calls ``fn`` through
    ``run_guarded``. ``kwargs`` go to ``app.command`` (e.g. ``help=`` instead of the docstring). The short
    help (``graphdiff --help``'s list of commands, shell completion) is the help's first paragraph on one line
    (``short_help``), unless ``kwargs`` give one.
    """

    def decorate(fn):
        sig = inspect.signature(fn, eval_str=True)  # typer gets resolved types, not the strings of PEP 563
        clash = [n for n, _ in _SHARED if n in sig.parameters]
        if clash:
            raise TypeError(f"{fn.__name__}: parameter(s) {clash} are added by @command")
        params = [*sig.parameters.values(),
                  *(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=bool)
                    for n, opt in _SHARED)]

        @functools.wraps(fn)
        def wrapper(*args, json_out: bool = False, quiet: bool = False, verbose: bool = False, **kw):
            configure(json_out, quiet, verbose)
            return run_guarded(fn, *args, **kw)

        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params  # a new dict, not fn's
                                   if p.annotation is not p.empty}
        kwargs.setdefault("short_help", short_help(kwargs.get("help") or fn.__doc__ or ""))
        return app.command(name, **kwargs)(wrapper)

    return decorate


def short_help(text: str) -> str:
    """The first paragraph of a command's help as one line. Without it typer's list of commands keeps the
    docstring's line breaks under rich (a sentence cut into rows mid-way) and shell completion cuts the text
    after 45 characters ("Write per-prompt rollout counts that sum...")."""
    return " ".join(inspect.cleandoc(text).partition("\f")[0].split("\n\n")[0].split())


def run(argv: list[str]) -> int:
    """Run one command line (``argv`` without the program name) and return its exit code: click's usage
    errors (an unknown option, a missing or malformed value) become the same one line as every other error
    (``graphdiff: error: ...``, exit 2) instead of a usage block and a boxed panel. The console script and
    ``graphdiff serve`` (one call per request) both come here; ``app`` has every command once app.py
    registered them."""
    from typer.exceptions import TyperException

    OUT.json = OUT.quiet = OUT.verbose = False  # per command line (a server runs many)
    try:
        code = app(args=list(argv), prog_name="graphdiff", standalone_mode=False)
    except TyperException as exc:  # typer's click: a usage error (unknown option, bad value, missing argument)
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "graphdiff"
        if not exc.format_message().strip():  # `graphdiff` alone: the help was printed, nothing failed
            return getattr(exc, "exit_code", EXIT_USAGE)
        OUT.json = OUT.json or "--json" in argv
        try:
            fail(f"{exc.format_message()} (see {where} --help)", getattr(exc, "exit_code", EXIT_USAGE), "usage")
        except typer.Exit as done:
            return done.exit_code
    except typer.Abort:
        try:
            fail("interrupted", 130, "interrupted")
        except typer.Exit as done:
            return done.exit_code
    return code if isinstance(code, int) else 0
