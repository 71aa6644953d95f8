"""Exclusive advisory file locks (fcntl.flock): the one lock helper of graphdiff.

The kernel drops a flock when its descriptor is closed or the process dies (even by kill -9), so a
lock file left behind is never stale: it is only a name to lock, and is not removed on release.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path
from typing import Callable

from ..errors import LockedError, StateError
from .atomic import open_nofollow

_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
POLL_S = 0.05
DEFAULT_LOCK_TIMEOUT = 600.0  # seconds a writer of a STATE (or a watcher of an inbox) waits for another


@contextlib.contextmanager
def file_lock(path, timeout: float = 0.0, *, busy: Callable[[str], str],
              cannot_open: Callable[[OSError], str] | None = None, record_pid: bool = False,
              mode: int = 0o644):
    """Hold an exclusive flock on ``path`` (created with ``mode`` if missing; a link there is refused with a
    StateError, never followed: ``atomic.open_nofollow``) for the ``with`` block.

    One non-blocking try, then polling every 50 ms until ``timeout`` seconds have passed (0: a single
    try). If the lock is still held, raise LockedError(busy(holder)), where ``holder`` is the pid the
    holder recorded in the file (``record_pid``) or "?". With ``record_pid`` the file is rewritten
    with our pid once we hold the lock. An OSError opening the file becomes StateError(cannot_open(exc))
    when ``cannot_open`` is given, else propagates. Closing the descriptor on exit releases the lock.
    """
    path = Path(path)
    try:
        fd = open_nofollow(path, os.O_RDWR | os.O_CREAT, mode)
    except OSError as exc:
        if cannot_open is None:
            raise
        raise StateError(cannot_open(exc)) from None
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in _BUSY:
                    raise
            if time.monotonic() >= deadline:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                raise LockedError(busy(holder)) from None
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        if record_pid:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock (and so does dying)
