"""Complex graph inputs and outputs. ONNX's complex types have no onnxruntime kernels, so ``gc.capture`` makes a
complex input or output (a complex example array, a complex ``gc.spec``, a returned complex Tensor) the real
pair of torch's ``view_as_real`` layout (``complex64[N, 4]`` is ``float32[N, 4, 2]``: real, imaginary), and
names those values in the model's metadata (``COMPLEX_IO_KEY``: JSON ``{"inputs": [...], "outputs": [...]}``).
``gc.Session.run`` reads it: a complex array fed there becomes its pair, and such an output comes back complex."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from graphc.errors import InputError
from graphc.model.dtypes import COMPLEX_PARTS, TensorSpec, type_text

COMPLEX_IO_KEY = "graphc.complex_io"
_COMPLEX_OF = {part: np.dtype(dtype) for dtype, part in COMPLEX_PARTS.items()}  # float32 -> complex64


def record(metadata: Any, inputs: list[str], outputs: list[str]) -> None:
    """Name the complex ``inputs`` and ``outputs`` in a model's ``metadata`` (nothing when there are none)."""
    if inputs or outputs:
        metadata[COMPLEX_IO_KEY] = json.dumps({"inputs": inputs, "outputs": outputs})


def complex_names(metadata: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """The names of the complex inputs and outputs a model's ``metadata`` records."""
    entry = json.loads(metadata.get(COMPLEX_IO_KEY, "{}"))
    return frozenset(entry.get("inputs", ())), frozenset(entry.get("outputs", ()))


def complex_spec(pair: TensorSpec) -> TensorSpec:
    """The complex value a pair spec holds (``float64[N, 4, 2]`` -> ``complex128[N, 4]``)."""
    shape = None if pair.shape is None else pair.shape[:-1]
    return TensorSpec(name=pair.name, dtype=str(_COMPLEX_OF[pair.dtype]), shape=shape)


def to_pair(spec: TensorSpec, value: Any) -> Any:
    """A feed of the complex input ``spec`` (its pair's spec) as the pair: a complex array of the complex
    dtype becomes ``[..., 2]``; anything else passes as it is (the pair itself), checked as the pair."""
    if not (isinstance(value, np.ndarray) and np.iscomplexobj(value)):
        if isinstance(value, np.ndarray) and spec.shape is not None and value.ndim == len(spec.shape) - 1:
            raise InputError(f"input {spec.name!r}: expected {complex_spec(spec)} (held as the "
                             f"{type_text(spec.dtype, spec.shape)} real pair), got the real {type_text(value.dtype, value.shape)}: feed a complex array or the pair")
        return value
    want = _COMPLEX_OF[spec.dtype]
    if value.dtype != want:
        raise InputError(f"input {spec.name!r}: expected {complex_spec(spec)} (held as the {type_text(spec.dtype, spec.shape)} "
                         f"real pair), got "
                         f"{type_text(value.dtype, value.shape)} (cast it with .astype(np.{want}))")
    return real_pair(value)


def real_pair(array: np.ndarray) -> np.ndarray:
    """A complex array as torch's ``view_as_real``: ``[..., 2]`` (real, imaginary); ``from_pair`` undoes it."""
    return np.stack([array.real, array.imag], -1)


def pairs_of(specs: list[TensorSpec], complex_inputs: frozenset[str], feeds: Mapping[str, Any]) -> dict[str, Any]:
    """``feeds`` with each of ``complex_inputs`` as its pair (``to_pair``; ``specs``: the model's inputs, the pairs')."""
    by_name = {s.name: s for s in specs}
    return {k: to_pair(by_name[k], v) if k in complex_inputs else v for k, v in feeds.items()}


def from_pair(pair: np.ndarray) -> np.ndarray:
    """A ``[..., 2]`` real pair as the complex array it holds (complex64 for float32 parts)."""
    return np.ascontiguousarray(pair).view(_COMPLEX_OF[str(pair.dtype)])[..., 0]


def complex_results(complex_outputs: frozenset[str], results: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``results`` with each of ``complex_outputs`` as the complex array its pair holds (``from_pair``)."""
    return {k: from_pair(v) if k in complex_outputs else v for k, v in results.items()}


__all__ = ["COMPLEX_IO_KEY", "record", "complex_names", "complex_spec", "to_pair", "real_pair", "pairs_of", "from_pair", "complex_results"]
