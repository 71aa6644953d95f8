#!/usr/bin/env python3
"""Show the workflow's job logs on the terminal while it runs: every ``*.log`` under a folder, each new line
prefixed with the job it comes from (``[report]``, ``[graph/k30]``). scripts/demo.sh runs it beside Snakemake,
whose jobs write their progress to ``logs/<run>/`` only.

    python scripts/follow_logs.py logs/demo [--every 10]

Only what is written after it starts is shown (a rerun job's log starts again from its first line). Progress
lines (``label: 3/42 (7%), ...`` and watch's ``step N <- ...``) are shown at most once per ``--every`` seconds
per log, the latest one; every other line (a warning, an error) as it comes. Stops on SIGTERM or SIGINT
after a last read, or when the process that started it is gone. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from pathlib import Path

PROGRESS = re.compile(r"(: \d+/(\d+|\?)( \(\d+%\))?, )|(^step \d+ <- )")


class Follower:
    def __init__(self, root: Path, every: float):
        self.root, self.every = root, every
        self.offset: dict[Path, int] = {}
        self.rest: dict[Path, bytes] = {}  # an unfinished last line
        self.pending: dict[Path, str] = {}  # the latest progress line not yet shown
        self.shown: dict[Path, float] = {}
        for path in self._logs():  # what is there already is an earlier run's
            self.offset[path] = path.stat().st_size

    def _logs(self) -> list[Path]:
        return sorted(self.root.rglob("*.log")) if self.root.is_dir() else []

    def _name(self, path: Path) -> str:
        return str(path.relative_to(self.root).with_suffix(""))

    def _show(self, path: Path, line: str) -> None:
        print(f"  [{self._name(path)}] {line}", flush=True)
        self.shown[path] = time.monotonic()

    def poll(self, final: bool = False) -> None:
        for path in self._logs():
            try:
                size = path.stat().st_size
                if size < self.offset.get(path, 0):  # the job was run again: its log starts over
                    self.offset[path], self.rest[path] = 0, b""
                with open(path, "rb") as f:
                    f.seek(self.offset.get(path, 0))
                    data = f.read()
            except OSError:
                continue
            self.offset[path] = self.offset.get(path, 0) + len(data)
            *lines, self.rest[path] = (self.rest.get(path, b"") + data).split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r")
                if not line.strip():
                    continue
                if PROGRESS.search(line):
                    self.pending[path] = line
                else:
                    if path in self.pending:  # keep the order: the progress before the line that follows it
                        self._show(path, self.pending.pop(path))
                    self._show(path, line)
            now = time.monotonic()
            if path in self.pending and (final or now - self.shown.get(path, -1e9) >= self.every):
                self._show(path, self.pending.pop(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="the folder of the logs (logs/<run>)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between two progress lines of one log")
    args = ap.parse_args()
    parent = os.getppid()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    follower = Follower(args.root, args.every)
    while not stop and os.getppid() == parent:
        follower.poll()
        time.sleep(1.0)
    follower.poll(final=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
