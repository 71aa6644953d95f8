"""Atomic folder writes: fill a staging folder next to the destination, fsync it, rename it into place.

A reader sees the old folder or the new one, never half of one; a crash (even kill -9) leaves at most
a staging folder ``.<name>.staging-<host>@<pid>@<random>`` (``io.debris``) beside the destination, which
readers ignore and the next writer of the same destination sweeps. Single files: see ``io.atomic``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .atomic import fsync_dir, make_dirs
from .debris import is_stale, owner, sweep, temp_name


FSYNC_THREADS = 16


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root``; returns when all are durable, or raises the error of the
    first failed one in walk order (``atomic.fsync_dir``'s rule for folders).

    The fsyncs are issued together from up to ``FSYNC_THREADS`` threads (fsync releases the GIL): a journaling
    file system then makes them durable in a few journal commits instead of one per file (what it saves, idle and
    beside other writers: docs/lab/performance.md, bench/fsync_tree.py). A pool per call: one kept across calls would hang in a forked child, which has none
    of its threads; where no thread can be started (interpreter shutdown), one after another."""
    files, folders = [], []
    for dirpath, _, names in os.walk(root):
        files += [os.path.join(dirpath, name) for name in names]
        folders.append(Path(dirpath))
    jobs = [(_fsync_file, f) for f in files] + [(fsync_dir, d) for d in folders]
    if len(jobs) > 2:
        pool = ThreadPoolExecutor(max_workers=min(FSYNC_THREADS, len(jobs)))
        try:
            futures = [pool.submit(fn, arg) for fn, arg in jobs]
        except RuntimeError:  # no thread could be started: the jobs submitted finish, then all one after another
            pool.shutdown(wait=True)
        else:
            with pool:
                for future in futures:  # in order: the first failed job's error is raised
                    future.result()
            return
    for fn, arg in jobs:
        fn(arg)


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory ``src`` to ``dst``, replacing any existing ``dst`` with at most a missing moment.

    os.rename cannot replace a non-empty directory, so an existing ``dst`` is first renamed aside
    (a reader then sees "missing", never a mixture) and deleted after the new one is in place.
    """
    trash = None
    if dst.exists() or dst.is_symlink():
        trash = dst.parent / temp_name(dst.name, "old")
        os.rename(dst, trash)
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def _restore_replaced(dest: Path) -> None:
    """A writer killed between ``replace_dir``'s two renames left ``dest`` missing and the previous version
    under its ``old`` name: put that back before anything else (it is the only intact copy)."""
    if dest.exists() or dest.is_symlink():
        return
    try:
        names = os.listdir(dest.parent)
    except OSError:
        return
    for name in sorted(names):
        who = owner(name)
        if who and who[0] == dest.name and who[1] == "old" and is_stale(name, dest.name):
            try:
                os.rename(dest.parent / name, dest)
            except OSError:
                continue
            return


@contextlib.contextmanager
def staged_dir(dest, *, replace: bool = True, durable: bool = True, before_replace=None):
    """Yield a new empty staging folder beside ``dest``; when the block ends without an exception,
    put it in place of ``dest`` atomically. On any exception the staging folder is removed and
    ``dest`` is left as it was.

    ``durable``: fsync every file and folder of the staging folder before the rename (and the parent
    after it, and the folders made for it: ``atomic.make_dirs``), so that a power loss cannot leave the new
    name with missing content.
    ``replace=True``: an existing ``dest`` is replaced (``replace_dir``). ``replace=False``: ``dest``
    may only be missing or an empty folder (which is removed first); anything else raises OSError.
    ``before_replace(dest)``: called after the staging folder is complete and just before the rename,
    so that a check of what ``dest`` holds sees it as late as possible; whatever it raises leaves
    ``dest`` as it was (the staging folder is removed).
    """
    dest = Path(dest)
    make_dirs(dest.parent, durable)
    _restore_replaced(dest)
    sweep(dest.parent, dest.name)  # what killed writers of this destination left
    staging = dest.parent / temp_name(dest.name, "staging")
    try:
        staging.mkdir()
        yield staging
        if durable:
            fsync_tree(staging)
        if before_replace is not None:
            before_replace(dest)
        if replace:
            replace_dir(staging, dest)
        else:
            if dest.exists():
                dest.rmdir()  # only an empty folder: rename cannot replace one on every platform
            os.rename(staging, dest)
            if durable:
                fsync_dir(dest.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
