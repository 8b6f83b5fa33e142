"""A Slice's gradient as a Pad of dy: the constant pads that undo a Slice of constant bounds, unit steps and a
static input (``static_slice_pads``), and, for bounds read at run time (``pos[:, :T]``), pads computed at run
time from the starts and the sizes of x and dy (``run_time_slice_grad``), in place of scattering dy over all
of x's positions."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, folded_array, is_static, static_shape

__all__ = ["constant_input", "run_time_slice_grad", "static_slice_pads"]

_INT64_MIN = -(2 ** 63)


def constant_input(node: ir.Node, i: int) -> tuple[bool, np.ndarray | None]:
    """(whether ``node`` is given its optional input ``i``, that input's value when a constant)."""
    value = node.inputs[i] if len(node.inputs) > i else None
    return value is not None, None if value is None else folded_array(value)


def static_slice_pads(node: ir.Node) -> list[int] | None:
    """Pads for Pad(dy) that undo a Slice whose bounds are constants and steps are 1, else None."""
    x = node.inputs[0]
    shape = static_shape(x)
    if not is_static(shape) or len(node.inputs) < 3:
        return None
    starts, ends = folded_array(node.inputs[1]), folded_array(node.inputs[2])
    has_axes, axes = constant_input(node, 3)
    has_steps, steps = constant_input(node, 4)
    if starts is None or ends is None or (has_axes and axes is None):
        return None
    if has_steps and (steps is None or np.any(steps != 1)):
        return None
    rank = len(shape)
    axes = range(len(starts)) if axes is None else [int(a) % rank for a in axes]
    dims = np.array([shape[a] for a in axes], np.int64)
    starts, ends = _clamped(starts, dims, 0), _clamped(ends, dims, 0)
    before, after = [0] * rank, [0] * rank
    for axis, s, e, dim in zip(axes, starts, ends, dims):
        before[axis], after[axis] = int(s), int(dim - s - max(0, e - s))
    return before + after


def _clamped(bounds: np.ndarray, dims: np.ndarray, short: np.ndarray | int) -> np.ndarray:
    """Constant Slice bounds as positions, as Slice reads them: a negative one from the end, then clamped to
    [0, dim - short] (``short`` 1 for a negative step's start, else 0)."""
    bounds = bounds.astype(np.int64)
    return np.maximum(np.minimum(np.where(bounds < 0, np.maximum(bounds, -dims) + dims, bounds), dims - short), 0)


def run_time_slice_grad(g: GradBuilder, node: ir.Node, dy: ir.Value) -> ir.Value | None:
    """dx of a Slice whose starts or ends are read at run time and whose axes and steps are constants: dy
    reversed along negative steps, its rows spread ``|step|`` apart (zeros between), then padded to x's size.
    The pad before each axis is the first position read, the start clamped as Slice clamps it (to [0, dim], or
    [0, dim - 1] for a negative step, from which the rows run back); the pad after is the rest of the axis
    (negative where the last spread row's zeros run past it). None where this does not apply."""
    x = node.inputs[0]
    shape = static_shape(x)
    if g.opset < 11 or shape is None or len(node.inputs) < 3 or \
            (folded_array(node.inputs[1]) is not None and folded_array(node.inputs[2]) is not None):
        return None
    has_axes, axes = constant_input(node, 3)
    has_steps, steps = constant_input(node, 4)
    count = static_shape(node.inputs[1])
    if (has_axes and axes is None) or (has_steps and steps is None) or not is_static(count) or len(count) != 1:
        return None
    rank = len(shape)
    axes = [int(a) % rank for a in axes] if has_axes else list(range(count[0]))
    steps = [int(s) for s in steps] if has_steps else [1] * len(axes)
    dy_shape = g.shape_of(dy)
    sizes = g.op("Gather", dy_shape, g.ints(axes))  # the rows dy has along each axis
    back = [a for a, s in zip(axes, steps) if s < 0]
    if back:
        dy = g.op("Slice", dy, g.ints([-1] * len(back)), g.ints([_INT64_MIN] * len(back)), g.ints(back),
                  g.ints([-1] * len(back)))
    dy = _spread(g, dy, dy_shape, rank, {a: abs(s) for a, s in zip(axes, steps) if abs(s) != 1})
    dims = g.ints([shape[a] for a in axes]) if all(isinstance(shape[a], int) for a in axes) else \
        g.op("Gather", g.op("Shape", x), g.ints(axes))
    before = _first_positions(g, node.inputs[1], dims, [1 if s < 0 else 0 for s in steps])
    if back:  # a negative step reads from its start back: the first position is the last row's
        last = g.add(before, g.mul(g.sub(sizes, g.ints([1])), g.ints([min(s, 0) for s in steps])))
        before = g.op("Min", last, dims)  # an empty slice's (its start + |step|) at most dim
    spans = g.mul(sizes, g.ints([abs(s) for s in steps])) if any(abs(s) != 1 for s in steps) else sizes
    after = g.sub(g.sub(dims, before), spans)
    where = {a: j for j, a in enumerate(axes)}  # pads: 0 for an axis not sliced, else its before / after
    index = [1 + where[a] if a in where else 0 for a in range(rank)]
    index += [1 + len(axes) + where[a] if a in where else 0 for a in range(rank)]
    pads = g.op("Gather", g.op("Concat", g.ints([0]), before, after, axis=0), g.ints(index))
    return g.op("Pad", dy, pads)


def _first_positions(g: GradBuilder, starts: ir.Value, dims: ir.Value, short: list[int]) -> ir.Value:
    """``_clamped`` on starts and dims read at run time (an int64 constant where both are constants)."""
    known, sizes = folded_array(starts), folded_array(dims)
    if known is not None and sizes is not None:
        return g.ints(_clamped(known.reshape(-1), sizes, np.array(short)))
    if starts.dtype != ir.DataType.INT64:
        starts = g.op("Cast", starts, to=ir.DataType.INT64)
    from_end = g.add(g.op("Max", starts, g.neg(dims)), dims)  # no int64 overflow for a start near its minimum
    starts = g.op("Where", g.op("Less", starts, g.ints([0])), from_end, starts)
    return g.op("Max", g.op("Min", starts, g.sub(dims, g.ints(short))), g.ints([0]))


def _spread(g: GradBuilder, dy: ir.Value, dy_shape: ir.Value, rank: int, steps: dict[int, int]) -> ir.Value:
    """``dy`` (of shape ``dy_shape``) with ``steps[a] - 1`` zeros after each row along each axis ``a`` of
    ``steps``: an axis unsqueezed after each, padded at its end, and merged back."""
    if not steps:
        return dy
    spread = sorted(steps)
    inserted = [a + i + 1 for i, a in enumerate(spread)]
    pads = [0] * (2 * (rank + len(spread)))
    for a, at in zip(spread, inserted):
        pads[rank + len(spread) + at] = steps[a] - 1
    padded = g.op("Pad", g.unsqueeze(dy, inserted), g.ints(pads))
    return g.op("Reshape", padded, g.mul(dy_shape, g.ints([steps.get(a, 1) for a in range(rank)])))
