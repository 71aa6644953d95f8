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
  rewritten at every step.

``read_state`` opens either kind, or a STATE directory: a folder with a ``CURRENT`` JSON pointer
``{"step": T, "path": "<relative path>"}`` (with ``"revision": R`` after an extend or retire) is read as the
artifact that pointer names. Every encoding version of each kind written so far is read (``_READERS``, one
reader per (kind, version)); the state dict comes back in its own version's layout, with that version under
``"version"``, and ``graphdiff_cli.estimator.versions`` migrates it to the current one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import ArtifactError, InvalidArgumentError, StateError
from .artifacts import hash_arrays, read_artifact, stamped_kind, write_artifact
from .estimator_layout import LAYOUTS, MODEL_VERSION, VERSION, legacy_version
from .layout import CURRENT, step_relpath

KIND = "estimator-state"
MODEL_KIND = "estimator-model"
STEP_KIND = "estimator-step"

# what a step never changes (n_states, config, step: attributes; version: the stamp's)
_STATIC = ("version", "n_states", "config", "step", "graph", "labels", "embeddings")


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
    """{"embeddings": the prompts' embeddings} when the estimator has them (its read-out reads them), else {}."""
    emb = state.get("embeddings")
    return {} if emb is None else {"embeddings": np.asarray(emb, dtype=np.float32)}


def model_embeddings(model_art):
    """The prompts' embeddings a model artifact holds (float32, N x d), or None when it holds none."""
    return model_art.array("embeddings") if "embeddings" in model_art.names else None


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


def save_step(state: dict, path, model_path, model_content: str, *, inputs: dict | None = None,
              extra_attrs: dict | None = None, durable: bool = True) -> Path:
    """Write what a step changes (q, a, b, counts, window evidence, ...) as an ``estimator-step`` artifact.

    ``model_path`` is the model artifact this step belongs to; it is recorded relative to ``path`` so
    the STATE directory can be moved as a whole.
    """
    st = state
    _check_current(st, path)
    step = st["step"]
    arrays = {k: v for k, v in st.items() if k not in _STATIC}
    rel = os.path.relpath(Path(model_path).resolve(), Path(path).resolve())
    return write_artifact(path, STEP_KIND, arrays, inputs={"model": model_content, **(inputs or {})},
                          attrs={"step": step, "model": rel, **(extra_attrs or {})}, durable=durable)


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
            "labels": labels, "embeddings": model_embeddings(m_art), **read_step_arrays(art)}


# one reader per (kind, version) this graphdiff reads (io.artifacts.ENCODINGS lists the same versions)
_READERS = {
    (MODEL_KIND, 1): _model_config_v1,
    (MODEL_KIND, MODEL_VERSION): _model_config_v2,
    (KIND, 1): _read_standalone_legacy,
    (KIND, 7): _read_standalone,
    (KIND, VERSION): _read_standalone,
    (STEP_KIND, 1): _read_step_legacy,
    (STEP_KIND, 7): _read_step,
    (STEP_KIND, VERSION): _read_step,
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
    version = art.version if art.version != 1 else legacy_version(state)
    missing = sorted(LAYOUTS[version or 1] - set(state))
    if missing:
        raise ArtifactError(f"{art.path}: {art.kind} artifact lacks array(s) {', '.join(missing)}")
    state["version"] = version
    return state
