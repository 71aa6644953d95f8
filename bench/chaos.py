"""Chaos and soak suite: real graphdiff processes killed, raced, starved of disk and fed damaged files.

    .venv/bin/python bench/chaos.py all --trials 10 --soak-steps 5000 --out chaos.json   # everything
    .venv/bin/python bench/chaos.py kill --trials 30                                     # one part

Parts (each a sub-command; ``all`` runs them in this order):

* ``kill``: ``kill -9`` of ``update``, ``rollback``, ``init``, ``predict``, ``extend`` and ``watch`` at a random
  moment (half the trials anywhere in the command's run, half in its last 30%, where the commits are).
  After each kill: ``graphdiff verify`` says intact, the STATE is at the old or the new version (nothing in
  between), the interrupted command run again completes, and the predictions then equal, byte for byte,
  those of a reference STATE that was never interrupted; the next writer leaves no temporary debris.
* ``race``: four ``update`` processes of one step at once (exactly one applies it; each other one is refused in
  one line, or, once the step is in, answers the no-op of the same outcomes sent again: exit 0, ``"noop": true``), and ``predict`` processes reading while updates commit (every read succeeds and equals a
  reference step's predictions: no torn state).
* ``readers``: ``predict``, ``select``, ``allocate``, ``status --json`` and ``verify`` while another process commits
  ``extend`` (3 -> 3.1), ``retire`` (3.1 -> 3.2) and ``rollback --to 3.0`` (3.2 -> 3, removing 3.1 and 3.2): the
  writer held at each point of its commit (the test hook of io.state_dir: model, artifact, log, current, prune;
  a rollback's current, log) while every reader runs, then released or killed there, and free races (the three
  commits back to back beside a loop of readers). Every reader must say what a clean
  run of 3, 3.1 or 3.2 says (the same table bytes, the same status fields, verify intact): the old version
  before CURRENT's rename, the new one from it on; a killed writer's rerun completes.
* ``redeliver``: ``update --outcomes F`` and ``retire --ids F`` while another thread renames one of two versions
  of F over it again and again: the log names the bytes the command applied (their hash) and the predictions
  are a clean run's of that version.
* ``resume``: each integration (bench/_resume_trainer.py: verl <= 0.7's sampler, TRL's callback, OpenRLHF's
  prompt chooser and recorder) run for 6 steps, killed at a random moment and resumed from a random checkpoint
  it wrote against the STATE as the kill left it: a resume goes on only where the STATE is at the checkpoint's
  step, else it is refused in one line (then the STATE is rolled back, or an earlier checkpoint used); at the
  end every step is in the log once and the predictions equal an uninterrupted run's.
* ``big``: ``kill -9`` of ``update`` and ``extend`` on a STATE of ``--big-n`` (150,000) prompts (synthetic
  embeddings, real ``build-graph``, ``cluster``, ``init``), ``--big-trials`` kills each: old or new, intact, the
  rerun's predictions equal a clean run's, and the rerun leaves no temporary debris.
* ``tamper``: every array of the current step and of the model damaged four ways (first chunk deleted,
  truncated, one byte flipped, swapped with the previous step's chunk), plus hand edits of the model's
  config, CURRENT pointed at an older step or outside the STATE, and an emptied log; the attacks that
  pass those checks unless they are held to more: a stamp stripped of its checksums before a chunk swap or
  a config edit, and the current step's folder replaced by a sibling STATE's (same model, other
  outcomes); and when the current step is a delta (its q the rows changed since the step before), the q arrays
  of every step it is composed from damaged three ways, the step before removed, or replaced by a sibling
  STATE's; ``verify``, ``predict`` and ``update`` must each refuse in one line and leave every byte of the
  STATE as it was.
* ``diskfull``: ``update``, ``predict`` and ``extend`` under a file-size limit (RLIMIT_FSIZE, SIGXFSZ
  ignored so writes fail with EFBIG as on a full disk) at several sizes: a one-line error, the STATE intact
  and unchanged, then the same command without the limit completes.
* ``links``: a symbolic link planted where a writer writes (``log.jsonl``, ``CURRENT``, ``retention.json`` and
  ``steps/`` moved outside the STATE with a link left in their place, a dangling ``.lock``, the watcher's lock
  in the inbox pointing at a user's file): ``update``, ``extend``, ``rollback``, ``retention`` and ``watch``
  must each refuse in one line (exit 7) with the STATE and every byte outside it unchanged, and complete once
  the link is gone; ``predict --out`` a link replaces the link and leaves the file it named alone.
* ``serve``: ``graphdiff serve`` and its clients on the server's local Unix socket: connections that stall
  (a client beside them must be answered at once, each stalled one closed in one line after the read timeout),
  malformed requests, requests announcing 400 MB to 2^64 bytes or sending 2 MiB (each refused in one line, the
  server goes on, its peak memory does not move), requests for another STATE or command (``serve``,
  ``rollback``, ``init``, ...: refused, the STATE served goes on), as root an impostor socket of another uid
  (0777, answering ``{"code": 0}``: the client sends it nothing and runs the update itself; ``serve`` says whose
  socket it is), a listener run as another uid behind a file made to look right (only SO_PEERCRED tells), a
  peer of another uid at a real server; a server stopped with SIGSTOP (the client runs the command itself
  within its bound); ``kill -9`` of the server while it runs an update (the client runs it
  itself: old or new, never torn); 80 clients at once (each answered right, one of 10 updates of one step
  applies it). Every exchange is bounded (``SERVE_BOUND`` seconds).
* ``streams``: ``update`` with an outcomes file of ``--stream-mb`` MB (JSONL; CSV at a tenth of it): applied
  with a peak resident memory under ``STREAM_PEAK_MB`` whatever the file's size (the file is parsed as a
  stream), and the same file with an unknown id on its last line refused in one line naming that line, the
  STATE unchanged byte for byte.
* ``soak``: one ``graphdiff watch`` process fed one outcomes file per step for ``--soak-steps`` steps, in
  lockstep like a trainer; its resident memory, the STATE's size and file count and the time per step
  recorded every ``--every`` steps.

Inputs are synthetic clustered embeddings written as real embeddings artifacts (no encoder run: the
encoder is not what is tested), a real ``build-graph``, ``cluster`` and ``init``, and real outcome files.
Prints one JSON object (and writes it to --out); exits 1 if any check failed. Not run by the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
import resource
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
from bench.common import GRAPHDIFF, ROOT, emit, rss_mb, write_outcomes  # noqa: E402
from graphdiff_cli.cli.wire import MAX_REPLY, MessageError, recv_message  # noqa: E402

STEPS = 6  # reference steps
STREAM_PEAK_MB = 400  # streams: an update's peak memory bound, whatever the outcomes file's size (600 prompts)
DEBRIS = (".staging-", ".tmp")
PARTS = ("kill", "race", "readers", "redeliver", "resume", "tamper", "diskfull", "links", "serve", "streams", "big",
         "soak")  # all: in this order


# ---------------------------------------------------------------------------------------------------
# processes and checks


def gd(*argv, check=False, limit_bytes=None, timeout=600) -> subprocess.CompletedProcess:
    """Run one graphdiff command to completion (optionally under a file-size limit)."""
    pre = None
    if limit_bytes is not None:
        def pre():
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    p = subprocess.run([str(GRAPHDIFF), *map(str, argv)], capture_output=True, text=True, preexec_fn=pre,
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"graphdiff {' '.join(map(str, argv))} failed: {p.stderr.strip()}")
    return p


def start(*argv) -> subprocess.Popen:
    return subprocess.Popen([str(GRAPHDIFF), *map(str, argv)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def kill_after(proc: subprocess.Popen, delay: float) -> bool:
    """SIGKILL ``proc`` after ``delay`` seconds; whether it was still running then."""
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return True


def sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def tree_hash(root: Path) -> str:
    """Every name and byte under ``root``; a symbolic link counts as the path it names (never followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        h.update(os.path.relpath(dirpath, root).encode())
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            p = Path(dirpath, name)
            h.update(name.encode())
            h.update(os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
    return h.hexdigest()


def debris(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if any(d in p.name for d in DEBRIS))


# The checks after a trial run in this process, through the same functions the commands call (a process
# start costs ~1 s here); what is killed, raced and starved is always a real graphdiff process.


def version(state: Path) -> tuple[int, int]:
    from graphdiff_cli.io.state_dir import StateDir

    return tuple(StateDir.open(state).current_version())


def intact(state: Path) -> bool:
    from graphdiff_cli.stages.verify import verify

    return bool(verify(state)["intact"])


def one_line(p: subprocess.CompletedProcess) -> bool:
    """A refusal as promised: non-zero exit, exactly one line on stderr, no traceback."""
    err = p.stderr.strip()
    return p.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err


class Tally:
    def __init__(self):
        self.parts: dict[str, dict] = {}
        self.failures: list[str] = []

    def record(self, part: str, case: str, ok: bool, detail: str = "") -> None:
        row = self.parts.setdefault(part, {}).setdefault(case, {"trials": 0, "passed": 0})
        row["trials"] += 1
        row["passed"] += bool(ok)
        if not ok:
            self.failures.append(f"{part}/{case}: {detail}")
            print(f"FAIL {part}/{case}: {detail}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# the world: inputs, a reference run, snapshots


class World:
    def __init__(self, work: Path, n: int, add: int, seed: int = 0):
        from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION
        from graphdiff_cli.io.artifacts import hash_arrays, write_artifact
        from graphdiff_cli.stages.prepare import ids_for_hash

        self.work, self.n = work, n
        rng = np.random.default_rng(seed)
        dim, topics = 32, max(4, n // 20)
        centres = rng.standard_normal((topics, dim)).astype(np.float32)
        x = centres[rng.integers(0, topics, n + add)] + 0.6 * rng.standard_normal((n + add, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        self.ids = [f"p{i:05d}" for i in range(n + add)]
        params = {"model": "bundled", "instruction": DEFAULT_INSTRUCTION, "dim": dim, "batch_size": 64,
                  "shard": None, "id_field": "id", "text_field": "prompt"}
        for name, rows in (("old", np.arange(n)), ("new", np.arange(n, n + add))):
            ids_arr = ids_for_hash([self.ids[i] for i in rows])
            write_artifact(work / f"{name}.zarr", "embeddings",
                           {"ids": ids_arr.astype(object), "embeddings": x[rows],
                            "text_hash": np.asarray([f"{i:016x}" for i in rows], dtype=object)},
                           params=params, inputs={"prompts": "synthetic"}, content_hash=hash_arrays(ids_arr, x[rows]),
                           attrs={"native_dim": dim})
        self.embeddings, self.new = work / "old.zarr", work / "new.zarr"
        self.graph, self.clusters = work / "graph.zarr", work / "clusters.zarr"
        gd("build-graph", self.embeddings, "--out", self.graph, "--k-nn", 10, check=True)
        gd("cluster", self.graph, "--out", self.clusters, "--states", 8, check=True)
        self.outcomes = {}
        batch = max(8, n // 10)
        for t in range(1, STEPS + 2):
            rows = rng.choice(n, batch, replace=False)
            path = work / "outcomes" / f"step-{t:06d}.jsonl"
            path.parent.mkdir(exist_ok=True)
            path.write_text("".join(json.dumps({"id": self.ids[i], "n": 8, "s": int(rng.integers(0, 9))}) + "\n"
                                    for i in rows))
            self.outcomes[t] = path
        # the reference: never interrupted; a snapshot and the predictions' hash after every step
        self.snap = {}
        self.pred = {}
        ref = work / "ref"
        gd("init", "--graph", self.graph, "--clusters", self.clusters, "--embeddings", self.embeddings, "--out", ref,
           "--device", "cpu", check=True)
        self._snapshot(ref, 0)
        for t in range(1, STEPS + 1):
            gd("update", "--state", ref, "--step", t, "--outcomes", self.outcomes[t], check=True)
            self._snapshot(ref, t)
        ext = work / "ref_ext"
        shutil.copytree(self.snap[3], ext)
        gd("extend", "--state", ext, "--embedded", self.new, check=True)
        self.pred_ext = self.predictions(ext)
        self.durations: dict[str, float] = {}

    def _snapshot(self, state: Path, t: int) -> None:
        self.snap[t] = self.work / "snap" / f"{t}"
        shutil.copytree(state, self.snap[t])
        self.pred[t] = self.predictions(state)

    def predictions(self, state: Path) -> str:
        from graphdiff_cli import State

        out = self.work / "ref_pred.jsonl"
        State.open(state).predict(out)
        return sha(out)

    def sibling(self, t: int) -> Path:
        """A STATE of the same model (the same inputs and settings) fed other outcomes for steps 1..t, made once:
        its step folders pass every check of a step but the log's outcomes hash."""
        sib = self.work / "sibling"
        if not sib.exists():
            gd("init", "--graph", self.graph, "--clusters", self.clusters, "--embeddings", self.embeddings, "--out",
               sib, "--device", "cpu", check=True)
            rng = np.random.default_rng(12345)
            for step in range(1, t + 1):
                rows = rng.choice(self.n, max(8, self.n // 10), replace=False)
                path = self.work / "sibling_outcomes" / f"step-{step:06d}.jsonl"
                path.parent.mkdir(exist_ok=True)
                path.write_text("".join(json.dumps({"id": self.ids[i], "n": 8, "s": int(rng.integers(0, 9))}) + "\n"
                                        for i in rows))
                gd("update", "--state", sib, "--step", step, "--outcomes", path, check=True)
        return sib

    def fresh(self, t: int, name: str = "S") -> Path:
        """A copy of the reference STATE after step t, to be damaged."""
        dst = self.work / "trial" / name
        shutil.rmtree(dst, ignore_errors=True)
        dst.parent.mkdir(exist_ok=True)
        shutil.copytree(self.snap[t], dst)
        return dst

    def duration(self, key: str, run) -> float:
        """How long an uninterrupted run of a command takes (measured once, on a scratch copy)."""
        if key not in self.durations:
            t0 = time.perf_counter()
            run()
            self.durations[key] = time.perf_counter() - t0
        return self.durations[key]


def delay(rng: random.Random, d: float) -> float:
    return rng.uniform(0.0, d) if rng.random() < 0.5 else rng.uniform(0.7 * d, d)


# ---------------------------------------------------------------------------------------------------
# parts


def part_kill(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    o = w.outcomes

    def after_writer_check(cmd, s, want_pred, detail=""):
        tally.record("kill", cmd, w.predictions(s) == want_pred and not debris(s.parent) and intact(s),
                     f"{detail} predictions/debris/verify after completion: {debris(s.parent)}")

    # update: step 3 -> 4
    d = w.duration("update", lambda: gd("update", "--state", w.fresh(3), "--step", 4, "--outcomes", o[4], check=True))
    for _ in range(trials):
        s = w.fresh(3)
        killed = kill_after(start("update", "--state", s, "--step", 4, "--outcomes", o[4]), delay(rng, d))
        v = version(s)
        if not (intact(s) and v[0] in (3, 4)):
            tally.record("kill", "update", False, f"after kill: version {v}, intact {intact(s)}")
            continue
        if v[0] == 3:
            gd("update", "--state", s, "--step", 4, "--outcomes", o[4], check=True)
        gd("update", "--state", s, "--step", 5, "--outcomes", o[5], check=True)  # the next writer sweeps
        after_writer_check("update", s, w.pred[5], f"killed={killed} version={v}")

    # rollback: step 6 -> 3, then step 4 replayed
    d = w.duration("rollback", lambda: gd("rollback", "--state", w.fresh(6), "--to", 3, check=True))
    for _ in range(trials):
        s = w.fresh(6)
        kill_after(start("rollback", "--state", s, "--to", 3), delay(rng, d))
        v = version(s)
        if not (intact(s) and v[0] in (3, 6)):
            tally.record("kill", "rollback", False, f"after kill: version {v}")
            continue
        if v[0] == 6:
            gd("rollback", "--state", s, "--to", 3, check=True)
        ok3 = w.predictions(s) == w.pred[3]
        gd("update", "--state", s, "--step", 4, "--outcomes", o[4], check=True)
        tally.record("kill", "rollback", ok3 and w.predictions(s) == w.pred[4] and not debris(s) and intact(s),
                     f"version {v}: rollback then replay not identical, or debris {debris(s)}")

    # init: nothing -> step 0
    def init(s):
        return ["init", "--graph", w.graph, "--clusters", w.clusters, "--embeddings", w.embeddings, "--out", s,
                "--device", "cpu"]

    scratch = w.work / "trial" / "init"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    d = w.duration("init", lambda: gd(*init(scratch / "S"), check=True))
    for i in range(trials):
        folder = w.work / "trial" / f"init{i}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        s = folder / "S"
        kill_after(start(*init(s)), delay(rng, d))
        existed = s.exists()
        if existed and not intact(s):
            tally.record("kill", "init", False, "a half-made STATE is visible under its name")
            continue
        if not existed:
            gd(*init(s), check=True)
        tally.record("kill", "init", w.predictions(s) == w.pred[0] and intact(s)
                     and (existed or not debris(folder)), f"existed={existed} debris {debris(folder)}")
        shutil.rmtree(folder, ignore_errors=True)

    # predict: the table is the old one or the new one, never a part
    d = w.duration("predict", lambda: gd("predict", "--state", w.snap[3], "--out", w.work / "trial" / "p.jsonl",
                                         check=True))
    for _ in range(trials):
        folder = w.work / "trial" / "pred"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        out = folder / "p.jsonl"
        gd("predict", "--state", w.snap[2], "--out", out, check=True)
        kill_after(start("predict", "--state", w.snap[3], "--out", out), delay(rng, d))
        seen = sha(out)
        gd("predict", "--state", w.snap[3], "--out", out, check=True)
        tally.record("kill", "predict", seen in (w.pred[2], w.pred[3]) and sha(out) == w.pred[3]
                     and not debris(folder), f"table after kill is neither version, or debris {debris(folder)}")

    # extend: step 3 -> 3.1
    d = w.duration("extend", lambda: gd("extend", "--state", w.fresh(3), "--embedded", w.new, check=True))
    for _ in range(trials):
        s = w.fresh(3)
        kill_after(start("extend", "--state", s, "--embedded", w.new), delay(rng, d))
        v = version(s)
        if not (intact(s) and v in ((3, 0), (3, 1))):
            tally.record("kill", "extend", False, f"after kill: version {v}")
            continue
        if v == (3, 0):
            gd("extend", "--state", s, "--embedded", w.new, check=True)
        tally.record("kill", "extend", w.predictions(s) == w.pred_ext and intact(s), f"version {v}")

    # watch: steps 1..6 from an inbox, killed and restarted until done; exactly once
    def inbox_for(folder):
        inbox = folder / "inbox"
        inbox.mkdir(parents=True)
        for t in range(1, STEPS + 1):
            shutil.copyfile(o[t], inbox / o[t].name)
        return inbox

    def watch(s, inbox):
        return ["watch", "--state", s, "--inbox", inbox, "--until-step", STEPS, "--poll", 0.05]

    folder = w.work / "trial" / "watch0"
    shutil.rmtree(folder, ignore_errors=True)
    d = w.duration("watch", lambda: gd(*watch(w.fresh(0), inbox_for(folder)), check=True))
    for i in range(trials):
        folder = w.work / "trial" / f"watch{i + 1}"
        shutil.rmtree(folder, ignore_errors=True)
        s, inbox = w.fresh(0), inbox_for(folder)
        kills = 0
        while kill_after(start(*watch(s, inbox)), delay(rng, d)) and kills < 5:
            kills += 1
            if not intact(s):
                break
        if version(s)[0] != STEPS:
            gd(*watch(s, inbox), check=True)
        log = [json.loads(x) for x in (s / "log.jsonl").read_text().splitlines() if x.strip()]
        applied = [r["step"] for r in log if r.get("event", "update") == "update" and r.get("step", 0) > 0]
        tally.record("kill", "watch", applied == list(range(1, STEPS + 1)) and w.predictions(s) == w.pred[STEPS]
                     and intact(s), f"{kills} kills, steps in the log {applied}")


def part_race(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    o = w.outcomes
    for _ in range(trials):
        s = w.fresh(2)
        procs = [subprocess.Popen([str(GRAPHDIFF), "update", "--state", str(s), "--step", "3", "--outcomes",
                                   str(o[3]), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        done = [(p.wait(), p.stdout.read(), p.stderr.read()) for p in procs]

        def noop(out: str) -> bool:  # the same outcomes again once the step is in: exit 0, "noop": true
            try:
                return bool(json.loads(out).get("noop"))
            except (ValueError, AttributeError):
                return False

        wins = sum(code == 0 and not noop(out) for code, out, _ in done)
        others_ok = all((code == 0 and noop(out)) or (code != 0 and len(e.strip().splitlines()) == 1)
                        for code, out, e in done if not (code == 0 and not noop(out)))
        tally.record("race", "4 writers of one step", wins == 1 and others_ok and intact(s)
                     and w.predictions(s) == w.pred[3],
                     f"{wins} applied; {[(c, e.strip()[:120]) for c, _, e in done]}")
    # readers while updates commit
    s = w.fresh(2)
    folder = w.work / "trial" / "readers"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    writer = subprocess.Popen(["bash", "-c", " && ".join(
        f"{GRAPHDIFF} update --state {s} --step {t} --outcomes {o[t]} -q" for t in range(3, STEPS + 1))])
    reads = 0
    good = {w.pred[t] for t in range(2, STEPS + 1)}
    while writer.poll() is None or reads < 2 * trials:
        out = folder / f"r{reads}.jsonl"
        p = gd("predict", "--state", s, "--out", out)
        tally.record("race", "predict during updates", p.returncode == 0 and sha(out) in good,
                     f"exit {p.returncode} {p.stderr.strip()[:200]}")
        reads += 1
        if writer.poll() is not None and reads >= 2 * trials:
            break
    tally.record("race", "updates under concurrent reads", writer.wait() == 0 and w.predictions(s) == w.pred[STEPS],
                 "the writer failed or ended elsewhere")


# ---------------------------------------------------------------------------------------------------
# an input file re-delivered while a command reads it


def part_redeliver(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    """``update --outcomes F`` and ``retire --ids F`` while another thread renames one of two versions of F over
    it again and again (the documented way to replace a file: write aside, rename), so that some reads land
    between two renames. Whichever version a command applied, the log must name that version's bytes (its hash)
    and the predictions must be a clean run's of that version, byte for byte: the old rows under the new
    file's hash (the bug of 2026-11-26) fails here."""
    import threading

    folder = w.work / "trial" / "redeliver"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    a = w.outcomes[4].read_bytes()
    b = "".join(json.dumps({**r, "s": r["n"] - r["s"]}) + "\n"
                for r in map(json.loads, a.decode().splitlines())).encode()
    ids = [json.loads(x)["id"] for x in a.decode().splitlines()]
    cases = {"update": ((a, b), lambda s, f: ("update", "--state", s, "--step", 4, "--outcomes", f), "outcomes_hash"),
             "retire": (("".join(f"{i}\n" for i in ids[:10]).encode(), "".join(f"{i}\n" for i in ids[10:20]).encode()),
                        lambda s, f: ("retire", "--state", s, "--ids", f), "ids_hash")}
    for name, (versions, argv, key) in cases.items():
        ext = ".jsonl" if name == "update" else ".txt"
        want = {}
        for v, data in enumerate(versions):  # a clean run of each version
            s, f = w.fresh(3, f"redeliver_ref_{name}_{v}"), folder / f"ref-{name}-{v}{ext}"
            f.write_bytes(data)
            gd(*argv(s, f), check=True)
            want[hashlib.sha256(data).hexdigest()[:16]] = w.predictions(s)
        if len(set(want.values())) != 2:
            raise RuntimeError(f"redeliver: the two versions of {name}'s file give the same STATE")
        seen = set()
        for i in range(trials):
            s, f = w.fresh(3, f"redeliver_{name}"), folder / f"{name}{ext}"
            f.write_bytes(versions[0])
            stop, swaps = threading.Event(), [0]

            def renamer():
                k = 0
                while not stop.is_set():
                    k += 1
                    tmp = folder / f".{name}-{k}{ext}.tmp"
                    tmp.write_bytes(versions[k % 2])
                    os.replace(tmp, f)
                    swaps[0] += 1
                    time.sleep(rng.uniform(0, 0.002))

            th = threading.Thread(target=renamer)
            th.start()
            p = gd(*argv(s, f))
            stop.set()
            th.join()
            entry = json.loads((s / "log.jsonl").read_text().splitlines()[-1])
            got = entry.get(key)
            seen.add(got)
            tally.record("redeliver", name, p.returncode == 0 and got in want and w.predictions(s) == want[got]
                         and intact(s), f"trial {i}: exit {p.returncode} {p.stderr.strip()[-200:]!r}, logged {got}, "
                         f"{swaps[0]} renames during the command")
        print(f"redeliver {name}: the logged version over {trials} trials: {sorted(map(str, seen))}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------
# each integration's resume


RESUME_STEPS = 6


def part_resume(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    """Each integration (bench/_resume_trainer.py: verl <= 0.7's sampler, TRL's callback, OpenRLHF's chooser and
    recorder) run for 6 steps, killed (-9) at a random moment, then resumed from a random checkpoint it wrote
    against the STATE as the kill left it (ahead of the checkpoint, at it or behind). A resume must go on only
    where the STATE is at the checkpoint's step, and otherwise be refused in one line; refused, the STATE is
    rolled back to the checkpoint (ahead) or the run resumed from the checkpoint at the STATE's step (behind).
    At the end every step 1..6 is in the log exactly once and the predictions equal an uninterrupted run's."""
    driver = [str(ROOT / ".venv" / "bin" / "python"), str(ROOT / "bench" / "_resume_trainer.py")]

    def fresh(name):  # a STATE at step 0 and nothing beside it (the recorder's folder, the outcomes folder)
        s = w.fresh(0, name)
        for side in (".openrlhf", ".outcomes"):
            shutil.rmtree(f"{s}{side}", ignore_errors=True)
        gd("retention", "--state", s, "--keep", 10, check=True)  # every step is a checkpoint: keep them all
        return s

    def run(name, s, ckpt, resume=0, run_id="run-0"):
        return [*driver, name, str(s), str(ckpt), "--steps", str(RESUME_STEPS), "--prompts", str(w.n),
                "--resume", str(resume), "--run", run_id]

    def applied(s):
        log = [json.loads(x) for x in (s / "log.jsonl").read_text().splitlines() if x.strip()]
        return [r["step"] for r in log if r.get("step", 0) > 0 and not r.get("revision")]

    for name in ("verl", "trl", "openrlhf"):
        s, ckpt = fresh(f"resume_{name}_ref"), w.work / "trial" / f"ckpt_{name}_ref"
        shutil.rmtree(ckpt, ignore_errors=True)
        t0 = time.perf_counter()
        p = subprocess.run(run(name, s, ckpt), capture_output=True, text=True)
        d = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"resume: the uninterrupted {name} run failed: {p.stderr.strip()[-400:]}")
        w.durations[f"resume {name}"] = d
        want = w.predictions(s)
        for i in range(trials):
            s, ckpt = fresh(f"resume_{name}"), w.work / "trial" / f"ckpt_{name}"
            shutil.rmtree(ckpt, ignore_errors=True)
            proc = subprocess.Popen(run(name, s, ckpt), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            kill_after(proc, rng.uniform(0.2 * d, d))
            notes, ok, resumes = [], True, 0
            have = sorted(int(f.stem.split("-")[1]) for f in ckpt.glob("ckpt-*.json"))
            c = rng.choice(have) if have else 0
            while resumes < 4:
                resumes += 1
                at = version(s)[0]
                p = subprocess.run(run(name, s, ckpt, c, f"run-{i}-{resumes}"), capture_output=True, text=True)
                if p.returncode == 0:
                    ok = ok and at == c  # it went on: only right where the STATE was at the checkpoint
                    notes.append(f"resumed from {c} with the STATE at {at}")
                    break
                one = p.returncode == 3 and len(p.stderr.strip().splitlines()) == 1 and at != c
                ok = ok and one
                notes.append(f"from {c} with the STATE at {at}: exit {p.returncode} {p.stderr.strip()[-200:]!r}")
                if at > c:
                    gd("rollback", "--state", s, "--to", c, check=True)  # what the refusal says to do
                else:
                    c = max([x for x in have if x <= at] or [0])
                    if c != at:  # no checkpoint of that step: back to one that exists
                        gd("rollback", "--state", s, "--to", c, check=True)
            steps = applied(s)
            tally.record("resume", name, ok and steps == list(range(1, RESUME_STEPS + 1)) and intact(s)
                         and w.predictions(s) == want, f"trial {i}: {'; '.join(notes)}; steps in the log {steps}")


def _chunks(array_dir: Path) -> list[Path]:
    return sorted(p for p in (array_dir / "c").rglob("*") if p.is_file()) if (array_dir / "c").is_dir() else \
        sorted(p for p in array_dir.iterdir() if p.name != "zarr.json")


def part_tamper(w: World, tally: Tally, trials: int, rng: random.Random, only: str | None = None) -> None:
    # the current step: 3, or 2 when 3 was written whole (its deltas' bytes reached its snapshot's), so that the
    # STATE ends in a delta (2 always is one: it follows the snapshot after init)
    t = 3 if (w.snap[3] / "steps/00000003.zarr/q_rows").is_dir() else 2
    base = w.snap[t]
    step_dir = f"steps/{t:08d}.zarr"
    arrays = [f"{step_dir}/{a.name}" for a in sorted((base / step_dir).iterdir()) if a.is_dir()]
    arrays += [f"model.zarr/{a.name}" for a in sorted((base / "model.zarr").iterdir()) if a.is_dir()]

    def delete(s, rel):
        _chunks(s / rel)[0].unlink()

    def truncate(s, rel):
        p = _chunks(s / rel)[0]
        p.write_bytes(p.read_bytes()[: max(0, p.stat().st_size // 2)])

    def flip(s, rel):
        p = _chunks(s / rel)[0]
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x10
        p.write_bytes(bytes(b))

    def swap(s, rel):
        src = s / rel.replace(step_dir, f"steps/{t - 1:08d}.zarr")
        if not src.is_dir():
            raise LookupError("not in the previous step (a delta after a snapshot)")
        a, b = _chunks(src), _chunks(s / rel)
        if not a or not b or a[0].read_bytes() == b[0].read_bytes():
            raise LookupError("identical in both steps")
        shutil.copyfile(a[0], b[0])

    # a delta's q is composed from the steps before it, to its snapshot: their q arrays are read as its own
    chain, cur = [], base / step_dir
    while (cur / "q_rows").is_dir():
        cur = (cur / json.loads((cur / "zarr.json").read_text())["attributes"]["base"]).resolve()
        chain.append(f"steps/{cur.name}")
    arrays += [f"{d}/{a}" for d in chain for a in ("q", "q_rows", "q_values") if (base / d / a).is_dir()]
    cases = []
    for rel in arrays:
        if not _chunks(base / rel):
            continue
        cases += [(f"{rel}: chunk deleted", lambda s, r=rel: delete(s, r)),
                  (f"{rel}: chunk truncated", lambda s, r=rel: truncate(s, r)),
                  (f"{rel}: byte flipped", lambda s, r=rel: flip(s, r))]
        if rel.startswith(step_dir):
            cases.append((f"{rel}: chunk from the previous step", lambda s, r=rel: swap(s, r)))

    def edit_config(s):
        meta = s / "model.zarr" / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["attributes"]["config"]["beta"] = float(doc["attributes"]["config"].get("beta", 1.0)) + 1.0
        meta.write_text(json.dumps(doc))

    def current_to(path):
        def tamper(s):
            doc = json.loads((s / "CURRENT").read_text())
            doc["path"] = path
            (s / "CURRENT").write_text(json.dumps(doc))
        return tamper

    def current_older(s):
        (s / "CURRENT").write_text(json.dumps({"step": t - 1, "path": f"steps/{t - 1:08d}.zarr"}))

    def strip_stamp(s, rel):  # an attacker who knows the format removes the checks first
        meta = s / rel / "zarr.json"
        doc = json.loads(meta.read_text())
        del doc["attributes"]["graphdiff"]["checksums"], doc["attributes"]["graphdiff"]["attrs_hash"]
        meta.write_text(json.dumps(doc))

    def from_sibling(s):  # the same model's step t, its own checksums intact, made from other outcomes
        shutil.rmtree(s / step_dir)
        shutil.copytree(w.sibling(t) / step_dir, s / step_dir)

    cases += [("model config.beta edited", edit_config),
              ("CURRENT points outside the STATE", current_to("../../../../etc")),
              ("log.jsonl emptied", lambda s: (s / "log.jsonl").write_text("")),
              ("CURRENT names an older step", current_older),
              ("step stamp stripped, then a byte of q_values flipped" if chain else
               "step stamp stripped, then q chunk from the previous step",
               lambda s: (strip_stamp(s, step_dir),
                          flip(s, f"{step_dir}/q_values") if chain else swap(s, f"{step_dir}/q"))),
              ("model stamp stripped, then config.beta edited",
               lambda s: (strip_stamp(s, "model.zarr"), edit_config(s))),
              ("step folder from a sibling STATE", from_sibling)]
    if chain:  # the step the current delta was made from: removed, or a sibling STATE's in its place
        def base_from_sibling(s):
            shutil.rmtree(s / chain[0])
            shutil.copytree(w.sibling(t) / chain[0], s / chain[0])

        cases += [("the current delta's base step removed", lambda s: shutil.rmtree(s / chain[0])),
                  ("the current delta's base step from a sibling STATE", base_from_sibling)]
    # who must refuse: the kNN lists are read only by extend (predict and update never read them, so their
    # estimates stay right); every other array by predict and update; verify checks everything
    only_extend = ("model.zarr/knn_indices", "model.zarr/knn_similarities")
    for name, tamper in cases:
        if only and not any(o in name for o in only.split(",")):
            continue
        s = w.fresh(t)
        try:
            tamper(s)
        except LookupError:
            continue  # an array whose content did not change between the steps: no swap to make
        before = tree_hash(s)
        readers = {"verify": ("verify", s),
                   "predict": ("predict", "--state", s, "--out", w.work / "trial" / "t.jsonl"),
                   "update": ("update", "--state", s, "--step", t + 1, "--outcomes", w.outcomes[t + 1]),
                   "extend": ("extend", "--state", s, "--embedded", w.new)}
        if name.startswith(only_extend):
            readers = {k: readers[k] for k in ("verify", "extend")}
        elif name != "CURRENT names an older step":
            del readers["extend"]
        tally.parts.setdefault("tamper", {}).setdefault("cases", []).append(name)
        for reader, argv in readers.items():
            p = gd(*argv)
            if name == "CURRENT names an older step":
                # indistinguishable from an update killed after its step folder and log line but before
                # CURRENT (handoff.md, invariant 2): every reader must see step t - 1, the same one
                if reader == "verify":
                    ok = p.returncode == 0 and "above CURRENT" in p.stdout + p.stderr
                elif reader == "predict":
                    ok = p.returncode == 0 and sha(w.work / "trial" / "t.jsonl") == w.pred[t - 1]
                else:
                    ok = one_line(p)  # update --step t + 1 is not the next step of t - 1; extend: see below
                    if reader == "extend":
                        ok = p.returncode == 0 and version(s) == (t - 1, 1)
                        before = tree_hash(s)
                tally.record("tamper", f"{reader} (older CURRENT)", ok and tree_hash(s) == before,
                             f"{name}: exit {p.returncode}, {p.stderr.strip()[:300]!r}")
                continue
            ok = one_line(p) if reader != "verify" else (p.returncode != 0 and "Traceback" not in p.stderr)
            tally.record("tamper", reader, ok and tree_hash(s) == before,
                         f"{name}: exit {p.returncode}, {p.stderr.strip()[:300]!r}")


def part_diskfull(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    o = w.outcomes
    step_bytes = sum(f.stat().st_size for f in (w.snap[3] / "steps" / f"{3:08d}.zarr").rglob("*") if f.is_file())
    limits = [0, 512, 4096, step_bytes // 8, step_bytes // 2]
    commands = {"update": lambda s: ("update", "--state", s, "--step", 4, "--outcomes", o[4]),
                "extend": lambda s: ("extend", "--state", s, "--embedded", w.new),
                "predict": lambda s: ("predict", "--state", s, "--out", w.work / "trial" / "full.jsonl")}
    for name, argv in commands.items():
        for limit in limits:
            s = w.fresh(3)
            before = tree_hash(s)
            p = gd(*argv(s), limit_bytes=limit)
            if p.returncode == 0:
                continue  # fitted under this limit (predict's table is small): nothing to check
            unchanged = tree_hash(s) == before or (intact(s) and version(s) == (3, 0))
            ok = one_line(p) and unchanged
            gd(*argv(s), check=True)  # and without the limit it completes
            tally.record("diskfull", name, ok and intact(s) and not debris(s.parent),
                         f"limit {limit} B: exit {p.returncode} {p.stderr.strip()[:200]!r}, unchanged {unchanged}")


def part_links(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    o = w.outcomes
    outside = w.work / "trial" / "outside"  # what a planted link points to: a user's files, never to be touched

    def moved_out(name):  # the STATE's own file or folder moved outside, a link left in its place
        def plant(s):
            os.replace(s / name, outside / name)
            os.symlink(outside / name, s / name)

        def undo(s):
            os.unlink(s / name)
            os.replace(outside / name, s / name)
        return plant, undo

    def dangling(name):  # a link to nothing: following it would create a file outside
        def plant(s):
            os.unlink(s / name)
            os.symlink(outside / name, s / name)
        return plant, lambda s: os.unlink(s / name)

    def fresh_outside():
        shutil.rmtree(outside, ignore_errors=True)
        outside.mkdir(parents=True)
        (outside / "user.txt").write_text("a user's file\n")

    writers = {"update": lambda s: ("update", "--state", s, "--step", 4, "--outcomes", o[4]),
               "extend": lambda s: ("extend", "--state", s, "--embedded", w.new),
               "rollback": lambda s: ("rollback", "--state", s, "--to", 2),
               "retention": lambda s: ("retention", "--state", s, "--keep", 3)}
    cases = [(name.rstrip("/"), name, *moved_out(name.rstrip("/")))
             for name in ("log.jsonl", "CURRENT", "retention.json", "steps/")]
    cases.append((".lock", ".lock (dangling)", *dangling(".lock")))
    for entry, case, plant, undo in cases:
        for writer, argv in writers.items():
            s = w.fresh(3)
            fresh_outside()
            plant(s)
            before, before_out = tree_hash(s), tree_hash(outside)
            p = gd(*argv(s))
            ok = one_line(p) and p.returncode == 7 and "symbolic link" in p.stderr
            same = tree_hash(s) == before and tree_hash(outside) == before_out
            undo(s)
            completes = p.returncode == 0 or gd(*argv(s)).returncode == 0  # without the link it completes
            tally.record("links", f"{writer}: {case}", ok and same and completes and intact(s) and not debris(s),
                         f"exit {p.returncode} {p.stderr.strip()[:200]!r}, unchanged {same}, completes {completes}")

    # the watcher's lock in its inbox pointing at a user's file (it used to be truncated to the watcher's pid)
    s = w.fresh(3)
    fresh_outside()
    inbox = w.work / "trial" / "links_inbox"
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    shutil.copyfile(o[4], inbox / o[4].name)
    os.symlink(outside / "user.txt", inbox / ".graphdiff-watch.lock")
    before, before_out = tree_hash(s), tree_hash(outside)
    p = gd("watch", "--state", s, "--inbox", inbox, "--once")
    ok = one_line(p) and p.returncode == 7 and tree_hash(s) == before and tree_hash(outside) == before_out
    os.unlink(inbox / ".graphdiff-watch.lock")
    gd("watch", "--state", s, "--inbox", inbox, "--once")
    tally.record("links", "watch: inbox lock", ok and version(s) == (4, 0) and intact(s),
                 f"exit {p.returncode} {p.stderr.strip()[:200]!r}")

    # predict --out a link: the table replaces the link (an atomic rename), the file it named is left alone
    fresh_outside()
    out = w.work / "trial" / "links_pred.jsonl"
    out.unlink(missing_ok=True)
    os.symlink(outside / "user.txt", out)
    p = gd("predict", "--state", w.snap[3], "--out", out)
    tally.record("links", "predict: --out a link", p.returncode == 0 and not out.is_symlink()
                 and sha(out) == w.pred[3] and (outside / "user.txt").read_text() == "a user's file\n",
                 f"exit {p.returncode} {p.stderr.strip()[:200]!r}")


# ---------------------------------------------------------------------------------------------------
# graphdiff serve under attack: local Unix sockets only

SERVE_BOUND = 30.0  # seconds any one exchange or client may take before its check fails
NOBODY = 65534


def _frame(body) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return struct.pack(">Q", len(data)) + data


def _frames(sock: socket.socket, timeout: float = SERVE_BOUND) -> list:
    """What the server sends on ``sock`` until its final frame (one with ``code``), the close or ``timeout``."""
    out, deadline = [], time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return out + ["timeout"]
        try:
            frame = recv_message(sock, MAX_REPLY, left)  # the client's own reader of a frame
        except socket.timeout:
            return out + ["timeout"]
        except (OSError, MessageError):
            return out
        if frame is None:
            return out
        out.append(frame)
        if "code" in frame:
            return out


def _ask(path: Path, raw: bytes, timeout: float = SERVE_BOUND, close_write: bool = False) -> list:
    """Send ``raw`` on a new connection to ``path`` (then end the sending side, with ``close_write``); the
    frames back."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
        with contextlib.suppress(OSError):  # refused from its length: the rest may not be taken
            sock.sendall(raw)
            if close_write:
                sock.shutdown(socket.SHUT_WR)
        return _frames(sock, timeout)
    except OSError as exc:
        return [f"connect: {exc}"]
    finally:
        sock.close()


def _refused(frames: list) -> bool:
    """A refusal as promised: a final frame with a non-zero code and one error line."""
    if not frames or not isinstance(frames[-1], dict) or not frames[-1].get("code"):
        return False
    lines = frames[-1].get("stderr", "").splitlines()
    return len(lines) == 1 and lines[0].startswith("graphdiff: error: ")


def _json(text: str, default=None):
    """``text`` parsed as JSON, or ``default`` ({}) when it is not JSON (a client that printed nothing)."""
    try:
        return json.loads(text)
    except ValueError:
        return {} if default is None else default


def _vmhwm_mb(pid: int) -> float:
    """The peak resident memory of process ``pid`` (nan once it is gone)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Server:
    """``graphdiff serve --state s`` as a real process, up once its socket answers."""

    def __init__(self, s: Path):
        from graphdiff_cli.cli.wire import socket_path

        self.s, self.path = s, socket_path(s)
        self.proc = subprocess.Popen([str(GRAPHDIFF), "serve", "--state", str(s)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        ready, _, _ = select.select([self.proc.stderr], [], [], 120)
        first = self.proc.stderr.readline() if ready else ""
        if not first.startswith("serving STATE"):
            self.proc.kill()
            raise RuntimeError(f"graphdiff serve did not start: {first!r} {self.proc.communicate()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> tuple[int | None, str]:
        """One SIGTERM; the exit code (None: still running after ``timeout``, then killed) and its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=timeout)
            return self.proc.returncode, err
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()
            return None, ""


def _client(*argv, cwd=None, env=None, timeout: float = SERVE_BOUND) -> subprocess.CompletedProcess | None:
    """A `graphdiff` client call (through the socket when a server answers); None when it ran past ``timeout``."""
    try:
        return subprocess.run([str(GRAPHDIFF), *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                              env={**os.environ, **(env or {})}, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def part_serve(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    """``graphdiff serve`` and its clients attacked on its local Unix socket: stalled, malformed, huge,
    wrong-STATE and other-uid connections, an impostor socket, ``kill -9`` of the server mid-update, and 80
    clients at once. Each exchange is bounded by SERVE_BOUND seconds."""
    o = w.outcomes
    status = ("--json", "status", "--state")

    def answered(p, step):  # a client call the server answered: its result, and nothing else said
        return p is not None and p.returncode == 0 and _json(p.stdout).get("step") == step and p.stderr == ""

    # stalled connections: 3 bytes of a header, a header and no body, nothing at all
    s = w.fresh(3, "served")
    srv = Server(s)
    try:
        for trial in range(trials):
            stalled = []
            for raw in (b"\x00\x00\x00", struct.pack(">Q", 100), b""):
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.connect(str(srv.path))
                c.sendall(raw)
                stalled.append(c)
            t0 = time.monotonic()
            p = _client(*status, s)
            took = time.monotonic() - t0
            tally.record("serve", "stalled: a client beside 3 stalled connections is answered", answered(p, 3)
                         and took < 10, f"{took:.1f} s, {p and (p.returncode, p.stderr.strip()[:200])}")
            for c in stalled:
                frames = _frames(c)
                c.close()
                tally.record("serve", "stalled: the connection is closed in one line", _refused(frames),
                             f"{frames[-1:]}")

        # malformed requests: each refused on its own connection, the server goes on
        good = {"v": 2, "argv": ["status", "--state", str(s)], "cwd": str(s.parent), "env": {}}
        malformed = {
            "a JSON list": _frame([1, 2]), "cwd null": _frame({**good, "cwd": None}),
            "env a list": _frame({**good, "env": ["x"]}),
            "env value with NUL": _frame({**good, "env": {"GRAPHDIFF_DEBUG": "a\x00b"}}),
            "env of a variable not read": _frame({**good, "env": {"LD_PRELOAD": "/x.so"}}),
            "argv a string": _frame({**good, "argv": "status"}), "argv of numbers": _frame({**good, "argv": [1]}),
            "argv with NUL": _frame({**good, "argv": ["status", "--state", "S\x00"]}),
            "cwd relative": _frame({**good, "cwd": "x"}), "no argv": _frame({"v": 2, "cwd": "/", "env": {}}),
            "no version": _frame({k: v for k, v in good.items() if k != "v"}),
            "not JSON": _frame(b"\xff\xfe{"), "nested 200,000 deep": _frame(b"[" * 200_000), "empty": _frame(b""),
            "a header cut short then closed": b"\x00\x00\x01",
        }
        for case, raw in malformed.items():
            frames = _ask(srv.path, raw, close_write=case.endswith("closed"))
            ok = _refused(frames) and srv.alive()
            tally.record("serve", f"malformed: {case}", ok, f"{frames[-1:]}")
        tally.record("serve", "malformed: still serving", answered(_client(*status, s), 3) and srv.alive(), "")

        # huge: refused from the announced length; the server's peak memory does not move
        before = _vmhwm_mb(srv.proc.pid)
        huge = {"400 MB announced": struct.pack(">Q", 400_000_000) + b"{" * 65536,
                "1 GiB announced": struct.pack(">Q", 1 << 30), "2^64 - 1 announced": struct.pack(">Q", (1 << 64) - 1),
                "2 MiB sent": _frame({**good, "argv": ["status", "x" * (2 << 20)]})}
        for case, raw in huge.items():
            t0 = time.monotonic()
            frames = _ask(srv.path, raw)
            tally.record("serve", f"huge: {case}", _refused(frames) and time.monotonic() - t0 < 10 and srv.alive(),
                         f"{frames[-1:]}")
        grew = _vmhwm_mb(srv.proc.pid) - before
        tally.record("serve", "huge: the server's peak memory grew < 32 MB", grew < 32, f"{grew:.1f} MB")

        # other STATEs and commands: refused, the served STATE goes on being served
        other = w.fresh(2, "other")
        from graphdiff_cli.cli.wire import socket_path

        wrong = {"serve S2": (["serve", "--state", str(other)], {}),
                 "status --state S2": (["status", "--state", str(other)], {}),
                 "status --state=S2": (["status", f"--state={other}"], {}),
                 "--state S then S2": (["status", "--state", str(s), "--state", str(other)], {}),
                 "GRAPHDIFF_STATE=S2": (["status"], {"GRAPHDIFF_STATE": str(other)}),
                 "rollback": (["rollback", "--state", str(s), "--to", "1"], {}),
                 "init": (["init", "--graph", str(w.graph), "--clusters", str(w.clusters), "--out", str(other) + "x"],
                          {}),
                 "watch": (["watch", "--state", str(s), "--inbox", str(s.parent)], {})}
        for case, (argv, env) in wrong.items():
            frames = _ask(srv.path, _frame({**good, "argv": argv, "env": env}))
            tally.record("serve", f"wrong STATE or command: {case}", _refused(frames) and srv.alive()
                         and not socket_path(other).exists() and version(s) == (3, 0), f"{frames[-1:]}")
        tally.record("serve", "wrong STATE or command: still serving its STATE",
                     answered(_client(*status, s), 3) and srv.alive() and intact(other)
                     and version(other) == (2, 0), "")

        # a stopped server (SIGSTOP: its socket takes the connection, nobody reads it): the client does not wait
        os.killpg(srv.proc.pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            p = _client(*status, s)
            took = time.monotonic() - t0
        finally:
            os.killpg(srv.proc.pid, signal.SIGCONT)
        tally.record("serve", "stopped server: the client runs the command itself within 15 s",
                     p is not None and p.returncode == 0 and _json(p.stdout).get("step") == 3
                     and "did not answer within" in p.stderr and took < 15,
                     f"{took:.1f} s, {p and (p.returncode, p.stderr.strip()[:200])}")
        tally.record("serve", "stopped server: serving again once continued",
                     answered(_client(*status, s), 3) and srv.alive(), "")
    finally:
        code, err = srv.stop()
    tally.record("serve", "one SIGTERM stops the server", code == 0 and not srv.path.exists(), f"exit {code}")

    # impostors: a socket another uid holds, a listener run as another uid (needs root to set them up)
    if os.geteuid() == 0:
        _serve_impostors(w, tally)

    # kill -9 of the server while it runs an update: the client runs it itself; old or new, never torn
    if "served update" not in w.durations:  # the client's whole call, on a scratch copy: where kills are aimed
        s = w.fresh(3, "served")
        srv = Server(s)
        try:
            w.duration("served update", lambda: gd("update", "--state", s, "--step", 4, "--outcomes", o[4],
                                                   check=True))
        finally:
            srv.stop()
    d = w.durations["served update"]
    for _ in range(trials):
        s = w.fresh(3, "served")
        srv = Server(s)
        client = subprocess.Popen([str(GRAPHDIFF), "update", "--state", str(s), "--step", "4", "--outcomes",
                                   str(o[4]), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay(rng, d))
        os.killpg(srv.proc.pid, signal.SIGKILL)
        srv.proc.communicate()
        try:
            out, err = client.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            client.kill()
            out, err = client.communicate()
        ok = client.returncode == 0 and version(s) == (4, 0) and intact(s) and w.predictions(s) == w.pred[4]
        p = gd("update", "--state", s, "--step", 5, "--outcomes", o[5])  # the next writer, in its own process
        ok = ok and p.returncode == 0 and w.predictions(s) == w.pred[5] and not debris(s.parent)
        tally.record("serve", "kill -9 of the server mid-update", ok,
                     f"client exit {client.returncode} {err.strip()[-200:]!r}; next {p.returncode}; "
                     f"debris {debris(s.parent)}")

    # 80 clients at once: every one answered right; exactly one of 10 updates of one step applies it
    s = w.fresh(3, "served")
    cands = w.work / "trial" / "serve_candidates.txt"
    cands.write_text("".join(f"{i}\n" for i in w.ids[:min(200, w.n)]))
    outdir = w.work / "trial" / "serve_out"
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir(parents=True)
    srv = Server(s)
    try:
        calls = ([("status", [*status, s]) for _ in range(40)]
                 + [("predict", ["predict", "--state", s, "--out", outdir / f"p{i}.jsonl"]) for i in range(20)]
                 + [("select", ["select", "--state", s, "--candidates", cands, "--batch-size", 8, "--seed", 1,
                                "--out", outdir / f"s{i}.txt", "--json"]) for i in range(10)]
                 + [("update", ["update", "--state", s, "--step", 4, "--outcomes", o[4], "--json"]) for _ in range(10)])
        rng.shuffle(calls)
        t0 = time.monotonic()
        procs = [(kind, argv, subprocess.Popen([str(GRAPHDIFF), *map(str, argv)], stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True)) for kind, argv in calls]
        done = []
        for kind, argv, proc in procs:
            try:
                out, err = proc.communicate(timeout=max(1.0, 300 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            done.append((kind, argv, proc.returncode, out, err))
        took = time.monotonic() - t0
        good_pred = {w.pred[3], w.pred[4]}

        def right(kind, argv, code, out, err):
            if code != 0 or "warning" in err:
                return False
            if kind == "predict":
                return sha(Path(argv[4])) in good_pred
            return _json(out).get("step") in (3, 4)

        def applies(kind, code, out):
            res = _json(out)
            return kind == "update" and code == 0 and "step" in res and not res.get("noop")

        for kind, argv, code, out, err in done:
            tally.record("serve", f"80 clients: {kind}", right(kind, argv, code, out, err),
                         f"exit {code} {err.strip()[:200]!r}")
        applied = sum(applies(kind, code, out) for kind, _, code, out, _ in done)
        tally.record("serve", "80 clients: exactly one update applied, STATE intact",
                     applied == 1 and version(s) == (4, 0) and intact(s) and w.predictions(s) == w.pred[4],
                     f"{applied} applied")
        tally.record("serve", "80 clients: all done within 300 s", took < 300, f"{took:.0f} s")
    finally:
        code, err = srv.stop()
    served = [line for line in err.splitlines() if "served" in line]
    w.durations["serve: 80 clients (s)"] = took
    tally.record("serve", "80 clients: the server served them all, stopped by one SIGTERM",
                 code == 0 and bool(served) and f"served {len(calls)} requests" in served[-1], f"{served[-1:]}")


NOBODY_LISTENS = r"""
import socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(sys.argv[1]); sock.listen(4); sock.settimeout(60)
print("listening", flush=True)
conn, _ = sock.accept(); conn.settimeout(60)
data = b""
try:
    while chunk := conn.recv(1 << 16):
        data += chunk
        if len(data) >= 8 and len(data) >= 8 + struct.unpack(">Q", data[:8])[0]:
            conn.sendall(struct.pack(">Q", 11) + b'{"code": 0}')
except OSError:
    pass
print(len(data), flush=True)
"""

NOBODY_ASKS = r"""
import json, socket, struct, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); sock.settimeout(30)
sock.connect(sys.argv[1])
req = json.dumps({"v": 2, "argv": ["--json", "status", "--state", sys.argv[2]], "cwd": "/", "env": {}}).encode()
data = b""
try:
    sock.sendall(struct.pack(">Q", len(req)) + req)
except OSError:
    pass
try:
    while chunk := sock.recv(1 << 16):
        data += chunk
except OSError:
    pass
print(json.dumps(data.decode(errors="replace")))
"""


def _serve_impostors(w: World, tally: Tally) -> None:
    from graphdiff_cli.cli.wire import socket_path

    o = w.outcomes
    # a socket another uid holds (mode 0777), answering {"code": 0} to everything
    s = w.fresh(3, "served")
    path = socket_path(s)
    imp = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    imp.bind(str(path))
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o777)
    imp.listen(8)
    imp.settimeout(0.2)
    got, stop = [], threading.Event()

    def answer():
        while not stop.is_set():
            try:
                conn, _ = imp.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    got.append(conn.recv(1 << 20))
                    conn.sendall(_frame({"code": 0}))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        p = _client("update", "--state", s, "--step", 4, "--outcomes", o[4], "--json",
                    env={"GRAPHDIFF_SECRET": "s3cret"}, timeout=120)
        ok = (p is not None and p.returncode == 0 and version(s) == (4, 0) and w.predictions(s) == w.pred[4]
              and f"uid {NOBODY}" in p.stderr and got == [])
        tally.record("serve", "impostor socket (another uid, 0777): the update runs here, nothing sent", ok,
                     f"{p and (p.returncode, p.stderr.strip()[:200])}; impostor got {len(got)} connections")
        p = _client("serve", "--state", s, timeout=120)
        tally.record("serve", "impostor socket: serve refused in one line naming its owner",
                     p is not None and one_line(p) and p.returncode == 7 and f"uid {NOBODY}" in p.stderr and got == [],
                     f"{p and (p.returncode, p.stderr.strip()[:200])}")
    finally:
        stop.set()
        thread.join(timeout=5)
        imp.close()
        path.unlink(missing_ok=True)

    if not shutil.which("setpriv"):
        return
    # a listener run by another uid behind a socket file made root's, 0600: only SO_PEERCRED tells
    shared = Path(tempfile.mkdtemp(prefix="gd-chaos-shared-", dir="/tmp"))
    try:
        os.chmod(shared, 0o1777)
        s = shared / "S"
        shutil.copytree(w.snap[3], s)
        path = socket_path(s)
        nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c"]
        lis = subprocess.Popen([*nobody, NOBODY_LISTENS, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
        if lis.stdout.readline().strip() == "listening":
            os.chown(path, 0, 0)
            os.chmod(path, 0o600)
            p = _client(*("--json", "status", "--state"), s, env={"GRAPHDIFF_SECRET": "s3cret"})
            out, _ = lis.communicate(timeout=90)
            ok = (p is not None and p.returncode == 0 and _json(p.stdout).get("step") == 3
                  and f"uid {NOBODY}" in p.stderr and out.split()[-1:] == ["0"])
            tally.record("serve", "impostor listener (another uid behind a root 0600 file): not one byte sent", ok,
                         f"{p and (p.returncode, p.stderr.strip()[:200])}; listener got {out.split()[-1:]} bytes")
        else:
            lis.kill()
            lis.communicate()
        path.unlink(missing_ok=True)
        # a peer of another uid at a real server whose socket everyone may connect to (0666)
        srv = Server(s)
        try:
            os.chmod(srv.path, 0o666)
            q = subprocess.run([*nobody, NOBODY_ASKS, str(srv.path), str(s)], capture_output=True, text=True,
                               timeout=60)
            reply = str(_json(q.stdout, "")) if q.returncode == 0 else ""
            tally.record("serve", "a peer of another uid is refused in one line (SO_PEERCRED)",
                         f"uid {NOBODY}" in reply and '"step"' not in reply and srv.alive(), f"{reply[:200]!r}")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------
# readers racing a committing extend / retire

# pause points of a revision's commit (io.state_dir._pause): before CURRENT's rename a reader must see the old
# version, from it on the new one
OLD_POINTS, NEW_POINTS = ("model", "artifact", "log"), ("current", "prune")  # a commit's, before/after CURRENT
ROLLBACK_POINTS = ("current", "log")  # a rollback's: CURRENT renamed; the log cut (later versions not yet removed)
STATUS_KEYS = ("step", "revision", "current", "n_prompts", "active", "retired", "joined", "model_hash", "n_applied")


class Readers:
    """predict, select, allocate, status and verify of one STATE, each a real process, and what each of them
    said, reduced to what a clean run of the same version says the same way (the tables' bytes, status's
    fields that do not carry a time, verify's verdict)."""

    def __init__(self, w: World, folder: Path):
        self.w, self.folder = w, folder
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(11)
        old = rng.choice(w.n, 60, replace=False)
        self.pool = folder / "pool.txt"  # candidates of select, and allocate's batch: old prompts only, some
        self.pool.write_text("".join(f"{w.ids[i]}\n" for i in old))  # of them retired by the writer
        self.batch = folder / "batch.txt"
        self.batch.write_text("".join(f"{w.ids[i]}\n" for i in old[:12]))
        self.retire_ids = folder / "retire.txt"
        self.retire_ids.write_text("".join(f"{w.ids[i]}\n" for i in old[:40:2]))  # 20, 6 of them in the batch
        self.n = 0

    def argv(self, reader: str, s: Path, out: Path):
        return {"predict": ("predict", "--state", s, "--out", out),
                "select": ("select", "--state", s, "--candidates", self.pool, "--batch-size", 8, "--out", out),
                "allocate": ("allocate", "--state", s, "--ids", self.batch, "--budget", 96, "--strategy", "variance",
                             "--out", out),
                "status": ("status", "--state", s, "--json"),
                "verify": ("verify", "--state", s)}[reader]

    def result(self, reader: str, p: subprocess.CompletedProcess, out: Path):
        """What a reader said, comparable between runs, or ("error", its stderr)."""
        if p.returncode != 0:
            return ("error", p.returncode, p.stderr.strip()[:300])
        if reader in ("predict", "select", "allocate"):
            return (reader, sha(out))
        if reader == "status":
            doc = json.loads(p.stdout)
            applied = [{k: v for k, v in e.items() if k != "applied_at"} for e in doc["applied"]]
            return (reader, json.dumps([doc[k] for k in STATUS_KEYS] + [applied], sort_keys=True))
        return (reader, "intact")  # verify, exit 0

    def run(self, reader: str, s: Path):
        self.n += 1
        out = self.folder / f"{reader}-{self.n}.jsonl"
        p = gd(*self.argv(reader, s, out))
        return self.result(reader, p, out), p

    def start(self, reader: str, s: Path):
        self.n += 1
        out = self.folder / f"{reader}-{self.n}.jsonl"
        return subprocess.Popen([str(GRAPHDIFF), *map(str, self.argv(reader, s, out))], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True), out


READERS = ("predict", "select", "allocate", "status", "verify")


def _peak_of(argv: list, timeout: float) -> tuple[subprocess.CompletedProcess | None, float]:
    """Run ``graphdiff argv`` and sample its peak resident memory (VmHWM, MB) until it exits."""
    proc = subprocess.Popen([str(GRAPHDIFF), *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    peak, t0 = 0.0, time.monotonic()
    while proc.poll() is None and time.monotonic() - t0 < timeout:
        peak = max(peak, _vmhwm_mb(proc.pid))
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
        return None, peak
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), peak


def part_streams(w: World, tally: Tally, trials: int, rng: random.Random, megabytes: float = 1000) -> dict:
    """``update`` with outcomes files of ``megabytes`` MB (JSONL; CSV at a tenth of it): applied with a peak
    memory that does not follow the file (under ``STREAM_PEAK_MB``), and the same file with an unknown id on its
    last line refused in one line naming that line, the STATE unchanged byte for byte."""
    figures = {}
    for fmt, mb in (("jsonl", megabytes), ("csv", megabytes / 10)):
        src = w.work / f"big-outcomes.{fmt}"
        for bad in (False, True):
            rows = write_outcomes(src, mb, w.ids[:w.n], fmt, n=1, bad_last=bad)
            state = w.fresh(0, "streams")
            before = tree_hash(state)
            t0 = time.perf_counter()
            res, peak = _peak_of(["update", "--state", state, "--step", 1, "--outcomes", src], timeout=3600)
            seconds = round(time.perf_counter() - t0, 1)
            case = f"{fmt}-{'unknown-id-last' if bad else 'valid'}"
            figures[case] = {"size_mb": round(src.stat().st_size / 1e6, 1), "rows": rows, "peak_rss_mb": round(peak, 1),
                             "seconds": seconds}
            if res is None:
                tally.record("streams", case, False, f"not finished in an hour ({figures[case]})")
                continue
            small = peak < STREAM_PEAK_MB
            if bad:
                ok = (res.returncode == 1 and one_line(res) and f"{src}:{rows + (fmt == 'csv')}: unknown prompt id"
                      in res.stderr and tree_hash(state) == before)
            else:
                ok = res.returncode == 0 and version(state) == (1, 0) and intact(state)
            tally.record("streams", case, ok and small,
                         f"exit {res.returncode}, {res.stderr.strip()[:200]!r}, peak {peak:.0f} MB ({figures[case]})")
            print(f"streams {case}: {figures[case]}", file=sys.stderr)
        src.unlink()
    return figures


def part_readers(w: World, tally: Tally, trials: int, rng: random.Random) -> None:
    """predict, select, allocate, status and verify while another process commits extend (3 -> 3.1, a new
    model) then retire (3.1 -> 3.2, a new step artifact of the same model): each must say what a clean run of
    3, 3.1 or 3.2 says, never a mix, a traceback or a "damaged" refusal. Three ways: (a) the writer held at each
    point of its commit (io.state_dir's test hook) while every reader runs: the old version before CURRENT's
    rename, the new one from it on; (b) the writer killed there: the same, then the rerun completes; (c) free
    races: the two commits back to back while the readers run in a loop beside them."""
    folder = w.work / "trial" / "readers"
    shutil.rmtree(folder, ignore_errors=True)
    r = Readers(w, folder)
    extend = lambda s: ("extend", "--state", s, "--embedded", w.new)
    retire = lambda s: ("retire", "--state", s, "--ids", r.retire_ids)
    rollback = lambda s: ("rollback", "--state", s, "--to", "3.0")
    # clean runs: each reader on a STATE nobody writes, at 3, 3.1 and 3.2
    clean = {}
    s = w.fresh(3, "readers_clean")
    for v, writer in (("3", None), ("3.1", extend), ("3.2", retire)):
        if writer:
            gd(*writer(s), check=True)
        for reader in READERS:
            res, p = r.run(reader, s)
            if res[0] == "error":
                raise RuntimeError(f"readers: a clean {reader} of {v} failed: {p.stderr.strip()[:300]}")
            clean[(reader, v)] = res
    for reader in READERS[:3]:  # the versions differ for the readers that read q (else the part proves little)
        if len({clean[(reader, v)] for v in ("3", "3.1", "3.2")}) < 2:
            print(f"readers: {reader} says the same at 3, 3.1 and 3.2", file=sys.stderr)

    def which(reader, res):
        return [v for v in ("3", "3.1", "3.2") if clean[(reader, v)] == res]

    def check(case, reader, res, want):
        got = which(reader, res)
        tally.record("readers", case, bool(set(got) & set(want)),
                     f"{reader}: {res if not got else 'saw ' + ','.join(got)}, want {'/'.join(want)}")

    # (a) and (b): the writer held at each point of its commit, then released or killed
    plan = [("extend", extend, "3", "3.1", pt) for pt in OLD_POINTS + NEW_POINTS]
    plan += [("retire", retire, "3.1", "3.2", pt) for pt in OLD_POINTS[1:] + NEW_POINTS]
    # a rollback renames CURRENT first, then cuts the log and removes the later versions (readers that found
    # 3.2 a moment before lose its folder): both its points are after CURRENT's rename
    plan += [("rollback", rollback, "3.2", "3", pt) for pt in ROLLBACK_POINTS]
    for name, writer, old, new, point in plan:
        for end in ("released", "killed"):
            s = w.fresh(3, "readers_held")
            for before in {"3": [], "3.1": [extend], "3.2": [extend, retire]}[old]:
                gd(*before(s), check=True)
            release = folder / f"release-{name}-{point}-{end}"
            env = {**os.environ, "GRAPHDIFF_TEST_PAUSE_AFTER": point, "GRAPHDIFF_TEST_PAUSE_FILE": str(release)}
            proc = subprocess.Popen([str(GRAPHDIFF), *map(str, writer(s))], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
            reached = Path(str(release) + ".reached")
            while not reached.exists() and proc.poll() is None:
                time.sleep(0.02)
            if proc.poll() is not None:
                tally.record("readers", f"{name} held at {point}", False,
                             f"the writer ended before the point: {proc.stderr.read().strip()[:300]}")
                continue
            want = [new] if point in NEW_POINTS or name == "rollback" else [old]
            for reader in READERS:
                res, _p = r.run(reader, s)
                check(f"{name} held at {point}", reader, res, want)
            if end == "released":
                release.touch()
                ok = proc.wait(timeout=300) == 0
            else:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                ok = True
            for reader in READERS:  # after the writer: the new version, or (killed before CURRENT) the old
                res, _p = r.run(reader, s)
                check(f"{name} {end} at {point}", reader, res, [new] if end == "released" or point in NEW_POINTS
                      or name == "rollback" else [old])
            target = tuple(map(int, f"{new}.0".split(".")[:2]))
            if end == "killed" and version(s) != target:
                ok = gd(*writer(s)).returncode == 0  # the rerun completes
            tally.record("readers", f"{name} {end} at {point}: writer", ok and version(s) == target and intact(s),
                         f"version {version(s)}, intact {intact(s)}")

    # (c) free races: extend, retire, then a rollback to 3.0 committing while the readers run beside them
    for i in range(trials):
        s = w.fresh(3, "readers_race")
        writer = subprocess.Popen(["bash", "-c", f"sleep {rng.uniform(0, 2):.2f} && " + " && ".join(
            " ".join(map(shlex.quote, [str(GRAPHDIFF), *map(str, argv(s)), "-q"]))
            for argv in (extend, retire, rollback))], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        k = 0
        while writer.poll() is None or k < len(READERS):
            reader = READERS[(i + k) % len(READERS)]
            k += 1
            res, _p = r.run(reader, s)
            check("free race", reader, res, ["3", "3.1", "3.2"])
        tally.record("readers", "free race: writer", writer.wait() == 0 and version(s) == (3, 0) and intact(s),
                     f"writer exit {writer.returncode} {writer.stderr.read().strip()[:200]}")


# ---------------------------------------------------------------------------------------------------
# kills at scale


def part_big(work: Path, tally: Tally, trials: int, rng: random.Random, n: int = 150_000, add: int = 1_000,
             states: int = 32) -> dict:
    """``kill -9`` of ``update`` (step 0 -> 1) and ``extend`` (0 -> 0.1, ``add`` prompts) on a STATE of ``n``
    prompts: synthetic clustered embeddings written as a real artifact (no encoder), a real ``build-graph``
    (k = 10), ``cluster`` and ``init``. After each kill: ``verify`` intact, old or new version, the command
    rerun completes, and the predictions then equal a clean run's byte for byte."""
    from graphdiff_cli.backends.embed import DEFAULT_INSTRUCTION
    from graphdiff_cli.io.artifacts import hash_arrays, write_artifact
    from graphdiff_cli.stages.prepare import ids_for_hash

    folder = work / "big"
    folder.mkdir(parents=True, exist_ok=True)
    built = {}
    t0 = time.perf_counter()
    rs = np.random.default_rng(3)
    dim, topics = 32, 400
    centres = rs.standard_normal((topics, dim)).astype(np.float32)
    x = centres[rs.integers(0, topics, n + add)] + 0.6 * rs.standard_normal((n + add, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ids = [f"p{i:07d}" for i in range(n + add)]
    params = {"model": "bundled", "instruction": DEFAULT_INSTRUCTION, "dim": dim, "batch_size": 64,
              "shard": None, "id_field": "id", "text_field": "prompt"}
    for name, rows in (("old", np.arange(n)), ("new", np.arange(n, n + add))):
        ids_arr = ids_for_hash([ids[i] for i in rows])
        write_artifact(folder / f"{name}.zarr", "embeddings",
                       {"ids": ids_arr.astype(object), "embeddings": x[rows],
                        "text_hash": np.asarray([f"{i:016x}" for i in rows], dtype=object)},
                       params=params, inputs={"prompts": "synthetic"}, content_hash=hash_arrays(ids_arr, x[rows]),
                       attrs={"native_dim": dim})
    del x
    for stage, argv in (("build-graph", ("build-graph", folder / "old.zarr", "--out", folder / "graph.zarr",
                                         "--k-nn", 10)),
                        ("cluster", ("cluster", folder / "graph.zarr", "--out", folder / "clusters.zarr", "--states",
                                     states)),
                        ("init", ("init", "--graph", folder / "graph.zarr", "--clusters", folder / "clusters.zarr",
                                  "--embeddings", folder / "old.zarr", "--out", folder / "S0", "--device", "cpu"))):
        t1 = time.perf_counter()
        gd(*argv, check=True, timeout=3600)
        built[stage] = round(time.perf_counter() - t1, 1)
    outcomes = folder / "step-000001.jsonl"
    rows = rs.choice(n, 2048, replace=False)
    outcomes.write_text("".join(json.dumps({"id": ids[i], "n": 8, "s": int(rs.integers(0, 9))}) + "\n" for i in rows))

    def fresh(name):
        dst = folder / name
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(folder / "S0", dst)
        return dst

    def predictions(s):
        out = folder / "pred.parquet"
        gd("predict", "--state", s, "--out", out, check=True)
        return sha(out)

    commands = {"update": (lambda s: ("update", "--state", s, "--step", 1, "--outcomes", outcomes), (1, 0)),
                "extend": (lambda s: ("extend", "--state", s, "--embedded", folder / "new.zarr"), (0, 1))}
    durations, want = {}, {}
    for name, (argv, new) in commands.items():
        s = fresh("ref")
        t1 = time.perf_counter()
        gd(*argv(s), check=True, timeout=3600)
        durations[name] = round(time.perf_counter() - t1, 1)
        want[name] = predictions(s)
    for name, (argv, new) in commands.items():
        for _ in range(trials):
            s = fresh("S")
            killed = kill_after(start(*argv(s)), delay(rng, durations[name]))
            v, ok = version(s), intact(s)
            if not (ok and v in ((0, 0), new)):
                tally.record("big", name, False, f"after the kill: version {v}, intact {ok}")
                continue
            if v != new:
                gd(*argv(s), check=True, timeout=3600)
            left = debris(s) if v != new else []  # the rerun, a writer, removes what the killed one left
            tally.record("big", name, predictions(s) == want[name] and intact(s) and version(s) == new and not left,
                         f"killed={killed} version after the kill {v}: predictions or verify differ after the "
                         f"rerun, or debris {left[:3]}")
    shutil.rmtree(folder, ignore_errors=True)
    return {"prompts": n, "added": add, "states": states, "build_s": built, "uninterrupted_s": durations,
            "setup_s": round(time.perf_counter() - t0, 1)}


def du(root: Path) -> tuple[float, int]:
    """(MB, files) under root, tolerant of folders the writer prunes while we walk."""
    size, files = 0, 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.stat(os.path.join(dirpath, name)).st_size
                files += 1
            except FileNotFoundError:
                pass
    return size / 2**20, files


def part_soak(w: World, tally: Tally, steps: int, every: int) -> dict:
    s = w.fresh(0, "soak")
    inbox = w.work / "trial" / "soak_inbox"
    shutil.rmtree(inbox, ignore_errors=True)
    inbox.mkdir(parents=True)
    pred = w.work / "trial" / "soak_pred.jsonl"
    rng = np.random.default_rng(7)
    n_base = w.n
    rows_per_step = max(8, n_base // 10)
    proc = subprocess.Popen([str(GRAPHDIFF), "watch", "--state", str(s), "--inbox", str(inbox), "--until-step",
                             str(steps), "--poll", "0.01", "--predictions", str(pred), "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    samples = []
    t_last = time.perf_counter()
    current = s / "CURRENT"
    for t in range(1, steps + 1):
        rows = rng.choice(n_base, rows_per_step, replace=False)
        tmp = inbox / f".step-{t:07d}.jsonl.part"
        tmp.write_text("".join(json.dumps({"id": w.ids[i], "n": 8, "s": int(rng.integers(0, 9))}) + "\n"
                               for i in rows))
        os.replace(tmp, inbox / f"step-{t:07d}.jsonl")
        while True:  # lockstep: the trainer waits for the step before it writes the next
            try:
                if json.loads(current.read_text())["step"] >= t:
                    break
            except (OSError, ValueError):
                pass
            if proc.poll() is not None:
                tally.record("soak", "watch", False, f"watch exited at step {t}: {proc.stderr.read()[-300:]}")
                return {"samples": samples}
            time.sleep(0.002)
        (inbox / f"step-{t:07d}.jsonl").unlink()  # the trainer cleans up applied files
        if t % every == 0 or t == 1:
            now = time.perf_counter()
            mb, files = du(s)
            samples.append({"step": t, "rss_mb": rss_mb(proc.pid), "state_mb": mb, "state_files": files,
                            "s_per_step": (now - t_last) / (every if t > 1 else 1)})
            t_last = now
    proc.wait(timeout=120)
    first, last = samples[min(1, len(samples) - 1)], samples[-1]
    tally.record("soak", "watch", proc.returncode == 0 and intact(s), f"exit {proc.returncode}")
    return {"steps": steps, "prompts": n_base, "rows_per_step": rows_per_step, "samples": samples,
            "rss_growth_mb_after_first_sample": last["rss_mb"] - first["rss_mb"],
            "state_mb_first_last": [first["state_mb"], last["state_mb"]],
            "s_per_step_first_last": [first["s_per_step"], last["s_per_step"]]}


# ---------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["all", *PARTS])
    ap.add_argument("--trials", type=int, default=10, help="kills per command, races, readers")
    ap.add_argument("--soak-steps", type=int, default=5000)
    ap.add_argument("--every", type=int, default=250, help="soak: a sample every this many steps")
    ap.add_argument("--n", type=int, default=600, help="prompts in the STATE")
    ap.add_argument("--big-n", type=int, default=150_000, help="big: prompts in its STATE")
    ap.add_argument("--big-trials", type=int, default=3, help="big: kills per command")
    ap.add_argument("--stream-mb", type=float, default=1000, help="streams: the JSONL outcomes file's size (MB)")
    ap.add_argument("--only", default=None, help="tamper: only the cases whose name contains this (or one of "
                                                 "these, comma-separated)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="keep the files here (default: a temporary folder, removed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="graphdiff-chaos-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rng = random.Random(args.seed)
    tally = Tally()
    t0 = time.perf_counter()
    try:
        parts = list(PARTS) if args.part == "all" else [args.part]
        if args.soak_steps < 1:
            parts = [p for p in parts if p != "soak"]
        # the 600-prompt world, only for the parts that use it (big builds its own STATE)
        world = World(work, args.n, max(4, args.n // 15), args.seed) if set(parts) - {"big"} else None
        soak = big = streams = None
        timings = {}
        for part in parts:
            t1 = time.perf_counter()
            if part == "soak":
                soak = part_soak(world, tally, args.soak_steps, args.every)
            elif part == "big":
                big = part_big(work, tally, args.big_trials, rng, n=args.big_n)
            elif part == "streams":
                streams = part_streams(world, tally, args.trials, rng, megabytes=args.stream_mb)
            else:
                extra = {"only": args.only} if part == "tamper" else {}
                globals()[f"part_{part}"](world, tally, args.trials, rng, **extra)
            timings[part] = round(time.perf_counter() - t1, 1)
        result = {
            "benchmark": "chaos", "date": date.today().isoformat(),
            "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                        "python": platform.python_version(), "system": platform.platform()},
            "prompts": args.n, "trials": args.trials, "seed": args.seed,
            "uninterrupted_s": {k: round(v, 2) for k, v in world.durations.items()} if world else {},
            "parts": tally.parts, "soak": soak, "big": big, "streams": streams, "part_s": timings,
            "checks": sum(r["trials"] for p in tally.parts.values() for k, r in p.items() if k != "cases"),
            "failures": tally.failures, "wall_s": round(time.perf_counter() - t0, 1),
        }
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    emit(result, args.out)
    sys.exit(1 if tally.failures else 0)


if __name__ == "__main__":
    main()
