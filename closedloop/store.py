"""Finished runs kept in the repository, so that a grid cut short on one machine resumes on another.

A CPU grid of the closed loop takes longer than a machine is held, and its outputs under ``artifacts/`` are gone
with the machine. ``run --store DIR`` therefore keeps every run it finishes in ``DIR/runs/<scheduler>/s<seed>/``
(``summary.json``, ``metrics.jsonl``, ``outcomes.jsonl``, and ``inputs.json``: the fingerprint of what the run
started from), and before training reuses a kept run instead of repeating it, but only when the kept run's
configuration and input fingerprint equal the current ones. The fingerprint covers the data (``train.jsonl``,
``test.jsonl``), the warm-start policy's files (its ``sft.json`` timing summary and hidden files aside) and the values of the
estimator state the run loads from the graph's STATE (not the files' metadata, which records when they were written), and
``run --test-limit`` where it is not 0 (the held-out prompts evaluated, which the run's configuration does not hold): a
machine whose SFT or graph build comes out different in one bit repeats the runs rather than mixing two experiments.

Code is not fingerprinted (any commit would void every kept run): after a change that alters a scheduler's runs,
delete its kept runs (``rm -r DIR/runs/<scheduler>``). ``python -m closedloop keep`` keeps the finished runs of
an artifacts folder written without ``--store``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

RUN_FILES = ("summary.json", "metrics.jsonl", "outcomes.jsonl")
INPUTS = "inputs.json"
_POLICY_SKIP = {"sft.json"}  # the SFT's own summary: timings, not weights (hidden files, e.g. Snakemake's
# .snakemake_timestamp in a directory output, are skipped too)


def _hash_files(paths, root: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.relative_to(root)).encode() + b"\0")
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _hash_state(path, h) -> None:
    """Hash the values of the estimator state a run loads from ``path`` (a STATE directory's current step with
    its model, or a saved estimator), the way it loads them: a delta step is hashed as the state it makes."""
    from graphdiff_cli.estimator import Estimator

    state = Estimator.load(path, device="cpu").state_dict(copy=False)  # what `run` starts from, as it loads it
    for key in sorted(state):
        _feed(h, key, state[key])


def _feed(h, key: str, v) -> None:
    import numpy as np
    import scipy.sparse as sp

    if sp.issparse(v):
        v = v.tocsr()
        for part in ("data", "indices", "indptr"):
            _feed(h, f"{key}.{part}", getattr(v, part))
        h.update(f"{key}.shape:{v.shape}\0".encode())
    elif isinstance(v, dict):
        for k in sorted(v):
            _feed(h, f"{key}.{k}", v[k])
    elif isinstance(v, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(v)
        h.update(f"{key}:{a.dtype.str}:{a.shape}\0".encode())
        h.update(a.tobytes() if a.dtype != object else repr(a.tolist()).encode())
    else:
        h.update(f"{key}={v!r}\0".encode())


def fingerprint(data_dir, policy_dir, state_dir, test_limit: int = 0) -> dict:
    """sha256 of the run's inputs: {"data", "policy", "state"} (``state_dir`` None: a run without a graph), and
    ``test_limit`` where it is not 0 (``run --test-limit``: which held-out prompts the run evaluates)."""
    data_dir, policy_dir = Path(data_dir), Path(policy_dir)
    out = {"data": _hash_files([data_dir / "train.jsonl", data_dir / "test.jsonl"], data_dir),
           "policy": _hash_files(sorted(p for p in policy_dir.rglob("*")
                                        if p.is_file() and p.name not in _POLICY_SKIP
                                        and not p.name.startswith(".")), policy_dir)}
    if state_dir is not None:
        h = hashlib.sha256()
        _hash_state(Path(state_dir), h)
        out["state"] = h.hexdigest()
    if test_limit:
        out["test_limit"] = int(test_limit)
    return out


def kept_dir(store, scheduler: str, seed: int) -> Path:
    return Path(store) / "runs" / scheduler / f"s{seed}"


def _same_config(a: dict, b: dict) -> bool:
    return json.loads(json.dumps(a)) == json.loads(json.dumps(b))


def reuse(store, scheduler: str, seed: int, config: dict, inputs: dict, out_dir) -> tuple[bool, str]:
    """Copy the kept run into ``out_dir`` when its configuration and inputs match; return whether it did and why
    (one line for the run's log)."""
    kept = kept_dir(store, scheduler, seed)
    if not (kept / "summary.json").is_file():
        return False, f"no kept run in {kept}"
    try:
        summary = json.loads((kept / "summary.json").read_text(encoding="utf-8"))
        inputs_path = kept / INPUTS
        stored = json.loads(inputs_path.read_text(encoding="utf-8")) if inputs_path.is_file() else {}
    except (OSError, ValueError) as exc:
        return False, f"the kept run in {kept} cannot be read ({exc}): running it again"
    if not _same_config(summary.get("config", {}), config):
        diff = sorted(k for k in set(config) | set(summary.get("config", {}))
                      if summary.get("config", {}).get(k) != config.get(k))
        return False, f"the kept run in {kept} has another configuration ({', '.join(diff)}): running it again"
    if stored.get("inputs") != inputs:
        diff = sorted(k for k in set(inputs) | set(stored.get("inputs") or {})
                      if (stored.get("inputs") or {}).get(k) != inputs.get(k))
        return False, (f"the kept run in {kept} started from other inputs ({', '.join(diff) or 'none recorded'}): "
                       "running it again")
    from graphdiff_cli.io.atomic import atomic_write

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").unlink(missing_ok=True)  # its presence marks a run finished: not until the copy is
    for name in RUN_FILES[::-1]:  # summary.json last, each file written whole
        if (kept / name).is_file():
            with (kept / name).open("rb") as src, atomic_write(out_dir / name, binary=True) as dst:
                shutil.copyfileobj(src, dst)
        else:  # a file of an earlier run in out_dir that the kept run does not have is not the kept run's
            (out_dir / name).unlink(missing_ok=True)
    return True, f"reused the kept run in {kept} (same configuration and inputs; kept at {stored.get('commit') or '?'})"


def keep(store, scheduler: str, seed: int, run_dir, inputs: dict, commit: str | None = None) -> Path:
    """Copy a finished run (its ``summary.json`` present) into the store, replacing what was kept, atomically: a
    sibling folder renamed into place."""
    run_dir = Path(run_dir)
    if not (run_dir / "summary.json").is_file():
        raise FileNotFoundError(f"{run_dir} has no summary.json (the run has not finished)")
    dest = kept_dir(store, scheduler, seed)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                shutil.copyfile(run_dir / name, tmp / name)
        (tmp / INPUTS).write_text(json.dumps({"inputs": inputs, "commit": commit}, indent=1) + "\n")
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def commit_of(path) -> str | None:
    """The git commit of the checkout holding ``path`` (None outside one): provenance, not checked on reuse."""
    import subprocess

    where = Path(path).resolve()
    where = where if where.is_dir() else where.parent
    try:
        res = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (res.stdout.strip() or None) if res.returncode == 0 else None
