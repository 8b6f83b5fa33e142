"""VJP rules of data-movement ops: Reshape-likes, Transpose, Expand, Slice, TopK, Trilu, CumSum, Pad, Tile
and Resize (Concat and Split are ``rules_concat``'s, the gathers and scatters ``rules_indexing``'s)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import (GradBuilder, attr, folded_array, is_static, node_attrs,
                                            static_shape)
from graphc.passes.autodiff.registry import grad_rule
from graphc.passes.autodiff.resize_runtime import block_sum, runtime_matrix
from graphc.passes.autodiff.separable import axis_matrix, contract
from graphc.passes.autodiff.slice_pads import constant_input, padded_slice_grad, static_slice_pads

# An edge/reflect/wrap Pad's gradient contracts dy with an [out, in] matrix per padded axis up to this
# many entries; past it (a long axis: the matrix and the MatMul's work grow with its square), dy is summed
# back by ScatterElements. Measured on ort-cpu, reflect pad then the gradient of sum(y**2), ms matrix /
# scatter: [8, 64, 128, 128] pads 2: 75.5 / 185.6; [16, 64, 128] pads 8: 1.55 / 2.58; [8, 64, 256] pads 16:
# 2.30 / 1.78; [16, 64, 384] pads 8: 7.78 / 7.43; [4, 16, 1024] pads 64: 1.30 / 0.67; [4, 4096] pads 200:
# 5.19 / 0.08; a [2, 160000] signal's matrix would take 191 GiB.
MAX_PAD_MATRIX = 1 << 17


@grad_rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def grad_reshape(g, node, dy):
    x = node.inputs[0]
    return (g.reshape_like(dy, x),) + (None,) * (len(node.inputs) - 1)


@grad_rule("Transpose")
def grad_transpose(g, node, dy):
    perm = attr(node, "perm")
    if perm is None:
        perm = list(reversed(range(g.rank(node.inputs[0]))))
    return (g.transpose(dy, list(np.argsort(perm))),)


@grad_rule("Expand", broadcast=(0,))
def grad_expand(g, node, dy):
    return dy, None


def _scattered_back(g: GradBuilder, x: ir.Value, dy: ir.Value, read, add: bool) -> ir.Value:
    """dx of an op whose output element k is x's element at ``read(positions)[k]``, ``read``
    applied to x's flat positions (shaped as x): dy scattered into zeros of x's size, summed where
    several read one element (``add``; opset >= 16), else each written once."""
    shape = g.shape_of(x)
    positions = g.reshape_to(g.op("Range", g.const(0, np.int64), g.op("Size", x), g.const(1, np.int64)), shape,
                             static_shape(x))
    zeros, index = g.flat_zeros_like(x, dy), g.op("Reshape", read(positions), g.ints([-1]))
    flat_dy = g.op("Reshape", dy, g.ints([-1]))
    flat = (g.scatter_elements(zeros, index, flat_dy, 0) if add
            else g.op("ScatterElements", zeros, index, flat_dy, axis=0))
    return g.reshape_to(flat, shape, static_shape(x))


@grad_rule("Slice")
def grad_slice(g, node, dy):
    # Scatter dy into zeros at the sliced positions: a Pad when x's shape and the bounds are
    # static with unit steps; else, where axes and steps are constants and no |step| > 1 is on
    # the last axis, padded_slice_grad's Pad with pads computed at run time (bounds read at run
    # time, or constant bounds on an x of symbolic size or with non-unit steps, dy's rows spread
    # |step| apart); else slice a tensor of flat indices the same way and ScatterElements into it.
    x = node.inputs[0]
    rest = (None,) * (len(node.inputs) - 1)
    pads = static_slice_pads(node)
    if pads is not None:
        return (g.op("Pad", dy, g.ints(pads)),) + rest
    dx = padded_slice_grad(g, node, dy)
    if dx is not None:
        return (dx,) + rest
    dx = _scattered_back(g, x, dy, lambda positions: g.op("Slice", positions, *node.inputs[1:]), add=False)
    return (dx,) + rest


@grad_rule("Col2Im")
def grad_col2im(g, node, dy):
    # Col2Im sums each column entry into an image pixel (or drops it into the padding); its
    # adjoint reads every entry back from dy: one Gather over the flattened image, with the
    # static pixel index of each (kernel offset, block) and a zero slot for padded positions.
    x, image, block = node.inputs
    sizes, kernel, sx = folded_array(image), folded_array(block), static_shape(x)
    if sizes is None or kernel is None or sx is None or not isinstance(sx[1], int):
        raise GraphError(f"gradient of Col2Im {node.name!r} needs constant image and block shapes and static columns")
    sizes, kernel = [int(v) for v in sizes], [int(v) for v in kernel]
    n = len(sizes)
    dilations = list(attr(node, "dilations", [1] * n))
    strides = list(attr(node, "strides", [1] * n))
    pads = list(attr(node, "pads", [0] * 2 * n))
    blocks = [(sizes[i] + pads[i] + pads[i + n] - dilations[i] * (kernel[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    pixels = int(np.prod(sizes))
    index = np.full((int(np.prod(kernel)), int(np.prod(blocks))), pixels, np.int64)  # the zero slot
    for k, offset in enumerate(np.ndindex(*kernel)):
        for b, where in enumerate(np.ndindex(*blocks)):
            at = [where[i] * strides[i] - pads[i] + offset[i] * dilations[i] for i in range(n)]
            if all(0 <= at[i] < sizes[i] for i in range(n)):
                index[k, b] = np.ravel_multi_index(at, sizes)
    channels = sx[1] // index.shape[0]
    flat = g.op("Reshape", dy, g.ints([0, channels, pixels]))
    padded = g.op("Pad", flat, g.ints([0, 0, 0, 0, 0, 1]))  # [N, C, pixels + 1]: the last is 0
    picked = g.op("Gather", padded, g.const(index.reshape(-1)), axis=2)  # [N, C, K * L]
    return g.op("Reshape", picked, g.ints([0, sx[1], index.shape[1]])), None, None


@grad_rule("CumSum")
def grad_cumsum(g, node, dy):
    # the adjoint of a running sum is the running sum in the other direction
    reverse = 0 if attr(node, "reverse", 0) else 1
    return g.op("CumSum", dy, node.inputs[1], exclusive=attr(node, "exclusive", 0), reverse=reverse), None


@grad_rule("CumProd")
def grad_cumprod(g, node, dy):
    # Exact with zeros (no division by x): with the axis last, reversed for reverse=1, and dy
    # moved one step back for exclusive=1 (an exclusive product is the inclusive one shifted),
    #   dx_j = (prod_{k<j} x_k) * sum_{i>=j} dy_i * Q[j, i],   Q[j, i] = prod_{j<k<=i} x_k,
    # Q being the running product along i of the [L, L] matrix "x_k where k > j, else 1"
    x = node.inputs[0]
    axis, shape = folded_array(node.inputs[1]), static_shape(x)
    axis = None if axis is None or shape is None else int(axis.reshape(-1)[0]) % len(shape)
    if axis is None or not isinstance(shape[axis], int):
        raise GraphError(f"gradient of CumProd {node.name!r} needs a constant axis and a static length along it")
    rank, length = len(shape), shape[axis]
    perm = [d for d in range(rank) if d != axis] + [axis]
    last = (lambda v: v) if axis == rank - 1 else (lambda v: g.transpose(v, perm))
    flip = ((lambda v: g.op("Slice", v, g.ints([-1]), g.ints([-(2 ** 63)]), g.ints([-1]), g.ints([-1])))
            if attr(node, "reverse", 0) else (lambda v: v))
    xs, dys = flip(last(x)), flip(last(dy))
    if attr(node, "exclusive", 0):
        dys = g.op("Pad", g.op("Slice", dys, g.ints([1]), g.ints([length]), g.ints([-1])),
                   g.ints([0] * (rank - 1) + [0] + [0] * (rank - 1) + [1]))
    j, k = np.indices((length, length))
    dtype = (dy.dtype or ir.DataType.FLOAT).numpy()
    masked = g.op("Where", g.const(k > j), g.op("Unsqueeze", xs, g.ints([-2])), g.const(np.ones((), dtype)))
    running = g.mul(g.op("CumProd", masked, g.ints([-1])), g.const((k >= j).astype(dtype)))
    summed = g.reduce("ReduceSum", g.mul(running, g.op("Unsqueeze", dys, g.ints([-2]))), [-1], keepdims=False)
    dx = flip(g.mul(g.op("CumProd", xs, g.ints([-1]), exclusive=1), summed))
    return (dx if axis == rank - 1 else g.transpose(dx, np.argsort(perm).tolist())), None


@grad_rule("Pad")
def grad_pad(g, node, dy):
    # Constant mode slices the padding back off (a crop too: dy is padded by the opposite
    # amounts, the pads negated at run time when only then known); edge/reflect/wrap are linear
    # and separable in x, so dx is dy contracted with each padded axis' [out, in] 0/1 matrix (the
    # border repeated, mirrored or circular copies summed back), or, where the pads or a padded
    # size are known only at run time, dy summed back into the positions the same Pad of x's flat
    # positions reads. The constant value gets the gradient of every element it fills.
    x = node.inputs[0]
    if g.opset < 11:  # Pad-2: pads is an attribute
        pads = np.asarray(attr(node, "pads"), np.int64) if attr(node, "pads") is not None else None
    else:
        pads = folded_array(node.inputs[1]) if len(node.inputs) > 1 else None
    has_axes, axes = constant_input(node, 3)
    mode = attr(node, "mode", "constant")
    rank = g.rank(x)
    if pads is None or (has_axes and axes is None):
        dx = (g.op("Pad", dy, g.neg(node.inputs[1]), None, *node.inputs[3:]) if mode == "constant"
              else _pad_scattered(g, node, dy))
    else:
        axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        n = len(axes)
        dx = _known_pads_grad(g, node, dy, mode, axes, [int(p) for p in pads[:n]], [int(p) for p in pads[n:]])
    grads = [dx, None, None, None][:len(node.inputs)]
    if mode == "constant" and len(node.inputs) > 2 and g.wants(node.inputs[2]):
        # every padded element is the constant value: it gets the gradient of all of them
        total = g.reduce("ReduceSum", dy, None, keepdims=False)
        grads[2] = g.sub(total, g.reduce("ReduceSum", dx, None, keepdims=False))
    return tuple(grads)


def _known_pads_grad(g: GradBuilder, node: ir.Node, dy: ir.Value, mode: str, axes: list[int], begin: list[int],
                     end: list[int]) -> ir.Value:
    """dx of a Pad whose pads and axes are constants."""
    x = node.inputs[0]
    if mode == "constant" and min(begin + end) >= 0:
        ends = g.add(g.op("Gather", g.shape_of(x), g.ints(axes)), g.ints(begin))
        return g.op("Slice", dy, g.ints(begin), ends, g.ints(axes))
    if mode == "constant":  # a crop too: the adjoint pads dy by the opposite amounts (any shape)
        g.require_opset(11, "Pad with negative pads")
        has_axes, _ = constant_input(node, 3)
        return g.op("Pad", dy, g.ints([-p for p in begin + end]), *([None, g.ints(axes)] if has_axes else []))
    shape = static_shape(x)
    if any(not isinstance(shape[a], int) for a, b, e in zip(axes, begin, end) if b or e):
        return _pad_scattered(g, node, dy)
    entries = [(shape[a] + b + e) * shape[a] for a, b, e in zip(axes, begin, end) if b or e]
    if g.opset >= 16 and max(entries, default=0) > MAX_PAD_MATRIX:
        return _pad_scattered(g, node, dy)
    return contract(g, dy, _pad_matrices(shape, mode, axes, begin, end), len(shape))


def _pad_scattered(g: GradBuilder, node: ir.Node, dy: ir.Value) -> ir.Value:
    """dx of an edge/reflect/wrap Pad: the Pad of x's flat positions says which element of x each
    output element reads, and dy sums back into those (ScatterElements, add)."""
    g.require_opset(16, "ScatterElements with reduction='add' (a Pad's gradient with pads or sizes known at "
                        "run time only)")
    return _scattered_back(g, node.inputs[0], dy, lambda positions: g.op(
        "Pad", positions, node.inputs[1], None, *node.inputs[3:], mode=attr(node, "mode")), add=True)


def _pad_matrices(shape, mode: str, axes, begin, end) -> dict[int, np.ndarray]:
    """{axis: [out, in] 0/1 matrix} of the Pad along each axis it changes (their sizes static)."""
    return {axis: _pad_matrix(mode, shape[axis], before, after)
            for axis, before, after in zip(axes, begin, end) if before or after}


def _pad_matrix(mode: str, size: int, before: int, after: int) -> np.ndarray:
    """Which input element each output element of a 1-D Pad reads (none: a constant). Negative
    pads crop first and the modes pad what is left (a wrap repeats the cropped part), as
    onnxruntime and onnx's reference run it. Built here rather than by running Pad on a basis:
    onnx's reference Pad refuses negative pads."""
    first, kept = max(-before, 0), size - max(-before, 0) - max(-after, 0)
    matrix = np.zeros((size + before + after, size))
    for out in range(matrix.shape[0]):
        i = out - max(before, 0)  # in the cropped part
        if mode == "edge":
            i = min(max(i, 0), kept - 1)
        elif mode == "wrap":
            i %= kept
        elif mode == "reflect":
            while not 0 <= i < kept:  # mirror about the end elements, which are not repeated
                i = 0 if kept == 1 else -i if i < 0 else 2 * (kept - 1) - i
        if 0 <= i < kept:
            matrix[out, first + i] = 1.0
    return matrix


@grad_rule("DepthToSpace", "SpaceToDepth")
def grad_depth_space(g, node, dy):
    # Both are a Reshape-Transpose-Reshape permutation of x (ONNX's definition; its function
    # body exists only from opset 28): dy goes back through the inverse permutation.
    x = node.inputs[0]
    shape, b = static_shape(x), attr(node, "blocksize")
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]):
        raise GraphError(f"gradient of {node.op_type} {node.name!r} needs a 4-D input with static channels and "
                         f"spatial dims (got {shape})")
    _, c, h, w = shape
    mode = attr(node, "mode", "DCR")
    if node.op_type == "SpaceToDepth":  # x as [N, C, H/b, b, W/b, b], then DCR or CRD order
        moved, perm = (([-1, b, b, c, h // b, w // b], [0, 3, 5, 1, 2, 4]) if mode == "DCR" else
                       ([-1, c, b, b, h // b, w // b], [0, 1, 3, 5, 2, 4]))
    elif mode == "DCR":  # x as [N, b, b, C/b^2, H, W], perm (0, 3, 4, 1, 5, 2)
        moved, perm = [-1, c // (b * b), h, b, w, b], [0, 3, 4, 1, 5, 2]
    else:  # CRD: x as [N, C/b^2, b, b, H, W], perm (0, 1, 4, 2, 5, 3)
        moved, perm = [-1, c // (b * b), h, b, w, b], [0, 1, 4, 2, 5, 3]
    back = g.transpose(g.op("Reshape", dy, g.ints(moved)), np.argsort(perm).tolist())
    return (g.op("Reshape", back, g.ints([-1, c, h, w])),)


@grad_rule("Tile")
def grad_tile(g, node, dy):
    # dy viewed as [r0, d0, r1, d1, ...] summed over the repeat axes; that view built at run time
    # (repeats and x's shape interleaved) where either is known only then
    x, repeats = node.inputs
    shape, known = static_shape(x), folded_array(repeats)
    rank = g.rank(x)
    if is_static(shape) and known is not None:
        split = g.ints([v for r, d in zip(known, shape) for v in (int(r), d)])
    else:
        pairs = g.op("Concat", g.unsqueeze(repeats, [1]), g.unsqueeze(g.op("Shape", x), [1]), axis=1)
        split = g.op("Reshape", pairs, g.ints([-1]))
    summed = g.reduce("ReduceSum", g.op("Reshape", dy, split), list(range(0, 2 * rank, 2)), keepdims=False)
    return summed, None


@grad_rule("TopK", multi_output=True)
def grad_top_k(g, node, dys):
    # the values' gradient goes back to the positions the Indices output names
    dy = dys[0]
    if dy is None:
        return (None,) * len(node.inputs)
    x = node.inputs[0]
    scattered = g.op("ScatterElements", g.zeros_like(x), node.outputs[1], dy, axis=attr(node, "axis", -1))
    return (scattered,) + (None,) * (len(node.inputs) - 1)


@grad_rule("Trilu")
def grad_trilu(g, node, dy):
    # the same triangle of dy (the op is a fixed mask)
    k = node.inputs[1] if len(node.inputs) > 1 else None
    return (g.op("Trilu", dy, k, upper=attr(node, "upper", 1)),) + (None,) * (len(node.inputs) - 1)


@grad_rule("Resize")
def grad_resize(g, node, dy):
    # Resize is linear in x and separable: along each resized axis a, y = M_a x for a fixed
    # [out_a, in_a] interpolation matrix (nearest, linear, cubic, antialias, any coordinate mode),
    # so dx is dy contracted with every M_a. Nearest upsampling by whole factors (what
    # F.interpolate(scale_factor=k) exports) is a block sum; anything else uses the matrices, read
    # off at run time on resized axes of sizes known only then (``resize_runtime``).
    rest = (None,) * (len(node.inputs) - 1)  # roi, scales, sizes: settings, no gradient (as in PyTorch)
    plan = _ResizePlan(g, node)
    sx, sy = plan.sx, plan.sy
    if is_static(sx) and is_static(sy) and _whole_factor_nearest(node, sx, sy):
        factors = [b // a for a, b in zip(sx, sy)]
        blocks = [v for d, k in zip(sx, factors) for v in (d, k)]
        summed = g.reduce("ReduceSum", g.op("Reshape", dy, g.ints(blocks)), list(range(1, 2 * len(sx), 2)),
                          keepdims=False)
        return (summed,) + rest
    if plan.runtime:  # sizes known only at run time
        factors = {a: plan.scales[a] for a in plan.axes}
        if plan.by_scales and _nearest_blocks(node) and all(f == int(f) and f >= 1 for f in factors.values()):
            return (block_sum(g, dy, node.inputs[0], {a: int(f) for a, f in factors.items()}, len(sx)),) + rest
        matrices = {a: runtime_matrix(g, node, dy, a, len(sx), plan.scales[a] if plan.by_scales else None,
                                      (plan.roi[a], plan.roi[a + len(sx)])) if a in plan.runtime else plan.matrix(a)
                    for a in plan.axes}
        return (contract(g, dy, matrices, len(sx)),) + rest
    return (contract(g, dy, {a: plan.matrix(a) for a in plan.axes}, len(sx)),) + rest


def _whole_factor_nearest(node: ir.Node, sx, sy) -> bool:
    return all(b % a == 0 for a, b in zip(sx, sy)) and _nearest_blocks(node)


def _nearest_blocks(node: ir.Node) -> bool:
    """Whether a nearest Resize by a whole factor k copies each element to a k-block."""
    return (attr(node, "mode", "nearest") == "nearest"
            and attr(node, "coordinate_transformation_mode", "half_pixel") in (
                "half_pixel", "asymmetric", "pytorch_half_pixel")
            and attr(node, "nearest_mode", "round_prefer_floor") in ("floor", "round_prefer_floor")
            and not attr(node, "antialias", 0))


class _ResizePlan:
    """What a Resize node does per axis, from its roi/scales/sizes (constants, or values an
    exporter computes from constants and static shapes: ``folded_array``): the output shape,
    the per-axis scale and roi, and which axes it changes (``runtime``: those of sizes known only
    at run time)."""

    def __init__(self, g: GradBuilder, node: ir.Node):
        self.g, self.node = g, node
        self.sx, sy = static_shape(node.inputs[0]), static_shape(node.outputs[0])
        rank = self.rank = len(self.sx) if self.sx is not None else None
        extra = list(node.inputs[1:4])
        if g.opset < 11:  # Resize-10: (X, scales)
            extra = [None, *extra[:1]]
        extra += [None] * (3 - len(extra))
        roi, scales, sizes = (folded_array(v) for v in extra)
        axes = attr(node, "axes")
        axes = [] if rank is None else list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        if sizes is None and extra[2] is not None and sy is not None and len(sy) == rank:
            # sizes computed at run time (Concat of Shape(x)[:2] and constants, as torch.onnx
            # writes F.interpolate(size=...) with a dynamic batch): shape inference has them. An
            # output dim it cannot tell is a run-time dim kept as it is only where the input's is
            # one too (the batch); where the input's is static, the size is unknown until run time.
            if all(isinstance(sy[a], int) or not isinstance(self.sx[a], int) for a in axes):
                sizes = np.array([sy[a] if isinstance(sy[a], int) else -1 for a in axes], np.int64)
        if rank is None or rank < 2 or any(v is not None and a is None for v, a in zip(extra, (roi, scales, sizes))):
            raise GraphError(f"gradient of {node.op_type} {node.name!r} needs a known rank >= 2 and roi/scales/sizes "
                             "known before run time")
        self.sizes = sizes if sizes is not None and sizes.size else None
        self.scales, self.roi, out = [1.0] * rank, [0.0] * rank + [1.0] * rank, list(self.sx)
        self.policy = attr(node, "keep_aspect_ratio_policy", "stretch") if self.sizes is not None else "stretch"
        if self.policy != "stretch":
            self._keep_aspect_ratio(axes, out)
        for i, a in enumerate(axes):
            if self.sizes is not None and self.policy == "stretch":
                size = int(self.sizes.ravel()[i])
                out[a] = size if size >= 0 else self.sx[a]  # -1: a run-time dim, left as it is
                self.scales[a] = out[a] / self.sx[a] if isinstance(self.sx[a], int) else 1.0
            elif self.sizes is None and scales is not None and scales.size:
                self.scales[a] = float(scales.ravel()[i])
                if self.scales[a] != 1.0:  # scale 1 keeps the dim, symbolic or not
                    out[a] = int(np.floor(self.sx[a] * self.scales[a])) if isinstance(self.sx[a], int) else None
            if roi is not None and roi.size:
                self.roi[a], self.roi[a + rank] = float(roi.ravel()[i]), float(roi.ravel()[i + len(axes)])
        self.sy = tuple(d if d is not None else (sy[i] if sy is not None else None) for i, d in enumerate(out))
        crop = attr(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize"
        self.axes = [a for a in range(rank) if self.scales[a] != 1.0 or self.sx[a] != self.sy[a]
                     or (crop and (self.roi[a], self.roi[a + rank]) != (0.0, 1.0))]
        # resized axes of sizes known only at run time: their matrices read off at run time
        self.runtime = [a for a in self.axes if not (isinstance(self.sx[a], int) and isinstance(self.sy[a], int))]
        if self.runtime and self.policy != "stretch":
            raise GraphError(f"gradient of {node.op_type} {node.name!r} needs a static size on resized axis "
                             f"{self.runtime[0]} (got {self.sx} -> {self.sy})")
        self.by_scales = self.sizes is None

    def _keep_aspect_ratio(self, axes: list[int], out: list) -> None:
        """One scale for every resized axis: the smallest (not_larger) or largest (not_smaller)
        of the requested sizes over the input's, each axis then rounded half up to its size."""
        sizes = [int(v) for v in self.sizes.ravel()]
        if not all(isinstance(self.sx[a], int) for a in axes) or min(sizes) < 0:
            raise GraphError(f"gradient of Resize {self.node.name!r} with the {self.policy!r} aspect-ratio policy "
                             f"needs static sizes on the axes {axes} (got {self.sx})")
        if attr(self.node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
            raise GraphError(f"gradient of Resize {self.node.name!r}: the {self.policy!r} aspect-ratio policy with "
                             "tf_crop_and_resize is not supported")
        ratios = [size / self.sx[a] for size, a in zip(sizes, axes)]
        pick = int(np.argmin(ratios) if self.policy == "not_larger" else np.argmax(ratios))
        self.requested = dict(zip(axes, sizes))
        self.deciding = axes[pick]  # the axis whose ratio is the scale
        for a in axes:
            self.scales[a] = ratios[pick]
            out[a] = int(ratios[pick] * self.sx[a] + 0.5)

    def matrix(self, a: int) -> np.ndarray:
        """M_a, the [out_a, in_a] interpolation matrix of axis ``a`` (``axis_matrix``: the basis
        vectors ride on another axis, which a run with scale 1 there leaves unchanged in every
        mode), with extrapolation 0 (outside a tf_crop_and_resize box the output is a constant)."""
        matrix = self._stretch_matrix(a) if self.policy == "stretch" else self._policy_matrix(a)
        if matrix.shape[0] != self.sy[a]:
            raise GraphError(f"gradient of {self.node.op_type} {self.node.name!r}: the interpolation along axis "
                             f"{a} gives {matrix.shape[0]} elements, the model says {self.sy[a]}")
        return matrix

    def _stretch_matrix(self, a: int) -> np.ndarray:
        """M_a without an aspect-ratio policy: a run of the node's own Resize along ``a``."""
        rank, n, out = self.rank, self.sx[a], self.sy[a]
        carrier = rank - 1 if a != rank - 1 else rank - 2
        scales = [1.0] * rank
        scales[a] = self.scales[a]
        roi = [0.0] * rank + [1.0] * rank
        roi[a], roi[a + rank] = self.roi[a], self.roi[a + rank]
        if self.g.opset < 11:
            extra = [np.array(scales, np.float32)]
        elif self.sizes is not None:
            sizes = [1] * rank
            sizes[a], sizes[carrier] = out, n
            extra = [np.array(roi), None, np.array(sizes, np.int64)]
        else:
            extra = [np.array(roi), np.array(scales, np.float32)]
        attrs = node_attrs(self.node, drop=("axes", "keep_aspect_ratio_policy", "extrapolation_value"))
        return axis_matrix("Resize", attrs, rank, a, carrier, n, extra, self.g.opset)

    def _policy_matrix(self, a: int) -> np.ndarray:
        """M_a under an aspect-ratio policy: the scale comes from the deciding axis, so the basis
        run resizes ``a`` together with that axis (held at ones and read at index 0; the
        interpolation weights of a row sum to 1 outside tf_crop_and_resize)."""
        c, rank = self.deciding, self.rank
        axes = [a] if a == c else [a, c]
        carrier = next(k for k in range(rank - 1, -1, -1) if k not in axes)
        attrs = node_attrs(self.node, drop=("axes", "extrapolation_value"))
        attrs["axes"] = axes
        sizes = np.array([self.requested[k] for k in axes], np.int64)
        return axis_matrix("Resize", attrs, rank, a, carrier, self.sx[a], [None, None, sizes], self.g.opset,
                           ones={c: self.sx[c]} if c != a else None)
