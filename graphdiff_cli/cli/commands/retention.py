"""``graphdiff retention``: which states a STATE keeps (so a trainer resuming from its checkpoint finds its
step), the disk they use, and a change of it at any time."""

from __future__ import annotations

from ..common import command, emit, warn
from ..options import (DEFAULT_LOCK_TIMEOUT, KeepEveryOption, KeepOption, LockTimeoutOption, SnapshotEveryOption,
                       StateOption)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@command("retention")
def retention(
    state: StateOption,
    keep: KeepOption = None,
    keep_every: KeepEveryOption = None,
    snapshot_every: SnapshotEveryOption = None,
    lock_timeout: LockTimeoutOption = DEFAULT_LOCK_TIMEOUT,
):
    """Show the retention (the last --keep steps and every multiple of --keep-every) and how often an update
    writes q whole (--snapshot-every); given any, set it and prune by it now. Set --keep-every to the trainer's
    checkpoint interval so that rollback --to it works."""
    from ...state import State

    res = State.open(state).retention(keep=keep, keep_every=keep_every, snapshot_every=snapshot_every,
                                      lock_timeout=lock_timeout)
    for line in res["warnings"]:
        warn(line)
    disk = res["disk_bytes"]
    every = f" and every multiple of {res['keep_every']}" if res["keep_every"] else ""
    emit(res, f"STATE {res['state']}: keeps the last {res['keep']} steps{every} (and step 0), q whole every "
              f"{res['snapshot_every']} steps; retained "
              f"{', '.join(map(str, res['retained']))}; {_mb(disk['steps'])} of states, {_mb(disk['models'])} of "
              f"models" + (f"; pruned {', '.join(map(str, res['pruned']))}" if res["pruned"] else ""), report=True)
