"""``gc.vmap``'s batching rules for the random ops, added to ``vmap_rules.RULES``: with ``randomness``
"different" a draw per example, with "same" one draw for all of the example's shape."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from graphc.dsl import ops
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap_rules import (
    RULES,
    Arg,
    Batching,
    as_args,
    as_batched,
    node_attrs,
    only_first,
    reemit,
)
from graphc.model import SOURCE_KEY
from graphc.model.dtypes import as_dtype
from graphc.passes.values import draws_random

__all__: list[str] = []


def _zeros_of(t: Tensor, start: int) -> Tensor:
    """Zeros of ``t``'s dtype and its shape from dim ``start`` on."""
    value = ir.Tensor(np.zeros(1, t.dtype.numpy))
    return ops.emit("ConstantOfShape", [ops.emit("Shape", [t], {"start": start})], {"value": value})


def _random(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    """A draw per example ("different"), or one for all ("same") of the example's shape."""
    if node.op_type in ("RandomNormal", "RandomUniform"):  # batched only when "different"
        attrs = node_attrs(node)
        shape = [int(d) for d in attrs.pop("shape")]
        zeros = ops.emit("ConstantOfShape", [ops.concat([b.batch_shape(), ops.const_i64(shape)])],
                         {"value": ir.Tensor(np.zeros(1, np.float32))})
        out = ops.emit(f"{node.op_type}Like", [zeros], attrs, source=node.metadata_props.get(SOURCE_KEY))
        return [Arg(out, True)]
    if b.randomness == "different" or not args[0].batched:
        return as_args(reemit(node, [as_batched(b, args[0]), *(a and a.t for a in args[1:])]))
    if node.op_type == "Bernoulli":  # "same": one uniform draw compared with each example's p
        p = args[0].t
        u = ops.emit("RandomUniformLike", [_zeros_of(p, 1)], {"seed": node_attrs(node).get("seed", 0.0)})
        dtype = node_attrs(node).get("dtype")
        out = ops.cast(ops.binary("Less", u, p), p.dtype if dtype is None else as_dtype(ir.DataType(dtype)))
        return [Arg(out, True)]
    if node.op_type == "Dropout":  # "same": one mask, the example's shape
        x = args[0].t
        ones = ops.emit("ConstantOfShape", [ops.emit("Shape", [x], {"start": 1})],
                        {"value": ir.Tensor(np.ones(1, x.dtype.numpy))})
        outs = reemit(node, [ones, *(a and a.t for a in args[1:])])
        return [Arg(x * outs[0], True), *as_args(outs[1:], False)]
    like = reemit(node, [_zeros_of(args[0].t, 1)])  # RandomNormalLike/RandomUniformLike
    return as_args(like, False)


def _dropout(b: Batching, node: ir.Node, args: list) -> list[Arg]:
    only_first(args)
    return _random(b, node, args) if draws_random(node) else as_args(reemit(node, [a and a.t for a in args]))


RULES.update({**dict.fromkeys(("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli"),
                              _random), "Dropout": _dropout})
