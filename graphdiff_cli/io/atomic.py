"""Atomic single-file writes: a temporary file in the same folder, fsync, then rename into place; appends and
opens that never follow a link; and the fsync of folders every writer uses.

No write goes through a symbolic link: a link planted where graphdiff writes (``STATE/log.jsonl``, a lock, the
OpenRLHF recorder's pending file) would make it change, truncate or create a file elsewhere. Files are opened
with O_NOFOLLOW (``open_nofollow``), which guards the last component of the path; folders inside a STATE are
checked with ``refuse_links`` before a writer writes into them. A link is refused with a one-line
``StateError``, and the file it points to is left as it was. An atomic write renames a new file over the
name, which replaces a link there rather than writing through it. Files are created 0o644 (less the umask):
never writable by others, whatever the umask.

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

from ..errors import StateError
from .debris import sweep, temp_name


def _link_refusal(path) -> StateError:
    return StateError(f"{path}: is a symbolic link; graphdiff does not write through links (the file it points to "
                      "would be changed): remove the link")


def refuse_links(*paths) -> None:
    """StateError if any of ``paths`` is a symbolic link (for folders, whose contents O_NOFOLLOW cannot guard)."""
    for path in paths:
        if os.path.islink(path):
            raise _link_refusal(path)


def open_nofollow(path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` (O_NOFOLLOW): a link there is refused with a
    StateError. A file it creates gets ``mode`` less the umask."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):  # ELOOP: Linux and macOS; the check: elsewhere
            raise _link_refusal(path) from None
        raise


def append_nofollow(path, data: bytes, *, durable: bool = True, create: bool = False,
                    drop_torn: bool = False) -> None:
    """Append ``data`` to the file ``path``, never through a link: written whole (a short write, on a full disk,
    is continued or raises) and fsynced (``durable``); on any error the file is cut back to its old size when
    it can be, so no torn line is left. ``create``: make the file (0o644) if missing. ``drop_torn``: first cut a
    last line left without its newline (an append a crash cut short)."""
    fd = open_nofollow(path, os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0))
    try:
        size = os.fstat(fd).st_size
        if drop_torn and size and os.pread(fd, 1, size - 1) != b"\n":
            size = os.pread(fd, size, 0).rfind(b"\n") + 1  # rare (a crash mid-append), so only then is it read
            os.ftruncate(fd, size)
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
            if durable:
                os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


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
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # a new name: the rename replaces a link at path
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
