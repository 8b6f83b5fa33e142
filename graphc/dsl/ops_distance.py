"""Bilinear maps, similarities and distances with ``torch.nn.functional``'s names and
signatures: ``bilinear``, ``cosine_similarity``, ``pairwise_distance`` and ``pdist`` (from ``ops_search``,
beside ``cdist``), each standard ONNX ops (Einsum, Gather, reductions), so the kernels and gradient rules apply."""

from __future__ import annotations

from graphc.dsl.autocast import autocast_op, cast, is_autocast_enabled
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops import detach, emit, lift, maximum, same_dim, scalar
from graphc.dsl.ops import sum as reduce_sum
from graphc.dsl.ops_einsum import einsum
from graphc.dsl.ops_math import norm
from graphc.dsl.ops_search import pdist
from graphc.dsl.tensor import Tensor
from graphc.dsl.upcast import in_float32


@autocast_op()
def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``y[..., o] = sum_ij input1[..., i] weight[o, i, j] input2[..., j] + bias[o]``; ``weight`` is
    ``[out, in1, in2]``, the inputs ``(*, in1)`` and ``(*, in2)``. Signature: ai.onnx@12::Einsum"""
    x1, x2 = lift(input1), lift(input2)
    w = lift(weight, x1)
    if w.shape is not None and len(w.shape) != 3:
        raise op_error("Bilinear", [x1, x2, w], f"weight must be [out, in1, in2], got rank {len(w.shape)}",
                       user_source())
    if x1.shape is not None and x2.shape is not None:
        if len(x1.shape) != len(x2.shape) or not x1.shape:
            raise op_error("Bilinear", [x1, x2, w], "input1 and input2 must have the same rank (at least 1), got "
                           f"{len(x1.shape)} and {len(x2.shape)}", user_source())
        for a, b in zip(x1.shape[:-1], x2.shape[:-1]):
            same_dim("Bilinear", [x1, x2], a, b, "input1 and input2 batch dims")
    if w.shape is not None:
        for x, i, name in ((x1, 1, "input1"), (x2, 2, "input2")):
            if x.shape:
                same_dim("Bilinear", [x, w], x.shape[-1], w.shape[i], f"{name} features and weight dim {i}")
    if is_autocast_enabled():  # torch's CPU kernel: two bmm (lowered) per output feature, summed in x1's dtype
        y = cast(einsum("...oj,...j->...o", einsum("...i,oij->...oj", x1, w), x2), x1.dtype)
    else:
        y = emit("Einsum", [x1, w, x2], {"equation": "...i,oij,...j->...o"})
    return y if bias is None else y + lift(bias, y)


@autocast_op()
@in_float32
def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """``sum(x1 / max(||x1||, eps) * x2 / max(||x2||, eps), dim)`` as torch: each norm clamped at
    ``eps`` in value only, its gradient the norm's (torch clamps the norms in place without grad)."""
    x1 = lift(x1)
    x2 = lift(x2, x1)

    def unit(x: Tensor) -> Tensor:
        n = norm(x, 2, dim, keepdim=True)
        return x / (n + detach(maximum(n, scalar(eps, n)) - n))

    return reduce_sum(unit(x1) * unit(x2), dim)


@in_float32
def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """``||x1 - x2 + eps||_p`` over the last dim (``torch.nn.functional.pairwise_distance``); ``p``
    as ``gc.norm`` takes it (its gradient at a zero difference is 0, as torch's)."""
    x1 = lift(x1)
    diff = x1 - lift(x2, x1)
    return norm(diff + scalar(eps, diff), p, -1, keepdim)


__all__ = ["bilinear", "cosine_similarity", "pairwise_distance", "pdist"]
