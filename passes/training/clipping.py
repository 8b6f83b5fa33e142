"""Gradient clipping before the optimizer step, as ``torch.nn.utils.clip_grad_value_`` and
``clip_grad_norm_`` between ``loss.backward()`` and ``optimizer.step()``.

An optimizer spec's ``clip_grad_value`` clamps each gradient to ``[-v, v]`` (``Clip``, NaN kept);
its ``max_grad_norm`` scales every gradient by ``min(max_norm / (total_norm + 1e-6), 1)``, the
total norm (``grad_norm_type`` 2, 1 or ``"inf"``) taken over all trainable gradients at once. Both
set: the values are clamped first and the norm is that of the clamped gradients. The norm is read
off the gradients as the update holds them (a few flat buffers, ``flat``): one reduction per
buffer, so its cost follows the gradients' bytes, not the number of params. A NaN or infinite
total norm propagates as torch's (``error_if_nonfinite=False``): NaN turns every gradient NaN, an
infinite norm scales by 0 (an infinite gradient entry becomes NaN).

Cost (``max_grad_norm=1.0`` against none, AdamW, bench_zoo's models exported and imported, 64 px,
Trainer steps on ort-cpu interleaved, median of 20-40 rounds on a shared 2-core VM): ResNet-18
at batch 2 1.05x / 1.08x (two runs), at batch 32 1.02x; GPT at batch 2 1.03x, at batch 32 1.00x.
Each buffer is read once more for its reduction and once more for the scaling, and no group's
step can start before every gradient is known (torch's clip_grad_norm_ has the same barrier).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.emit import HALF_DTYPES, Emitter

__all__ = ["EPS", "clip", "joined_norm", "norm_dtype", "partial_norm", "total_norm"]

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: max_norm / (total_norm + 1e-6)
_WIDTH = {ir.DataType.FLOAT: 0, ir.DataType.DOUBLE: 1}


def clip(b: Emitter, hyper: dict, grads: Sequence[ir.Value], dtypes: Sequence[ir.DataType],
         norm: ir.Value | None = None) -> tuple[list[ir.Value], ir.Value | None]:
    """``grads`` (of ``dtypes``: a per-param gradient may be untyped) clipped as the spec ``hyper``
    (JSON) asks (as they are if it asks for none), and the total norm before the norm clipping
    (None without ``max_grad_norm``): ``norm`` where given (a sharded update's, ``joined_norm``),
    else ``grads``'."""
    grads = list(grads)
    value = hyper.get("clip_grad_value")
    if value is not None:
        grads = [b.op("Clip", g, b.const(-value, dt), b.const(value, dt), dtype=dt) for g, dt in zip(grads, dtypes)]
    max_norm = hyper.get("max_grad_norm")
    if max_norm is None:
        return grads, None
    if norm is None:
        norm = total_norm(b, grads, dtypes, hyper.get("grad_norm_type", 2.0))
    coef = b.op("Div", b.const(max_norm, norm.dtype), b.op("Add", norm, b.const(EPS, norm.dtype)))
    one = b.const(1.0, norm.dtype)
    # min(coef, 1) that keeps a NaN (onnxruntime's Min would too, but Where says so): torch.clamp(max=1)
    coef = b.op("Where", b.op("Greater", coef, one), one, coef)
    coefs = {dt: coef if dt == norm.dtype else b.op("Cast", coef, to=dt, dtype=dt) for dt in set(dtypes)}
    return [b.op("Mul", g, coefs[dt], dtype=dt) for g, dt in zip(grads, dtypes)], norm


def norm_dtype(dtypes: Iterable[ir.DataType]) -> ir.DataType:
    """The dtype a norm of gradients of ``dtypes`` is taken in: their widest (float16 and bfloat16
    counted as float32: summed in float32, where a float16 sum of squares passes 65504 at a norm of 256)."""
    return max((ir.DataType.FLOAT if dt in HALF_DTYPES else dt for dt in dtypes), key=lambda dt: _WIDTH.get(dt, 0))


def total_norm(b: Emitter, grads: Sequence[ir.Value], dtypes: Sequence[ir.DataType], norm_type) -> ir.Value:
    """The ``norm_type`` norm of ``grads`` seen as one vector, a scalar of ``norm_dtype(dtypes)``."""
    part = partial_norm(b, grads, dtypes, norm_type, norm_dtype(dtypes))
    return b.op("Sqrt", part) if _rooted(norm_type) else part


def partial_norm(b: Emitter, grads: Sequence[ir.Value], dtypes: Sequence[ir.DataType], norm_type,
                 wide: ir.DataType) -> ir.Value:
    """``grads``' share of a total norm, a scalar of ``wide``: their max of absolute values
    (``"inf"``), sum of them (1) or sum of squares (2); shares add up (``joined_norm``)."""
    parts = []
    for g, dt in zip(grads, dtypes):
        if dt != wide:
            g = b.op("Cast", g, to=wide, dtype=wide)
        if norm_type == "inf":  # ReduceMax skips a NaN past the first element on onnxruntime: ReduceL1 sees it
            top, l1 = b.op("ReduceMax", b.op("Abs", g), keepdims=0), b.op("ReduceL1", g, keepdims=0)
            parts.append(b.op("Where", b.op("IsNaN", l1), l1, top))
        else:
            parts.append(b.op("ReduceL1" if norm_type == 1.0 else "ReduceSumSquare", g, keepdims=0))
    if len(parts) == 1:
        return parts[0]
    return b.op("Max" if norm_type == "inf" else "Sum", *parts)


def joined_norm(parts: Sequence[np.ndarray], norm_type) -> np.ndarray:
    """The total norm from every shard's ``partial_norm`` (in shard order, in their dtype); a NaN
    share makes it NaN."""
    parts = np.stack([np.asarray(p) for p in parts])
    if norm_type == "inf":
        return np.max(parts)  # NaN wins, as the graph's Where(IsNaN(...))
    total = np.sum(parts, dtype=parts.dtype)
    return np.sqrt(total) if _rooted(norm_type) else total


def _rooted(norm_type) -> bool:
    return norm_type not in ("inf", 1.0)
