"""How a command ends when cut short: by Ctrl-C (one line on stderr, exit 130), or by its reader
closing the pipe it prints to (``graphc inspect m.onnx | head -1``: silent, exit 141).

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

PIPE_CLOSED = 141
"""The exit code of a command whose standard output was closed under it: 128 + SIGPIPE, what the
shell reports for a C tool that the pipe's signal ends; not typer's 1, which `graphc` gives a
failed check (`graphc parity` found a mismatch). Nothing is printed."""


def wrote(path: PathT) -> PathT:
    """Record that the command under way has written ``path`` (named if it is then interrupted);
    returns it."""
    _written.append(os.fspath(path))
    return path


@contextmanager
def said_when_interrupted() -> Iterator[None]:
    """Around a command: a ``KeyboardInterrupt`` inside becomes one line on stderr and exit 130
    (typer's own handling exits 130 silently); a closed standard output, exit ``PIPE_CLOSED``."""
    _written.clear()
    try:
        yield
    except KeyboardInterrupt:
        done = f"interrupted after writing {', '.join(_written)} (kept)" if _written else "interrupted: nothing written"
        sys.stderr.write(done + "\n")
        raise typer.Exit(130) from None
    except BrokenPipeError:
        _quiet_stdout()
        raise typer.Exit(PIPE_CLOSED) from None


def _quiet_stdout() -> None:
    """Standard output pointed at /dev/null, its reader gone: Python's flush at exit then finds no
    closed pipe to report."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
