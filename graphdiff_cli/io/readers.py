"""One reader per artifact kind and input file, used by every stage, bench script and integration.

Each artifact reader checks the stamp (kind, format version: ``artifacts.read_artifact``), the arrays'
shapes, and the provenance the same way: an artifact made from another (clusters from a graph, a graph
from embeddings) must name that artifact's content hash in its ``inputs``, so a STATE or a report can
never combine a graph with clusters or embeddings of another prompt set. Errors are one line naming
the file and how to fix it.

- ``read_graph``        "graph" artifact -> ``Graph`` (ids, W, the kNN lists on demand)
- ``read_clusters``     "clusters" artifact made from that graph -> ``Clusters`` (labels in graph order, K)
- ``read_embeddings``   "embeddings" artifact (whole, not a shard); ``embedding_matrix`` aligns it to a graph
- ``covariate_inputs``  the encoded covariates an embeddings artifact holds (``graphdiff embed``), in a graph's order
- ``read_inputs``       graph + clusters (+ embeddings), what init, evaluate and the benchmarks start from
- ``read_log``          a training log (step, id, n, s[, p_true]) with ids mapped to graph nodes
- ``read_id_file``      an ids file (a table with an ``id`` column or one id per line)
- ``IdIndex``           prompt id -> node index, the one place an unknown id is refused
- ``read_mapping``      a YAML mapping with the line of each key (settings files)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import ArtifactError, DataError, InvalidArgumentError, option
from .artifacts import Artifact, read_artifact
from .tables import SUFFIX_FORMATS


# ----------------------------------------------------------------------------------------------------
# prompt ids


class IdIndex:
    """Prompt ids (row i = node i) and the map back; ``nodes`` refuses an id it does not know."""

    def __init__(self, ids: Sequence[str], what: str = "the graph's prompts"):
        self.ids = [str(x) for x in ids]
        self.what = what
        self._index: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def index(self) -> dict[str, int]:
        if self._index is None:
            self._index = {pid: i for i, pid in enumerate(self.ids)}
        return self._index

    def get(self, pid: str) -> int | None:
        return self.index.get(str(pid))

    def nodes(self, ids: Iterable, where=None) -> np.ndarray:
        """Node indices of ``ids``; ``where(j)`` names the place of the j-th id in an error (default
        ``ids[j]``): "<where>: unknown prompt id '<id>' (not among ...)"."""
        ids = list(ids)
        out = np.empty(len(ids), dtype=np.int64)
        index = self.index
        for j, pid in enumerate(ids):
            i = index.get(str(pid))
            if i is None:
                place = where(j) if where is not None else f"ids[{j}]"
                pid = str(pid)
                hint = (f"; it differs from the known id {pid.strip()!r} only by whitespace (ids are exact strings)"
                        if pid.strip() != pid and pid.strip() in index else "")
                raise DataError(f"{place}: unknown prompt id {pid!r} (not among {self.what}, {len(self.ids)} ids)"
                                + hint)
            out[j] = i
        return out


def read_id_file(path, *, unique: bool = True, data: bytes | None = None,
                 id_field: str = "id") -> list[tuple[int, str]]:
    """(line, id) pairs of an ids file: a table with an ``id`` column (.jsonl/.csv/.tsv/.parquet; ``id_field``
    names another column or a dotted path into nested fields, ``tables.row_id``) or
    plain text with one id per line, each exactly as written: only its line end (\\n or \\r\\n) is dropped (and a
    UTF-8 byte order mark before the first), empty lines are skipped. With ``unique``, a repeated id is refused
    with both lines. ``data``: the file's bytes, already read (``tables.read_file_once``)."""
    from .tables import check_id_field, read_rows, row_id

    path = Path(path)
    id_field = check_id_field(id_field)
    if data is None and not path.is_file():
        raise DataError(f"{path}: no such ids file")
    pairs: list[tuple[int, str]] = []
    if path.suffix.lower() in SUFFIX_FORMATS:
        for line_no, row in read_rows(path, data=data):
            pairs.append((line_no, row_id(row, id_field, path, line_no)))
    elif id_field != "id":
        raise InvalidArgumentError(f"{path}: {option('--id-field')} {id_field} names a column, but this is a plain "
                                   "list of ids (one per line); give a .jsonl/.csv/.parquet table or leave "
                                   f"{option('--id-field')} out")
    else:
        try:
            text = (path.read_bytes() if data is None else data).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise DataError(f"{path}: not UTF-8 text") from None
        # split at \n only (str.splitlines would also split at U+2028, U+0085, ...: characters of an id)
        lines = (line.removesuffix("\r") for line in text.split("\n"))
        pairs = [(i, line) for i, line in enumerate(lines, start=1) if line]
    if not pairs:
        raise DataError(f"{path}: no ids")
    if unique:
        first: dict[str, int] = {}
        for line_no, pid in pairs:
            if pid in first:
                raise DataError(f"{path}:{line_no}: duplicate id {pid!r} (first on line {first[pid]}); "
                                "each prompt may appear once")
            first[pid] = line_no
    return pairs


def id_file_nodes(path, index: IdIndex, *, unique: bool = True, data: bytes | None = None,
                  id_field: str = "id") -> tuple[list[str], np.ndarray]:
    """(ids, node indices) of an ids file (``read_id_file``), unknown ids refused with their line."""
    pairs = read_id_file(path, unique=unique, data=data, id_field=id_field)
    nodes = index.nodes((pid for _, pid in pairs), where=lambda j: f"{path}:{pairs[j][0]}")
    return [pid for _, pid in pairs], nodes


def id_nodes(source, index: IdIndex, *, unique: bool = True, data: bytes | None = None,
             id_field: str = "id") -> tuple[list[str], np.ndarray, str]:
    """(ids, node indices, where) of ``source``: an ids file (``id_file_nodes``; ``id_field``: where a table
    holds the id) or a list of ids given in memory, checked alike (none at all, with ``unique`` a repeat, and
    an unknown id refused in one line)."""
    if isinstance(source, (str, Path)):
        return (*id_file_nodes(source, index, unique=unique, data=data, id_field=id_field), str(source))
    ids = [str(x) for x in source]
    if not ids:
        raise DataError("no ids given")
    if unique:
        seen: dict[str, int] = {}
        for j, pid in enumerate(ids):
            if pid in seen:
                raise DataError(f"ids[{j}]: prompt {pid!r} repeats ids[{seen[pid]}]")
            seen[pid] = j
    return ids, index.nodes(ids), "the ids given"


# ----------------------------------------------------------------------------------------------------
# artifacts


@dataclass
class Graph:
    """A read "graph" artifact: prompt ids (node order), W (symmetric CSR) and the artifact."""

    art: Artifact
    ids: list[str]
    w: object  # scipy.sparse.csr_matrix
    index: IdIndex = field(init=False)

    def __post_init__(self):
        self.index = IdIndex(self.ids, f"the prompts of {self.art.path}")

    @property
    def path(self) -> Path:
        return self.art.path

    def knn_indices(self) -> np.ndarray:
        """The kNN lists the graph was built from (N x k; spectral clustering's fallback)."""
        knn = self.art.array("knn_indices")
        if knn.ndim != 2 or knn.shape[0] != len(self.ids):
            raise ArtifactError(f"{self.path}: knn_indices shape {knn.shape} does not fit {len(self.ids)} ids; "
                                "rebuild the graph")
        return knn


def read_graph(path) -> Graph:
    """A "graph" artifact, its CSR arrays checked against its ids and W validated (``core.graph``)."""
    import scipy.sparse as sp

    from ..core.graph import validate_graph

    art = read_artifact(path, "graph")
    ids = [str(x) for x in art.array("ids")]
    n = len(ids)
    indptr, indices, data = art.array("indptr"), art.array("indices"), art.array("data")
    if indptr.shape != (n + 1,) or indices.shape != data.shape or (n and indptr[-1] != indices.size):
        raise ArtifactError(f"{path}: CSR arrays do not fit {n} ids; rebuild the graph")
    if indices.size and (indices.min() < 0 or indices.max() >= n):
        raise ArtifactError(f"{path}: CSR column indices out of range; rebuild the graph")
    if len(set(ids)) != n:
        raise ArtifactError(f"{path}: the graph's ids are not unique")
    try:
        w = validate_graph(sp.csr_matrix((data, indices, indptr), shape=(n, n)), n_nodes=n)
    except DataError as exc:
        raise ArtifactError(f"{path}: {exc}") from None
    return Graph(art=art, ids=ids, w=w)


def _check_made_from(art: Artifact, key: str, source: Artifact, remedy: str) -> None:
    """Provenance: ``art`` names ``source``'s content hash as its input ``key``."""
    made_from = art.inputs.get(key)
    if made_from != source.content_hash:
        raise DataError(f"{art.path}: made from {key} {made_from}, not from {source.path} (content hash "
                        f"{source.content_hash}); {remedy}")


def _same_ids(art: Artifact, ids: list[str], graph: Graph) -> None:
    if ids == graph.ids:
        return
    if len(ids) != len(graph.ids):
        raise DataError(f"{art.path}: {len(ids)} prompt ids, but {graph.path} has {len(graph.ids)}")
    i = next(j for j, (a, b) in enumerate(zip(ids, graph.ids)) if a != b)
    raise DataError(f"{art.path}: prompt ids differ from {graph.path}'s at row {i} ({ids[i]!r} vs {graph.ids[i]!r})")


@dataclass
class Clusters:
    """A read "clusters" artifact: the spectral label c_i of each prompt (graph node order) and K."""

    art: Artifact
    ids: list[str]
    labels: np.ndarray  # int64
    k: int


def read_clusters(path, graph: Graph | None) -> Clusters:
    """A "clusters" artifact, labels in [0, K). Given the ``graph``, it must have been made from it
    (provenance and ids checked); None reads the clustering alone (diagnostics match prompts by id)."""
    art = read_artifact(path, "clusters")
    ids = [str(x) for x in art.array("ids")]
    if graph is not None:
        _check_made_from(art, "graph", graph.art, "run graphdiff cluster on this graph")
        _same_ids(art, ids, graph)
    labels = art.array("labels")
    k = art.params.get("states")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ArtifactError(f"{path}: params.states is {k!r}, expected the number of states K >= 1")
    n = len(ids)
    if labels.shape != (n,) or labels.dtype.kind not in "iu":
        raise ArtifactError(f"{path}: labels must be {n} integers, got {labels.dtype} {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= k):
        raise ArtifactError(f"{path}: labels outside [0, {k}); re-run graphdiff cluster")
    return Clusters(art=art, ids=ids, labels=labels.astype(np.int64), k=int(k))


def read_embeddings(path) -> Artifact:
    """An "embeddings" artifact usable as a whole (not one shard of a sharded embedding)."""
    art = read_artifact(path, "embeddings")
    if art.params.get("shard") or art.attr("shard") is not None:
        raise ArtifactError(f"{path}: is shard {art.params.get('shard')} only; merge all shards first "
                            "(graphdiff merge-embeddings)")
    return art


def _embeddings_of(path, graph: Graph) -> Artifact:
    """The embeddings artifact at ``path``, checked to be the one ``graph`` was built from, with its ids."""
    art = read_embeddings(path)
    _check_made_from(graph.art, "embeddings", art, "pass the embeddings this graph was built from")
    _same_ids(art, [str(x) for x in art.array("ids")], graph)
    return art


def embedding_matrix(path, graph: Graph) -> np.ndarray:
    """The unit-norm embeddings (float64, graph node order) of the embeddings ``graph`` was built from."""
    art = _embeddings_of(path, graph)
    x = np.asarray(art.array("embeddings"), dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(graph.ids):
        raise ArtifactError(f"{path}: embeddings shape {x.shape} does not match {len(graph.ids)} ids")
    norms = np.linalg.norm(x, axis=1)
    if not np.all(np.isfinite(x)) or (norms == 0).any():
        raise ArtifactError(f"{path}: embeddings contain zero, NaN or infinite rows")
    return x / norms[:, None]  # stored rows are unit-norm; this only removes float32 rounding


# the arrays and attribute of an embeddings artifact that hold its prompts' covariates (``graphdiff embed``)
COVARIATES, REFERENCE_RATE, COVARIATE_SPEC = "covariates", "reference_rate", "covariate_spec"


@dataclass(frozen=True)
class CovariateInputs:
    """The prompts' covariates as ``graphdiff embed`` encoded them (``core.covariates``), in a graph's node order:
    ``features`` (N x c float64, finite), ``reference`` (N float64, a reference pass rate in [0, 1], NaN where a
    prompt has none; None without a reference column) and the ``spec`` that encoded them (``CovariateSpec``)."""

    features: np.ndarray
    reference: np.ndarray | None
    spec: object  # core.covariates.CovariateSpec


def covariate_inputs(path, graph: Graph) -> CovariateInputs | None:
    """The covariates of the embeddings artifact ``graph`` was built from (provenance and ids checked as
    ``embedding_matrix`` checks them), or None when it has none (made without covariates, or before embed
    computed them)."""
    from ..core.covariates import CovariateSpec
    from .artifacts import has_array

    art = _embeddings_of(path, graph)
    if not has_array(art, COVARIATES):
        return None
    remedy = "re-run graphdiff embed on the prompts file"
    raw_spec = art.attr(COVARIATE_SPEC)
    if not isinstance(raw_spec, dict):
        raise ArtifactError(f"{path}: has covariates but no {COVARIATE_SPEC} attribute; {remedy}")
    try:
        spec = CovariateSpec.from_dict(raw_spec)
    except DataError as exc:
        raise ArtifactError(f"{path}: {exc}; {remedy}") from None
    n = len(graph.ids)
    x = art.array(COVARIATES)
    if x.shape != (n, spec.width) or x.dtype.kind != "f":
        raise ArtifactError(f"{path}: covariates {x.dtype} {x.shape}, expected {n} x {spec.width} floats (its "
                            f"spec's features); {remedy}")
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ArtifactError(f"{path}: covariates hold NaN or infinite values; {remedy}")
    ref = None
    if spec.reference is not None:
        if not has_array(art, REFERENCE_RATE):
            raise ArtifactError(f"{path}: its covariates have a reference rate column but no {REFERENCE_RATE} array; "
                                f"{remedy}")
        ref = np.asarray(art.array(REFERENCE_RATE), dtype=np.float64)
        if ref.shape != (n,) or (~np.isnan(ref) & ~((ref >= 0) & (ref <= 1))).any():
            raise ArtifactError(f"{path}: {REFERENCE_RATE} must be {n} pass rates in [0, 1] (NaN: none); {remedy}")
    return CovariateInputs(features=x, reference=ref, spec=spec)


@dataclass
class Inputs:
    """What init, evaluate and the benchmarks start from: the graph, its clusters, and (optionally) the
    embeddings it was built from."""

    graph: Graph
    clusters: Clusters
    embeddings: np.ndarray | None = None

    @property
    def ids(self) -> list[str]:
        return self.graph.ids

    @property
    def w(self):
        return self.graph.w

    @property
    def labels(self) -> np.ndarray:
        return self.clusters.labels

    @property
    def k(self) -> int:
        return self.clusters.k


def read_inputs(graph, clusters, embeddings=None) -> Inputs:
    g = read_graph(graph)
    return Inputs(graph=g, clusters=read_clusters(clusters, g),
                  embeddings=None if embeddings is None else embedding_matrix(embeddings, g))


# ----------------------------------------------------------------------------------------------------
# input files


def read_log(path, index: IdIndex) -> dict:
    """Rows step, id, n, s of a JSONL/CSV/Parquet log, ids mapped to node indices by ``index``.

    Rows are stably sorted by step (rows of one step keep their file order). An optional ``p_true``
    column (written by ``graphdiff simulate``) is kept when every row has it.
    """
    from .tables import as_float, as_id, as_int, read_rows

    step, pids, lines, n, s, p_true = [], [], [], [], [], []
    has_truth = True
    for line, row in read_rows(path):
        for name in ("step", "id", "n", "s"):
            if name not in row:
                raise DataError(f"{path}:{line}: no {name!r} field (a log row needs step, id, n, s)")
        pids.append(as_id(row["id"], path, line, "id"))
        lines.append(line)
        t = as_int(row["step"], path, line, "step")
        nn = as_int(row["n"], path, line, "n")
        ss = as_int(row["s"], path, line, "s")
        if nn < 1:
            raise DataError(f"{path}:{line}: n = {nn}; a row needs at least one rollout")
        if not 0 <= ss <= nn:
            raise DataError(f"{path}:{line}: s = {ss} is outside [0, n = {nn}]")
        step.append(t)
        n.append(nn)
        s.append(ss)
        if has_truth and row.get("p_true") not in (None, ""):
            p_true.append(as_float(row["p_true"], path, line, "p_true"))
        else:
            has_truth = False
    if not step:
        raise DataError(f"{path}: the log has no rows")
    node = index.nodes(pids, where=lambda j: f"{path}:{lines[j]}")  # the log must use the graph's ids
    order = np.argsort(np.asarray(step), kind="stable")
    out = {k: np.asarray(v, dtype=np.int64)[order] for k, v in (("step", step), ("id", node), ("n", n), ("s", s))}
    out["p_true"] = np.asarray(p_true, dtype=np.float64)[order] if has_truth else None
    return out


MAX_CONFIG_BYTES = 1 << 20     # a config holds a few hundred values
MAX_CONFIG_NODES = 100_000     # values after expanding YAML aliases: a "billion laughs" file stops here


def _check_nodes(path, node) -> None:
    """Refuse a YAML (or JSON) document whose aliases expand to more than MAX_CONFIG_NODES values (counted on the
    composed nodes, an alias counting once per use, without building anything), or with a key twice in one
    mapping (YAML and JSON loaders keep the last value, silently)."""
    import yaml

    seen, stack = 0, [node] if node is not None else []
    while stack:
        n = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_NODES:
            raise DataError(f"{path}: expands to more than {MAX_CONFIG_NODES} values through YAML aliases (&/*); a "
                            "config holds a few hundred: write the values out")
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            keys: set = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.value in keys and k.tag != "tag:yaml.org,2002:merge":
                    raise DataError(f"{path}:{k.start_mark.line + 1}: duplicate key {k.value[:60]!r} (which value "
                                    "is meant?)")
                keys.add(k.value if isinstance(k, yaml.ScalarNode) else None)
                stack.extend((k, v))


def read_mapping(path) -> tuple[dict, dict[str, int]]:
    """(mapping, {key: line}) of a YAML (or JSON) file holding one mapping; {} for an empty file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(f"{path}: no such config file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise DataError(f"{path}: {path.stat().st_size} bytes is no config file (at most {MAX_CONFIG_BYTES})")
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_nodes(path, node)  # before anything builds (or an error message prints) the expanded value
        data = yaml.safe_load(text)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise DataError(f"{path}{line}: malformed YAML ({getattr(exc, 'problem', None) or exc})") from None
    except RecursionError:
        raise DataError(f"{path}: nested too deeply to read (a config is a few levels deep)") from None
    except ValueError as exc:  # ours (DataError) as they are; the loader's int() of a number over 4,300 digits
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{path}: a value the YAML loader cannot convert ({str(exc)[:80]})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"{path}:1: expected a mapping, got {type(data).__name__}")
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for k_node, v_node in node.value:
            lines[str(k_node.value)] = k_node.start_mark.line + 1
            if isinstance(v_node, yaml.MappingNode):  # one level down: "section.key"
                for kk, _ in v_node.value:
                    lines[f"{k_node.value}.{kk.value}"] = kk.start_mark.line + 1
    return data, lines

