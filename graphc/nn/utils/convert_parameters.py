"""``gc.nn.utils.parameters_to_vector``/``vector_to_parameters``: outside a capture, on the
Parameters' numpy values (what a graphc Parameter holds); inside one, ``parameters_to_vector`` of
Tensors is their Reshape + Concat."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import user_source
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.module import Parameter
from graphc.nn.utils.norms import weight_value

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters: Iterable[Any]) -> Any:
    """``torch.nn.utils.parameters_to_vector``: every parameter flattened and concatenated, in
    order: a numpy vector of Parameters' values, or a Tensor of Tensors (inside a capture)."""
    items = list(parameters)
    if items and all(isinstance(p, Tensor) for p in items):
        return ops.concat([ops.reshape(p, [-1]) for p in items], axis=0)
    if not all(isinstance(p, Parameter) for p in items):
        kinds = sorted({type(p).__name__ for p in items})
        raise CaptureError(f"parameters_to_vector: parameters must be all gc.nn.Parameters or all Tensors, got "
                           f"{', '.join(kinds)} (at {user_source()})")
    values = [weight_value(p).reshape(-1) for p in items]
    if len({v.dtype for v in values}) > 1:
        dtypes = sorted({str(v.dtype) for v in values})
        raise CaptureError(f"parameters_to_vector: the parameters' dtypes differ ({dtypes}) (at {user_source()})")
    return np.concatenate(values)


def vector_to_parameters(vec: Any, parameters: Iterable[Parameter]) -> None:
    """``torch.nn.utils.vector_to_parameters``: the Parameters' values set from consecutive slices
    of ``vec`` (a numpy vector as long as all of them; a captured Tensor cannot be written into them)."""
    items = list(parameters)
    if isinstance(vec, Tensor):
        raise CaptureError(f"vector_to_parameters: vec is a captured Tensor; a Parameter's value is set outside "
                           f"the capture (pass a numpy array) (at {user_source()})")
    vec = np.asarray(vec)
    sizes = [int(np.prod(p.shape)) for p in items]
    if vec.ndim != 1 or vec.size != sum(sizes):
        raise CaptureError(f"vector_to_parameters: vec must be 1-D with {sum(sizes)} elements (the parameters' "
                           f"total), got shape {vec.shape} (at {user_source()})")
    start = 0
    for p, n in zip(items, sizes):
        p.data = vec[start:start + n].reshape(p.shape)
        start += n
