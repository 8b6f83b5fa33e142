"""The file `graphc run -o` writes its outputs to, its format told by the extension: ``.npz``
(every output by name), ``.npy`` (a model's one output) or ``.json``. Any other name is refused
before the model runs: a ``.txt`` got an .npz archive under its name."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from graphc.cli.app import json_text
from graphc.cli.arrays import npz_bytes, widened
from graphc.errors import InputError
from graphc.runtime.feeds import dtype_name

FORMATS = {".npz": "every output by name", ".npy": "a model's one output",
           ".json": "each output's dtype, shape and values"}


def check_output_file(path: Path) -> None:
    """Refuse ``path`` (``-o``) unless its extension is one of ``FORMATS``."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        accepted = ", ".join(f"{ext} ({what})" for ext, what in FORMATS.items())
        raise InputError(f"-o/--output {path}: graphc run writes the format its extension names, and "
                         f"{suffix or 'no extension'} names none; accepted: {accepted}")


def check_holds_outputs(path: Path, outputs: list) -> None:
    """Refuse a ``.npy`` ``path`` unless the model has one output (``outputs``: its specs)."""
    if path.suffix.lower() == ".npy" and len(outputs) != 1:
        raise InputError(f"-o/--output {path}: a .npy file holds one array and the model has {len(outputs)} outputs "
                         f"({', '.join(s.name for s in outputs)}); write .npz or .json")


def output_bytes(path: Path, results: dict[str, np.ndarray]) -> bytes:
    """``results`` in the format of ``path``'s extension (``check_output_file``), bfloat16 ones as
    float32 (exact), which .npy, .npz and numpy hold."""
    results = widened(results)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return npz_bytes(results)
    if suffix == ".npy":
        [array] = results.values()
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
        return buffer.getvalue()
    return (json_text({name: _json_array(a) for name, a in results.items()}, indent=None) + "\n").encode()


def _json_array(array: np.ndarray) -> dict:
    """An array as JSON: its dtype, shape and nested values, a complex one's as [real, imaginary]
    pairs (JSON has no complex numbers), a non-finite one as "inf", "-inf" or "nan"."""
    values = np.stack([array.real, array.imag], axis=-1) if np.iscomplexobj(array) else array
    return {"dtype": dtype_name(array.dtype), "shape": list(array.shape), "data": values.tolist()}
