"""The graphs that add one micro-batch's gradients into their running sums (gradient
accumulation, ``gc.Trainer(accumulate=k)``). ``accumulate_graph``: for every gradient ``g`` of
the gradients graph, ``g.acc = (first ? 0 : g.sum) + g * share``, ``share`` (a float64 scalar,
cast to each sum's dtype) the micro-batch's part of the optimizer step (its rows over the step's
rows for a mean loss, 1 for a summed one) and ``first`` (bool) true on a step's first
micro-batch, whose ``g.sum`` is ignored (any buffer of the right shape: no zeros to allocate,
and an inf left from an earlier step never becomes 0 * inf). A float16 or bfloat16 gradient is
summed in float32, as data-parallel training's ``weighted_sum`` adds the workers' (a float16 sum
of k scaled parts overflows or rounds where the one-batch gradient does not);
``narrow_graph`` casts those sums back to the gradients' dtype once per step, for the update.
The sums stay on the backend's device.

A model with ``gc.autograd.Function``s (backward hooks are Functions too) seeds its backward with ``seed_weight``:
its training graphs take ``WEIGHT`` (float64, default 1), and differentiate ``loss * WEIGHT``. The accumulating
trainer feeds each micro-batch's share there and adds the gradients with share 1, so a Function's backward, and
so a hook, sees the weighted gradient, as torch's ``(loss * rows / step_rows).backward()``: a hook not linear in
its gradient (a clamp) steps as torch's. A model without Functions keeps its graphs as they were."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from graphc.passes.emit import Emitter
from graphc.passes.training.graph_outputs import input_with_default

SUM_SUFFIX = ".sum"  # the running sum an input
ACC_SUFFIX = ".acc"  # the sum with this micro-batch added, an output
SHARE = "share"
FIRST = "first"
WEIGHT = "accumulate.weight"  # the training graphs' seed weight input (``seed_weight``)
_HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)

Grads = Sequence[tuple[str, int, Sequence]]  # (name, ONNX element type, shape) of each gradient


def sum_type(elem: int) -> int:
    """The element type a gradient of type ``elem`` is summed in: float32 for a half float."""
    return TensorProto.FLOAT if elem in _HALF else elem


def sum_zeros(elem: int, shape: Sequence[int]) -> np.ndarray:
    """Zeros of a sum of gradients of type ``elem`` and ``shape``."""
    return np.zeros(tuple(shape), helper.tensor_dtype_to_np_dtype(sum_type(elem)))


def seed_weight(b: Emitter, loss: ir.Value) -> ir.Value:
    """The input ``WEIGHT`` (a float64 scalar, default 1) added to ``b``'s graph, in ``loss``'s dtype: the
    backward's seed factor."""
    weight = input_with_default(b.graph, WEIGHT, np.array(1.0))
    return weight if loss.dtype == weight.dtype else b.op("Cast", weight, to=loss.dtype, dtype=loss.dtype)


def accumulate_graph(grads: Grads, opset: int) -> onnx.ModelProto:
    """The accumulate model of ``grads``: sums of ``sum_type``, each gradient cast to it."""
    nodes = []
    inputs = [helper.make_tensor_value_info(SHARE, TensorProto.DOUBLE, []),
              helper.make_tensor_value_info(FIRST, TensorProto.BOOL, [])]
    outputs, zeros = [], {}
    for name, elem, shape in grads:
        wide = sum_type(elem)
        inputs += [helper.make_tensor_value_info(name + SUM_SUFFIX, wide, list(shape)),
                   helper.make_tensor_value_info(name, elem, list(shape))]
        outputs.append(helper.make_tensor_value_info(name + ACC_SUFFIX, wide, list(shape)))
        if wide not in zeros:  # per dtype: the share cast once, a zero to start the sum from
            zeros[wide] = f"zero.{wide}"
            zero = numpy_helper.from_array(sum_zeros(elem, ()))
            nodes += [helper.make_node("Constant", [], [zeros[wide]], value=zero),
                      helper.make_node("Cast", [SHARE], [f"share.{wide}"], to=wide)]
        part = name
        if wide != elem:
            part = f"{name}.wide"
            nodes.append(helper.make_node("Cast", [name], [part], to=wide))
        nodes += [helper.make_node("Where", [FIRST, zeros[wide], name + SUM_SUFFIX], [f"{name}.held"]),
                  helper.make_node("Mul", [part, f"share.{wide}"], [f"{name}.part"]),
                  helper.make_node("Add", [f"{name}.held", f"{name}.part"], [name + ACC_SUFFIX])]
    return _model(nodes, "accumulate", inputs, outputs, opset)


def narrow_graph(grads: Grads, opset: int) -> onnx.ModelProto | None:
    """The model casting the float32 sums (``<g>.acc``) of ``grads``' half-float gradients back to
    their type, as ``<g>`` (what the update takes); None where no gradient is a half float."""
    half = [(name, elem, shape) for name, elem, shape in grads if elem in _HALF]
    if not half:
        return None
    inputs = [helper.make_tensor_value_info(n + ACC_SUFFIX, TensorProto.FLOAT, list(s)) for n, _, s in half]
    outputs = [helper.make_tensor_value_info(n, e, list(s)) for n, e, s in half]
    nodes = [helper.make_node("Cast", [n + ACC_SUFFIX], [n], to=e) for n, e, _ in half]
    return _model(nodes, "narrow", inputs, outputs, opset)


def _model(nodes, name, inputs, outputs, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
