"""Random small ONNX graphs, drawn by hypothesis from an op table, agree on numpy and onnxruntime.

Each table entry takes a value from the pool of computed values (name, shape) and adds one or
a few nodes whose output joins the pool. Values are kept in a moderate range (weights scaled
by 1/sqrt(fan-in), Exp only after Tanh, Div by 1+|y|) so float32 round-off stays within the
default parity tolerances.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

import graphc as gc

Shape = tuple[int, ...]


class Builder:
    """Collects nodes, initializers and the pool of (value name, shape)."""

    def __init__(self, draw, dtype: np.dtype):
        self.draw, self.dtype = draw, np.dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.pool: list[tuple[str, Shape]] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def const(self, array: np.ndarray) -> str:
        name = self.name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def random_const(self, shape: Shape, scale: float = 1.0) -> str:
        seed = self.draw(st.integers(0, 2**16))
        return self.const((np.random.default_rng(seed).standard_normal(shape) * scale).astype(self.dtype))

    def op(self, op_type: str, inputs: list[str], shape: Shape, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        self.pool.append((out, shape))
        return out

    def pick(self, min_rank: int = 0) -> tuple[str, Shape] | None:
        """A pool value of rank >= ``min_rank`` (None when there is none: the op is skipped)."""
        candidates = [(n, s) for n, s in self.pool if len(s) >= min_rank]
        return self.draw(st.sampled_from(candidates)) if candidates else None


def unary(op_type: str) -> Callable[[Builder], None]:
    def build(b: Builder) -> None:
        x, shape = b.pick()
        b.op(op_type, [x], shape)
    return build


def exp_of_tanh(b: Builder) -> None:
    x, shape = b.pick()
    b.op("Exp", [b.op("Tanh", [x], shape)], shape)


def sqrt_of_abs(b: Builder) -> None:
    x, shape = b.pick()
    b.op("Sqrt", [b.op("Abs", [x], shape)], shape)


def _broadcast_partner(b: Builder, shape: Shape) -> tuple[str, Shape]:
    """Another pool value that broadcasts with ``shape``, or a constant that does."""
    partners = [(n, s) for n, s in b.pool if _broadcasts(s, shape)]
    if b.draw(st.booleans()) and partners:
        return b.draw(st.sampled_from(partners))
    keep = b.draw(st.integers(0, len(shape)))
    const_shape = tuple(d if b.draw(st.booleans()) else 1 for d in shape[len(shape) - keep:])
    return b.random_const(const_shape), const_shape


def _broadcasts(a: Shape, c: Shape) -> bool:
    try:
        np.broadcast_shapes(a, c)
        return True
    except ValueError:
        return False


def binary(op_type: str) -> Callable[[Builder], None]:
    def build(b: Builder) -> None:
        x, shape = b.pick()
        y, other = _broadcast_partner(b, shape)
        out_shape = np.broadcast_shapes(shape, other)
        if op_type == "Div":  # x / (1 + |y|): no near-zero denominators
            one = b.const(np.ones((), b.dtype))
            y = b.op("Add", [b.op("Abs", [y], other), one], other)
        b.op(op_type, [x, y], out_shape)
    return build


def matmul(b: Builder) -> None:
    if not (picked := b.pick(min_rank=1)):
        return
    x, shape = picked
    k, m = shape[-1], b.draw(st.integers(1, 4))
    w = b.random_const((k, m), scale=1 / math.sqrt(k))
    b.op("MatMul", [x, w], (*shape[:-1], m) if len(shape) > 1 else (m,))


def reduce(op_type: str) -> Callable[[Builder], None]:
    def build(b: Builder) -> None:
        if not (picked := b.pick(min_rank=1)):
            return
        x, shape = picked
        axes = sorted(b.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1)))
        keepdims = b.draw(st.sampled_from([0, 1]))
        out = tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes)
        b.op(op_type, [x, b.const(np.array(axes, np.int64))], out, keepdims=keepdims)
    return build


def softmax(op_type: str) -> Callable[[Builder], None]:
    def build(b: Builder) -> None:
        if not (picked := b.pick(min_rank=1)):
            return
        x, shape = picked
        b.op(op_type, [x], shape, axis=b.draw(st.integers(-len(shape), len(shape) - 1)))
    return build


def transpose(b: Builder) -> None:
    if not (picked := b.pick(min_rank=1)):
        return
    x, shape = picked
    perm = b.draw(st.permutations(range(len(shape))))
    b.op("Transpose", [x], tuple(shape[p] for p in perm), perm=list(perm))


def reshape(b: Builder) -> None:
    if not (picked := b.pick(min_rank=1)):
        return
    x, shape = picked
    size = math.prod(shape)
    target, out = b.draw(st.sampled_from([([-1], (size,)), ([1, -1], (1, size)),
                                          ([shape[0], -1], (shape[0], size // shape[0]))]))
    b.op("Reshape", [x, b.const(np.array(target, np.int64))], out)


def concat(b: Builder) -> None:
    if not (picked := b.pick(min_rank=1)):
        return
    x, shape = picked
    axis = b.draw(st.integers(0, len(shape) - 1))
    extra = b.draw(st.integers(1, 3))
    other = b.random_const(tuple(extra if i == axis else d for i, d in enumerate(shape)))
    out = tuple(2 * d + extra if i == axis else d for i, d in enumerate(shape))
    b.op("Concat", [x, other, x], out, axis=axis)


def unsqueeze(b: Builder) -> None:
    x, shape = b.pick()
    if len(shape) >= 4:
        return
    axis = b.draw(st.integers(0, len(shape)))
    b.op("Unsqueeze", [x, b.const(np.array([axis], np.int64))], (*shape[:axis], 1, *shape[axis:]))


OPS: dict[str, Callable[[Builder], None]] = {
    **{op: unary(op) for op in ("Relu", "Sigmoid", "Tanh", "Abs", "Neg")},
    "Exp": exp_of_tanh,
    "Sqrt": sqrt_of_abs,
    **{op: binary(op) for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
    "MatMul": matmul,
    **{op: reduce(op) for op in ("ReduceSum", "ReduceMean", "ReduceMax")},
    **{op: softmax(op) for op in ("Softmax", "LogSoftmax")},
    "Transpose": transpose,
    "Reshape": reshape,
    "Concat": concat,
    "Unsqueeze": unsqueeze,
}

_ELEM = {np.dtype(np.float32): onnx.TensorProto.FLOAT, np.dtype(np.float64): onnx.TensorProto.DOUBLE}


@st.composite
def random_graphs(draw) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[str]]:
    dtype = np.dtype(draw(st.sampled_from(["float32", "float64"])))
    b = Builder(draw, dtype)
    shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
    inputs = [(f"in_{i}", draw(shapes)) for i in range(draw(st.integers(1, 2)))]
    b.pool.extend(inputs)
    ops = draw(st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=8))
    for op in ops:
        OPS[op](b)
    computed = b.pool[len(inputs):]
    if not computed:  # every drawn op declined (e.g. Unsqueeze on rank 4)
        unary("Relu")(b)
        computed = b.pool[len(inputs):]
    outputs = [computed[-1], *draw(st.lists(st.sampled_from(computed), max_size=2))]
    outputs = list(dict(outputs).items())
    elem = _ELEM[dtype]
    graph = helper.make_graph(
        b.nodes, "random",
        [helper.make_tensor_value_info(n, elem, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, elem, s) for n, s in outputs], b.initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", draw(st.integers(18, 21)))])
    proto.ir_version = 9
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    feeds = {n: rng.standard_normal(s).astype(dtype) for n, s in inputs}
    return proto, feeds, ops


@settings(max_examples=int(os.environ.get("GRAPHC_RANDOM_GRAPHS", 100)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_numpy_and_onnxruntime_agree_on_random_graphs(case):
    proto, feeds, ops = case
    report = gc.parity.compare(proto, feeds, backends=("numpy", "ort-cpu"), bisect=True)
    assert report.ok, f"ops {ops}:\n{report}\n{onnx.printer.to_text(proto.graph)}"
    assert report.first_divergence is None, f"ops {ops}:\n{report}"
