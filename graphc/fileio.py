"""Atomic file writes: a crash or a kill mid-write leaves the previous file, never half of one.

Data goes to a temp file in the target's folder (named after the writer's pid), is fsync'ed,
then ``os.replace``d over the target; the folder is fsync'ed so the rename survives a power
loss. Temp files of writers that were killed are removed by the next write.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Union

PathLike = Union[str, os.PathLike]


def atomic_write(path: PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically with permissions ``mode``; returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(target)
    tmp = target.with_name(f".{target.name}.tmp-{threading.get_native_id()}-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return target


def fsync_dir(folder: Path) -> None:
    """Flush a folder's entries (renames) to disk, where the platform allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows cannot open folders
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(target: Path) -> None:
    """Delete temp files left by writers that were killed mid-write (their pid is gone)."""
    for tmp in target.parent.glob(f".{target.name}.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
