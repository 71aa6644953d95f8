"""The outcomes parser (io/outcomes.py): aggregates checked by hand and by brute force, every refusal
with its file and line, and property-based fuzzing (valid rows parse right; garbage is a DataError)."""

from __future__ import annotations

import json
import math
import re
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _handoff_fixtures import write_outcomes
from graphdiff_cli.errors import DataError, InvalidArgumentError
from graphdiff_cli.io.outcomes import read_outcomes
from graphdiff_cli.io.readers import IdIndex


def _as_dict(o):
    return {pid: (int(n), int(s)) for pid, n, s in zip(o.ids, o.n, o.s)}


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".parquet"])
def test_counts_are_summed_per_prompt_in_every_format(tmp_path, ext):
    rows = [{"id": "a", "n": 8, "s": 3}, {"id": "b", "n": 4, "s": 4}, {"id": "a", "n": 8, "s": 1},
            {"id": "c", "n": 0, "s": 0}]
    o = read_outcomes(write_outcomes(tmp_path / f"o{ext}", rows))
    assert o.schema == "counts" and o.n_rows == 4
    assert o.ids == ["a", "b", "c"]  # order of first appearance
    assert _as_dict(o) == {"a": (16, 4), "b": (4, 4), "c": (0, 0)}
    assert o.lines == ([1, 2, 4] if ext != ".csv" else [2, 3, 5])


def test_rollout_rows_use_the_threshold(tmp_path):
    rows = [{"id": "a", "reward": 0.3}, {"id": "a", "reward": 0.9}, {"id": "b", "reward": 1.0},
            {"id": "a", "reward": 0.5}, {"id": "b", "reward": -2}]
    path = write_outcomes(tmp_path / "r.jsonl", rows)
    o = read_outcomes(path, success_threshold=0.5)
    assert _as_dict(o) == {"a": (3, 2), "b": (2, 1)} and o.warnings == ()
    assert _as_dict(read_outcomes(path, success_threshold=1.0)) == {"a": (3, 0), "b": (2, 1)}
    # no threshold chosen: rewards that are not 0/1 are refused at the first such row, never thresholded silently
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: reward 0.3 is not 0 or 1; pass "
                                        r"success_threshold=X"):
        read_outcomes(path)


@pytest.mark.parametrize("ext", [".jsonl", ".csv", ".parquet"])
def test_continuous_rewards_without_a_threshold_are_refused_with_the_row(tmp_path, ext):
    rows = [{"id": "a", "reward": 1}, {"id": "a", "reward": 0}, {"id": "b", "reward": 0.7}, {"id": "b", "reward": 1}]
    path = write_outcomes(tmp_path / f"r{ext}", rows)
    line = 4 if ext == ".csv" else 3  # CSV: the header is line 1
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:{line}: reward 0.7 is not 0 or 1; pass "
                                        r"success_threshold=X"):
        read_outcomes(path)
    # -1/1 rewards (DAPO's) are not 0/1 either: a threshold must be chosen for them too
    dapo = write_outcomes(tmp_path / f"d{ext}", [{"id": "a", "reward": -1.0}, {"id": "a", "reward": 1.0}])
    with pytest.raises(DataError, match="reward -1 is not 0 or 1"):
        read_outcomes(dapo)
    assert _as_dict(read_outcomes(dapo, success_threshold=1.0)) == {"a": (2, 1)}


def test_a_chosen_threshold_that_puts_every_reward_on_one_side_is_a_warning(tmp_path):
    path = write_outcomes(tmp_path / "r.jsonl", [{"id": "a", "reward": 0.7}] * 4)
    below = read_outcomes(path, success_threshold=0.8)
    assert _as_dict(below) == {"a": (4, 0)}
    assert below.warnings == (f"{path}: all 4 rewards are below success_threshold 0.8 (the highest is 0.7): "
                              "every rollout counts as a failure",)
    above = read_outcomes(path, success_threshold=0.7)  # at the threshold is a success
    assert _as_dict(above) == {"a": (4, 4)}
    assert above.warnings == (f"{path}: all 4 rewards are at or above success_threshold 0.7 (the lowest is "
                              "0.7): every rollout counts as a success",)
    # counts rows and 0/1 rewards without a threshold: nothing to warn about, even when all fail
    assert read_outcomes(write_outcomes(tmp_path / "c.jsonl", [{"id": "a", "n": 4, "s": 0}])).warnings == ()
    assert read_outcomes(write_outcomes(tmp_path / "z.jsonl", [{"id": "a", "reward": 0}] * 4)).warnings == ()


def test_binary_and_boolean_rewards_pass_through(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 7, "reward": 1}\n{"id": "7", "reward": 0}\n{"id": 8, "reward": true}\n'
                    '{"id": 8, "reward": false}\n\n{"id": 8, "reward": 1.0}\n')
    o = read_outcomes(path)
    assert _as_dict(o) == {"7": (2, 1), "8": (3, 2)}  # 7 and "7" are one id; blank lines skipped


def test_node_indices_map_ids_and_refuse_unknown_ones_with_the_line(tmp_path):
    path = write_outcomes(tmp_path / "o.jsonl", [{"id": "b", "n": 2, "s": 1}, {"id": "zz", "n": 2, "s": 1}])
    o = read_outcomes(path)
    assert o.node_indices(IdIndex(["a", "b", "c", "d", "e", "zz"])).tolist() == [1, 5]
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: unknown prompt id 'zz'"):
        o.node_indices(IdIndex(["a", "b"]))


@pytest.mark.parametrize("raw", [" \tp00000 \n", "p00000\u2028", "\u00a0p00000\u3000", "p00000 "])
def test_ids_are_exact_strings_and_whitespace_is_never_stripped(tmp_path, raw):
    """An id that differs from a known one only by (Unicode) whitespace is another id: unknown, never credited."""
    path = write_outcomes(tmp_path / "o.jsonl", [{"id": raw, "n": 2, "s": 1}, {"id": "p00001", "n": 2, "s": 2}])
    o = read_outcomes(path)
    assert o.ids == [raw, "p00001"]
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: unknown prompt id .* differs from the known "
                                        "id 'p00000' only by whitespace"):
        o.node_indices(IdIndex(["p00000", "p00001"]))
    assert o.node_indices(IdIndex(["p00000", "p00001", raw])).tolist() == [2, 1]  # an id with spaces is an id
    csv = write_outcomes(tmp_path / "o.csv", [{"id": " p00000", "n": 2, "s": 1}])
    assert read_outcomes(csv).ids == [" p00000"]


BAD = [
    ("s_gt_n.jsonl", '{"id": "a", "n": 8, "s": 3}\n{"id": "b", "n": 2, "s": 3}\n', 2, "more than n"),
    ("neg_n.jsonl", '{"id": "a", "n": -1, "s": 0}\n', 1, "negative"),
    ("neg_s.jsonl", '{"id": "a", "n": 4, "s": -1}\n', 1, "negative"),
    ("frac.jsonl", '{"id": "a", "n": 8, "s": 2}\n{"id": "a", "n": 2.5, "s": 1}\n', 2, "integer"),
    ("nan.jsonl", '{"id": "a", "n": NaN, "s": 1}\n', 1, "integer"),
    ("nan_reward.jsonl", '{"id": "a", "reward": NaN}\n', 1, "finite"),
    ("nan_id.jsonl", '{"id": NaN, "n": 1, "s": 1}\n', 1, ""),
    ("text_count.jsonl", '{"id": "a", "n": "eight", "s": 1}\n', 1, "must be a number"),
    ("bool_count.jsonl", '{"id": "a", "n": true, "s": 1}\n', 1, "integer"),
    ("malformed.jsonl", '{"id": "a", "n": 8, "s": 3}\n{"id": "b", "n": 8,\n', 2, "malformed JSON"),
    ("not_object.jsonl", '[1, 2, 3]\n', 1, "JSON object"),
    ("no_s.jsonl", '{"id": "a", "n": 8, "s": 3}\n{"id": "b", "n": 8}\n', 2, "missing column 's'"),
    ("no_id.jsonl", '{"n": 8, "s": 3}\n', 1, "missing column 'id'"),
    ("no_counts.jsonl", '{"id": "a", "score": 3}\n', 1, "missing columns"),
    ("empty_id.jsonl", '{"id": "  ", "n": 1, "s": 1}\n', 1, "empty"),
    ("huge.jsonl", '{"id": "a", "n": 100000000000000000000000, "s": 1}\n', 1, "implausibly large"),
    ("huge_reward.jsonl", '{"id": "a", "reward": 1' + "0" * 400 + '}\n', 1, ""),
    ("no_s.csv", "id,n\na,8\n", 1, "missing column 's'"),
    ("s_gt_n.csv", "id,n,s\na,8,3\nb,1,2\n", 3, "more than n"),
    ("nan.csv", "id,n,s\na,nan,1\n", 2, "integer"),
    ("short.csv", "id,n,s\na,8\n", 2, "fewer fields"),
    ("long.csv", "id,n,s\na,8,1,9\n", 2, "more fields"),
    ("latin1.jsonl", b'{"id": "a", "n": 1, "s": 1}\n{"id": "\xe9", "n": 1, "s": 1}\n', 2, "UTF-8"),
    ("nul.csv", b"id,n,s\na,1\x00,1\n", 2, "NUL"),
    ("string_count.jsonl", '{"id": "a", "n": "8", "s": 1}\n', 1, "got the string '8'"),
    ("string_reward.jsonl", '{"id": "a", "reward": "1.0"}\n', 1, "got the string '1.0'"),
    # the cap holds for an id's total over the step's rows, not only per row
    ("cap_total.jsonl", "".join('{"id": "a", "n": %d, "s": 0}\n' % 400_000 for _ in range(3)), 3,
     "implausibly large"),
    ("n_1e12.jsonl", '{"id": "a", "n": 1000000000000, "s": 1}\n', 1,
     "n = 1000000000000 is implausibly large (more than 1,000,000 rollouts of one prompt in one step"),
    # a missing column says what the header (or first row) does hold
    ("header.csv", "prompt_id,n,s\na,8,3\n", 1, "missing column 'id' (outcomes need id, n, s or id, reward; it "
                                                 "has 'prompt_id', 'n', 's')"),
    ("no_s_named.csv", "id,n\na,8\n", 1, "missing column 's' (counts rows need id, n, s; it has 'id', 'n')"),
    # JSON that json.loads takes (the last of two keys wins) or cannot take in one line (issue items 6 and 7)
    ("duplicate_key.jsonl", '{"id": "a", "n": 8, "s": 1}\n{"id": "b", "n": 8, "s": 1, "s": 8}\n', 2,
     "duplicate key 's' in a JSON object"),
    ("duplicate_id.jsonl", '{"id": "a", "id": "b", "n": 8, "s": 1}\n', 1, "duplicate key 'id'"),
    ("nested_duplicate.jsonl", '{"id": "a", "n": 8, "s": 1, "x": {"k": 1, "k": 2}}\n', 1, "duplicate key 'k'"),
    ("digits.jsonl", '{"id": "a", "n": 1' + "0" * 5000 + ', "s": 1}\n', 1, "a JSON number with more than 4300 digits"),
    ("deep.jsonl", '{"id": "a", "n": 1, "s": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n", 1,
     "JSON nested too deeply"),
]


@pytest.mark.parametrize("ext,content", [
    (".jsonl", '\ufeff{"id": "a", "n": 8, "s": 3}\n'),
    (".csv", "\ufeffid,n,s\na,8,3\n"),
    (".csv", "id,n,s\na,8.0,\"3\"\n"),  # CSV is text: numbers in it are read as numbers
])
def test_a_byte_order_mark_and_csv_text_numbers_are_read(tmp_path, ext, content):
    path = tmp_path / f"o{ext}"
    path.write_text(content, encoding="utf-8")
    assert _as_dict(read_outcomes(path)) == {"a": (8, 3)}


@pytest.mark.parametrize("name,content,line,words", BAD, ids=[b[0] for b in BAD])
def test_bad_rows_are_refused_with_file_and_line(tmp_path, name, content, line, words):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_outcomes(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert words in msg and "\n" not in msg


@pytest.mark.parametrize("content", ["", "\n\n  \n", "id,n,s\n"])
def test_an_empty_file_is_refused(tmp_path, content):
    path = tmp_path / ("e.csv" if content.startswith("id") else "e.jsonl")
    path.write_text(content)
    with pytest.raises(DataError, match="no outcome rows"):
        read_outcomes(path)


def test_missing_file_unknown_extension_and_bad_threshold(tmp_path):
    with pytest.raises(DataError, match="no such outcomes file"):
        read_outcomes(tmp_path / "nope.jsonl")
    (tmp_path / "o.txt").write_text("a 1 1\n")
    with pytest.raises(InvalidArgumentError, match="extension"):
        read_outcomes(tmp_path / "o.txt")
    ok = write_outcomes(tmp_path / "o.jsonl", [{"id": "a", "reward": 1}])
    for bad in (math.nan, math.inf, "x"):
        with pytest.raises(InvalidArgumentError, match="success_threshold"):
            read_outcomes(ok, success_threshold=bad)


def test_a_long_parquet_file_is_read_in_memory_that_does_not_follow_its_rows(tmp_path):
    """100,000 rollout rows (a 14 KB file): every row as a dict at once peaked at 26 MB of Python objects (a
    381 KB file of 3e6 rows took 1.32 GB); read a record batch at a time it stays near one batch's."""
    import tracemalloc

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 100_000
    path = tmp_path / "o.parquet"
    ids = np.array([f"p{i:05d}" for i in range(400)])[np.arange(rows) % 400]
    pq.write_table(pa.table({"id": ids, "reward": (np.arange(rows) % 3 == 0).astype(np.float64)}), path)
    tracemalloc.start()
    try:
        o = read_outcomes(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert o.n_rows == rows and len(o.ids) == 400 and int(o.n.sum()) == rows and int(o.s.sum()) == (rows + 2) // 3
    assert o.lines[:2] == [1, 2]  # rows are numbered through the batches, first = 1
    assert peak < 10 * 2**20, peak


def test_a_broken_parquet_file_is_a_data_error(tmp_path):
    path = tmp_path / "o.parquet"
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match="Parquet"):
        read_outcomes(path)


# ------------------------------------------------------------------------------ property-based fuzzing

IDS = st.one_of(st.sampled_from(["a", "b", "c", "p-1", "p_2"]), st.integers(0, 30).map(str))
COUNT_ROW = st.integers(0, 64).flatmap(lambda n: st.tuples(IDS, st.just(n), st.integers(0, n)))


def _write(folder: Path, ext: str, rows: list[dict]) -> Path:
    return write_outcomes(folder / f"o{ext}", rows)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(COUNT_ROW, min_size=1, max_size=40), ext=st.sampled_from([".jsonl", ".csv", ".parquet"]))
def test_fuzz_valid_count_rows_parse_to_the_brute_force_aggregates(rows, ext):
    want = defaultdict(lambda: [0, 0])
    order = []
    for pid, n, s in rows:
        if pid not in want:
            order.append(pid)
        want[pid][0] += n
        want[pid][1] += s
    with tempfile.TemporaryDirectory() as d:
        o = read_outcomes(_write(Path(d), ext, [{"id": p, "n": n, "s": s} for p, n, s in rows]))
    assert o.ids == order
    assert o.n.tolist() == [want[p][0] for p in order]
    assert o.s.tolist() == [want[p][1] for p in order]
    assert o.n_rows == len(rows)


REWARD = st.one_of(st.integers(-3, 3), st.floats(-10, 10, allow_nan=False, allow_infinity=False))


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(IDS, REWARD), min_size=1, max_size=40),
       threshold=st.floats(-5, 5, allow_nan=False), ext=st.sampled_from([".jsonl", ".csv"]))
def test_fuzz_rollout_rows_count_rewards_at_or_above_the_threshold(rows, threshold, ext):
    with tempfile.TemporaryDirectory() as d:
        o = read_outcomes(_write(Path(d), ext, [{"id": p, "reward": r} for p, r in rows]),
                          success_threshold=threshold)
    # CSV round-trips the reward through repr(), JSON through its own float text: both exact
    want = defaultdict(lambda: [0, 0])
    for pid, r in rows:
        want[pid][0] += 1
        want[pid][1] += int(float(r) >= threshold)
    assert {p: [int(n), int(s)] for p, n, s in zip(o.ids, o.n, o.s)} == dict(want)


def _fuzz_garbage(path: Path, data: bytes):
    path.write_bytes(data)
    try:
        read_outcomes(path)
    except DataError as exc:
        msg = str(exc)
        assert msg.startswith(str(path)) and "\n" not in msg
        return msg
    return None  # by chance a valid file


JSON_CELL = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), st.text(max_size=5),
                      st.lists(st.integers(), max_size=2))
JSON_ROW = st.dictionaries(st.sampled_from(["id", "n", "s", "reward", "x"]), JSON_CELL, max_size=4)
GARBAGE_LINE = st.one_of(st.text(max_size=30), JSON_ROW.map(lambda r: json.dumps(r, allow_nan=True)),
                         st.binary(max_size=20).map(lambda b: b.decode("latin-1")))


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(GARBAGE_LINE, min_size=1, max_size=8))
def test_fuzz_garbage_jsonl_is_a_data_error_naming_the_line(lines):
    with tempfile.TemporaryDirectory() as d:
        raw = "\n".join(lines).encode("utf-8", errors="surrogatepass")
        msg = _fuzz_garbage(Path(d) / "g.jsonl", raw)
    if msg is not None and any(line.strip() for line in raw.split(b"\n")):
        assert re.match(r"^.*g\.jsonl:\d+: ", msg), msg


@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.binary(max_size=200),
                      st.lists(st.text(max_size=20), max_size=6).map(lambda ls: "\n".join(ls).encode(
                          "utf-8", errors="surrogatepass"))))
def test_fuzz_garbage_csv_and_bytes_is_a_data_error(data):
    with tempfile.TemporaryDirectory() as d:
        _fuzz_garbage(Path(d) / "g.csv", data)
        _fuzz_garbage(Path(d) / "g.jsonl", data)


def test_a_real_step_of_a_grpo_run_parses(shared_data, tmp_path):
    """First 128 rows of One-Shot-RLVR's accuracy history (step 1's batch) as an outcomes file."""
    rows = []
    with open(shared_data / "oneshot_rlvr" / "acc_history.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r["visit"] == 0:
                rows.append({"id": r["index"], "n": r["n_rollouts"], "s": r["n_correct"]})
            if len(rows) == 128:
                break
    o = read_outcomes(write_outcomes(tmp_path / "step1.csv", rows))
    assert len(o.ids) == len({r["id"] for r in rows})
    assert int(o.n.sum()) == sum(r["n"] for r in rows) and int(o.s.sum()) == sum(r["s"] for r in rows)
    assert np.all(o.s <= o.n)


def test_an_id_on_several_count_rows_is_summed_and_said(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_text('{"id": "a", "n": 8, "s": 3}\n{"id": "b", "n": 8, "s": 1}\n{"id": "a", "n": 8, "s": 5}\n')
    out = read_outcomes(path)
    assert _as_dict(out) == {"a": (16, 8), "b": (8, 1)}
    assert out.warnings == (f"{path}: 1 id(s) on more than one row (first 'a', lines 1 and 3); their n and s are "
                            "summed, as for a prompt rolled out in several groups",)
    rollouts = tmp_path / "r.jsonl"  # one row per rollout is that schema's shape: nothing to say
    rollouts.write_text('{"id": "a", "reward": 1}\n{"id": "a", "reward": 0}\n')
    assert _as_dict(read_outcomes(rollouts)) == {"a": (2, 1)} and read_outcomes(rollouts).warnings == ()


# ------------------------------------------------------------------ CSV read as strictly as JSON; files as streams

@pytest.mark.parametrize("header,words", [("id,n,s,id", "column 'id' appears twice"),
                                          ("id,n,n,s", "column 'n' appears twice"),
                                          ("id,s,n,s,n", "columns 'n', 's' appear twice")])
def test_a_csv_header_with_a_column_twice_is_refused(tmp_path, header, words):
    path = tmp_path / "o.csv"
    path.write_text(header + "\n" + ",".join(["a", "8", "3", "b", "1"][:header.count(",") + 1]) + "\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:1: {words} in the header"):
        read_outcomes(path)


def test_a_csv_column_graphdiff_does_not_read_may_repeat(tmp_path):
    path = tmp_path / "o.csv"
    path.write_text("id,n,s,note,note,,\na,8,3,x,y,,\n")
    assert _as_dict(read_outcomes(path)) == {"a": (8, 3)}


@pytest.mark.parametrize("cell", ["1_0", "\uff18", "\u0668", "8\u00a0", "nan", "inf", "0x8", "8e", "", "+"])
def test_csv_numbers_are_ascii_digits_as_json_writes_them(tmp_path, cell):
    path = tmp_path / "o.csv"
    path.write_text(f"id,n,s\na,{cell},0\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: n must be an integer"):
        read_outcomes(path)
    path.write_text(f"id,reward\na,{cell}\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: reward must be a number"):
        read_outcomes(path, success_threshold=0.5)


@pytest.mark.parametrize("cell,value", [(" 8 ", 8), ("8.0", 8), ("+8", 8), ("8e0", 8), ("80e-1", 8)])
def test_csv_numbers_still_read_as_before(tmp_path, cell, value):
    path = tmp_path / "o.csv"
    path.write_text(f"id,n,s\na,{cell},1\n", encoding="utf-8")
    assert _as_dict(read_outcomes(path)) == {"a": (value, 1)}


@pytest.mark.parametrize("ext", [".jsonl", ".csv"])
def test_text_outcomes_are_read_as_a_stream_and_hashed_whole(tmp_path, ext, monkeypatch):
    """JSONL and CSV are parsed line by line from one open file (never read whole: memory follows the ids, not
    the file), and the hash is of every byte of that file."""
    import hashlib

    rows = [{"id": f"p{i % 50}", "n": 4, "s": i % 5} for i in range(2000)]
    path = write_outcomes(tmp_path / f"o{ext}", rows)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
    out = read_outcomes(path)
    assert len(out.ids) == 50 and out.n_rows == 2000 and int(out.n.sum()) == 8000
    monkeypatch.undo()
    assert out.hash == hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test_an_unknown_id_is_refused_at_its_line_while_streaming(tmp_path):
    path = write_outcomes(tmp_path / "o.jsonl", [{"id": "a", "n": 1, "s": 0}, {"id": "zz", "n": 1, "s": 0}])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: unknown prompt id 'zz'"):
        read_outcomes(path, index=IdIndex(["a", "b"]))


@pytest.mark.parametrize("ext", [".jsonl", ".csv"])
def test_bad_bytes_are_refused_with_their_line(tmp_path, ext):
    path = tmp_path / f"o{ext}"
    head = b'{"id": "a", "n": 1, "s": 0}\n' if ext == ".jsonl" else b"id,n,s\n"
    path.write_bytes(head + b"a,1,0\n" * (ext == ".csv") + b"\xff\xfe,1,0\n")
    line = 3 if ext == ".csv" else 2
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:{line}: not UTF-8 text"):
        read_outcomes(path)
    path.write_bytes(head + b"b\x00,1,0\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: contains a NUL byte"):
        read_outcomes(path)


def test_a_csv_with_lone_carriage_returns_reads_as_lines(tmp_path):
    path = tmp_path / "o.csv"
    path.write_bytes(b"id,n,s\ra,8,3\rb,4,4\r")
    assert _as_dict(read_outcomes(path)) == {"a": (8, 3), "b": (4, 4)}
