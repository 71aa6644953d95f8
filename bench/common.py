"""What the benchmark scripts share, in one place: printing a result, reading a workflow run folder or a pair of
graph and clusters artifacts, the planted synthetic graph, running the graphdiff command, and a few small
helpers. A script imports this module, never another script.

A script run by path (``python bench/x.py``) puts the repository root on ``sys.path`` before importing it:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run by path: the repository root
    from bench.common import emit  # noqa: E402
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GRAPHDIFF = ROOT / ".venv" / "bin" / "graphdiff"


def emit(result: dict, out: str | None = None) -> None:
    """What every script ends with: print the result as JSON and, with ``out``, write it there too."""
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


# --- a workflow run folder (artifacts/<run>/ with graph/*.zarr, clusters/*.zarr, data/log.jsonl, one of each) ---

def run_file(run: Path, pattern: str) -> Path:
    """The one file of ``run`` that matches ``pattern`` (a glob); exits with one line when there is not exactly one."""
    found = sorted(Path(run).glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"{run}: expected one {pattern}, found {len(found)}")
    return found[0]


def run_inputs(run: Path):
    """The run's graph and clusters (``io.readers.read_inputs``)."""
    from graphdiff_cli.io.readers import read_inputs

    return read_inputs(run_file(run, "graph/*.zarr"), run_file(run, "clusters/*.zarr"))


def run_log(run: Path, inputs):
    """The run's log, prompt ids mapped to the graph's node indices (``io.readers.read_log``)."""
    from graphdiff_cli.io.readers import read_log

    return read_log(run_file(run, "data/log.jsonl"), inputs.graph.index)


def round0_steps(step: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Steps in which every prompt is seen for the first time (the cold start)."""
    seen: set = set()
    bad: set = set()
    for t, i in zip(step.tolist(), ids.tolist()):
        if i in seen:
            bad.add(t)
        seen.add(i)
    return np.array([t for t in np.unique(step) if t not in bad and t < min(bad, default=np.inf)])


# --- what a prompt file says of the One-Shot run's prompts: their text and answer, a reference model's pass rate ---

SHARED_DATA = ROOT.parent / "shared" / "data"


def oneshot_prompts(run: Path, data: Path = SHARED_DATA) -> dict[str, tuple[str, str]]:
    """{run id: (problem, answer)} of the One-Shot run's prompts: the run's data/prompts.jsonl ids are the row
    indices of ``data``/oneshot_rlvr/prompts.jsonl (``index``, ``problem``, ``answer``); a prompt whose text is
    not that row's problem exits with one line."""
    shared = {}
    with open(data / "oneshot_rlvr" / "prompts.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            shared[str(row["index"])] = (row["problem"], row.get("answer"))
    out = {}
    with open(run_file(run, "data/prompts.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            got = shared.get(str(row["id"]))
            if got is None or got[0] != row["prompt"]:
                raise SystemExit(f"{run}: prompt {row['id']!r} is not row {row['id']} of {data}/oneshot_rlvr")
            out[str(row["id"])] = got
    return out


def reference_rates(run: Path, data: Path = SHARED_DATA):
    """{run id: (s, n)} of Qwen2.5-Math-7B over 128 attempts (``data``/deepscaler_difficulty) for the run's prompts
    whose text, stripped of leading and trailing whitespace, is a DeepScaleR problem's, and the join counts
    (exact, stripped, whitespace-collapsed matches)."""
    import re

    squash = lambda t: re.sub(r"\s+", " ", t).strip()  # noqa: E731
    exact, stripped, squashed = {}, {}, {}
    with open(data / "deepscaler_difficulty" / "problems.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            sn = (int(row["s"]), int(row["n"]))
            exact[row["problem"]] = stripped[row["problem"].strip()] = squashed[squash(row["problem"])] = sn
    out, counts = {}, {"prompts": 0, "exact": 0, "stripped": 0, "whitespace_collapsed": 0}
    with open(run_file(run, "data/prompts.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            text = row["prompt"]
            counts["prompts"] += 1
            counts["exact"] += text in exact
            counts["whitespace_collapsed"] += squash(text) in squashed
            if text.strip() in stripped:
                counts["stripped"] += 1
                out[str(row["id"])] = stripped[text.strip()]
    return out, counts


def step_scores(step, p, r, sel):
    """Within-batch Pearson r and MAE of predictions ``p`` against rates ``r`` on the rows ``sel`` (steps
    non-decreasing), each with its circular block bootstrap interval over steps (``ratio_bootstrap``: each step's
    r over scored steps; each step's summed error over its rows)."""
    from graphdiff_cli.evaluation.metrics import ratio_bootstrap, within_batch_scores

    st, pp, rr = step[sel], p[sel], r[sel]
    pr, _, ok = within_batch_scores(st, pp, rr)
    first = np.flatnonzero(np.r_[True, st[1:] != st[:-1]])
    err = np.add.reduceat(np.abs(pp - rr), first)
    rows = np.diff(np.r_[first, st.size]).astype(np.float64)
    return ratio_bootstrap(np.where(ok, pr, 0.0), ok.astype(np.float64)), ratio_bootstrap(err, rows)


# --- graph and clusters artifacts, real or planted ---

def adjusted_rand(a: np.ndarray, b: np.ndarray) -> float:
    """Adjusted Rand index of two labelings (1: the same partition; ~0: chance agreement)."""
    import scipy.sparse as sp

    c = sp.coo_matrix((np.ones(a.size), (a, b))).tocsr()
    comb = lambda x: float(np.sum(x * (x - 1) / 2))  # noqa: E731
    s_ij, s_a, s_b = comb(c.data), comb(np.asarray(c.sum(axis=1)).ravel()), comb(np.asarray(c.sum(axis=0)).ravel())
    expected = s_a * s_b / comb(np.array([a.size]))
    return (s_ij - expected) / (0.5 * (s_a + s_b) - expected)


def read_artifacts(graph: Path, clusters: Path):
    """ids, labels and W of existing graph and clusters artifacts (the clusters' order mapped to the graph's)."""
    from graphdiff_cli import load_graph
    from graphdiff_cli.io.artifacts import read_artifact

    w, ids = load_graph(graph)
    c = read_artifact(clusters, "clusters")
    pos = {pid: i for i, pid in enumerate(str(x) for x in c.array("ids"))}
    labels = np.asarray(c.array("labels"))[[pos[str(i)] for i in ids]].astype(np.int64)
    return np.asarray(ids, dtype=str), labels, w


def synthetic_graph(n, k, deg, seed=0):
    """Symmetric CSR with ~deg neighbours per node, most inside the node's planted state (one of k); and the
    planted states."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, k, n)
    order = np.argsort(labels, kind="stable")
    starts = np.searchsorted(labels[order], np.arange(k))
    sizes = np.bincount(labels, minlength=k)
    half = deg // 2  # each node proposes deg/2 edges; symmetrizing gives ~deg neighbours
    rows = np.repeat(np.arange(n), half)
    same = rng.random(n * half) < 0.85
    lab = labels[rows]
    pick = starts[lab] + (rng.random(n * half) * sizes[lab]).astype(np.int64)
    cols = np.where(same, order[pick], rng.integers(0, n, n * half))
    vals = rng.uniform(0.3, 0.9, rows.size).astype(np.float32)
    keep = rows != cols
    w = sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(n, n))
    w = w.maximum(w.T).tocsr()
    w.sort_indices()
    return w, labels


def synthetic_embeddings(n, dim, topics, seed=0):
    """Clustered unit vectors: topic centres plus noise (the local structure a kNN graph sees)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((topics, dim)).astype(np.float32)
    x = centres[rng.integers(0, topics, n)] + 0.9 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write_inputs(folder: Path, n, k, deg):
    """The planted graph (``synthetic_graph``) written as graph and clusters artifacts in ``folder``
    (graph.zarr, clusters.zarr): ids p0000000.., labels, W."""
    from graphdiff_cli.io.artifacts import hash_arrays, write_artifact

    w, labels = synthetic_graph(n, k, deg)
    ids = np.asarray([f"p{i:07d}" for i in range(n)], dtype=str)
    knn = np.zeros((n, 1), dtype=np.int64)  # unused downstream of clustering
    arrays = {"ids": ids.astype(object), "indptr": w.indptr.astype(np.int64), "indices": w.indices.astype(np.int64),
              "data": w.data.astype(np.float32), "knn_indices": knn}
    g_hash = hash_arrays(ids, arrays["indptr"], arrays["indices"], arrays["data"], knn, extra="graph")
    write_artifact(folder / "graph.zarr", "graph", arrays, params={"k_nn": deg, "synthetic": True},
                   inputs={"embeddings": "synthetic"}, content_hash=g_hash)
    labels = labels.astype(np.int64)
    write_artifact(folder / "clusters.zarr", "clusters", {"ids": ids.astype(object), "labels": labels},
                   params={"states": k, "seed": 0, "planted": True}, inputs={"graph": g_hash},
                   content_hash=hash_arrays(ids, labels, extra="clusters"))
    return ids, labels, w


# --- the graphdiff command, processes, files ---

def run_graphdiff(*args) -> tuple[dict, float]:
    """Run one graphdiff command; its --json result (plus "peak_rss_mb": the process's own maximum resident set,
    and "cpu_s": its user + system CPU seconds, both from wait4) and its wall time. Exits with the command's error
    when it fails."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errf:
        proc = subprocess.Popen([str(GRAPHDIFF), *map(str, args), "--json"], stdout=subprocess.PIPE,
                                stderr=errf, text=True)
        out = proc.stdout.read()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)  # reaps the child and returns its own rusage
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            errf.seek(0)
            sys.exit(f"{args[0]} failed: {errf.read()}")
    res = json.loads(out)
    res["peak_rss_mb"] = usage.ru_maxrss / 1024
    res["cpu_s"] = usage.ru_utime + usage.ru_stime
    return res, wall


def rss_mb(pid: int) -> float:
    """A process's resident set now (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_outcomes(path: Path, megabytes: float, ids: list[str], fmt: str, n: int = 8, bad_last: bool = False) -> int:
    """An outcomes file of about ``megabytes`` MB: counts rows of ``n`` rollouts cycling through ``ids`` (s = row
    number mod n + 1); with ``bad_last`` a last row whose id is no prompt's. Returns the rows written (the files of
    ``bench/outcomes_stream.py`` and of ``bench/chaos.py streams``)."""
    target, rows = int(megabytes * 1e6), 0
    with open(path, "w", encoding="utf-8") as f:
        if fmt == "csv":
            f.write("id,n,s\n")
        written = f.tell()
        block = []
        while written < target:
            pid, s = ids[rows % len(ids)], rows % (n + 1)
            line = f'{{"id": "{pid}", "n": {n}, "s": {s}}}\n' if fmt == "jsonl" else f"{pid},{n},{s}\n"
            block.append(line)
            written += len(line)
            rows += 1
            if len(block) == 100_000:
                f.write("".join(block))
                block = []
        if bad_last:
            block.append('{"id": "not-a-prompt", "n": 1, "s": 0}\n' if fmt == "jsonl" else "not-a-prompt,1,0\n")
            rows += 1
        f.write("".join(block))
    return rows


def seeds_of(text: str) -> list[int]:
    """Seeds written as a list of numbers and ranges: "0-2,5" is [0, 1, 2, 5]."""
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    return out


def fsync_tree_one_by_one(root) -> None:
    """``io.staging.fsync_tree`` as it was before it issued the fsyncs together: every file, then its folder, one
    fsync at a time (what bench/fsync_tree.py and bench/step_phases.py compare it with)."""
    from graphdiff_cli.io.atomic import fsync_dir

    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def write_group_one_by_one(folder, arrays, attributes, *, in_flight) -> None:
    """``io.artifacts.write_group`` as it was before it wrote a group's arrays together: through zarr's synchronous
    API, each array created and then written a few chunk rows at a time, one array after another, the attributes
    last, with zarr's default chunk files (c/0/0: a folder per array's chunks). bench/step_phases.py compares it
    with the writer of now, so the figure is both changes together; ``in_flight`` is ignored."""
    import zarr
    from zarr.storage import LocalStore

    from graphdiff_cli.io import artifacts

    group = zarr.open_group(LocalStore(folder), mode="w")
    for name, arr in arrays.items():
        if arr.dtype.kind in "UOT":
            z = group.create_array(name, shape=arr.shape, dtype=str, chunks=artifacts.chunk_shape(arr, itemsize=64))
            z[...] = arr.astype(object)
            continue
        z = group.create_array(name, shape=arr.shape, dtype=arr.dtype, chunks=artifacts.chunk_shape(arr))
        if arr.ndim == 0:
            z[...] = arr
            continue
        slab = artifacts.chunk_shape(arr)[0] * artifacts.write_slab_chunks()
        for start in range(0, arr.shape[0], slab):
            z[start:start + slab] = arr[start:start + slab]
    group.attrs.update(attributes())
