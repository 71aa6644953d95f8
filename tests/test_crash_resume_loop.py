"""A shell trainer loop killed and restarted at random points through 200 steps.

``loop.sh`` below is what a shell trainer runs: it checkpoints every 50 steps (a file holding the step),
and on (re)start resumes from its last checkpoint C with ``graphdiff rollback --to C``, then sends one
``update`` per step and branches only on exit codes (0 applied or a no-op: next step; 5 locked / 130
interrupted: the same step again; anything else: stop). It keeps a ``graphdiff serve`` running for its
calls (started when none answers), so kills land in the loop, in a client, and in the server in the
middle of a write. The harness kills the whole process group with SIGKILL at random moments until the
loop finishes, with no manual step. The STATE must then hold steps 1..200 each applied exactly once from
its own file (the log, and the estimates equal to a clean run's to rounding) and verify intact.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from _handoff_fixtures import GRAPHDIFF, make_inputs
from _tolerances import UPDATE
from graphdiff_cli.io.artifacts import hash_file
from graphdiff_cli.state import State

STEPS, EVERY = 200, 50

LOOP = r"""#!/bin/bash
set -u
G="$1"
# one server for this STATE's calls (refused if one answers already; a stale socket, its server killed,
# is replaced); the loop's calls run in their own process until it listens
( "$G" serve --state "$PWD/STATE" -q >/dev/null 2>&1 & )
ckpt=$(cat ckpt 2>/dev/null || echo 0)
until "$G" rollback --state STATE --to "$ckpt" -q; do   # resume from the trainer's checkpoint
  rc=$?; [ $rc -eq 5 ] || [ $rc -eq 130 ] || exit $rc
done
t=$((ckpt + 1))
while [ $t -le %(steps)d ]; do
  "$G" update --state STATE --step $t --outcomes out/$t.jsonl -q
  rc=$?
  case $rc in
    0) ;;                     # applied, or already applied from these bytes: a no-op
    5|130) continue ;;        # locked or interrupted: the same step again
    *) echo "step $t: exit $rc" >&2; exit $rc ;;
  esac
  if [ $((t %% %(every)d)) -eq 0 ]; then echo $t > ckpt.tmp && mv ckpt.tmp ckpt; fi   # the trainer's checkpoint
  t=$((t + 1))
done
echo done > finished
""" % {"steps": STEPS, "every": EVERY}


def _outcomes(folder, ids):
    rng = np.random.default_rng(3)
    (folder / "out").mkdir()
    for t in range(1, STEPS + 1):
        batch = rng.choice(len(ids), size=8, replace=False)
        s = rng.integers(0, 9, size=8)
        (folder / "out" / f"{t}.jsonl").write_text(
            "".join(json.dumps({"id": ids[i], "n": 8, "s": int(x)}) + "\n" for i, x in zip(batch, s)))


@pytest.mark.skipif(os.name != "posix", reason="a bash loop and process-group kills")
def test_a_killed_and_restarted_shell_loop_applies_every_step_exactly_once(tmp_path):
    graph, clusters, ids = make_inputs(tmp_path, n=40, k_states=4, prefix="p")
    work = tmp_path / "run"
    work.mkdir()
    assert subprocess.run([str(GRAPHDIFF), "init", "--graph", graph, "--clusters", clusters, "--out", "STATE",
                           "-q"], cwd=work).returncode == 0
    _outcomes(work, ids)
    (work / "loop.sh").write_text(LOOP)
    rng = np.random.default_rng(0)
    kills, starts = 0, 0
    deadline = time.monotonic() + 1500
    while not (work / "finished").exists():
        assert time.monotonic() < deadline, f"the loop did not finish ({kills} kills)"
        starts += 1
        proc = subprocess.Popen(["bash", "loop.sh", str(GRAPHDIFF)], cwd=work, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # the first kills come soon (server start-up, rollback, a client mid-update), later ones
        # further apart so that the loop gets past its checkpoints; after 12 kills it runs to the end
        delay = rng.uniform(0.5, 4.0) if kills < 6 else rng.uniform(3.0, 20.0)
        try:
            proc.wait(timeout=delay if kills < 12 else 1200)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
            continue
        finally:
            subprocess.run(["pkill", "-9", "-f", f"serve --state {work}/STATE"])  # a server left behind
        assert proc.returncode == 0, proc.stderr.read()
    assert kills >= 6
    print(f"crash-resume loop: {kills} kills, {starts} starts")  # shown with pytest -s

    st = State.open(work / "STATE")
    assert st.step == STEPS
    applied = [e for e in st.dir.log_entries() if e.get("step", 0) > 0]
    assert [e["step"] for e in applied] == list(range(1, STEPS + 1))  # each once, in order
    for e in applied:
        assert e["outcomes_hash"] == hash_file(work / "out" / f"{e['step']}.jsonl")
    ok = subprocess.run([str(GRAPHDIFF), "verify", "--state", "STATE"], cwd=work, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the estimates are those of a run that was never killed: the same steps, though along another path (other
    # processes, states rolled back and composed from deltas), so to a few float32 ulp (_tolerances.UPDATE), not
    # to the bit; a step applied twice or lost would move them by far more (and the counts exactly)
    clean = State.init(graph, clusters, tmp_path / "CLEAN", durable=False)
    for t in range(1, STEPS + 1):
        clean.update(t, work / "out" / f"{t}.jsonl")
    a, b = st.estimates(st.ids), clean.estimates(st.ids)
    np.testing.assert_array_equal(a["n_seen"], b["n_seen"])
    for key in ("p", "variance", "p_zero_variance"):
        np.testing.assert_allclose(a[key], b[key], **UPDATE, err_msg=key)
