"""float32 data in a half type: finite values beyond the type's range clamped to its largest
finite value, and counts of what was clamped, became subnormal or was flushed to zero."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from graphc.model.dtypes import finfo


@dataclass(frozen=True)
class Narrowed:
    """One tensor's float32 data in the target type; ``clamped``: finite values beyond the range;
    ``subnormal``: values that became the type's subnormals (float16: below 6.1e-5 in magnitude,
    fewer significant bits); ``flushed``: non-zero values that became 0."""

    tensor: ir.Tensor
    clamped: int
    subnormal: int
    flushed: int


def narrow(tensor: ir.TensorProtocol, target: ir.DataType, name: str) -> Narrowed:
    """``tensor`` (float32) as ``target``; NaN and +-inf stay what they are."""
    array = tensor.numpy()
    dtype = target.numpy()
    info = finfo(dtype)
    largest = float(info.max)
    beyond = np.isfinite(array) & (np.abs(array) > largest)
    clamped = np.where(beyond, np.sign(array) * largest, array)
    out = clamped.astype(dtype)
    magnitude = np.abs(out.astype(np.float32))
    subnormal = int(np.count_nonzero((magnitude > 0) & (magnitude < float(info.smallest_normal))))
    flushed = int(np.count_nonzero((array != 0) & (out == 0)))
    return Narrowed(ir.tensor(out, name=name), int(beyond.sum()), subnormal, flushed)
