"""Reading a safetensors file one tensor at a time, each straight into an array of its own.

Why not the ``safetensors`` package's reader: it maps the whole file (or takes its bytes) and
copies each tensor out of it, so while a state is read the process holds it twice. Here each
tensor is read from the file into its own fresh, writable array, and a caller that packs and
drops the arrays as it goes (the Trainer) never holds more than one copy: ``gc.Trainer`` from a
folder, ResNet-50's 307 MB AdamW state, reading it peaked at 845 MB RSS, now 553 (the steps' own
peak, 778, is then the process's).
Writing still goes through ``safetensors.numpy.save``; the format is its documented one: 8 bytes of
little-endian header length, a JSON header (``name -> {dtype, shape, data_offsets}`` and an
optional ``__metadata__``), then the data.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Union

import ml_dtypes  # an onnx dependency: numpy's bfloat16
import numpy as np

__all__ = ["DTYPES", "RepeatedKey", "read_header", "read_tensors", "unique_keys"]

MAX_HEADER = 100_000_000  # safetensors' own limit on the header size
DTYPES = {  # safetensors' dtype codes -> numpy
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "I64": np.int64,
    "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32, "U16": np.uint16,
    "U8": np.uint8, "BOOL": np.bool_}


class RepeatedKey(ValueError):
    """A JSON object that names a key twice (``unique_keys``)."""


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``json.loads``'s ``object_pairs_hook`` that refuses a repeated key (``RepeatedKey``): json
    keeps the last value, so a header naming a tensor twice would read one and ignore the other."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise RepeatedKey(f"the header names {key[:60]!r} twice")
        out[key] = value
    return out


def read_header(path: Union[str, os.PathLike]) -> tuple[dict, int]:
    """(the JSON header, the offset its data starts at); ``ValueError`` names what is wrong (a
    tensor named twice, ``RepeatedKey``, included)."""
    with open(path, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < size <= MAX_HEADER:
            raise ValueError("not a safetensors file (no header length in its first 8 bytes)")
        text = f.read(size)
    try:
        header = json.loads(text, object_pairs_hook=unique_keys) if len(text) == size else None
    except RepeatedKey:
        raise
    except ValueError:  # also UnicodeDecodeError
        header = None
    if not isinstance(header, dict):
        raise ValueError("not a safetensors file, or truncated within its header")
    return header, 8 + size


def read_tensors(path: Union[str, os.PathLike], header: dict | None = None, start: int | None = None
                 ) -> dict[str, np.ndarray]:
    """Every tensor of the file at ``path``, in header order, each read into a new array.
    ``header`` and ``start``: what ``read_header`` gave, when the caller has read it already.
    ``ValueError`` names the tensor and what is wrong (dtype, shape, offsets, a short file), or
    the layout (``_check_layout``), before any tensor is read."""
    path = Path(path)
    if header is None or start is None:
        header, start = read_header(path)
    data_size = path.stat().st_size - start
    entries = {name: _entry(name, entry, data_size) for name, entry in header.items() if name != "__metadata__"}
    _check_layout(entries, data_size)
    out = {}
    with open(path, "rb") as f:
        for name, (dtype, shape, begin) in entries.items():
            array = np.empty(shape, dtype)
            f.seek(start + begin)
            # bytes through a uint8 view: the buffer protocol has no format for bfloat16
            if array.nbytes and f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != array.nbytes:
                raise ValueError(f"tensor {name!r}: the file ends within its data (truncated)")
            out[name] = array
    return out


def _entry(name: str, entry: object, data_size: int) -> tuple[np.dtype, list[int], int]:
    """(dtype, shape, first byte) of the header ``entry`` of tensor ``name``, its offsets checked."""
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
        got = entry.get("dtype") if isinstance(entry, dict) else entry
        raise ValueError(f"tensor {name!r}: dtype {got!r} is not one of {', '.join(DTYPES)}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    dtype = np.dtype(DTYPES[entry["dtype"]])
    nbytes = math.prod(shape) * dtype.itemsize
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_size and offsets[1] - offsets[0] == nbytes):
        raise ValueError(f"tensor {name!r}: data_offsets {offsets!r} do not hold {nbytes} bytes of "
                         f"{dtype.name} {shape} within the file's {data_size} bytes of data")
    return dtype, shape, offsets[0]


def _check_layout(entries: dict[str, tuple[np.dtype, list[int], int]], data_size: int) -> None:
    """As the safetensors package requires: the tensors' byte ranges, in offset order, follow one
    another from byte 0 to the end of the data, so no two tensors share bytes and no byte
    (appended or in a gap) belongs to none."""
    end, last = 0, None
    for name, (dtype, shape, begin) in sorted(entries.items(), key=lambda item: item[1][2]):
        if begin != end:
            where = f"after tensor {last!r}'s, which ends at byte {end}" if last else "at byte 0"
            raise ValueError(f"tensor {name!r}: its data starts at byte {begin}, not {where}: tensors that "
                             "overlap or leave a gap (a corrupted or hand-made file)")
        end, last = begin + math.prod(shape) * dtype.itemsize, name
    if end != data_size:
        raise ValueError(f"the file holds {data_size} bytes of data, its tensors {end}: {data_size - end} bytes "
                         "belong to no tensor (a corrupted or hand-made file)")
