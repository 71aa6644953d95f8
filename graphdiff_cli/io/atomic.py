"""Atomic single-file writes: a temporary file in the same folder, fsync, then rename into place.

The temporary is named by ``io.debris`` (host and pid in the name); each write first sweeps the ones of
the same destination whose writer died.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .debris import sweep, temp_name


@contextlib.contextmanager
def atomic_write(path, binary: bool = False, encoding: str = "utf-8"):
    """Yield a file object; on success its content replaces ``path`` atomically, on error nothing changes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep(path.parent, path.name)
    tmp = path.parent / temp_name(path.name, "tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any user file
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": encoding})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path, text: str) -> Path:
    with atomic_write(path) as f:
        f.write(text)
    return Path(path)
