"""Paths as a user types them: ``~`` expanded by graphc where the shell leaves it (``--output=~/m.onnx``,
a quoted ``'~/m.onnx'``), so no folder named ``~`` is made; ``-``, which names standard output to
other tools, refused as an output (graphc writes files, and a file named ``-`` was made); an
output that would replace the command's own input (``graphc optimize m.onnx -o m.onnx`` did), or
a folder written into that holds it (``graphc grad arts/inference.onnx -o arts`` replaced it); and
an ONNX model's output not named ``.onnx`` (``-o model.npz`` got an ONNX file under that name)."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
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


def check_not_stdout(path: Path, option: str, what: str = "file") -> None:
    """Refuse ``-`` as an output: graphc writes files (into a folder, ``what``), not standard output."""
    if str(path) == "-":
        raise InputError(f"{option} -: graphc writes {'into ' if what == 'folder' else ''}a {what} here, not "
                         f"standard output; give a {what} path (one named '-': its full path, as pathlib reads ./- as -)")


def check_onnx_name(path: Path, option: str) -> None:
    """Refuse an output ``path`` for an ONNX model whose extension is not ``.onnx`` (any case)."""
    if path.suffix.lower() != ".onnx":
        raise InputError(f"{option} {path}: graphc writes an ONNX model here, and "
                         f"{path.suffix or 'a name without an extension'} names another format; give a .onnx "
                         f"name, such as {path.with_suffix('.onnx') if path.suffix else path.with_name(path.name + '.onnx')}")


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


def check_not_beside_an_input(folder: Path, option: str, inputs: dict[str, Path], names: Sequence[str]) -> None:
    """Refuse an output ``folder`` that the files ``names`` are written into where it holds one of
    ``inputs`` (by the path given or the one its links lead to), or one of those files is an input:
    a written file would replace it, or lie among the input's own (its external data)."""
    if not folder.is_dir():
        return
    for what, source in inputs.items():
        if not source.exists():
            continue
        beside = any(os.path.samefile(folder, place) for place in (source.absolute().parent, source.resolve().parent))
        written = [name for name in names if (folder / name).exists() and os.path.samefile(folder / name, source)]
        if beside or written:
            raise InputError(f"{option} {folder}: {'the folder holding' if beside else 'a folder where'} the input "
                             f"{what} {source}{'' if beside else f' is its {written[0]}'}; graphc never writes beside or over its "
                             "input: write to another folder")
