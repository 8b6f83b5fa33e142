"""Atomic file writes: a crash or a kill mid-write leaves the previous file, never half of one.

Data goes to a temp file (or a scratch folder, for writers that make several files) beside the
target, named ``.<target name>.tmp-<thread id>-<pid>``; it is fsync'ed, then ``os.replace``d
over the target, and the folder is fsync'ed so the rename survives a power loss. Temps of the
same target whose writer is gone (killed, even by SIGKILL) match that pattern and are removed by
the next write, or ``remove_stale_temps``: only entries of that pattern, only in the target's folder.
Folders a write makes for its target (``made_folders``) go again, where still empty, when it fails
or is interrupted. An ``OSError`` on the temp names the target instead (the user asked for the target, not the temp).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Union

PathLike = Union[str, os.PathLike]

_TEMP_SUFFIX = re.compile(r"\.tmp-\d+-(\d+)")


def atomic_write(path: PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically with permissions ``mode``; returns the path."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(f"cannot write {target}: it is a directory")
    with _temp_beside(target) as tmp:
        try:
            write_synced(tmp, data, mode)
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    fsync_dir(target.parent)
    return target


@contextmanager
def scratch_dir(target: PathLike) -> Iterator[Path]:
    """A fresh temp folder beside ``target`` (stale ones of the target removed first) for a
    writer that fills it, fsyncs (``sync_tree``) and moves its files into place; removed on exit."""
    with _temp_beside(Path(target)) as tmp:
        try:
            tmp.mkdir()
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _temp_beside(target: Path) -> Iterator[Path]:
    """A fresh temp path beside ``target``: its folder made where missing (removed again, while
    empty, where the block fails: ``made_folders``), stale temps of ``target`` removed first, and
    an ``OSError`` naming the temp raised naming ``target`` (``_naming``)."""
    with made_folders(target.parent):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(target)
        tmp = temp_path(target)
        with _naming(tmp, target):
            yield tmp


@contextmanager
def made_folders(folder: PathLike) -> Iterator[None]:
    """Around a write into ``folder``: where the block fails or is interrupted (any exception,
    Ctrl-C too), ``folder`` and its parents that did not exist on entry are removed again while
    empty, the deepest first, so a write that did not happen leaves no new folder behind. Folders
    that held something before, or hold something now, stay."""
    folder = Path(folder).absolute()
    missing = []
    for path in (folder, *folder.parents):  # the deepest first, up to the nearest that exists
        if os.path.lexists(path):
            break
        missing.append(path)
    try:
        yield
    except BaseException:
        for path in missing:
            try:
                os.rmdir(path)
            except OSError:  # not empty (another writer's files), or already gone
                if os.path.lexists(path):
                    break
        raise


@contextmanager
def _naming(tmp: Path, target: Path) -> Iterator[None]:
    """An ``OSError`` raised inside that names the temp ``tmp`` (or an entry in it) is raised
    again naming ``target`` (or that entry under it), the original as its cause."""
    try:
        yield
    except OSError as exc:
        name = os.fspath(exc.filename) if isinstance(exc.filename, (str, os.PathLike)) else None
        inside = isinstance(name, str) and (name == str(tmp) or name.startswith(f"{tmp}{os.sep}"))
        if exc.errno is None or not inside:
            raise
        raise OSError(exc.errno, exc.strerror, str(target) + name[len(str(tmp)):]) from exc


class OutsideFolder(ValueError):
    """An entry of a folder that leads outside it (``confined``)."""


def confined(folder: PathLike, name: str, kind: str = "folder") -> Path:
    """``folder / name`` where it may be read as one of the folder's own entries (it need not
    exist): its real path (every symlink and '..' resolved) inside the folder's, and a file there
    of one hard link only (its other names may lie anywhere; onnx's checker refuses hard-linked
    external data for the same reason). Else ``OutsideFolder`` says why, calling the folder
    ``kind``. For the files graphc finds in a folder by name (an artifact directory's manifest,
    state and graphs, a checkpoint folder's file and ``artifacts/``), never for paths a user gives."""
    folder = Path(folder)
    root, real = folder.resolve(), (folder / name).resolve()
    if not real.is_relative_to(root):
        raise OutsideFolder(f"{name!r} resolves to {real}, outside the {kind} {root}; refusing to read it")
    if real.is_file() and real.stat().st_nlink > 1:
        raise OutsideFolder(f"{name!r} in the {kind} {root} has {real.stat().st_nlink} hard links; a hard-linked "
                            "file may be one outside the folder, refusing to read it (copy it in)")
    return folder / name


def temp_path(target: Path) -> Path:
    """This writer's temp name for ``target``: recognisable, beside it, unique per thread."""
    return target.with_name(f".{target.name}.tmp-{threading.get_native_id()}-{os.getpid()}")


def write_synced(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a new file ``path`` and flush it to disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(path, mode)


def sync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and the folders themselves (before renaming them)."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


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


def stale_temps(target: PathLike) -> list[Path]:
    """The temp files and folders of ``target`` in its folder whose writers are gone (their pid
    is not running): what a killed writer left (empty where the folder cannot be read)."""
    target = Path(target)
    prefix = f".{target.name}"
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return []
    found = [(entry, _TEMP_SUFFIX.fullmatch(entry.name[len(prefix):])) for entry in entries
             if entry.name.startswith(prefix)]
    return [Path(entry.path) for entry, match in found
            if match is not None and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1)))]


def remove_stale_temps(target: PathLike) -> None:
    """Delete ``stale_temps(target)``; never anything else, never outside ``target``'s folder.
    Best effort: a read-only folder is left as it is."""
    for path in stale_temps(target):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    if pid <= 0:  # not a writer's pid (and kill(0) would signal our own group)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def missing(path: PathLike, what: str) -> str:
    """Why nothing is at ``path``, for an error: ``no such WHAT``, or, where ``path`` is a symbolic
    link, that it loops or names a missing target (read as "no such file" by the user, who sees it)."""
    if not os.path.islink(path):
        return f"no such {what}"
    target = os.readlink(path)
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"no such {what}: a symbolic link that loops (to {target})"
    return f"no such {what}: a symbolic link to {target}, which does not exist"

