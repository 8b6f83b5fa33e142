"""Where a captured node came from: the ``file.py:LINE`` of the user's code that made it.

A node's source is the innermost frame outside the graphc package (and numpy, whose wrappers
dispatch to ``Tensor``). Code graphc runs for the user with no user frame below it (`graphc grad`
capturing the loss its ``--loss`` option names) would find the command line's parser there
(typer's ``main.py``), so such code names itself instead with ``on_behalf_of``.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import os
import sys
import sysconfig
import traceback
from pathlib import Path
from types import FrameType

import numpy as np

_PKG_DIR = str(Path(__file__).resolve().parents[1]) + os.sep  # the graphc package


def _own_dirs() -> tuple[str, ...]:
    """The graphc package's folder and those of its subpackages that lie elsewhere: an editable
    install maps ``graphc.passes`` and ``graphc.backends`` to the repository's ``passes/`` and
    ``backends/`` (a wheel holds them inside the package)."""
    found = {_PKG_DIR}
    for name in ("graphc.passes", "graphc.backends"):
        spec = importlib.util.find_spec(name)
        found.update(str(Path(p).resolve()) + os.sep for p in (spec.submodule_search_locations or [] if spec else []))
    return tuple(sorted(found))


# Frames that are never the user's code: graphc's own, and numpy's (``np.sum(t)`` dispatches to
# ``Tensor.__array_function__`` from numpy's Python wrappers).
_NOT_USER = (*_own_dirs(), str(Path(np.__file__).resolve().parent) + os.sep)
# Python's own and installed libraries: where user code calls them, the user's line is the call
_LIBRARIES = tuple(sorted({str(Path(sysconfig.get_path(k)).resolve()) + os.sep
                           for k in ("stdlib", "platstdlib", "purelib", "platlib")}))
# The ``on_behalf_of`` blocks running in this thread / asyncio task: (graphc's frame, the source it names)
_BEHALF: contextvars.ContextVar[tuple[tuple[FrameType, str], ...]] = contextvars.ContextVar("graphc_on_behalf",
                                                                                          default=())


class on_behalf_of:
    """``with on_behalf_of("graphc grad --loss ce:logits:y"):`` in graphc's own code: the nodes
    made within the block with no user code on the way (graphc's frames only, up to the block's)
    name ``source`` as theirs, not a frame of whoever called graphc; user code called within (a
    ``graphc capture FILE.py:Net``'s) still names its own line."""

    def __init__(self, source: str):
        self.source = source

    def __enter__(self) -> on_behalf_of:
        self._token = _BEHALF.set((*_BEHALF.get(), (sys._getframe(1), self.source)))
        return self

    def __exit__(self, *exc_info) -> None:
        _BEHALF.reset(self._token)


def user_source() -> str:
    """``file.py:LINE`` of the innermost frame outside the graphc package (the user's code), or
    the source of the innermost ``on_behalf_of`` block reached before it."""
    frame, behalf = sys._getframe(1), dict(_BEHALF.get())
    while frame is not None and frame.f_code.co_filename.startswith(_NOT_USER):
        if frame in behalf:
            return behalf[frame]
        frame = frame.f_back
    if frame is None:
        return "<unknown>:0"
    return f"{_display_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def called_from_graphc(depth: int = 1) -> bool:
    """Whether the frame ``depth`` levels above the caller is graphc's own code (or numpy's), not the user's."""
    return sys._getframe(depth + 1).f_code.co_filename.startswith(_NOT_USER)


def raised_at(exc: BaseException) -> str:
    """``file.py:LINE`` where ``exc`` was raised in the user's code: the innermost frame of its
    traceback outside graphc and numpy, and outside Python's own and installed libraries when
    the user's code called one (``json.loads`` raising); graphc's own innermost frame when no user
    code is on the way (a layer's defect); ``<unknown>:0`` when there is no traceback."""
    frames = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__)]
    user = [f for f in frames if not f[0].startswith(_NOT_USER)]
    own = [f for f in user if not os.path.realpath(f[0]).startswith(_LIBRARIES)] or user or frames
    return f"{_display_path(own[-1][0])}:{own[-1][1]}" if own else "<unknown>:0"


@functools.lru_cache(maxsize=1024)
def _display_path(filename: str) -> str:
    """Relative to the working directory when below it, else as given."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # other drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


__all__ = ["called_from_graphc", "on_behalf_of", "raised_at", "user_source"]
