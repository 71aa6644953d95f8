"""An estimator's state on disk, as Zarr v3 groups written atomically (``io.artifacts``).

io knows no estimator: these functions write and read the plain ``state`` dict of
``Estimator.state_dict`` (config, step, graph, labels and arrays); ``Estimator.save``/``load`` and the
handoff stages turn it into an ``Estimator``.

Two layouts:

- standalone (``Estimator.save(path)``): one ``estimator-state`` artifact. Arrays: the graph W in CSR
  parts (``graph_indptr``, ``graph_indices``, ``graph_data``), ``labels`` and every array of
  ``io.estimator_layout.STATE_ARRAYS``. Attributes: ``n_states``, ``config`` (the settings) and ``step``.
- split, for a STATE directory of the step handoff (``io.state_dir``): an ``estimator-model`` artifact
  (graph, labels, prompt ``ids``; attributes ``n_states`` and ``config``; written by init and again by each
  ``graphdiff extend``) and
  one small ``estimator-step`` artifact per applied version holding only what a step changes (every
  array of ``state_dict`` but the graph and labels). A step artifact names its model by a path relative
  to itself (attribute ``model``) and by content hash (``inputs.model``), so a 150k-prompt graph is not
  rewritten at every step. From encoding version 9 a step may be a *delta*: q as the rows that changed
  since its base step (``q_rows``, ``q_values``), the base named the same two ways (attribute ``base``,
  ``inputs.base``); ``compose_q`` reads it back from the snapshot and the deltas after it.

``read_state`` opens either kind, or a STATE directory: a folder with a ``CURRENT`` JSON pointer
``{"step": T, "path": "<relative path>"}`` (with ``"revision": R`` after an extend or retire) is read as the
artifact that pointer names. Every encoding version of each kind written so far is read (``_READERS``, one
reader per (kind, version)); the state dict comes back in its own version's layout, with that version under
``"version"``, and ``graphdiff_cli.estimator.versions`` migrates it to the current one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import ArtifactError, InvalidArgumentError, StateError
from .artifacts import hash_arrays, read_artifact, stamped_kind, write_artifact
from .estimator_layout import (LAYOUTS, MODEL_VERSION, Q_ROWS, Q_VALUES, STEP_LAYOUT, STEP_VERSION, VERSION,
                               legacy_version)
from .layout import CURRENT, step_relpath, step_version

KIND = "estimator-state"
MODEL_KIND = "estimator-model"
STEP_KIND = "estimator-step"

# the content hash of the step artifact a state dict was read from (``read_state`` sets it; not an array)
SOURCE_HASH = "source_hash"
# what a step never changes (n_states, config, step: attributes; version: the stamp's)
_STATIC = ("version", "n_states", "config", "step", "graph", "labels", "embeddings", "covariates", "reference_rate",
           SOURCE_HASH)


def model_hash(graph: sp.csr_matrix, labels: np.ndarray) -> str:
    """Content hash of the model an estimator state belongs to: W and the spectral labels."""
    return hash_arrays(graph.indptr.astype(np.int64, copy=False), graph.indices.astype(np.int64, copy=False),
                       graph.data.astype(np.float64, copy=False), np.asarray(labels, dtype=np.int64), extra="model")


def _graph_arrays(g: sp.csr_matrix) -> dict:
    return {"graph_indptr": g.indptr.astype(np.int64), "graph_indices": g.indices.astype(np.int64),
            "graph_data": g.data.astype(np.float64)}


_graph_arrays_names = ("graph_indptr", "graph_indices", "graph_data")


def _read_graph(art, n: int) -> sp.csr_matrix:
    """W as stored (int64 indices, the format's) but held with int32 indices where they fit, as scipy
    builds them: half the index memory of a loaded state."""
    indices, indptr = art.array("graph_indices"), art.array("graph_indptr")
    if indices.size < np.iinfo(np.int32).max and n < np.iinfo(np.int32).max:
        indices, indptr = indices.astype(np.int32), indptr.astype(np.int32)
    return sp.csr_matrix((art.array("graph_data"), indices, indptr), shape=(n, n))


def check_save_target(path) -> None:
    """Refuse a destination a standalone estimator may not be written to, since writing replaces it whole.

    Allowed: a path that does not exist, an empty folder, or an ``estimator-state`` artifact (a save
    written earlier: re-saving replaces it). Refused, in one line naming the right call: a STATE directory
    (it has ``CURRENT``; StateError), a file or symbolic link, another kind of artifact, a folder holding
    anything else (InvalidArgumentError).
    """
    path = Path(path)
    export = "save the estimator to a new path (or an empty folder) to export it"
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        what = "a symbolic link" if path.is_symlink() else "a file"
        raise InvalidArgumentError(f"{path}: is {what}, which saving would replace; {export}")
    if not path.exists():
        return
    if is_state_dir(path):
        raise StateError(f"{path}: is a STATE directory, which saving would replace with a bare estimator; continue "
                         f"it with graphdiff_cli.State.open({str(path)!r}), or {export}")
    kind = stamped_kind(path)
    if kind == KIND:
        return
    if kind is not None:
        raise InvalidArgumentError(f"{path}: is {'an' if kind[:1] in 'aeiou' else 'a'} {kind} artifact, which "
                                   f"saving would replace; {export}")
    if any(path.iterdir()):
        raise InvalidArgumentError(f"{path}: is a folder holding other files, which saving would delete; {export}")


def write_state(state: dict, path, *, inputs: dict | None = None, extra_attrs: dict | None = None,
                durable: bool = True) -> Path:
    """Write an estimator ``state`` dict as one standalone ``estimator-state`` artifact at ``path``.

    W is written as given: it must be a validated graph (``Estimator.state_dict``'s is), since a load of
    this artifact does not test its symmetry again (``Estimator.from_state_dict``'s ``verified``).

    ``path`` must be new, an empty folder or an ``estimator-state`` artifact (``check_save_target``,
    which refuses anything else before a byte is written). The check runs again just before the atomic
    rename that puts the new artifact in place, so what another process put at ``path`` while this one
    wrote is seen too; only a change in the instant between that check and the rename goes unseen (a
    STATE writer holds its lock, which a plain save does not take).
    """
    check_save_target(path)
    _check_current(state, path)
    g: sp.csr_matrix = state["graph"]
    arrays = {**_graph_arrays(g), "labels": state["labels"], **_embedding_arrays(state),
              **{k: v for k, v in state.items() if k not in _STATIC}}
    content = model_hash(g, state["labels"])
    attrs = {"n_states": state["n_states"], "config": state["config"], "step": state["step"]}
    return write_artifact(path, KIND, arrays, inputs={"model": content, **(inputs or {})},
                          attrs={**attrs, **(extra_attrs or {})}, durable=durable, before_replace=check_save_target)


def _embedding_arrays(state: dict) -> dict:
    """{"embeddings": the prompts' embeddings, "covariates": their encoded covariates, "reference_rate": their
    reference pass rates}, each when the estimator has it (its read-outs read them)."""
    out = {}
    for name, dtype in STATIC_INPUTS.items():
        if state.get(name) is not None:
            out[name] = np.asarray(state[name], dtype=dtype)
    return out


# the static per-prompt inputs a model artifact (and a standalone state) may hold, with their dtypes
STATIC_INPUTS = {"embeddings": np.float32, "covariates": np.float64, "reference_rate": np.float64}


def model_embeddings(model_art):
    """The prompts' embeddings a model artifact holds (float32, N x d), or None when it holds none."""
    return model_art.array("embeddings") if "embeddings" in model_art.names else None


def model_inputs(model_art) -> dict:
    """{name: array} of the static inputs (``STATIC_INPUTS``) a model artifact holds, None for each it lacks."""
    return {name: model_art.array(name) if name in model_art.names else None for name in STATIC_INPUTS}


def _check_current(state: dict, path) -> None:
    """Only the current layout is written (a state dict of an older version is migrated first)."""
    if state.get("version", VERSION) != VERSION:
        raise ArtifactError(f"{path}: refusing to write a version {state['version']} estimator state as version "
                            f"{VERSION} (Estimator.from_state_dict migrates it)")


def save_model(state: dict, path, ids, *, inputs: dict | None = None, extra_attrs: dict | None = None,
               extra_arrays: dict | None = None, durable: bool = True) -> str:
    """Write the part of a ``state`` no step changes (W, labels, ``ids``, config); returns its content hash.

    ``ids[i]`` is the prompt id of node i (row i of the embedded prompts file). ``extra_arrays`` go with
    them (what ``graphdiff extend`` needs: the directed kNN lists, the added prompts' embeddings, ...).
    W must be a validated graph, as in ``write_state``.
    """
    st = state
    _check_current(st, path)
    ids = [str(x) for x in ids]
    if len(ids) != len(st["labels"]):
        raise ArtifactError(f"{path}: {len(ids)} ids for a model of {len(st['labels'])} prompts")
    content = model_hash(st["graph"], st["labels"])
    arrays = {"ids": np.asarray(ids, dtype=object), **_graph_arrays(st["graph"]), "labels": st["labels"],
              **_embedding_arrays(st), **(extra_arrays or {})}
    write_artifact(path, MODEL_KIND, arrays, inputs=inputs, content_hash=content,
                   attrs={"n_states": st["n_states"], "config": st["config"], **(extra_attrs or {})}, durable=durable)
    return content


# the files a version is made from, each recorded twice: as "<name>_hash" in its log line and as the step
# artifact's input <name> (update: outcomes; extend: prompts; retire: ids); readers hold the two equal
STEP_INPUTS = ("outcomes", "prompts", "ids")


def step_inputs(entry: dict) -> dict:
    """{name: hash} of the files the log line ``entry`` says its version was made from."""
    return {k: entry[k + "_hash"] for k in STEP_INPUTS if entry.get(k + "_hash")}


@dataclass(frozen=True)
class Delta:
    """What makes a step artifact a delta: the step artifact ``base`` it was made from (an opened ``Artifact``
    of the same model, the version before it) and the rows of q that changed since (``rows``, sorted, unique).
    ``chain_bytes`` is measured once, for the writer's choice and for the attributes written."""

    base: object
    rows: np.ndarray

    @property
    def depth(self) -> int:
        """How many deltas lie between the new step and the snapshot its q is composed from, itself included."""
        return delta_depth(self.base) + 1

    @cached_property
    def chain_bytes(self) -> tuple[int, int]:
        """(bytes on disk of the snapshot the new step's q is composed from, bytes of the deltas between that
        snapshot and the new step): the base's folder measured now, the rest carried in the deltas' attributes
        ``snapshot_bytes`` and ``chain_bytes`` (a base delta without them raises: the writer then writes a
        snapshot)."""
        size = folder_bytes(self.base.path)
        if self.base.attr("base") is None:
            return size, 0
        snap, chain = self.base.attr("snapshot_bytes"), self.base.attr("chain_bytes")
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (snap, chain)):
            raise ArtifactError(f"{self.base.path}: damaged snapshot_bytes / chain_bytes attributes")
        return snap, chain + size


def folder_bytes(path) -> int:
    """Bytes of the files under ``path`` (an artifact's folder: its chunks and metadata)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        total += sum(os.stat(os.path.join(root, f)).st_size for f in files)
    return total


def delta_depth(step_art) -> int:
    """0 for a step artifact holding q whole (a snapshot, and every step written before version 9), else the
    number of deltas from its snapshot to it."""
    depth = step_art.attr("delta_depth") if step_art.attr("base") is not None else 0
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ArtifactError(f"{step_art.path}: damaged delta_depth attribute {depth!r}")
    return depth


def q_dtype(step_art) -> str:
    """The dtype of the q a step artifact's state holds (a delta's: its snapshot's, which its rows are written in)."""
    dtype = step_art.attr("q_dtype")
    if isinstance(dtype, str):
        return dtype
    return str(step_art.group["q"].dtype) if "q" in step_art.names else "unknown"  # written before version 9


def save_step(state: dict, path, model_path, model_content: str, *, inputs: dict | None = None,
              extra_attrs: dict | None = None, delta: Delta | None = None, durable: bool = True) -> Path:
    """Write what a step changes (q, a, b, counts, window evidence, ...) as an ``estimator-step`` artifact.

    ``model_path`` is the model artifact this step belongs to; it is recorded relative to ``path`` so
    the STATE directory can be moved as a whole. With ``delta`` q is written as the rows that changed since
    ``delta.base`` (``q_rows``, ``q_values``), named by relative path and content hash as the model is; every
    other array is written whole (each is N long at most, 1/K of q).
    """
    st = state
    _check_current(st, path)
    step = st["step"]
    arrays = {k: v for k, v in st.items() if k not in _STATIC}
    rel = os.path.relpath(Path(model_path).resolve(), Path(path).resolve())
    attrs = {"step": step, "model": rel, "q_dtype": str(np.asarray(st["q"]).dtype), **(extra_attrs or {})}
    made_from = {"model": model_content}
    if delta is not None:
        q = arrays.pop("q")
        rows = np.asarray(delta.rows, dtype=np.int64)
        if rows.ndim != 1 or (rows.size and (rows[0] < 0 or rows[-1] >= q.shape[0] or np.any(np.diff(rows) <= 0))):
            raise ArtifactError(f"{path}: internal: the changed rows of q must be sorted, unique and in [0, "
                                f"{q.shape[0]})")
        if q_dtype(delta.base) != str(q.dtype):
            raise ArtifactError(f"{path}: internal: a delta of {q.dtype} rows onto a {q_dtype(delta.base)} q")
        arrays[Q_ROWS], arrays[Q_VALUES] = rows, q[rows]
        snapshot_bytes, chain_bytes = delta.chain_bytes
        attrs.update(base=os.path.relpath(Path(delta.base.path).resolve(), Path(path).resolve()),
                     delta_depth=delta.depth, snapshot_bytes=snapshot_bytes, chain_bytes=chain_bytes)
        made_from["base"] = delta.base.content_hash
    return write_artifact(path, STEP_KIND, arrays, inputs={**made_from, **(inputs or {})}, attrs=attrs,
                          durable=durable)


def read_pointer(root) -> tuple[int, int, str]:
    """(current step, its revision, relative path of its artifact) from a STATE directory's CURRENT pointer
    ``{"step": T, "path": ...}``, with ``"revision": R`` when the prompt set changed after update T."""
    pointer = Path(root) / CURRENT
    try:
        cur = json.loads(pointer.read_text())
        step, rel, rev = cur["step"], cur["path"], cur.get("revision", 0)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"{pointer}: damaged CURRENT pointer ({exc.__class__.__name__})") from None
    if (not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(rel, str)
            or not isinstance(rev, int) or isinstance(rev, bool) or rev < 0):
        raise ArtifactError(f"{pointer}: damaged CURRENT pointer (step {step!r}, revision {rev!r}, path {rel!r})")
    if rel != step_relpath(step, rev):  # nothing outside the STATE, nor another step's state, is opened through it
        raise ArtifactError(f"{pointer}: damaged CURRENT pointer: step {step} must name {step_relpath(step, rev)}, "
                            f"not {rel[:200]!r} (graphdiff rollback --to a retained step rewrites it)")
    return step, rev, rel


def read_current(root) -> tuple[int, str]:
    """(current step, relative path of its artifact) from a STATE directory's CURRENT pointer."""
    step, _rev, rel = read_pointer(root)
    return step, rel


def pointer_text(step: int, revision: int = 0) -> str:
    """The CURRENT file naming ``step`` at ``revision``."""
    cur = {"step": step, "path": step_relpath(step, revision)}
    if revision:
        cur["revision"] = revision
    return json.dumps(cur) + "\n"


def is_state_dir(path) -> bool:
    """Whether ``path`` is a STATE directory (it has a CURRENT pointer) rather than a saved estimator."""
    return (Path(path) / CURRENT).is_file()


def resolve_state_path(path) -> tuple[Path, int | None]:
    """(a saved estimator, None), or (the artifact named by a STATE directory's CURRENT pointer, its step)."""
    path = Path(path)
    if is_state_dir(path):
        step, rev, rel = read_pointer(path)
        return path / rel, (step, rev)
    return path, None


def _model_config_v1(art) -> dict:
    """Version 1 kept n_states inside the settings (``config``; the stamp's params held a copy)."""
    config = art.attr("config")
    if not isinstance(config, dict) or "n_states" not in config:
        raise ArtifactError(f"{art.path}: estimator-model artifact lacks its config attribute")
    return dict(config)


def _model_config_v2(art) -> dict:
    """Version 2 keeps n_states and the settings (``config``) as two attributes, once."""
    n_states, config = art.attr("n_states"), art.attr("config")
    if not isinstance(n_states, int) or not isinstance(config, dict):
        raise ArtifactError(f"{art.path}: estimator-model artifact lacks its n_states or config attribute")
    return {"n_states": n_states, **config}


def read_model(path):
    """(artifact, ids, W, labels, config) of an ``estimator-model`` artifact, checked for consistency.

    ``config`` describes the model as a STATE's callers show and use it: ``n_states`` and every setting, one
    dict (each version's reader in ``_READERS`` makes it from that version's attributes)."""
    art = read_artifact(path, MODEL_KIND)
    ids = [str(x) for x in art.array("ids")]
    labels = art.array("labels")
    config = _READERS[(MODEL_KIND, art.version)](art)
    if labels.shape != (len(ids),):
        raise ArtifactError(f"{art.path}: {labels.shape[0]} labels for {len(ids)} ids")
    return art, ids, _read_graph(art, len(ids)), labels, config


def step_model_path(step_art) -> Path:
    rel = step_art.attr("model")
    if not isinstance(rel, str):
        raise ArtifactError(f"{step_art.path}: estimator-step artifact does not name its model")
    return Path(os.path.normpath(step_art.path / rel))


def read_step_arrays(step_art) -> dict:
    """Every array of an ``estimator-step`` artifact, by name (what ``save_step`` wrote: its stamp lists them)."""
    return {name: step_art.array(name) for name in step_art.names}


def check_step_artifact(art, step, model_art=None, *, said_by: str = "CURRENT says", entry: dict | None = None) -> None:
    """Refuse an ``estimator-step`` artifact that does not hold ``step`` (when given: a step, or a (step,
    revision) version), does not belong to the model artifact ``model_art`` (when given) or was not made from
    the files the log line ``entry`` of its version records (when given: a step folder of a sibling STATE, the
    same model fed other outcomes, passes every other check): the one check of a step's identity, for every
    reader."""
    step, rev = step if isinstance(step, tuple) else (step, None)
    if step is not None and art.attr("step") != step:
        raise ArtifactError(f"{art.path}: holds step {art.attr('step')!r} but {said_by} step {step}; the STATE is "
                            "damaged (graphdiff rollback --to a retained step)")
    if rev is not None and (art.attr("revision") or 0) != rev:
        raise ArtifactError(f"{art.path}: holds revision {art.attr('revision') or 0!r} of step {step} but {said_by} "
                            f"revision {rev}; the STATE is damaged (graphdiff rollback --to a retained step)")
    if model_art is not None and art.inputs.get("model") != model_art.content_hash:
        raise ArtifactError(f"{art.path}: belongs to a model with content hash {art.inputs.get('model')}, but "
                            f"{model_art.path} has {model_art.content_hash}")
    if entry is not None:
        made_from = {k: art.inputs[k] for k in STEP_INPUTS if art.inputs.get(k)}
        logged = step_inputs(entry)
        if made_from != logged:
            def show(d):
                return ", ".join(f"{k} {str(v)[:20]}" for k, v in d.items()) or "no input file"
            raise ArtifactError(f"{art.path}: was made from {show(made_from)}, but the log's line of its version "
                                f"records {show(logged)}: the folder is another STATE's, or the log was edited; the "
                                "STATE is damaged (graphdiff rollback --to a retained step)")


def _standalone_arrays(art) -> dict:
    n = int(art.array("labels").size)
    arrays = {k: v for k, v in read_step_arrays(art).items() if k not in _graph_arrays_names}
    return {"step": art.attr("step"), "graph": _read_graph(art, n), **arrays}


def _read_standalone_legacy(art, model) -> dict:
    """Versions 1-6 (all stamped 1): n_states inside the settings (``config``)."""
    return {"config": art.attr("config"), **_standalone_arrays(art)}


def _read_standalone(art, model) -> dict:
    """Version 7: the attributes n_states and config (the settings)."""
    return {"n_states": art.attr("n_states"), "config": art.attr("config"), **_standalone_arrays(art)}


def _read_step_legacy(art, model) -> dict:
    """Versions 1-6 of a step: the model's config as those versions held it, n_states inside."""
    _m_art, _ids, graph, labels, config = model
    return {"config": config, "step": art.attr("step"), "graph": graph, "labels": labels, **read_step_arrays(art)}


def _read_step(art, model) -> dict:
    """Version 7 of a step: n_states beside the settings (from the model, whatever its version)."""
    m_art, _ids, graph, labels, config = model
    settings = {k: v for k, v in config.items() if k != "n_states"}
    return {"n_states": config["n_states"], "config": settings, "step": art.attr("step"), "graph": graph,
            "labels": labels, **model_inputs(m_art), **read_step_arrays(art)}


def _read_step_v9(art, model) -> dict:
    """Versions 9 and 10 of a step: version 8's (9's) state, its q whole or composed from its base's and its own
    rows."""
    state = _read_step(art, model)
    if art.attr("base") is not None:
        state["q"] = compose_q(art, state.pop(Q_ROWS), state.pop(Q_VALUES))
    return state


def base_path(step_path, rel) -> Path | None:
    """The folder a step artifact at ``step_path`` names as its base (its attribute ``base``, ``rel``): None for
    a snapshot (no base); refused unless it is an earlier version's step folder beside it."""
    if rel is None:
        return None
    step_path = Path(os.path.normpath(step_path))
    path = Path(os.path.normpath(step_path / rel)) if isinstance(rel, str) else None
    own, base = step_version(step_path.name), step_version(path.name) if path is not None else None
    if path is None or path.parent != step_path.parent or base is None or own is None or base >= own:
        raise ArtifactError(f"{step_path}: damaged base attribute {str(rel)[:200]!r} (a delta step names an "
                            "earlier step folder beside it)")
    return path


def step_base(step_art):
    """The step artifact a delta step ``step_art`` was made from, opened and checked to be the one it was made
    from (content hash), of the same model, an earlier version in the same folder and one delta nearer its
    snapshot; None for a snapshot."""
    path = base_path(step_art.path, step_art.attr("base"))
    if path is None:
        return None
    fix = "the STATE is damaged (graphdiff rollback --to a retained step whose chain is whole; verify lists them)"
    try:
        base = read_artifact(path, STEP_KIND)
    except ArtifactError as exc:
        raise ArtifactError(f"{step_art.path}: holds the rows of q that changed since {path.name}, which cannot be "
                            f"read ({exc}); {fix}") from None
    if base.content_hash != step_art.inputs.get("base"):
        raise ArtifactError(f"{step_art.path}: was made from a {path.name} with content hash "
                            f"{step_art.inputs.get('base')}, but {path.name} has {base.content_hash}; {fix}")
    if base.inputs.get("model") != step_art.inputs.get("model"):
        raise ArtifactError(f"{step_art.path}: its base {path.name} belongs to another model; {fix}")
    if delta_depth(base) != delta_depth(step_art) - 1:
        raise ArtifactError(f"{step_art.path}: says it is {delta_depth(step_art)} deltas from its snapshot, but its "
                            f"base {path.name} is {delta_depth(base)}; {fix}")
    return base


def step_chain(step_art) -> list:
    """The step artifacts q of ``step_art`` is composed from: its snapshot first, ``step_art`` last, each base
    checked (``step_base``); reads stamps only."""
    chain = [step_art]
    while (base := step_base(chain[-1])) is not None:  # each one delta nearer its snapshot: the loop ends
        chain.append(base)
    return chain[::-1]


def compose_q(step_art, rows=None, values=None) -> np.ndarray:
    """q of the step artifact ``step_art``: its snapshot's q with the rows of every delta after it applied in
    order (``rows``, ``values``: ``step_art``'s own, when already read). Every array is checksum-verified as it
    is read; a delta whose rows do not fit the q they apply to is refused."""
    chain = step_chain(step_art)
    q = chain[0].array("q")
    for art in chain[1:]:
        r, v = (rows, values) if art is step_art and rows is not None else (art.array(Q_ROWS), art.array(Q_VALUES))
        check_delta_rows(art, r, v, q.shape, q.dtype)
        q[r] = v
    return q


def check_delta_rows(art, rows, values, shape, dtype=None) -> None:
    """Refuse a delta whose ``rows`` (1-D integers, sorted, unique, in [0, N)) and ``values`` (one row of q each)
    do not fit a q of ``shape`` (and ``dtype``, when given)."""
    if not (rows.ndim == 1 and rows.dtype.kind in "iu" and values.shape == (rows.size,) + tuple(shape[1:])
            and (dtype is None or values.dtype == dtype)
            and (rows.size == 0 or (rows[0] >= 0 and rows[-1] < shape[0] and bool(np.all(np.diff(rows) > 0))))):
        raise ArtifactError(f"{art.path}: holds {values.dtype} rows of shape {values.shape} at {rows.size} places "
                            f"that do not fit the {dtype or ''} q of shape {tuple(shape)} it applies to (sorted, "
                            "unique rows of it); the STATE is damaged (graphdiff rollback --to a retained step)")


# one reader per (kind, version) this graphdiff reads (io.artifacts.ENCODINGS lists the same versions)
_READERS = {
    (MODEL_KIND, 1): _model_config_v1,
    (MODEL_KIND, MODEL_VERSION): _model_config_v2,
    (KIND, 1): _read_standalone_legacy,
    (KIND, 7): _read_standalone,
    (KIND, 8): _read_standalone,
    (KIND, VERSION): _read_standalone,
    (STEP_KIND, 1): _read_step_legacy,
    (STEP_KIND, 7): _read_step,
    (STEP_KIND, 8): _read_step,
    (STEP_KIND, 9): _read_step_v9,
    (STEP_KIND, STEP_VERSION): _read_step_v9,
}


def read_state(path, model=None, *, version=None, entry: dict | None = None) -> dict:
    """An estimator's state dict from a standalone artifact, a step artifact (with its model) or a STATE
    directory (``Estimator.from_state_dict`` makes the estimator; the arrays are fresh, so it may own them).

    The dict is in the layout of the artifact's encoding version, which it holds under ``"version"`` (an
    artifact stamped 1 is one of versions 1-6, told apart by its arrays: ``estimator_layout.legacy_version``);
    every array of that version's layout is checked to be there. ``model`` is an already-read
    ``read_model`` tuple to reuse, or a function of the model artifact's path that returns one (a STATE
    directory's models are read once and kept by path). ``version`` and ``entry``: the (step, revision) a step
    artifact at ``path`` must hold and its log line (``StateDir.read_state_and_model``, which read CURRENT).
    """
    where, current = resolve_state_path(path)
    art = read_artifact(where, (KIND, STEP_KIND))
    if art.kind == STEP_KIND:
        if model is None or callable(model):
            model = (model or read_model)(step_model_path(art))
        check_step_artifact(art, current if version is None else version, model[0], entry=entry)
    state = _READERS[(art.kind, art.version)](art, model)
    if state["config"] is None or state["step"] is None or state.get("n_states", 0) is None:
        raise ArtifactError(f"{art.path}: {art.kind} artifact lacks its n_states, config or step attribute")
    version = art.version if art.kind != STEP_KIND else STEP_LAYOUT[art.version]
    version = version if version != 1 else legacy_version(state)
    missing = sorted(LAYOUTS[version or 1] - set(state))
    if missing:
        raise ArtifactError(f"{art.path}: {art.kind} artifact lacks array(s) {', '.join(missing)}")
    state["version"] = version
    if art.kind == STEP_KIND:
        state[SOURCE_HASH] = art.content_hash
    return state
