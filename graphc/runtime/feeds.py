"""Feed validation: every check a Session makes before any backend runs.

A feed must name a graph input, have the input's dtype and rank, match every fixed dim, and
agree with the other feeds on the size of each symbolic dim (all ``"N"`` dims are one size).
Every failure raises ``InputError`` naming the input, the expected spec and what was given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphc.errors import InputError
from graphc.model.dtypes import TensorSpec, as_dtype, to_numpy, type_text


def _as_array(spec: TensorSpec, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    try:  # Python scalars and lists take the input's dtype, as a convenience
        array = np.asarray(value, dtype=to_numpy(spec.dtype))
    except OverflowError as exc:
        raise InputError(f"input {spec.name!r}: expected {spec}, got a value out of the range of {spec.dtype} "
                         f"({exc})") from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"input {spec.name!r}: expected {spec}, got a {type(value).__name__} "
                         f"that does not convert to an array ({exc})") from None
    if array.dtype.kind in "iub":  # numpy truncates 1.5 to 1 and makes 0.5 True: refuse what changes
        given = np.asarray(value)
        if given.dtype.kind in "fc" and not np.array_equal(given, array):
            raise InputError(f"input {spec.name!r}: expected {spec}, got a {type(value).__name__} of non-integral "
                             f"values, which {spec.dtype} cannot hold (e.g. {given.flat[0]!r}; round them first)")
    return array


def dtype_name(dtype: np.dtype) -> str:
    try:
        return str(as_dtype(dtype))
    except TypeError:
        return str(dtype)


def check_one(spec: TensorSpec, shape: Sequence[int], dtype: str, dims: dict[str, tuple[int, str, int]]) -> None:
    """Check one value's dtype/shape against ``spec``; ``dims`` collects symbolic dim sizes."""
    got = type_text(dtype, shape)
    if dtype != spec.dtype:
        fix = (f"{spec.name!r} is no complex input (graphc.complex_io): feed z.real, or where the model reads a "
               "[..., 2] real pair, np.stack([z.real, z.imag], -1)"
               if dtype.startswith("complex") else "cast it with .astype")
        raise InputError(f"input {spec.name!r}: expected {spec}, got {got} (dtype {dtype} is not {spec.dtype}; {fix})")
    if spec.shape is None:
        return
    if len(shape) != len(spec.shape):
        raise InputError(f"input {spec.name!r}: expected {spec}, got {got} "
                         f"(rank {len(shape)}, expected rank {len(spec.shape)})")
    for axis, (want, size) in enumerate(zip(spec.shape, shape)):
        if isinstance(want, int) and want != size:
            raise InputError(f"input {spec.name!r}: expected {spec}, got {got} "
                             f"(axis {axis} has size {size}, the model fixes it at {want})")
        if isinstance(want, str):
            seen = dims.setdefault(want, (size, spec.name, axis))
            if seen[0] != size:
                raise InputError(
                    f"input {spec.name!r}: expected {spec}, got {got}: dim {want!r} is {size} "
                    f"here (axis {axis}) but {seen[0]} in input {seen[1]!r} (axis {seen[2]})")


def optional_inputs(model: Any) -> frozenset[str]:
    """Names of a ``gc.Model``'s inputs backed by an initializer (feeding them is optional)."""
    graph = model.graph
    return frozenset(v.name for v in graph.inputs if v.name in graph.initializers)


def random_feeds(specs: Sequence[TensorSpec], dims: Mapping[str, int] | None = None, seed: int = 0,
                 default_dim: int = 2, int_high: int = 4) -> dict[str, np.ndarray]:
    """Seeded random arrays for ``specs``: floats ~ N(0, 1), integers in [0, ``int_high``),
    random bools, strings "s0".."s{int_high - 1}". Symbolic dims take their size from ``dims``,
    unknown ones ``default_dim``."""
    rng = np.random.default_rng(seed)
    dims = dims or {}
    feeds = {}
    for spec in specs:
        shape = tuple(d if isinstance(d, int) else dims.get(d or "", default_dim) for d in (spec.shape or ()))
        dtype = to_numpy(spec.dtype)
        if spec.dtype == "bool":
            feeds[spec.name] = rng.random(shape) < 0.5
        elif spec.dtype == "string":
            feeds[spec.name] = np.array([f"s{v}" for v in rng.integers(0, int_high, size=shape).ravel()],
                                        dtype=object).reshape(shape)
        elif np.issubdtype(dtype, np.integer):
            feeds[spec.name] = rng.integers(0, int_high, size=shape).astype(dtype)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def required_specs(model: Any) -> list[TensorSpec]:
    """The input specs of a ``gc.Model`` a caller must feed (those without an initializer)."""
    optional = optional_inputs(model)
    return [s for s in model.inputs if s.name not in optional]


def validate_feeds(specs: Sequence[TensorSpec], feeds: Mapping[str, Any],
                   optional: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Check ``feeds`` against the graph's input ``specs``; return them as numpy arrays
    (device handles such as ``OrtValue``s are checked by their shape and dtype and kept).

    ``optional`` names inputs that have a default (initializer-backed) and may be left out.
    """
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict of input name -> array, got {type(feeds).__name__}")
    by_name = {s.name: s for s in specs}
    listing = ", ".join(str(s) for s in specs) or "(none)"
    for name in feeds:
        if name not in by_name:
            raise InputError(f"unknown input {name!r}; the model's inputs are: {listing}")
    missing = [s for s in specs if s.name not in feeds and s.name not in optional]
    if missing:
        raise InputError(f"missing input {missing[0].name!r} (expected {missing[0]}); "
                         f"the model's inputs are: {listing}")
    dims: dict[str, tuple[int, str, int]] = {}
    values: dict[str, Any] = {}
    for spec in specs:
        if spec.name not in feeds:
            continue
        value = feeds[spec.name]
        meta = handle_meta(value)
        if meta is None:
            value = _as_array(spec, value)
            meta = (value.shape, dtype_name(value.dtype))
        check_one(spec, meta[0], meta[1], dims)
        values[spec.name] = value
    return values


def handle_meta(value: Any) -> tuple[tuple[int, ...], str] | None:
    """(shape, dtype name) of a device handle such as an ``OrtValue``; None for anything else."""
    if isinstance(value, np.ndarray) or not callable(getattr(value, "element_type", None)):
        return None
    return tuple(value.shape()), str(as_dtype(int(value.element_type())))
