"""Temporary names that say who made them, and the sweep of those whose maker died.

Every temporary file or folder graphdiff puts beside a destination ``NAME`` is called
``.NAME.<kind>-<host>@<pid>@<random>`` (``kind``: ``tmp`` for a file of ``io.atomic``, ``staging`` for a
folder of ``io.staging``, ``old`` for a folder renamed aside while being replaced). A writer that is killed
(kill -9, OOM, a node lost) leaves its temporary behind; the next writer of the same destination removes
every one made on this host by a process that no longer exists (``sweep``). One made on another host (a
shared filesystem) or by a live process is left alone: the sweep never races a running writer. Names of
the older form without host and pid are left too (their maker cannot be told). ``graphdiff verify`` lists
them (``leftovers``, ``describe``) without removing anything.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import uuid
from pathlib import Path

KINDS = ("tmp", "staging", "old")
def _host_token() -> str:
    """The host name plus this process's pid namespace (a container sharing the host's name has its own
    pids: a pid is only meaningful inside its namespace)."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname() or "host")
    try:
        return f"{host}-ns{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return host


_HOST = _host_token()
_NAME = re.compile(r"^\.(?P<dest>.+)\.(?P<kind>tmp|staging|old)-(?P<host>[A-Za-z0-9_.-]+)@(?P<pid>\d+)@[0-9a-f]+$")


def temp_name(dest_name: str, kind: str) -> str:
    """A fresh temporary name for ``dest_name`` made by this process."""
    if kind not in KINDS:
        raise ValueError(f"unknown temporary kind {kind!r}")
    return f".{dest_name}.{kind}-{_HOST}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def owner(name: str) -> tuple[str, str, str, int] | None:
    """(destination name, kind, host, pid) of a temporary name, or None if it is not one."""
    m = _NAME.match(name)
    return (m["dest"], m["kind"], m["host"], int(m["pid"])) if m else None


def alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a pid we may not signal exists too)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(name: str, dest_name: str | None = None) -> bool:
    """A temporary name (of ``dest_name`` when given) made on this host by a process that is gone."""
    who = owner(name)
    if who is None or (dest_name is not None and who[0] != dest_name):
        return False
    return who[2] == _HOST and who[3] != os.getpid() and not alive(who[3])


def sweep(folder, dest_name: str | None = None) -> list[str]:
    """Remove the stale temporaries in ``folder`` (of ``dest_name`` only, when given); returns their names."""
    folder = Path(folder)
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        if not is_stale(name, dest_name):
            continue
        p = folder / name
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue  # another sweeper was first
        except OSError:
            continue  # not ours to remove after all (permissions): leave it
        removed.append(name)
    return removed


def leftovers(folder, dest_name: str) -> list[str]:
    """The temporary names of ``dest_name`` in ``folder`` (whoever made them, alive or not), sorted: what
    ``graphdiff verify`` lists beside an artifact or a STATE. Reads only."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(n for n in names if (who := owner(n)) is not None and who[0] == dest_name)


_KIND_WORDS = {"tmp": "temporary file", "staging": "staging folder", "old": "previous version, renamed aside,"}


def describe(name: str, swept_by: str, *, any_host: bool = False) -> str:
    """In words, what the temporary ``name`` is and what becomes of it (a notice of ``graphdiff verify``).
    ``swept_by``: who removes it ("the next write of graph.zarr"); ``any_host``: it removes it whoever made it
    (a STATE's writers hold its lock, so a temporary inside a STATE is never a running writer's of another host)."""
    who = owner(name)
    if who is None:  # a trash folder or a temporary of the older form: its maker cannot be told
        return f"left by a write that stopped before it finished; {swept_by} removes it"
    dest, kind, host, pid = who
    what = f"{_KIND_WORDS[kind]} of {dest}"
    if host != _HOST and not any_host:
        return (f"{what}, made on another host ({host}, process {pid}); {swept_by} there removes it once that "
                "process is gone")
    if host == _HOST and (pid == os.getpid() or alive(pid)):
        return f"{what} of a write in progress (process {pid} is running)"
    if host != _HOST:
        return f"{what}, left by a write on host {host} (process {pid}) that did not finish; {swept_by} removes it"
    return f"{what}, left by a write that was killed (its process {pid} is gone); {swept_by} removes it"
