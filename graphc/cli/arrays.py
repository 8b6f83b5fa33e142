"""Array files the CLI reads (``.npy`` for ``--input``, ``.npz`` for ``--data``), never unpickled.

Each file is checked by its first bytes before numpy reads it, and each array by its header, so
a wrong kind of file, a corrupt one or an array of Python objects (which only pickle could
restore) is one ``InputError`` naming the option, the file and the problem.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
from pathlib import Path
from typing import BinaryIO

import ml_dtypes
import numpy as np

from graphc.errors import InputError
from graphc.fileio import missing
from graphc.model.dtypes import type_text
from graphc.runtime.feeds import dtype_name

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
_READ_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile)


def load_npy(path: Path, option: str) -> np.ndarray:
    """The array in the ``.npy`` file ``path`` (``np.save``)."""
    kind = _kind(path, option)
    if kind != "npy":
        raise InputError(f"{option} {path}: expected one array saved with np.save (.npy), found {_FOUND[kind]}")
    try:
        with open(path, "rb") as f:
            _check_header(f, f"{option} {path}: the array", path.stat().st_size)
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except InputError:
        raise
    except _READ_ERRORS as exc:
        raise InputError(f"{option} {path}: not a readable .npy file ({_first_line(exc)})") from None


def npz_names(path: Path, option: str) -> list[str]:
    """The names of the arrays in the ``.npz`` archive ``path`` (``np.savez``)."""
    kind = _kind(path, option)
    if kind != "npz":
        raise InputError(f"{option} {path}: expected arrays saved by name with np.savez(path, x=..., y=...) "
                         f"(.npz), found {_FOUND[kind]}")
    try:
        with zipfile.ZipFile(path) as archive:
            return [n[:-4] for n in archive.namelist() if n.endswith(".npy")]
    except _READ_ERRORS as exc:
        raise InputError(f"{option} {path}: not a readable .npz archive ({_first_line(exc)})") from None


def load_npz(path: Path, option: str, names: list[str]) -> dict[str, np.ndarray]:
    """The arrays ``names`` of the ``.npz`` archive ``path``."""
    out = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for name in names:
                with archive.open(f"{name}.npy") as f:
                    _check_header(f, f"{option} {path}: array {name!r}", archive.getinfo(f"{name}.npy").file_size)
                    f.seek(0)
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
    except InputError:
        raise
    except _READ_ERRORS as exc:
        raise InputError(f"{option} {path}: not a readable .npz archive ({_first_line(exc)})") from None
    return out


def fit_bfloat16(arrays: dict[str, np.ndarray], specs) -> dict[str, np.ndarray]:
    """``arrays`` with those of bfloat16 inputs (``specs``: the model's) made bfloat16. A .npy or
    .npz file cannot hold bfloat16: ``np.save`` writes ml_dtypes' bfloat16 as raw 2-byte values
    (``|V2``), read back here as bfloat16, and a float32 array is rounded to it (to nearest even, as
    torch's ``.to(torch.bfloat16)``). Any other array is left for the model's own check to name."""
    wanted = {spec.name for spec in specs if spec.dtype == "bfloat16"}
    out = dict(arrays)
    for name in wanted & set(arrays):
        array = arrays[name]
        if array.dtype == np.dtype("V2"):
            out[name] = array.view(ml_dtypes.bfloat16)
        elif array.dtype == np.float32:
            out[name] = array.astype(ml_dtypes.bfloat16)
    return out


def check_dtypes(arrays: dict[str, np.ndarray], specs, keys: list[str], what: str) -> None:
    """Each of ``arrays`` (by input name) has its input's dtype (``specs``: the model inputs, in
    the order of ``keys``, the arrays' names in the file ``what`` names with its option), else
    an error naming the file, the array and the cast to save it with (``np.savez`` keeps
    numpy's default float64)."""
    for spec, key in zip(specs, keys):
        array = arrays[spec.name]
        if dtype_name(array.dtype) != spec.dtype:
            want = "float32" if spec.dtype == "bfloat16" else spec.dtype  # an .npz holds bfloat16 as float32
            raise InputError(f"{what}: array {key!r} is {type_text(array.dtype, array.shape)} where the model input "
                             f"{spec} takes {spec.dtype}; save it as {want}: np.savez(..., {key}={key}"
                             f".astype(np.{want}))")


def widened(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``arrays`` with bfloat16 ones as float32 (exact), which an .npz can hold and numpy read."""
    return {name: a.astype(np.float32) if a.dtype == ml_dtypes.bfloat16 else a for name, a in arrays.items()}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An ``.npz`` archive of ``arrays`` by name, as ``np.savez`` writes one (without pickle), for
    any names: ``np.savez(f, **arrays)`` fails on an array named ``file`` or ``allow_pickle``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)
    return buffer.getvalue()


_FOUND = {"npy": "a single-array .npy file", "npz": "an .npz archive", "other": "a file that is neither .npy nor .npz"}


def _kind(path: Path, option: str) -> str:
    if path.is_dir():
        raise InputError(f"{option} {path}: a folder, not a file")
    if not path.is_file():
        raise FileNotFoundError(f"{option} {path}: {missing(path, 'file')}" if path.is_symlink()
                                else f"{option}: no such file {path}")
    if not os.access(path, os.R_OK):
        raise InputError(f"{option} {path}: no permission to read the file")
    with open(path, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    return "npy" if head == NPY_MAGIC else "npz" if head.startswith(ZIP_MAGIC) else "other"


def _check_header(f: BinaryIO, what: str, size: int) -> None:
    """Refuse an array whose dtype holds Python objects (only unpickling could read it) or whose
    header declares more data than the ``size`` bytes of its file hold (numpy would allocate all
    of it first: a 100-byte file can ask for terabytes)."""
    version = np.lib.format.read_magic(f)
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        return  # format 3.0 (utf-8 field names): np.load's allow_pickle=False still refuses objects
    shape, _, dtype = readers[version](f)
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects (dtype {dtype}), which only unpickling could read, and "
                         "graphc never unpickles; save numeric arrays (e.g. np.asarray(a, dtype=np.float32))")
    declared, held = math.prod(shape) * dtype.itemsize, size - f.tell()
    if declared > held:
        raise InputError(f"{what} is truncated: its header declares {dtype}{list(shape)} ({declared:,} bytes) but "
                         f"the file holds {max(held, 0):,} bytes of data")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
