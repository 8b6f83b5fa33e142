"""What the numpy kernels whose output size depends on input values would allocate, found from
their inputs before they run, for a run's ``max_tensor_bytes`` (``interpreter.Plan.run``).

An Expand counts as the tensor it stands for: its broadcast view costs nothing, but whatever
reads it (an Add, a ReduceSum) touches every element, in one numpy call no cancel can stop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from graphc.backends.numpy.kernels import scalar
from graphc.backends.numpy.resize import _plan_sizes
from graphc.backends.value_sized import too_large
from graphc.errors import TensorTooLarge

Shape = Sequence[int]


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).ravel()]


def _constant_of_shape(shape, *, value=None, **_) -> tuple[Shape, np.dtype]:
    return _ints(shape), (value.dtype if value is not None else np.dtype(np.float32))


def _expand(x, shape, **_) -> tuple[Shape, np.dtype]:
    return np.broadcast_shapes(x.shape, tuple(_ints(shape))), x.dtype


def _tile(x, repeats, **_) -> tuple[Shape, np.dtype]:
    return [d * r for d, r in zip(x.shape, _ints(repeats))], x.dtype


def _range(start, limit, delta, **_) -> tuple[Shape, np.dtype, int]:
    first, last, step = (scalar(v) for v in (start, limit, delta))
    n = max(math.ceil((last - first) / step), 0)
    return [n], start.dtype, n * 8 * (start.dtype.itemsize < 8)  # np.arange's 64-bit values, then cast


def _pad(x, pads=None, constant_value=None, axes=None, **attrs) -> tuple[Shape, np.dtype]:
    pads = _ints(attrs["pads"] if pads is None else pads)  # opset 2's pads are an attribute
    axes = [a % x.ndim for a in (_ints(axes) if axes is not None else range(x.ndim))]
    out = list(x.shape)
    for i, a in enumerate(axes):
        out[a] += pads[i] + pads[i + len(axes)]
    return out, x.dtype


def _one_hot(indices, depth, values, *, axis=-1, **_) -> tuple[Shape, np.dtype]:
    out = list(np.shape(indices))
    out.insert(axis % (len(out) + 1), int(scalar(depth)))
    return out, values.dtype


def _resize(x, *inputs, axes=None, keep_aspect_ratio_policy="stretch", scales=None, **_) -> tuple[Shape, np.dtype]:
    if len(inputs) == 1 or scales is not None:  # Resize-10 and Upsample: (x, scales); Upsample-7: attribute
        return _plan_sizes(x.shape, inputs[0] if scales is None else scales, None, None, "stretch")[0], x.dtype
    padded = [*inputs, None, None, None][:3]  # roi, scales, sizes
    return _plan_sizes(x.shape, padded[1], padded[2], axes, keep_aspect_ratio_policy)[0], x.dtype


def _window(size, *, output_datatype=1, **_) -> tuple[Shape, np.dtype]:
    return [int(scalar(size))], tensor_dtype_to_np_dtype(output_datatype)


def _center_crop_pad(x, shape, *, axes=None, **_) -> tuple[Shape, np.dtype]:
    out = list(x.shape)
    for a, target in zip(axes if axes is not None else range(x.ndim), _ints(shape)):
        out[a % x.ndim] = target
    return out, x.dtype


def _max_unpool(x, indices, output_shape=None, **_) -> tuple[Shape, np.dtype]:
    return (_ints(output_shape) if output_shape is not None else []), x.dtype


def _col2im(x, image_shape, block_shape, *, pads=None, **_) -> tuple[Shape, np.dtype]:
    image, block = _ints(image_shape), _ints(block_shape)
    pads = pads or [0] * (2 * len(image))  # the kernel sums into the padded image, then crops it
    return [x.shape[0], x.shape[1] // math.prod(block),
            *(n + pads[i] + pads[i + len(image)] for i, n in enumerate(image))], x.dtype


def _mel_weight_matrix(num_mel_bins, dft_length, *_, output_datatype=1, **__) -> tuple[Shape, np.dtype, int]:
    shape = [int(scalar(dft_length)) // 2 + 1, int(scalar(num_mel_bins))]
    return shape, tensor_dtype_to_np_dtype(output_datatype), math.prod(shape) * 8  # float64 filters, then cast


def _stft(signal, frame_step, window=None, frame_length=None, *, onesided=1, **_) -> tuple[Shape, np.dtype, int]:
    length = int(scalar(frame_length)) if frame_length is not None else window.shape[0]
    frames = 1 + (signal.shape[1] - length) // int(scalar(frame_step))
    shape = [signal.shape[0], frames, length // 2 + 1 if onesided else length, 2]
    return shape, signal.dtype, signal.shape[0] * frames * length * 16  # the complex128 frames numpy cuts first


# (shape, dtype[, bytes of scratch the kernel makes besides])
SIZES: dict[str, Callable[..., tuple]] = {
    "ConstantOfShape": _constant_of_shape, "Expand": _expand, "Tile": _tile, "Range": _range, "Pad": _pad,
    "OneHot": _one_hot, "Resize": _resize, "Upsample": _resize, "HannWindow": _window, "HammingWindow": _window,
    "BlackmanWindow": _window, "CenterCropPad": _center_crop_pad, "MaxUnpool": _max_unpool, "Col2Im": _col2im,
    "MelWeightMatrix": _mel_weight_matrix, "STFT": _stft,
}


def check(size: Callable[..., tuple], label: str, op: str, args: Sequence[Any],
          attrs: dict[str, Any], limit: int) -> None:
    """``TensorTooLarge`` if the node would allocate more than ``limit`` bytes. Inputs the sizes
    cannot be read from pass: the kernel then refuses them with its own error."""
    try:
        shape, dtype, *scratch = size(*args, **attrs)
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize + sum(scratch)
    except Exception:  # noqa: BLE001 - malformed inputs are the kernel's to report
        return
    if nbytes > limit:
        raise TensorTooLarge(too_large(label, op, shape, dtype, nbytes, limit))
