"""Users' tables: JSONL, CSV or Parquet files of rows, read with line numbers for error messages.

``read_rows`` is the one reader every user file goes through (prompts, outcomes, id lists, logs).
Errors name the file and the line (JSONL: the physical line; CSV: the line of the record, header = 1;
Parquet: the row number, first row = 1) and are raised as ``DataError``.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import re
import sys
from pathlib import Path
from typing import Iterator

from ..errors import DataError, InvalidArgumentError, option

FORMATS = ("jsonl", "csv", "parquet")
# the one map from a file's extension to its table format (readers, writers, the watch inbox)
SUFFIX_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "csv",
                  ".parquet": "parquet", ".pq": "parquet"}


def detect_format(path, fmt: str | None = None) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise InvalidArgumentError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
        return fmt
    fmt = SUFFIX_FORMATS.get(Path(path).suffix.lower())
    if fmt is not None:
        return fmt
    raise InvalidArgumentError(f"{path}: cannot tell the format from the extension; use .jsonl, .csv or .parquet")


def read_rows(path, fmt: str | None = None, data: bytes | None = None, stream=None,
              columns=None) -> Iterator[tuple[int, dict]]:
    """Yield (line number, row dict) for every data row of a JSONL, CSV or Parquet file; ``data``: the file's
    bytes, already read (a reader that hashes what it parses reads the file once: ``read_file_once``);
    ``stream``: a binary file object to read JSONL or CSV from as it goes (``open_hashed``), so a file of any
    size is parsed in constant memory. ``columns``: the columns the caller reads; a CSV header that names one of
    them twice is refused (which one is meant?), other repeated names are ignored as other columns are (None:
    any name given twice is refused)."""
    path = Path(path)
    if data is None and stream is None and not path.is_file():
        raise DataError(f"{path}: no such file")
    fmt = detect_format(path, fmt)
    source = stream if stream is not None else data
    if fmt == "jsonl":
        yield from _read_jsonl(path, source)
    elif fmt == "csv":
        yield from _read_csv(path, source, columns)
    else:
        yield from _read_parquet(path, data if stream is None else stream.read())


def read_file_once(path) -> tuple[bytes, str]:
    """(the bytes of ``path``, their content hash), from one open: what is parsed is what is hashed, even when
    the file is replaced (renamed over) while it is read."""
    import hashlib

    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a file") from None
    return data, hashlib.sha256(data).hexdigest()[:16]


class _Hashing(io.RawIOBase):
    """A binary file that hashes every byte read from it."""

    def __init__(self, f):
        self._f = f
        self._sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = self._f.readinto(b)
        if n:
            self._sha.update(memoryview(b)[:n])
        return n

    def digest(self) -> str:
        """The content hash (sha256, 16 hex digits) of the whole file: what was not read yet is read first."""
        buf = bytearray(1 << 20)
        while n := self._f.readinto(buf):
            self._sha.update(memoryview(buf)[:n])
        return self._sha.hexdigest()[:16]


@contextlib.contextmanager
def open_hashed(path):
    """Open ``path`` once to parse it as a stream: yields (binary stream, digest()), where ``digest()`` is the
    content hash of every byte of that open file (read to its end first), so what is parsed is what is
    hashed even when the file is replaced (renamed over) meanwhile, and nothing is held whole in memory."""
    path = Path(path)
    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder, not a file") from None
    with f:
        raw = _Hashing(f)
        yield io.BufferedReader(raw, buffer_size=1 << 20), raw.digest


def unique_keys(pairs) -> dict:
    """``json.loads``'s object_pairs_hook that refuses an object with a key twice (json keeps the last, silently:
    ``{"s": 1, "s": 8}`` would be 8 successes)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise DataError(f"duplicate key {_show(key)} in a JSON object (which value is meant?)")
        obj[key] = value
    return obj


def load_json(text, where) -> object:
    """The one parser of JSON a user gives (rows of outcomes, prompts and id tables, the One-Shot log): a key
    twice in an object, a number of more digits than Python converts (4,300) and nesting deeper than its
    recursion limit are each one ``DataError`` line starting with ``where``, as malformed JSON is."""
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DataError as exc:
        raise DataError(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: malformed JSON ({exc.msg})") from None
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply to read") from None
    except ValueError:  # json's int() of a literal longer than sys.get_int_max_str_digits()
        raise DataError(f"{where}: a JSON number with more than {sys.get_int_max_str_digits()} digits") from None


def _opened(path: Path, source):
    """A binary file to read: ``source``'s bytes, ``source`` itself when it is a stream (left open for its
    owner), else ``path`` opened."""
    if source is None:
        return open(path, "rb")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source)
    return _Unclosed(source)


class _Unclosed(io.BufferedIOBase):
    """``stream`` read through a ``with`` that must not close it (its opener closes it)."""

    def __init__(self, stream):
        self._s = stream

    def readable(self) -> bool:
        return True

    def read(self, size=-1):
        return self._s.read(size)

    def read1(self, size=-1):
        return self._s.read1(size)

    def readinto(self, b):
        return self._s.readinto(b)

    def readline(self, size=-1):
        return self._s.readline(size)


def _text_lines(path: Path, f):
    """(line number, text) of each line of the binary file ``f``, as read (ends kept): a line that is not UTF-8
    or holds a NUL byte is refused with its number; a UTF-8 byte order mark before the first is dropped."""
    for line_no, raw in enumerate(f, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"{path}:{line_no}: not UTF-8 text") from None
        if "\x00" in line:
            raise DataError(f"{path}:{line_no}: contains a NUL byte (binary data, not a text table)")
        if line_no == 1 and line.startswith("\ufeff"):
            line = line[1:]  # a UTF-8 byte order mark (some Windows tools write one): not part of the data
        yield line_no, line


def _read_jsonl(path: Path, source=None):
    with _opened(path, source) as f:
        for line_no, line in _text_lines(path, f):
            if not line.strip(" \t\r\n"):  # JSON's own whitespace only: U+0085 is no blank line
                continue
            row = load_json(line, f"{path}:{line_no}")
            if not isinstance(row, dict):
                raise DataError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            yield line_no, row


_LONE_CR = re.compile(r"(?<=\r)(?!\n)")  # a line end of a file written with CR alone


def _read_csv(path: Path, source=None, columns=None):
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    try:
        with _opened(path, source) as f:
            lines = (part for _, line in _text_lines(path, f)
                     for part in (_LONE_CR.split(line) if "\r" in line.rstrip("\r\n") else (line,)) if part)
            reader = csv.DictReader(lines, delimiter=delimiter)
            if reader.fieldnames is None:
                return
            twice = sorted({c for c in reader.fieldnames if reader.fieldnames.count(c) > 1 and c.strip()
                            and (columns is None or c in columns)})
            if twice:
                raise DataError(f"{path}:1: column{'s' if len(twice) > 1 else ''} "
                                f"{', '.join(_show(c) for c in twice)} appear{'' if len(twice) > 1 else 's'} twice "
                                "in the header (which one is meant?)")
            for row in reader:
                line_no = reader.line_num
                if None in row:
                    raise DataError(f"{path}:{line_no}: more fields than the header has")
                if any(v is None for v in row.values()):
                    raise DataError(f"{path}:{line_no}: fewer fields than the header has")
                yield line_no, row
    except csv.Error as exc:
        raise DataError(f"{path}: malformed CSV ({exc})") from None


PARQUET_BATCH_ROWS = 16_384  # rows decoded at a time


def _read_parquet(path: Path, data: bytes | None = None):
    """Rows of a Parquet file, decoded one record batch at a time, column by column: only one batch's values
    exist as Python objects at once (the whole table as row dicts took 1.32 GB for a 381 KB file of 3e6 rows)."""
    def unreadable(exc):
        return DataError(f"{path}: cannot be read as Parquet ({exc.__class__.__name__})")

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        batches = pq.ParquetFile(pa.BufferReader(data) if data is not None else path).iter_batches(
            batch_size=PARQUET_BATCH_ROWS)
    except Exception as exc:  # noqa: BLE001
        raise unreadable(exc) from None
    i = 0
    while True:
        try:
            batch = next(batches, None)
            if batch is None:
                return
            names, columns = batch.schema.names, [column.to_pylist() for column in batch.columns]
        except Exception as exc:  # noqa: BLE001 - a damaged row group
            raise unreadable(exc) from None
        for values in zip(*columns):
            i += 1
            yield i, dict(zip(names, values))


def write_rows(path, rows, fmt: str | None = None, columns: list[str] | None = None) -> Path:
    """Write rows (dicts; any iterable when ``columns`` is given: JSONL and CSV stream it, so 150k rows
    need not be held as dicts) atomically (temporary file in the same folder, fsync, rename)."""
    from .atomic import atomic_write

    path = Path(path)
    fmt = detect_format(path, fmt)
    if columns is None:
        rows = list(rows)
        columns = list(rows[0].keys()) if rows else []
    if fmt == "parquet":
        rows = list(rows)
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: [r.get(c) for r in rows] for c in columns})
        with atomic_write(path, binary=True) as f:
            pq.write_table(table, f)
        return path
    with atomic_write(path) as f:
        if fmt == "jsonl":
            for r in rows:
                f.write(json.dumps({c: r.get(c) for c in columns}, allow_nan=False) + "\n")
        else:
            w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    return path


def _show(value) -> str:
    """repr of a bad cell, cut short so one error stays one line."""
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


# A number written as text (a CSV cell): ASCII digits, an optional sign, fraction and exponent, as JSON writes
# numbers; no "1_000" (Python's int() reads it as 1000), no full-width or other Unicode digits, no "nan"/"inf".
_BLANK = " \t\r\n"  # around a number in a cell; a no-break space is no blank
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def as_int(value, path, line_no: int, field: str, strict: bool = False) -> int:
    """An integer count from a cell ("8", 8, 8.0); NaN, fractions, booleans and text are refused. ``strict``
    (typed formats: JSON, Parquet): a number written as a string ("8") is refused too."""
    if strict and isinstance(value, str):
        raise DataError(f"{path}:{line_no}: {field} must be a number, got the string {_show(value)} (write {field} "
                        "as a JSON number)")
    if isinstance(value, bool):
        raise DataError(f"{path}:{line_no}: {field} must be an integer, got {_show(value)}")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value):
            return int(value)
        raise DataError(f"{path}:{line_no}: {field} must be an integer, got {_show(value)}")
    if isinstance(value, str):
        v = value.strip(_BLANK)
        if not _NUMBER.fullmatch(v):
            raise DataError(f"{path}:{line_no}: {field} must be an integer, got {_show(value)}")
        try:
            return int(v)
        except ValueError:
            return as_int(float(v), path, line_no, field)
    raise DataError(f"{path}:{line_no}: {field} must be an integer, got {_show(value)}")


def as_float(value, path, line_no: int, field: str, strict: bool = False) -> float:
    """A finite number from a cell; NaN, infinities, booleans and text are refused (``strict``: as ``as_int``)."""
    if strict and isinstance(value, str):
        raise DataError(f"{path}:{line_no}: {field} must be a number, got the string {_show(value)} (write {field} "
                        "as a JSON number)")
    if isinstance(value, bool) or value is None or (isinstance(value, str) and not _NUMBER.fullmatch(value.strip(_BLANK))):
        raise DataError(f"{path}:{line_no}: {field} must be a number, got {_show(value)}")
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        raise DataError(f"{path}:{line_no}: {field} must be a number, got {_show(value)}") from None
    if not math.isfinite(f):
        raise DataError(f"{path}:{line_no}: {field} must be a finite number, got {_show(value)}")
    return f


def as_id(value, path, line_no: int, field: str) -> str:
    """A prompt id as a string, exactly as given: ids are exact strings (" p1" and "p1\\u2028" are not "p1";
    nothing is stripped), and a number is its decimal text (12, 12.0 and "12" are the same id). An empty id, or
    one of whitespace only, is refused."""
    if value is None or isinstance(value, (dict, list, bool)):
        raise DataError(f"{path}:{line_no}: {field} is missing or not a string/number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DataError(f"{path}:{line_no}: {field} must be a string or integer, got {_show(value)}")
        if value == int(value):
            value = int(value)
    s = str(value)
    if not s.strip():
        raise DataError(f"{path}:{line_no}: {field} is empty" + (" (whitespace only)" if s else ""))
    return s


# How a chat-list prompt ([{"role": ..., "content": ...}, ...], as verl's preprocessing scripts and TRL's
# conversational datasets write it) becomes the one text that is embedded. The policy sees the messages
# through its tokenizer's chat template, which graphdiff does not have; neither choice is that text.
MESSAGES_MODES = ("user", "all")
DEFAULT_MESSAGES = "user"  # the user turns' contents: what differs between prompts; a plain prompt's own text


def field_value(row: dict, field: str) -> tuple[bool, object]:
    """(found, value) of ``field`` in a row: a column of that exact name, else a dotted path into nested
    objects (``extra_info.index``: the ``index`` of the ``extra_info`` struct/object)."""
    if field in row:
        return True, row[field]
    value = row
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


DEFAULT_ID_FIELD = "id"
def id_field_hint() -> str:
    """How to name the id column, in the caller's terms (a flag on the command line, a keyword in Python)."""
    return f"use {option('--id-field')} to name the id column, e.g. extra_info.index for a verl parquet"


def row_id(row: dict, id_field: str, path, line_no: int) -> str:
    """The prompt id of a table row: its ``id_field`` (a column, or a dotted path into nested fields:
    ``field_value``) as ``as_id`` reads it; a row without that field is refused with its line. The one reader of
    ids in prompts, ids and outcomes files (``embed``/``extend``'s and ``select``/``predict``/``update``'s
    ``--id-field``)."""
    found, value = field_value(row, id_field)
    if not found:
        raise DataError(f"{path}:{line_no}: no {id_field!r} field ({id_field_hint()})")
    return as_id(value, path, line_no, id_field)


def check_id_field(id_field) -> str:
    """``--id-field`` as given: a non-empty column name or dotted path."""
    if not isinstance(id_field, str) or not id_field.strip() or any(not p for p in id_field.split(".")):
        raise InvalidArgumentError(f"{option('--id-field')} must name a column or a dotted path such as extra_info.index, "
                                   f"got {id_field!r}")
    return id_field


def _content_text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}, {"type": "image"}, ...]
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if all(isinstance(t, str) for t in parts):
            return "\n".join(parts)
    raise DataError(f"{where}: content is neither text nor a list of {{type: text, text}} parts, got {_show(content)}")


def prompt_text(value, where: str, field: str, messages: str = DEFAULT_MESSAGES) -> str:
    """The text to embed of a prompt cell: a string as it is; a chat list of ``{role, content}`` messages
    flattened by ``messages``: "user" joins the user turns' contents with a blank line, "all" joins every
    turn as "role: content". Anything else, and a chat with no user turn under "user", is refused."""
    if isinstance(value, str):
        return value
    if messages not in MESSAGES_MODES:
        raise InvalidArgumentError(f"--messages must be one of {', '.join(MESSAGES_MODES)}, got {messages!r}")
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(m, dict) for m in value):
        raise DataError(f"{where}: {field} is neither text nor a chat list of {{role, content}} messages, got "
                        f"{_show(value)}")
    turns = []
    for k, m in enumerate(value):
        if not isinstance(m.get("role"), str) or "content" not in m:
            raise DataError(f"{where}: {field}[{k}] is not a {{role, content}} message, got {_show(m)}")
        turns.append((m["role"], _content_text(m["content"], f"{where}: {field}[{k}]")))
    if messages == "all":
        return "\n\n".join(f"{role}: {text}" for role, text in turns)
    users = [text for role, text in turns if role == "user"]
    if not users:
        raise DataError(f"{where}: {field} has no user message (roles: {', '.join(r for r, _ in turns)}); use "
                        "--messages all to embed every turn")
    return "\n\n".join(users)


def prompt_row_text(row: dict, text_field: str, path, line_no: int, messages: str = DEFAULT_MESSAGES) -> str:
    """The prompt text of one row as ``graphdiff embed`` embeds it (``text_field`` a column or dotted path, a chat
    list flattened by ``prompt_text``); a row without it, or with an empty one, is refused with its line. The one
    check of a row's text: ``read_prompts`` and ``graphdiff ids`` make it."""
    found, text = field_value(row, text_field)
    if not found:
        raise DataError(f"{path}:{line_no}: no {text_field!r} field (use {option('--text-field')} to name the text column)")
    text = prompt_text(text, f"{path}:{line_no}", text_field, messages)
    if not text.strip():
        raise DataError(f"{path}:{line_no}: {text_field} is empty")
    return text


def read_prompts(path, id_field: str = "id", text_field: str = "prompt", fmt: str | None = None,
                 messages: str = DEFAULT_MESSAGES, data: bytes | None = None) -> tuple[list[str], list[str]]:
    """(ids, texts) of a prompts file; duplicate or empty ids and empty texts are refused with the line.

    Fields are columns or dotted paths into nested objects (``extra_info.index``, ``field_value``); a chat-list
    prompt is flattened by ``prompt_text``. Ids are strings: an integer id (verl's ``extra_info.index``) is
    its decimal text, as the trainer integrations report it. ``data``: the file's bytes, already read."""
    if messages not in MESSAGES_MODES:
        raise InvalidArgumentError(f"--messages must be one of {', '.join(MESSAGES_MODES)}, got {messages!r}")
    ids: list[str] = []
    texts: list[str] = []
    first_line: dict[str, int] = {}
    for line_no, row in read_rows(path, fmt, data):
        pid = row_id(row, id_field, path, line_no)
        text = prompt_row_text(row, text_field, path, line_no, messages)
        if pid in first_line:
            raise DataError(f"{path}:{line_no}: duplicate id {pid!r} (first on line {first_line[pid]})")
        first_line[pid] = line_no
        ids.append(pid)
        texts.append(text)
    if not ids:
        raise DataError(f"{path}: no prompts")
    return ids, texts
