"""Eager evaluation of one node during capture (``print(t)`` inside ``forward`` shows values).

Uses the numpy backend's ``run_node``; an op it has no kernel for goes to onnx's reference
evaluator on a one-node model. Control-flow nodes never come to ``run``: ``graphc.dsl.control``
evaluates them itself, and gives ``record`` its evaluator for them (``control.record``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir


def _plain(value: Any) -> Any:
    if isinstance(value, ir.TensorProtocol):
        return value.numpy()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def run(op_type: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], opset: int,
        node_outputs: int = 1) -> list[np.ndarray]:
    attrs = {k: _plain(v) for k, v in attrs.items()}
    if op_type == "Constant":
        return [np.asarray(attrs["value"])]
    from graphc.backends.numpy import run_node

    try:  # inf/NaN results are ONNX semantics, as in a Session's run (numpy backend), not warnings
        with np.errstate(all="ignore"):
            # a random node draws from its own seed attribute (two gc.randn(3) differ, as torch's draws)
            rng = np.random.default_rng(int(attrs["seed"])) if "seed" in attrs else None
            outs = list(run_node(op_type, list(inputs), attrs, opset, num_outputs=node_outputs, rng=rng))
    except Exception as exc:  # a kernel the numpy backend lacks: the reference evaluator decides
        try:
            outs = _reference(op_type, inputs, attrs, opset, node_outputs)
        except Exception:
            raise exc from None
    return [None if o is None else np.asarray(o) for o in outs]


def record(values: dict, node: ir.Node, opset: int, evaluate: Callable[[list], list] | None = None) -> None:
    """Evaluate ``node`` on its inputs' example values (``values``: value id -> array) and record its
    outputs' there; nothing when every output has one already or an input has none. ``evaluate``
    (arrays -> outputs) takes the place of ``run``, as ``control.record`` gives it for control flow."""
    if all(id(v) in values for v in node.outputs):
        return
    arrays = [None if v is None else values.get(id(v)) for v in node.inputs]
    if any(a is None for v, a in zip(node.inputs, arrays) if v is not None):
        return
    if evaluate is None:
        attrs = {a.name: a.value for a in node.attributes.values()}
        outs = run(node.op_type, arrays, attrs, opset, len(node.outputs))
    else:
        outs = evaluate(arrays)
    values.update((id(v), r) for v, r in zip(node.outputs, outs))


def _reference(op_type: str, inputs: list[np.ndarray | None], attrs: dict[str, Any], opset: int,
               node_outputs: int) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    in_names = ["" if a is None else f"i{k}" for k, a in enumerate(inputs)]
    out_names = [f"o{k}" for k in range(node_outputs)]
    node = onnx.helper.make_node(op_type, in_names, out_names, **attrs)
    feeds = {n: a for n, a in zip(in_names, inputs) if n}
    graph = onnx.helper.make_graph(
        [node], "eager",
        [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in feeds.items()],
        [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None) for n in out_names])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    return list(ReferenceEvaluator(model).run(None, feeds))
