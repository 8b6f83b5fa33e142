"""A Slice's gradient as a Pad of dy, in place of scattering dy over all of x's positions: the constant pads
that undo a Slice of constant bounds, unit steps and a static input (``static_slice_pads``), and pads computed
from the starts and the sizes of x and dy, folded where those are known before run time and read at run time
where not (``padded_slice_grad``): bounds read at run time (``pos[:, :T]``), or constant ones on an input of
symbolic dims (``logits[:, :-1]`` of [B, T, V]), any constant steps but a ``|step| > 1`` on the last axis."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from graphc.passes.autodiff.builder import GradBuilder, folded_array, is_static, static_shape

__all__ = ["constant_input", "padded_slice_grad", "static_slice_pads"]

_INT64_MIN = -(2 ** 63)
_FOLDED = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Min": np.minimum, "Max": np.maximum,
           "Less": np.less, "Where": np.where, "Gather": np.take}


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
    starts, ends = _clamped(None, starts, dims, 0), _clamped(None, ends, dims, 0)
    before, after = [0] * rank, [0] * rank
    for axis, s, e, dim in zip(axes, starts, ends, dims):
        before[axis], after[axis] = int(s), int(dim - s - max(0, e - s))
    return before + after


def _ints(g: GradBuilder | None, op: str, *args: np.ndarray | ir.Value) -> np.ndarray | ir.Value:
    """int64 arithmetic ``op`` folded in numpy where every argument is known (or ``g`` is None), else a node
    of ``g``."""
    if g is None or all(isinstance(a, np.ndarray) for a in args):
        return _FOLDED[op](*args)
    return g.op(op, *(g.const(a) if isinstance(a, np.ndarray) else a for a in args))


def _clamped(g: GradBuilder | None, bounds, dims, short):
    """Slice bounds as positions, as Slice reads them: a negative one from the end, then clamped to
    [0, dim - short] (``short`` 1 for a negative step's start, else 0); numpy where all are known, the
    count-back and its Where left out where the bounds are known to be all of one sign."""
    zero = np.zeros(1, np.int64)
    negative = _ints(g, "Less", bounds, zero)
    if not isinstance(negative, np.ndarray) or negative.any():
        from_end = _ints(g, "Add", _ints(g, "Max", bounds, _ints(g, "Sub", zero, dims)), dims)  # no overflow
        bounds = from_end if isinstance(negative, np.ndarray) and negative.all() else \
            _ints(g, "Where", negative, from_end, bounds)
    top = _ints(g, "Sub", dims, np.asarray(short, np.int64)) if np.any(short) else dims
    return _ints(g, "Max", _ints(g, "Min", bounds, top), zero)


def _sizes(g: GradBuilder, value: ir.Value, axes: Sequence[int]) -> np.ndarray | ir.Value:
    """``value``'s sizes along ``axes``: numpy where all are static, else read off its Shape."""
    shape = static_shape(value)
    if all(isinstance(shape[a], int) for a in axes):
        return np.array([shape[a] for a in axes], np.int64)
    return g.op("Gather", g.op("Shape", value), g.ints(axes))


def padded_slice_grad(g: GradBuilder, node: ir.Node, dy: ir.Value) -> ir.Value | None:
    """dx of a Slice whose axes and steps are constants: dy reversed along negative steps, its rows spread
    ``|step|`` apart (zeros between), then padded to x's size. The pad before each axis is the first position
    read, the start clamped as Slice clamps it (to [0, dim], or [0, dim - 1] for a negative step, from which
    the rows run back); the pad after is the rest of the axis (negative where the last spread row's zeros run
    past it). A ``|step| > 1`` on the last axis, of constant bounds or bounds read at run time, is left to the
    scatter (None), as is anything else this does not take: on ort-cpu spreading the innermost axis is slower
    than scattering (1 thread, a step forward and back, ms spread / scatter; constant bounds: [16, 256, 512]
    ``y[..., 1::3]`` 7.6-8.0 / 5.7-6.2; run-time bounds, CPU ms, median of 20: ``y[..., 1:T:3]`` 6.64 / 5.03,
    ``y[..., 1:T:4]`` 5.51 / 4.12, ``y[..., :T:2]`` 9.94 / 6.62, ``y[..., T-1::-2]`` 13.1 / 9.5; [64, 1024, 8]
    ``y[..., :T:3]`` 2.74 / 1.40), while on another axis it is faster (``y[:, ::2]`` 3.3-3.7 / 6.3-6.9). The
    numpy backend differs by shape (constant bounds [64, 1024, 8] 18.3 / 3.4; run-time bounds [64, 1024, 8]
    1.60 / 1.52, [16, 256, 512] ``:T:2`` 3.01 / 5.96); the graph serves both, and the choice follows ort-cpu."""
    x = node.inputs[0]
    shape = static_shape(x)
    if g.opset < 11 or shape is None or len(node.inputs) < 3:
        return None
    has_axes, axes = constant_input(node, 3)
    has_steps, steps = constant_input(node, 4)
    count = static_shape(node.inputs[1])
    if (has_axes and axes is None) or (has_steps and steps is None) or not is_static(count) or len(count) != 1:
        return None
    rank = len(shape)
    axes = [int(a) % rank for a in axes] if has_axes else list(range(count[0]))
    steps = [int(s) for s in steps] if has_steps else [1] * len(axes)
    if any(abs(s) > 1 and a == rank - 1 for a, s in zip(axes, steps)):
        return None
    starts = folded_array(node.inputs[1])
    if starts is None:
        starts = node.inputs[1] if node.inputs[1].dtype == ir.DataType.INT64 else \
            g.op("Cast", node.inputs[1], to=ir.DataType.INT64)
    else:
        starts = starts.reshape(-1).astype(np.int64)
    sizes = _sizes(g, dy, axes)  # the rows dy has along each axis
    back = [a for a, s in zip(axes, steps) if s < 0]
    if back:
        dy = g.op("Slice", dy, g.ints([-1] * len(back)), g.ints([_INT64_MIN] * len(back)), g.ints(back),
                  g.ints([-1] * len(back)))
    dy = _spread(g, dy, rank, {a: abs(s) for a, s in zip(axes, steps) if abs(s) != 1})
    dims = _sizes(g, x, axes)
    before = _clamped(g, starts, dims, [1 if s < 0 else 0 for s in steps])
    if back:  # a negative step reads from its start back: the first position is the last row's
        last = _ints(g, "Add", before, _ints(g, "Mul", _ints(g, "Sub", sizes, np.ones(1, np.int64)),
                                             np.array([min(s, 0) for s in steps], np.int64)))
        before = _ints(g, "Min", last, dims)  # an empty slice's (its start + |step|) at most dim
    spans = _ints(g, "Mul", sizes, np.array([abs(s) for s in steps], np.int64)) if \
        any(abs(s) != 1 for s in steps) else sizes
    after = _ints(g, "Sub", _ints(g, "Sub", dims, before), spans)
    where = {a: j for j, a in enumerate(axes)}  # pads: 0 for an axis not sliced, else its before / after
    index = [1 + where[a] if a in where else 0 for a in range(rank)]
    index += [1 + len(axes) + where[a] if a in where else 0 for a in range(rank)]
    parts = [np.zeros(1, np.int64), before, after]
    joined = np.concatenate(parts) if all(isinstance(p, np.ndarray) for p in parts) else \
        g.op("Concat", *(g.const(p) if isinstance(p, np.ndarray) else p for p in parts), axis=0)
    pads = _ints(g, "Gather", joined, np.array(index, np.int64))
    return g.op("Pad", dy, g.const(pads) if isinstance(pads, np.ndarray) else pads)


def _spread(g: GradBuilder, dy: ir.Value, rank: int, steps: dict[int, int]) -> ir.Value:
    """``dy`` with ``steps[a] - 1`` zeros after each row along each axis ``a`` of ``steps``: an axis unsqueezed
    after each, padded at its end, and merged back."""
    if not steps:
        return dy
    spread = sorted(steps)
    inserted = [a + i + 1 for i, a in enumerate(spread)]
    pads = [0] * (2 * (rank + len(spread)))
    for a, at in zip(spread, inserted):
        pads[rank + len(spread) + at] = steps[a] - 1
    padded = g.op("Pad", g.unsqueeze(dy, inserted), g.ints(pads))
    return g.op("Reshape", padded, g.mul(g.shape_of(dy), g.ints([steps.get(a, 1) for a in range(rank)])))
