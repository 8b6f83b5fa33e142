"""The graph that adds one micro-batch's gradients into their running sums (gradient
accumulation, ``gc.Trainer(accumulate=k)``): for every gradient ``g`` of the gradients graph,
``g.acc = (first ? 0 : g.sum) + g * share``, ``share`` (a float64 scalar, cast to each
gradient's dtype) the micro-batch's part of the optimizer step (its rows over the step's rows
for a mean loss, 1 for a summed one) and ``first`` (bool) true on a step's first micro-batch,
whose ``g.sum`` is ignored (any buffer of the right shape: no zeros to allocate, and an inf
left from an earlier step never becomes 0 * inf). The sums stay on the backend's device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SUM_SUFFIX = ".sum"  # the running sum an input
ACC_SUFFIX = ".acc"  # the sum with this micro-batch added, an output
SHARE = "share"
FIRST = "first"


def accumulate_graph(grads: Sequence[tuple[str, int, Sequence]], opset: int) -> onnx.ModelProto:
    """The accumulate model of ``grads``: (name, ONNX element type, shape) of each gradient."""
    nodes = []
    inputs = [helper.make_tensor_value_info(SHARE, TensorProto.DOUBLE, []),
              helper.make_tensor_value_info(FIRST, TensorProto.BOOL, [])]
    outputs, zeros = [], {}
    for name, elem, shape in grads:
        inputs += [helper.make_tensor_value_info(name + SUM_SUFFIX, elem, list(shape)),
                   helper.make_tensor_value_info(name, elem, list(shape))]
        outputs.append(helper.make_tensor_value_info(name + ACC_SUFFIX, elem, list(shape)))
        if elem not in zeros:  # per dtype: the share cast once, a zero to start the sum from
            zeros[elem] = f"zero.{elem}"
            dtype = helper.tensor_dtype_to_np_dtype(elem)
            nodes += [helper.make_node("Constant", [], [zeros[elem]], value=numpy_helper.from_array(np.zeros((), dtype))),
                      helper.make_node("Cast", [SHARE], [f"share.{elem}"], to=elem)]
        nodes += [helper.make_node("Where", [FIRST, zeros[elem], name + SUM_SUFFIX], [f"{name}.held"]),
                  helper.make_node("Mul", [name, f"share.{elem}"], [f"{name}.part"]),
                  helper.make_node("Add", [f"{name}.held", f"{name}.part"], [name + ACC_SUFFIX])]
    graph = helper.make_graph(nodes, "accumulate", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
