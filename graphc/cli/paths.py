"""Paths as a user types them: ``~`` expanded by graphc where the shell leaves it (``--output=~/m.onnx``,
a quoted ``'~/m.onnx'``), so no folder named ``~`` is made; ``-``, which names standard output to
other tools, refused as an output (graphc writes files, and a file named ``-`` was made); and an
output that would replace the command's own input (``graphc optimize m.onnx -o m.onnx`` did)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from graphc.errors import InputError


def user_path(path: str | os.PathLike) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded."""
    return Path(path).expanduser()


def user_paths(value: Any) -> Any:
    """A parsed option or argument value with each ``Path`` in it (a list's too) passed through
    ``user_path``; any other value as it is."""
    if isinstance(value, Path):
        return user_path(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, Path) for v in value):
        return type(value)(user_path(v) if isinstance(v, Path) else v for v in value)
    return value


def check_not_stdout(path: Path, option: str) -> None:
    """Refuse ``-`` as an output: graphc writes files, not standard output."""
    if str(path) == "-":
        raise InputError(f"{option} -: graphc writes a file here, not standard output; give a file "
                         "path (a file named '-': its full path, as pathlib reads ./- as -)")


def check_not_a_loop(path: Path, option: str) -> None:
    """Refuse a ``path`` that is a symbolic link looping back to itself: writing replaced the link
    with a file, where a shell's ``>`` says the link loops."""
    if path.is_symlink() and not path.exists():
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputError(f"{option} {path}: a symbolic link that loops ({exc.strerror}); give another "
                                 "path") from None


def check_not_an_input(path: Path, option: str, inputs: dict[str, Path]) -> None:
    """Refuse an output ``path`` that would replace one of ``inputs`` (what each is -> its path): the
    same file by any spelling or link, or a file inside an input folder (an artifact directory's
    ``inference.onnx``)."""
    if not path.exists():
        return
    for what, source in inputs.items():
        if not source.exists():
            continue
        inside = source.is_dir() and not os.path.samefile(path, source) and \
            path.resolve().is_relative_to(source.resolve())
        if inside or os.path.samefile(path, source):
            raise InputError(f"{option} {path}: {'a file of' if inside else 'the same file as'} the input {what} "
                             f"{source}; graphc never overwrites its input: write to another path")
