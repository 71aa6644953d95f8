"""Atomic single-file writes: a temporary file in the same folder, fsync, then rename into place; and the
fsync of folders every writer uses.

The temporary is named by ``io.debris`` (host and pid in the name); each write first sweeps the ones of
the same destination whose writer died.

fsync errors are raised, never swallowed, with one deliberate exception: EINVAL from fsync on a *folder*.
POSIX gives EINVAL for a descriptor "that does not support synchronization", and some file systems (some
FUSE and network ones) answer a directory fsync that way: they offer no folder durability to ask for, so
refusing every write there would make graphdiff unusable and buy nothing (PostgreSQL's ``fsync_fname``
makes the same exception). Every other error (EIO, ENOSPC, EDQUOT, ...) means the disk may not hold what
was written, and is raised.
"""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

from .debris import sweep, temp_name


def fsync_dir(path) -> None:
    """fsync a folder's entries (so a file created, renamed or removed in it survives a power loss). Raises
    every error but EINVAL from the fsync itself (see the module docstring)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a file system without folder fsync: nothing to make durable
            raise
    finally:
        os.close(fd)


def make_dirs(path, durable: bool = True) -> Path:
    """``mkdir -p path``. With ``durable``, every folder it creates is fsynced, and so is the folder the first
    of them was created in: a file then published in ``path`` cannot lose the folders above it in a power loss
    (fsyncing the file and its own folder is not enough when that folder is new)."""
    path = Path(path)
    created = []
    p = path
    while not p.is_dir() and p.parent != p:
        created.append(p)
        p = p.parent
    for p in reversed(created):
        try:
            p.mkdir()
        except FileExistsError:  # another writer was first (then it is a folder), or a file or a link is there
            if not p.is_dir():
                raise
    if durable and created:
        for p in [*created, created[-1].parent]:  # deepest first; the last one existed before
            fsync_dir(p)
    return path


@contextlib.contextmanager
def atomic_write(path, binary: bool = False, encoding: str = "utf-8", sync_dir: bool = True):
    """Yield a file object; on success its content replaces ``path`` atomically, on error nothing changes.
    ``sync_dir=False``: the folder is not fsynced after the rename; the caller does it (a commit point that
    must tell "not written" from "written, durability unknown")."""
    path = Path(path)
    make_dirs(path.parent)
    sweep(path.parent, path.name)
    tmp = path.parent / temp_name(path.name, "tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any user file
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": encoding})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def atomic_write_text(path, text: str, sync_dir: bool = True) -> Path:
    with atomic_write(path, sync_dir=sync_dir) as f:
        f.write(text)
    return Path(path)
