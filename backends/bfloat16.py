"""bfloat16 tensors across onnxruntime's Python boundary, which has no numpy type for them.

``InferenceSession.run`` refuses an ml_dtypes bfloat16 array ("Numpy_type 256 can't be
converted to MLDataType") and ``OrtValue.numpy()`` a bfloat16 result. Their bits are uint16's:
a feed goes in as an OrtValue made from its uint16 view with the ONNX type BFLOAT16 (one kept on a
device, a Trainer's param or state, as a new OrtValue of that type its bits are copied into), and a
result comes out as a copy of its bytes viewed as bfloat16.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

from graphc.errors import BackendError
from graphc.model.dtypes import to_numpy

BFLOAT16 = to_numpy("bfloat16")
TYPE = "tensor(bfloat16)"


def to_ortvalue(ortvalue: Any, array: np.ndarray) -> Any:
    """``array`` (C-contiguous) as an ``ortvalue`` (onnxruntime's OrtValue class) on the CPU; bfloat16
    through its uint16 view."""
    if array.dtype == BFLOAT16:
        return ortvalue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), onnx.TensorProto.BFLOAT16)
    return ortvalue.ortvalue_from_numpy(array)


def to_device(ort: Any, array: np.ndarray, keep: bool, device: str, device_id: int) -> Any:
    """``array`` as an OrtValue on ``device``: wrapping ``array`` itself where ``keep`` (C-contiguous,
    on the CPU), else a copy; a bfloat16 one always a copy, into an OrtValue of that ONNX type."""
    if array.dtype == BFLOAT16:
        value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), onnx.TensorProto.BFLOAT16, device,
                                                          device_id)
        value.update_inplace(np.ascontiguousarray(array).view(np.uint16))
        return value
    return ort.OrtValue.ortvalue_from_numpy(array if keep else np.array(array, copy=True, order="C"), device, device_id)


def to_array(value: Any) -> Any:
    """An OrtValue result as numpy: a bfloat16 tensor's bytes copied out and viewed as bfloat16."""
    if value.data_type() != TYPE:
        return value.numpy()
    if value.device_name().lower() != "cpu":  # data_ptr would be a device address
        raise BackendError(f"a bfloat16 result on {value.device_name()} cannot be read back to numpy")
    shape = value.shape()
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, BFLOAT16)
    bits = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.array(bits, dtype=np.uint16).reshape(shape).view(BFLOAT16)


def run(session: Any, ort: Any, names: list[str], feeds: Mapping[str, np.ndarray], options: Any) -> list[Any]:
    """``session.run`` for a model with bfloat16 inputs or outputs."""
    values = {name: to_ortvalue(ort.OrtValue, array) for name, array in feeds.items()}
    return [to_array(value) for value in session.run_with_ort_values(names, values, options)]
