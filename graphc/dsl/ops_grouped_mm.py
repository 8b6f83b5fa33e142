"""``F.grouped_mm``, the mixture-of-experts grouped GEMM, from run-time ``offs``: each group's
rows (or columns, or shared dim) picked by a mask compared against ``offs``, so no shape depends on it."""

from __future__ import annotations

from typing import Any


from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_array import dim_positions
from graphc.dsl.ops_math import logical_and
from graphc.dsl.tensor import Tensor
from graphc.model.dtypes import FLOAT_DTYPES

FN = "grouped_mm"


def _membership(x: Tensor, axis: int, offs: Tensor) -> Tensor:
    """``[G, n]`` bool: position ``i`` of ``x``'s ``axis`` is in group ``g`` (``offs[g-1] <= i < offs[g]``);
    positions from ``offs[-1]`` on are in none."""
    pos = dim_positions(x, axis)
    ends = ops.unsqueeze(ops.cast(offs, "int64"), [1])  # [G, 1]
    starts = ops.concat([ops.const_i64([[0]]), ends[:-1]], 0)
    pos = ops.unsqueeze(pos, [0])
    return logical_and(pos >= starts, pos < ends)


def _rows(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """2D ``[M, K]`` x 3D ``[G, K, N]``: row ``i`` of ``a`` times ``b[g]`` of its group, as one GEMM
    ``[M, G*K] @ [G*K, N]`` with ``a``'s row placed in its group's block (zeros elsewhere).
    ort-cpu (2 shared cores), M=1024 K=256 N=512 G=8 float32, median of 7: this 46-50 ms; all G
    products ``[G, M, N]`` then a masked sum over G 77-87 ms; ``Gather(b, group)`` then a batched
    ``[M, 1, K] @ [M, K, N]`` 153-235 ms (and an ``[M, K, N]`` copy). At M=256 K=N=64 G=4: 0.1 / 0.1 / 0.2 ms."""
    g, k, n = b.shape
    member = ops.unsqueeze(ops.transpose(_membership(a, 0, offs), [1, 0]), [2])  # [M, G, 1]
    blocks = ops.where(member, ops.unsqueeze(a, [1]), ops.scalar(0, a))  # [M, G, K]
    return ops.matmul(ops.reshape(blocks, [-1, g * k]), ops.reshape(b, [g * k, n]))


def grouped_mm(mat_a: Any, mat_b: Any, *, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Tensor:
    """``torch.nn.functional.grouped_mm``: 3D x 3D ``[G, M, K] @ [G, K, N]``, ``offs`` None; with
    ``offs`` (``[G]`` increasing ends of the groups): 2D x 3D ``[M, K]`` x ``[G, K, N]`` -> ``[M, N]``
    (rows grouped), 3D x 2D ``[G, M, K]`` x ``[K, N]`` -> ``[M, N]`` (columns grouped), 2D x 2D
    ``[M, K]`` x ``[K, N]`` -> ``[G, M, N]`` (the shared dim grouped). Rows / columns from
    ``offs[-1]`` on, and empty groups, are zeros (torch leaves them unwritten). Any float dtype."""
    a = ops.lift(mat_a)
    b = ops.lift(mat_b, a)
    for name, t in (("mat_a", a), ("mat_b", b)):
        if t.shape is None or t.ndim not in (2, 3):
            raise op_error(FN, [t], f"{name} must be a 2D or 3D Tensor, got shape {t.shape}", user_source())
        if t.dtype not in FLOAT_DTYPES:
            raise op_error(FN, [t], f"{name} must be floating-point, got {t.dtype}", user_source())
    ops.same_dtype(FN, a, b)
    if bias is not None:
        raise op_error(FN, [a, b], "bias is not supported (torch 2.13: 'Bias not supported yet')", user_source())
    ops.same_dim(FN, [a, b], a.shape[-1], b.shape[-2], "mat_a's last dim and mat_b's contracted dim")
    both_3d = a.ndim == 3 and b.ndim == 3
    if both_3d != (offs is None):
        raise op_error(FN, [a, b], "offs must be None when mat_a and mat_b are 3D, and given when either is 2D",
                       user_source())
    if both_3d:
        ops.same_dim(FN, [a, b], a.shape[0], b.shape[0], "the number of groups of mat_a and mat_b")
        out = ops.matmul(a, b)
    else:
        o = ops.lift(offs)
        if o.ndim != 1 or o.dtype in FLOAT_DTYPES or o.dtype == "bool":
            raise op_error(FN, [o], f"offs must be a 1D integer Tensor, got {o.dtype}{list(o.shape or [])}",
                           user_source())
        three = b if b.ndim == 3 else a if a.ndim == 3 else None
        if three is not None:
            ops.same_dim(FN, [three, o], three.shape[0], o.shape[0], "the number of groups and offs' length")
        if a.ndim == 2 and b.ndim == 3:
            out = _rows(a, b, o)
        elif a.ndim == 3:  # columns of b grouped: (b^T per group a^T)^T
            out = ops.transpose(_rows(ops.transpose(b, [1, 0]), ops.transpose(a, [0, 2, 1]), o), [1, 0])
        else:  # the shared dim grouped: [G, M, K] masked copies of a, times b
            member = ops.unsqueeze(_membership(b, 0, o), [1])  # [G, 1, K]
            out = ops.matmul(ops.where(member, ops.unsqueeze(a, [0]), ops.scalar(0, a)), b)
    return out if out_dtype is None else ops.cast(out, out_dtype)
