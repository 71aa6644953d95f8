"""scripts/follow_logs.py, which shows the demo's job logs on the terminal while Snakemake runs."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "follow_logs.py"


def test_new_log_lines_are_shown_with_their_job_and_progress_is_thinned(tmp_path):
    logs = tmp_path / "logs"
    (logs / "graph").mkdir(parents=True)
    (logs / "old.log").write_text("from an earlier run\n")
    follower = subprocess.Popen([sys.executable, str(SCRIPT), str(logs), "--every", "60"], stdout=subprocess.PIPE,
                                text=True)
    try:
        time.sleep(1.5)  # it has taken stock of what is there
        with open(logs / "old.log", "a") as f:
            f.write("a new line\n")
        (logs / "graph" / "k30.log").write_text("graph of 20 prompts\nunfinished")
        # five progress lines within --every: only the latest is shown, before the line that follows them; a
        # warning as it comes; the last progress line when the follower stops (one write: one read)
        (logs / "report.log").write_text(
            "".join(f"counterfactual selection (estimator x rule runs): {done}/42 (2%), {done} s, ETA 9 s\n"
                    for done in range(1, 6))
            + "graphdiff: warning: something to see\n"
            + "replaying the log (3 methods, steps): 7/9 (77%), 3 s, ETA 1 s\n")
        time.sleep(2.5)
    finally:
        follower.send_signal(signal.SIGTERM)
        out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0
    lines = out.splitlines()
    assert sorted(lines[:2]) == ["  [graph/k30] graph of 20 prompts", "  [old] a new line"], out  # logs in name order
    assert lines[2:] == [
        "  [report] counterfactual selection (estimator x rule runs): 5/42 (2%), 5 s, ETA 9 s",
        "  [report] graphdiff: warning: something to see",
        "  [report] replaying the log (3 methods, steps): 7/9 (77%), 3 s, ETA 1 s",
    ], out
