"""``gc.vmap``'s batching rules for the ops on images ``(N, C, ...)`` (Conv and ConvTranspose, pools,
normalizations, Resize), added to ``vmap_rules.RULES``: the examples folded into the images' N; mapped
weights make a grouped convolution, the examples folded into the channels (``group`` times the mapped
size, which must be static), as torch's vmap does. Also the folds' helpers."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap_rules import (
    RULES,
    Arg,
    Batching,
    NoRule,
    as_batched,
    const_of,
    node_attrs,
    only_first,
    rank_of,
    reemit,
)
from graphc.errors import CaptureError
from graphc.model import SOURCE_KEY, VMAP_FOLDED_KEY
from graphc.passes.values import static_shape

__all__ = ["known_shape", "merge_dims", "per_image", "split_dim"]


def _static(t: Tensor) -> bool:
    return t.shape is not None and all(isinstance(d, int) for d in t.shape)


def known_shape(b: Batching, a: Arg, value: ir.Value) -> tuple | None:
    """The static shape of ``as_batched(b, a)`` (``a`` standing for ``value``): from ``a``'s Tensor,
    else from the example's (the trace's inference); None where neither is known."""
    if a.batched and _static(a.t):
        return tuple(a.t.shape)
    shape = tuple(a.t.shape) if _static(a.t) else static_shape(value)
    if isinstance(b.size, int) and shape is not None and all(isinstance(d, int) for d in shape):
        return (b.size, *shape)
    return None


def merge_dims(t: Tensor, axis: int, shape: tuple | None = None) -> Tensor:
    """``t`` with its dims ``axis`` and ``axis + 1`` as one; given its static ``shape`` (or where its
    own is), the result's is static too."""
    s = shape or (tuple(t.shape) if _static(t) else None)
    if s is not None:
        return ops.emit("Reshape", [t, ops.const_i64([*s[:axis], s[axis] * s[axis + 1], *s[axis + 2:]])])
    return ops.emit("Reshape", [t, ops.concat([ops.const_i64([0] * axis + [-1]),
                                               ops.emit("Shape", [t], {"start": axis + 2})])])


def split_dim(b: Batching, t: Tensor, axis: int) -> Tensor:
    """``t`` with its dim ``axis`` (the mapped size times another) as two, the mapped size first."""
    if _static(t) and isinstance(b.size, int):
        s = t.shape
        return ops.emit("Reshape", [t, ops.const_i64([*s[:axis], b.size, s[axis] // b.size, *s[axis + 1:]])])
    return ops.emit("Reshape", [t, ops.concat([ops.const_i64([0] * axis), b.batch_shape(), ops.const_i64([-1]),
                                               ops.emit("Shape", [t], {"start": axis + 1})])])


def per_image(b: Batching, node: ir.Node, args: list, mark: dict | None = None) -> list[Arg]:
    """Ops on an ``(N, C, ...)`` input, each image alone (Conv, pools, inference BatchNorm): the
    mapped dim folded into N and out again; ``mark``: metadata for the node emitted."""
    only_first(args)
    if len(node.outputs) != 1:
        raise NoRule("more than one output")
    y = reemit(node, [merge_dims(args[0].t, 0, known_shape(b, args[0], node.inputs[0])),
                      *(a and a.t for a in args[1:])])[0]
    y.value.producer().metadata_props.update(mark or {})
    return [Arg(split_dim(b, y, 0), True)]


def _conv(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Conv/ConvTranspose: mapped images alone fold into N; mapped weights (or bias) make one grouped
    convolution of ``group * B`` groups over the images ``(N, B*C, ...)``."""
    if not any(a is not None and a.batched for a in args[1:]):
        return per_image(b, node, args)
    if not isinstance(b.size, int):
        raise NoRule("mapped weights of a mapped size not static (the group count is an attribute)")
    if rank_of(node.inputs[0], args[0]) < 3:
        raise NoRule("unbatched (N-less) images")
    size, x, rank = b.size, args[0].t, rank_of(node.inputs[0], args[0]) + 1
    if args[0].batched:  # (B, N, C, ...) -> (N, B*C, ...)
        shape = known_shape(b, args[0], node.inputs[0])
        x = merge_dims(ops.transpose(x, [1, 0, *range(2, rank)]), 1, shape and (shape[1], shape[0], *shape[2:]))
    else:  # (N, C, ...) -> (N, B*C, ...), the channels repeated for each example's group
        x = ops.emit("Tile", [x, ops.const_i64([1, size] + [1] * (rank - 3))])
    ins = [x, merge_dims(as_batched(b, args[1]), 0, known_shape(b, args[1], node.inputs[1]))]
    if len(args) > 2 and args[2] is not None:
        ins.append(merge_dims(as_batched(b, args[2]), 0))
    group = int(node_attrs(node).get("group", 1))
    y = reemit(node, ins, node_attrs(node, group=group * size))[0]  # (N, B*O, ...)
    return [Arg(ops.transpose(split_dim(b, y, 1), [1, 0, *range(2, rank)]), True)]


def _batch_norm(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Inference BatchNorm: each image alone (``per_image``), marked ``VMAP_FOLDED_KEY``. Training mode of a mapped input with running
    statistics the same for all examples is refused, as torch.func.vmap refuses it (each example would
    update them); with mapped running statistics each example's own statistics come from the Scan over the
    examples, which onnxruntime CPU runs faster than the one BatchNormalization of the examples folded into
    its channels ``(N, B*C, ...)`` (float32, 64 examples of (8, 16, 32): 0.18 ms vs 0.52 ms; of (32, 16, 8, 8):
    1.0 ms vs 24 ms; of 256 of (4, 8, 16): 0.40 ms both; written out in ReduceMeans over each example's N and
    spatial axes, 0.56 ms and 8.6 ms for the first two)."""
    if not node_attrs(node).get("training_mode", 0):  # marked: training graphs may not switch it (modes.py)
        return per_image(b, node, args, {VMAP_FOLDED_KEY: node.metadata_props.get(SOURCE_KEY, "?")})
    if args[0].batched and not all(a is not None and a.batched for a in args[3:5]):
        raise CaptureError(f"gc.vmap: the training-mode BatchNorm at {node.metadata_props.get(SOURCE_KEY, '?')} "
                           f"gets a per-example input while its running_mean and running_var, which training "
                           f"updates, are the same for every example (torch.func.vmap refuses this too): pass "
                           f"track_running_stats=False (gc.nn.BatchNorm*d) or None running statistics "
                           f"(F.batch_norm) for each example's own statistics, or map the running statistics")
    raise NoRule("training mode (the Scan is faster than the examples folded into the channels)")


def _max_pool(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """MaxPool: the images folded into N; its indices (flat offsets into the folded input) taken
    modulo an example's element count."""
    if len(node.outputs) < 2:
        return per_image(b, node, args)
    if not args[0].batched or len(args) > 1:
        raise NoRule("a mapped operand other than the data")
    if node_attrs(node).get("storage_order", 0):
        raise NoRule("column-major indices")
    x = args[0].t
    y, idx = reemit(node, [merge_dims(x, 0, known_shape(b, args[0], node.inputs[0]))])
    per_example = ops.emit("ReduceProd", [ops.emit("Shape", [x], {"start": 1}), ops.const_i64([0])], {"keepdims": 1}) \
        if b.builder.opset >= 18 else ops.emit("ReduceProd", [ops.emit("Shape", [x], {"start": 1})], {"keepdims": 1})
    idx = ops.emit("Mod", [idx, per_example])
    return [Arg(split_dim(b, y, 0), True), Arg(split_dim(b, idx, 0), True)]


def _resize(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """Resize of the dims after N and C only (constant scales or sizes): the images folded into N."""
    if not args[0].batched or any(a is not None and a.batched for a in args[1:]):
        raise NoRule("a mapped operand other than the data")
    x, ins = args[0].t, [a and a.t for a in args]
    if x.shape is None:
        raise NoRule("unknown rank")
    rank, attrs = x.ndim - 1, node_attrs(node)
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        raise NoRule("tf_crop_and_resize")
    if attrs.get("axes") is not None:
        if any(int(a) % rank < 2 for a in attrs["axes"]):
            raise NoRule("a resized N or C")
        return [Arg(split_dim(b, reemit(node, [merge_dims(x, 0, known_shape(b, args[0], node.inputs[0])), *ins[1:]])[0], 0), True)]
    scales = const_of(b, node.inputs[2]) if len(node.inputs) > 2 else None
    sizes = const_of(b, node.inputs[3]) if len(node.inputs) > 3 else None
    if scales is not None and scales.size:
        if scales.size < 2 or not np.all(scales[:2] == 1):
            raise NoRule("a resized N or C")
    elif sizes is not None and sizes.size:
        if sizes.size < 2 or [int(s) for s in sizes[:2]] != list(x.shape[1:3]):
            raise NoRule("a resized N or C (or their sizes not static)")
        ins[3] = ops.const_i64([b.size * x.shape[1], *sizes[1:]]) if isinstance(b.size, int) else \
            ops.concat([b.batch_shape() * x.shape[1], ops.const_i64(sizes[1:])])
    else:
        raise NoRule("scales and sizes not constant")
    return [Arg(split_dim(b, reemit(node, [merge_dims(x, 0, known_shape(b, args[0], node.inputs[0])), *ins[1:]])[0], 0), True)]


_PER_IMAGE = ("AveragePool", "GlobalAveragePool", "GlobalMaxPool", "InstanceNormalization", "LpPool")
RULES.update({**dict.fromkeys(_PER_IMAGE, per_image), "BatchNormalization": _batch_norm, "Conv": _conv,
              "ConvTranspose": _conv, "MaxPool": _max_pool, "Resize": _resize})
