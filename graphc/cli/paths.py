"""Paths as a user types them: ``~`` expanded by graphc where the shell leaves it (``--output=~/m.onnx``,
a quoted ``'~/m.onnx'``), so no folder named ``~`` is made; and ``-``, which names standard output to
other tools, refused as an output (graphc writes files, and a file named ``-`` was made)."""

from __future__ import annotations

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
