"""``graphdiff verify``: check a STATE directory (its whole lineage) or any artifact, end to end.

Everything a reader would refuse is looked for at once and reported one line each, instead of failing on the
first: CURRENT (it names its own step's folder), the model artifacts (model.zarr and those extend wrote
under models/: stamp, attribute hash, every array against its checksums), the log (every step up to CURRENT, once, in order), and every retained step
artifact (every array its stamp lists, its step attribute, the model it belongs to, and for a delta the step it
was made from, to its snapshot). What crashed writers left is a notice, not a problem: versions above CURRENT,
the staging and trash folders and temporary files in the STATE (``StateDir.debris_paths``), and the temporaries
of the STATE or artifact beside it (a killed ``init`` or ``build-graph``'s staging folder, ``io.debris``). A
path that graphdiff did not write (no CURRENT, no stamped ``zarr.json``) is refused in one line (exit 6), not
reported as damage. Reads only; writes nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import ArtifactError, StateError
from ..io import debris
from ..io.artifacts import STAMP_KEY, read_artifact, stamped_kind
from ..io.estimator_layout import Q_ROWS, Q_VALUES
from ..io.estimator_store import (MODEL_KIND, STEP_KIND, check_delta_rows, check_step_artifact, is_state_dir,
                                  step_base, step_model_path)
from ..io.layout import CURRENT, LOG, RETENTION, STEPS, step_version
from ..io.state_dir import MODEL, MODELS, READ_TRIES, Retention, StateDir


def check_artifact(path, kind: str | None = None) -> tuple[list[str], object]:
    """(problems, artifact or None): open ``path`` and read every array of it."""
    path = Path(path)
    kind = kind or stamped_kind(path) or "graphdiff"
    try:
        art = read_artifact(path, kind)
    except ArtifactError as exc:
        return [str(exc)], None
    problems = []
    for name in art.names:  # each on its own: one damaged array's metadata does not hide the others'
        try:
            art.array(name)
        except ArtifactError as exc:
            problems.append(str(exc))
    return problems, art


def verify(path) -> dict:
    """The check of a STATE directory or artifact at ``path``: ``intact`` and one line per problem. A STATE
    that a writer changed while it was checked (CURRENT replaced, or a version or model folder removed: a
    rollback, or the prune that follows a commit's CURRENT) is checked again, so a commit is never reported
    as damage; one that changes under each of ``READ_TRIES`` checks is refused in one line."""
    path = Path(path)
    for _ in range(READ_TRIES):
        before = _layout(path)
        report = _verify(path)
        if report["intact"] or before is None or _layout(path) == before:
            return report
    raise StateError(f"{path}: the STATE changed under each of {READ_TRIES} checks (a writer committing without "
                     f"pause); the last one said: {report['problems'][0]}")


def _layout(path: Path):
    """What a writer changes in a STATE: the CURRENT file in place and the version and model folders; None
    for what is not a STATE."""
    sig = StateDir(path).signature()
    if sig is None:
        return None
    listing = []
    for sub in (path / STEPS, path / MODELS):
        try:
            listing.append(tuple(sorted(os.listdir(sub))))
        except OSError:
            listing.append(None)
    return sig, tuple(listing)


def _looks_like_state(path: Path) -> bool:
    """A STATE directory, even one missing parts (its CURRENT, its model): checked as one, never as an artifact."""
    return is_state_dir(path) or (path / MODEL).exists() or (path / STEPS).is_dir() or (path / LOG).is_file() \
        or (path / CURRENT).exists()


def _foreign(path: Path) -> bool:
    """Whether ``path`` is nothing graphdiff wrote: a file, a folder without a ``zarr.json``, or a Zarr group
    without graphdiff's stamp. A ``zarr.json`` that cannot be read at all is a damaged artifact, not foreign."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return True
    try:
        doc = json.loads(meta.read_text())
    except (OSError, ValueError):
        return False
    attrs = doc.get("attributes") if isinstance(doc, dict) else None
    return not (isinstance(attrs, dict) and STAMP_KEY in attrs)


def _beside(path: Path) -> list[str]:
    """Notices for the temporaries of ``path`` beside it (a killed init, build-graph, ... of the same path)."""
    return [f"{path.parent / name}: {debris.describe(name, f'the next write of {path.name}')}"
            for name in debris.leftovers(path.parent, path.name)]


def _verify(path: Path) -> dict:
    if not path.exists():
        left = debris.leftovers(path.parent, path.name)
        raise ArtifactError(f"{path}: no such STATE directory or artifact"
                            + (f" (beside it: {', '.join(left)}, left by a write of it that did not finish)"
                               if left else ""))
    problems: list[str] = []
    notices: list[str] = []
    checked: list[str] = []
    if _looks_like_state(path):
        kind = "STATE"
        sd = StateDir(path)
        version = None
        try:
            version = sd.current_version()
        except ArtifactError as exc:
            problems.append(str(exc))
        models = {}  # checked model artifacts by resolved path
        for folder in [path / MODEL] + sorted((path / MODELS).glob("*.zarr")):
            p, model = check_artifact(folder, MODEL_KIND)
            problems += p
            checked.append(str(folder.relative_to(path)))
            models[os.path.normpath(folder.absolute())] = model
        entries = {}  # the log's line of each version, to hold each step folder to what it was made from
        if version is not None:
            try:
                entries = {(e["step"], e.get("revision", 0)): e for e in sd.log_entries(upto=version)}
            except ArtifactError as exc:
                problems.append(str(exc))
            checked.append("log.jsonl")
        # the (shape, dtype) of each checked version's q, or why it is unknown, for the deltas made from it: the
        # versions come in order, so a delta's base is met before it and each step is opened once
        q_meta: dict[tuple[int, int], tuple | str] = {}
        for v, folder in sd.version_dirs().items():
            rel = f"{folder.parent.name}/{folder.name}"
            name = f"{v[0]}.{v[1]}" if v[1] else str(v[0])
            if version is not None and v > version:
                notices.append(f"{folder}: step {name} is above CURRENT (debris of a crashed write; the next update "
                               "or rollback removes it)")
                continue
            p, art = check_artifact(folder, STEP_KIND)
            problems += p
            checked.append(rel)
            if art is not None:
                try:
                    target = os.path.normpath(step_model_path(art).absolute())
                    if target not in models:
                        raise ArtifactError(f"{folder}: belongs to model {art.attr('model')}, which is missing")
                    check_step_artifact(art, v, models[target], said_by="its name says", entry=entries.get(v))
                    base = step_base(art)  # a delta's base: the step it was made from (checked in turn)
                    if base is None:
                        try:
                            q = art.group["q"]
                            q_meta[v] = (q.shape, q.dtype)
                        except Exception as exc:  # noqa: BLE001 - zarr's errors for a damaged array vary
                            q_meta[v] = f"{folder}: its q cannot be opened ({exc.__class__.__name__})"
                    else:  # its rows must fit its snapshot's q
                        q_meta[v] = q_meta.get(step_version(base.path.name),
                                               f"{base.path}: its q was not checked (its problem is listed)")
                        if isinstance(q_meta[v], str):
                            raise ArtifactError(f"{q_meta[v]}, so neither can {folder.name}'s")
                        check_delta_rows(art, art.array(Q_ROWS), art.array(Q_VALUES), *q_meta[v])
                except ArtifactError as exc:
                    problems.append(str(exc))
        if (path / RETENTION).exists():
            try:
                Retention.read(path / RETENTION)
            except ArtifactError as exc:
                problems.append(str(exc))
            checked.append(RETENTION)
        if version is not None and version not in sd.version_dirs():
            problems.append(f"{path}: CURRENT names step {version[0]}"
                            f"{'.' + str(version[1]) if version[1] else ''}, whose state folder is missing")
        notices += [f"{p}: {debris.describe(p.name, 'the next update, extend, retire or rollback', any_host=True)}"
                    for p in sd.debris_paths()]
        notices += _beside(path)
    else:
        if stamped_kind(path) is None and _foreign(path):
            raise ArtifactError(f"{path}: not a graphdiff STATE directory or artifact (no CURRENT, no zarr.json "
                                "with graphdiff's stamp); give a STATE directory or an artifact graphdiff wrote")
        p, art = check_artifact(path)
        kind = art.kind if art is not None else "artifact"
        problems += p
        checked.append(path.name)
        notices += _beside(path)
    return {"command": "verify", "path": str(path), "kind": kind, "intact": not problems, "problems": problems,
            "notices": notices, "checked": checked}
