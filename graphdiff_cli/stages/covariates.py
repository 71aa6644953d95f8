"""Covariates through the command line: which fields of a prompts file are read as covariates, and their encoding
(``core.covariates``) at embed, init and extend.

- ``graphdiff embed`` reads the fields (``CovariateFields``: ``--covariate``, ``--category``, ``--reference-rate``,
  ``--answer-field``; the prompt's text statistics unless ``--no-text-statistics``), makes the spec over all
  its prompts and writes the encoded covariates into the embeddings artifact beside the embeddings
  (``covariates``, ``reference_rate``, the attribute ``covariate_spec``; docs/reference/artifact-format.md);
- ``graphdiff init`` gives them to the estimator (``state_covariates``), whose model artifact keeps them, and keeps
  the fields and the spec in the model's ``prompt_set`` attribute;
- ``graphdiff extend`` reads the same fields of the new prompts and encodes them by that spec
  (``encode_new``), so a feature keeps its meaning.

A field is a column or a dotted path into nested fields (``extra_info.pass_rate``), read as ``--id-field`` is
(``io.tables.field_value``); a row without it has a missing value. No typer or rich.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError, InvalidArgumentError, option
from ..io.readers import COVARIATE_SPEC, COVARIATES, REFERENCE_RATE

# the key of the model's prompt_set attribute that holds the fields and the spec (init; extend reads it)
STATE_KEY = "covariates"


@dataclass(frozen=True)
class CovariateFields:
    """Which fields of a prompts file are covariates: ``numeric`` and ``categorical`` fields, a ``reference``
    pass rate (with the field of its number of ``attempts``), the ``answer`` field whose text statistics are
    taken, and whether the prompt's own ``text_statistics`` are."""

    numeric: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    reference: str | None = None
    attempts: str | None = None
    answer: str | None = None
    text_statistics: bool = True

    @classmethod
    def of_options(cls, covariates=(), categories=(), reference_rate: str | None = None,
                   answer_field: str | None = None, text_statistics: bool = True) -> "CovariateFields":
        """The fields of embed's options, checked: each a column or dotted path, none named twice."""
        from ..core.covariates import ANSWER_STATISTICS, TEXT_STATISTICS

        numeric = tuple(_field(f, "--covariate") for f in covariates or ())
        categorical = tuple(_field(f, "--category") for f in categories or ())
        reference = attempts = None
        if reference_rate is not None:
            reference, sep, attempts = str(reference_rate).partition(":")
            reference = _field(reference, "--reference-rate")
            attempts = _field(attempts, "--reference-rate (after the colon: the attempts field)") if sep else None
        answer = None if answer_field is None else _field(answer_field, "--answer-field")
        names = list(numeric) + list(categorical) + ([reference] if reference else [])
        if text_statistics:
            names += list(TEXT_STATISTICS)
        if answer is not None:
            names += list(ANSWER_STATISTICS) + ["answer_missing"]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InvalidArgumentError(f"covariate {twice[0]!r} is named twice (each field is one covariate: "
                                       f"{option('--covariate')}, {option('--category')} or "
                                       f"{option('--reference-rate')}, and the text statistics have these names)")
        return cls(numeric, categorical, reference, attempts, answer, bool(text_statistics))

    @property
    def any(self) -> bool:
        """Whether these fields give any covariate."""
        return bool(self.numeric or self.categorical or self.reference or self.answer or self.text_statistics)

    @property
    def explicit(self) -> bool:
        """Whether a field was named (the text statistics are on by default)."""
        return bool(self.numeric or self.categorical or self.reference or self.answer)

    def paths(self) -> list[str]:
        """The fields read from each row."""
        out = [*self.numeric, *self.categorical]
        out += [f for f in (self.reference, self.attempts, self.answer) if f is not None]
        return list(dict.fromkeys(out))

    def as_dict(self) -> dict:
        return {**asdict(self), "numeric": list(self.numeric), "categorical": list(self.categorical)}

    @classmethod
    def from_dict(cls, d: dict) -> "CovariateFields":
        try:
            return cls(**{**d, "numeric": tuple(d.get("numeric", ())), "categorical": tuple(d.get("categorical", ()))})
        except TypeError as exc:
            raise DataError(f"unreadable covariate fields: {exc}") from None


def _field(name, flag: str) -> str:
    if not isinstance(name, str) or not name.strip() or any(not p for p in name.split(".")):
        raise InvalidArgumentError(f"{option(flag)} must name a column or a dotted path such as extra_info.pass_rate, "
                                   f"got {name!r}")
    return name


def read_fields(path, fields: CovariateFields, data: bytes | None = None) -> tuple[dict[str, list], list[int]]:
    """{field: one value per row of the prompts file ``path`` (None where the row lacks it, or holds empty text:
    a CSV's empty cell)}, in file order (the order ``io.tables.read_prompts`` gives the prompts). ``data``: the
    file's bytes, already read. With them, each row's line in the file (``io.tables.read_rows``)."""
    from ..io.tables import field_value, read_rows

    paths = fields.paths()
    out: dict[str, list] = {f: [] for f in paths}
    lines: list[int] = []
    if not paths:
        return out, lines
    for line, row in read_rows(path, data=data):
        lines.append(line)
        for f in paths:
            found, value = field_value(row, f)
            out[f].append(None if not found or (isinstance(value, str) and not value.strip()) else value)
    return out, lines


def _at_line(exc: DataError, path, lines: list[int]) -> DataError:
    """``core.covariates``' one-line refusal, its row (an index among the prompts) named by its line in ``path``."""
    msg = str(exc)
    m = re.search(r"\brow (\d+)\b", msg)
    if m is None or int(m.group(1)) >= len(lines):
        return DataError(f"{path}: {msg}")
    return DataError(f"{path}:{lines[int(m.group(1))]}: {msg[:m.start()]}this row{msg[m.end():]}")


def raw_columns(fields: CovariateFields, texts: list[str], values: dict[str, list]) -> dict:
    """{column name: ``core.covariates.Raw``} of these prompts (their texts and ``read_fields``' values), in the
    order the spec's columns take: text statistics, numeric fields, categorical fields, the reference rate."""
    from ..core.covariates import Raw, text_statistics

    raw = {}
    if fields.text_statistics or fields.answer is not None:
        stats = text_statistics(texts, values[fields.answer] if fields.answer is not None else None)
        if not fields.text_statistics:  # only the answer's
            stats = {k: v for k, v in stats.items() if not k.startswith("prompt_")}
        raw.update({name: Raw("text", v) for name, v in stats.items()})
    raw.update({f: Raw("numeric", values[f]) for f in fields.numeric})
    raw.update({f: Raw("categorical", values[f]) for f in fields.categorical})
    if fields.reference is not None:
        raw[fields.reference] = Raw("reference", values[fields.reference],
                                    attempts=None if fields.attempts is None else values[fields.attempts],
                                    attempts_field=fields.attempts)
    return raw


def embed_covariates(path, fields: CovariateFields, texts: list[str], data: bytes | None = None):
    """(spec, ``Encoded``) of the prompts file ``path`` (its prompts' ``texts`` in file order), the spec made over
    all of them; (None, None) when the fields give no covariate. A bad value is refused in one line."""
    from ..core.covariates import encode, make_spec

    if not fields.any:
        return None, None
    values, lines = read_fields(path, fields, data)
    raw = raw_columns(fields, texts, values)
    try:
        spec = make_spec(raw)
        return spec, encode(spec, raw, len(texts))
    except DataError as exc:
        raise _at_line(exc, path, lines) from None


def artifact_parts(spec, enc) -> tuple[dict, dict]:
    """(arrays, attributes) of the embeddings artifact that hold the encoded covariates."""
    arrays = {COVARIATES: np.ascontiguousarray(enc.features, dtype=np.float64)}
    if enc.reference is not None:
        arrays[REFERENCE_RATE] = np.asarray(enc.reference, dtype=np.float64)
    return arrays, {COVARIATE_SPEC: spec.as_dict()}


def summary(spec, enc) -> dict | None:
    """What embed says of the covariates: the columns, the features, what the encoding filled in."""
    if spec is None:
        return None
    return {"columns": [{"name": c.name, "kind": c.kind} for c in spec.columns], "features": spec.names,
            "width": spec.width, "reference": None if spec.reference is None else spec.reference.name,
            "notes": list(enc.notes)}


# ---------------------------------------------------------------------------------------------- init

def state_covariates(graph, embeddings, settings, use: bool = True) -> tuple:
    """(the ``io.readers.CovariateInputs`` the STATE keeps, or None; what init says about them; the entry of the
    model's prompt_set attribute for extend, or None). Read from the embeddings artifact the graph was built from
    (``embeddings``, else where build-graph read it) when the covariates' read-out is on and ``use``."""
    from ..io.readers import covariate_inputs, read_embeddings

    if not use:
        return None, {"on": False, "why": f"{option('--no-covariates')} was given"}, None
    if settings.covariate_readout is None:
        return None, {"on": False, "why": "the setting covariate_readout is null"}, None
    path = embeddings if embeddings is not None else graph.art.attr("embeddings_path")
    if path is None or not Path(path).exists():
        why = (f"the embeddings the graph was built from are not at {path}" if path else
               "the graph does not say where its embeddings are")
        return None, {"on": False, "why": f"{why}; pass {option('--embeddings')} to use the covariates"}, None
    cov = covariate_inputs(path, graph)
    if cov is None:
        return None, {"on": False, "why": f"{path} has no covariates (graphdiff embed made it without them)"}, None
    fields = read_embeddings(path).params.get("covariates")
    info = {"on": True, "embeddings": str(Path(path).resolve()), "features": cov.spec.names,
            "width": cov.spec.width, "reference": None if cov.spec.reference is None else cov.spec.reference.name}
    return cov, info, {"fields": fields, "spec": cov.spec.as_dict()}


# -------------------------------------------------------------------------------------------- extend

def encode_new(entry: dict, path, texts: list[str], data: bytes | None = None):
    """The ``Encoded`` covariates of new prompts (the prompts file ``path``, their ``texts`` in file order) by the
    spec and fields a STATE keeps (``entry``: ``state_covariates``' third value): the same fields read, encoded as
    the first prompts were. A category not seen then, or a missing value, is said in its notes."""
    from ..core.covariates import CovariateSpec, encode

    if not isinstance(entry, dict) or not isinstance(entry.get("fields"), dict):
        raise DataError("the STATE's covariates do not say which fields they were read from; re-create the STATE "
                        "with graphdiff init")
    fields = CovariateFields.from_dict(entry["fields"])
    spec = CovariateSpec.from_dict(entry["spec"])
    values, lines = read_fields(path, fields, data)
    raw = raw_columns(fields, texts, values)
    try:
        return encode(spec, raw, len(texts))
    except DataError as exc:
        raise _at_line(exc, path, lines) from None


def encode_embedded(entry: dict, path):
    """The ``Encoded`` covariates of new prompts given as their embeddings artifact ``path`` (``extend
    --embedded``), by the spec a STATE keeps: the artifact's own covariates (made by embed with the same fields,
    encoded by a spec of their own) are decoded to the values they were made from (``decoded``) and encoded
    again by the STATE's spec."""
    from ..core.covariates import CovariateSpec, encode
    from ..io.readers import read_embeddings

    art = read_embeddings(path)
    fields = art.params.get("covariates")
    if fields != entry.get("fields") or COVARIATES not in art.names:
        said = "none" if fields is None else CovariateFields.from_dict(fields).as_dict()
        raise DataError(f"{path}: its covariates ({said}) are not the ones the STATE's prompts were embedded with "
                        f"({entry.get('fields')}); embed the new prompts with the same covariate options, or give "
                        f"them as {option('--prompts')}")
    own = CovariateSpec.from_dict(art.attr(COVARIATE_SPEC) or {})
    x = np.asarray(art.array(COVARIATES), dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != own.width:
        raise DataError(f"{path}: covariates of shape {x.shape} do not fit its spec's {own.width} features; re-run "
                        "graphdiff embed")
    ref = np.asarray(art.array(REFERENCE_RATE), dtype=np.float64) if REFERENCE_RATE in art.names else None
    try:
        return encode(CovariateSpec.from_dict(entry["spec"]), decoded(own, x, ref), x.shape[0])
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None


def decoded(spec, features: np.ndarray, reference: np.ndarray | None) -> dict:
    """{column: ``core.covariates.Raw``}: the values ``features`` were encoded from by ``spec`` (a centred and
    scaled value scaled back, to float rounding; None where its missing indicator is set; a category from its
    indicator, None for the baseline: a value not kept or none), the reference rates as given (already smoothed
    by their attempts), the answer's statistics None where ``answer_missing`` says it is."""
    from ..core.covariates import ANSWER_STATISTICS, Raw

    raw, j, n = {}, 0, features.shape[0]
    for col in spec.columns:
        width = len(col.features())
        block, j = features[:, j:j + width], j + width
        if col.kind == "categorical":
            on = block.argmax(axis=1) if width else np.zeros(n, np.int64)
            has = block.max(axis=1) > 0.5 if width else np.zeros(n, bool)
            raw[col.name] = Raw("categorical", [col.categories[k] if h else None for k, h in zip(on, has)])
        elif col.kind == "reference":
            raw[col.name] = Raw("reference", [None if np.isnan(r) else float(r) for r in reference])
        else:
            missing = block[:, 1] > 0.5 if col.missing else np.zeros(n, bool)
            values = block[:, 0] * col.scale + col.center
            raw[col.name] = Raw(col.kind, [None if m else float(v) for v, m in zip(values, missing)])
    if "answer_missing" in raw:
        gone = [v is not None and v > 0.5 for v in raw["answer_missing"].values]
        for name in ANSWER_STATISTICS:
            if name in raw:
                raw[name] = Raw("text", [None if g else v for v, g in zip(raw[name].values, gone)])
    return raw
