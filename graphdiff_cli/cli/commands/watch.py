"""``graphdiff watch``: apply a trainer's per-step outcomes files (and prompt set changes) from an inbox, in step
order, exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..common import NOT_CONVERGED, command, debug, emit, info, warn
from ..options import (DEFAULT_GROUP_SIZE, DEFAULT_LOCK_TIMEOUT, DEFAULT_SUCCESS_THRESHOLD, GroupSizeOption,
                       LockTimeoutOption, StateOption, SuccessThresholdOption)


def _describe(event: dict, once: bool = False, applied: int = 0) -> str | None:
    """The line for one event of the watcher; ``once``: a --once pass, which ends where a watcher would wait
    (``applied``: the steps it applied before)."""
    kind = event["event"]
    if kind == "applied":
        return (f"step {event['step']} <- {event['file']}: {event['prompts']} prompts, "
                f"{event['successes']}/{event['rollouts']} successes, {event['iterations']} rounds "
                f"({'converged' if event['converged'] else NOT_CONVERGED}) in {event['seconds']:.2f} s")
    if kind in ("extended", "retired"):
        return (f"step {event['version']} <- {event['file']}: {event['prompts']} prompts "
                f"{'added' if kind == 'extended' else 'retired'} in {event['seconds']:.2f} s")
    if kind == "predicted":
        return f"  predictions of step {event['step']} -> {event['out']}"
    if kind == "waiting":
        if once:  # the pass ends here: say what it found, not that it waits
            parts = [f"nothing {'more ' if applied else ''}to apply: no file for step {event['next_step']} in the "
                     "inbox"]
            if event["later_steps"]:
                parts.append(f"left for a later run: step(s) {', '.join(map(str, event['later_steps']))} (after "
                             f"step {event['next_step']})")
        else:
            parts = [f"waiting for step {event['next_step']}"]
            if event["later_steps"]:
                parts.append(f"held until then: step(s) {', '.join(map(str, event['later_steps']))}")
        if event["incomplete"]:
            parts.append(f"incomplete (no .done marker): {', '.join(event['incomplete'])}")
        if event["invalid"]:
            parts.append(f"ignored (step 0 is init's): {', '.join(event['invalid'])}")
        return "; ".join(parts)
    if kind == "conflict" and event.get("late"):
        return (f"[yellow]warning:[/yellow] {event['file']} changes the prompts before step {event['step']}, which "
                f"is already applied; left alone. To apply it, graphdiff rollback --to {event['step'] - 1} first.")
    if kind == "conflict":
        return (f"[yellow]warning:[/yellow] {event['file']} is for step {event['step']}, already applied from "
                f"{event['applied_from']} with other bytes (hash {event['applied_hash']}, this file "
                f"{event['hash']}); left alone. To re-apply, graphdiff rollback --to {event['step'] - 1} first.")
    if kind == "vanished":
        return (f"[yellow]warning:[/yellow] {event['file']} (for step {event['step']}) was deleted from the inbox "
                "before it could be read; waiting for it again")
    if kind == "moved":
        return (f"[yellow]warning:[/yellow] another writer moved the STATE to step {event['current']} while "
                f"step {event['step']} was being applied; following CURRENT")
    return None


@command("watch")
def watch(
    state: StateOption,
    inbox: Path = typer.Option(..., "--inbox", help="Folder the trainer writes one outcomes file per step into: "
                               "step-<T>.jsonl|csv|parquet, e.g. step-000012.jsonl."),
    once: bool = typer.Option(False, "--once", help="Apply every step that is ready, then exit (for cron)."),
    poll: float = typer.Option(2.0, "--poll", help="Seconds between looks at the inbox."),
    predictions: Optional[Path] = typer.Option(None, "--predictions", help="Write the predictions table here "
                                               "after each applied step (and at start); '{step}' in the name "
                                               "makes one file per step (e.g. preds-{step}.jsonl)."),
    complete: str = typer.Option("rename", "--complete", help="When a step file is complete: 'rename' (once it "
                                 "exists under its name: write elsewhere, then rename into place) or 'done' "
                                 "(once a marker <file>.done exists beside it)."),
    predict_ids: Optional[Path] = typer.Option(None, "--predict-ids", help="Write predictions only for the ids in "
                                               "this file (one per line, or a table with an id column), read "
                                               "again at every step: the trainer's next candidate pool."),
    until_step: Optional[int] = typer.Option(None, "--until-step", help="Exit once the STATE reaches this step."),
    group_size: GroupSizeOption = DEFAULT_GROUP_SIZE,
    success_threshold: SuccessThresholdOption = DEFAULT_SUCCESS_THRESHOLD,
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT,
):
    """Apply each new outcomes file of an inbox to the STATE in step order, exactly once (safe to kill and restart)."""
    import signal

    from ...state import State

    stopping = []

    def on_signal(signum, frame):  # finish the step in progress, then exit cleanly
        stopping.append(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    applied = []

    def listener(event: dict) -> None:
        if event["event"] == "applied":
            applied.append(event["step"])
        text = _describe(event, once, len(applied))
        if text is None:
            return
        for line in event.get("warnings", ()):
            warn(line)
        if event["event"] in ("predicted", "waiting"):
            debug(text) if event["event"] == "predicted" else info(text)
        else:
            info(text)

    try:
        res = State.open(state).watch(inbox, once=once, poll=poll, predictions=predictions, group_size=group_size,
                        success_threshold=success_threshold, lock_timeout=lock_timeout, complete=complete,
                        until_step=until_step, predict_ids=predict_ids, stop=lambda: bool(stopping),
                        listener=listener)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    emit(res, f"STATE {res['state']} at step {res['step']}: applied {res['n_applied']} step(s) from "
              f"{res['inbox']} ({res['stopped']})"
              + (f"; {len(res['conflicts'])} conflicting file(s) left alone" if res["conflicts"] else ""))
