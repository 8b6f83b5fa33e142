"""What a command says when Ctrl-C stops it: one line on stderr, then exit 130.

A command records each file or folder it has finished writing with ``wrote``; interrupted, it
says ``interrupted: nothing written``, or ``interrupted after writing PATH, ... (kept)``. graphc's
writes are atomic and remove the folders they made when cut short, so a write under way leaves
nothing. `graphc train` says its own line (the step, the checkpoint saved) and exits 130 itself.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar, Union

import typer

PathT = TypeVar("PathT", bound=Union[str, os.PathLike])
_written: list[str] = []


def wrote(path: PathT) -> PathT:
    """Record that the command under way has written ``path`` (named if it is then interrupted);
    returns it."""
    _written.append(os.fspath(path))
    return path


@contextmanager
def said_when_interrupted() -> Iterator[None]:
    """Around a command: a ``KeyboardInterrupt`` inside becomes one line on stderr and exit 130
    (typer's own handling exits 130 silently)."""
    _written.clear()
    try:
        yield
    except KeyboardInterrupt:
        done = f"interrupted after writing {', '.join(_written)} (kept)" if _written else "interrupted: nothing written"
        sys.stderr.write(done + "\n")
        raise typer.Exit(130) from None
