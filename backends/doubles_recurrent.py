"""Double-precision RNN, GRU and LSTM written out for onnxruntime, in a session's copy of a model
(``doubles.lower_double`` runs them).

onnxruntime 1.31's CPU provider has no double RNN kernel ("Could not find an implementation for RNN(14)"), and
its GRU and LSTM fail at run time ("does not support double yet"). Each such node becomes the form every other
caller writes too (``passes/recurrent.write_out``, every attribute and input of the ops; the node converted to
onnx-ir and back): one Scan over time per direction whose body is the cell, the input projection and the
biases that fold into it one MatMul outside. Its activations are written in ops with double kernels (Where,
Min, Max, Exp, Log, ...), with the alpha/beta the numpy backend's kernels (``backends/numpy/rnn.py``) take
(the ONNX defaults in double, where the op form would round them to float32 attributes).

Measured (ort-cpu, 1 thread, a shared 2-core machine; this form against the writer this module had before,
which sliced gates with Gathers): a float64 LSTM 32 -> 64, batch 16, T=50 is written out in 2.6 ms (1.3),
its onnxruntime session made in 2.6 ms (3.1) and run in 2.10 ms (2.57), gc.Session and the first run 10.8-11.1
ms (11.5); a 2-layer bidirectional LSTM 32 -> 128, batch 16, T=128 runs in 67 ms (76; numpy backend 312 ms,
onnxruntime's fused float32 kernel 16 ms), a GRU of that shape in 43 ms (56; 148, 12).

On the CUDA provider a node cuDNN runs (the default activations, no alpha/beta or clip, LSTM without peepholes or
``input_forget``, GRU with ``linear_before_reset`` 1, layout 0: the provider's ``RNNNeedFallbackToCPU``) is left
to its double kernel; any other would fall back to the CPU provider and is written out.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from graphc.backends.written_out import Writer, log1p
from graphc.errors import BackendError
from graphc.model import node_label, node_source
from graphc.passes.emit import Emitter
from graphc.passes.recurrent import Activation, op_activation, unknown_activations, write_out
from graphc.passes.recurrent_activations import DEFAULT_ACTIVATIONS, activation_names

__all__ = ["LOWERINGS", "cudnn_runs"]


def _attrs(node: onnx.NodeProto) -> dict:
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in values.items()}


def cudnn_runs(node: onnx.NodeProto) -> bool:
    """Whether onnxruntime's CUDA provider runs this RNN/GRU/LSTM node on cuDNN (its ``RNNNeedFallbackToCPU``,
    with layout 0 and GRU's ``linear_before_reset`` set to 1 asked for besides)."""
    attrs = _attrs(node)
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    defaults = [n.lower() for n in DEFAULT_ACTIVATIONS[node.op_type] * directions]
    return ([n.lower() for n in activation_names(node.op_type, attrs.get("activations"), directions)] == defaults and
            not {"activation_alpha", "activation_beta", "clip"} & attrs.keys() and attrs.get("layout", 0) == 0 and
            not attrs.get("input_forget", 0) and (node.op_type != "GRU" or attrs.get("linear_before_reset", 0) == 1) and
            not (node.op_type == "LSTM" and len(node.input) > 7 and node.input[7]))


def _double_activation(e: Emitter, key: str, alpha: float, beta: float) -> Activation:
    """The activation ``key`` in ops onnxruntime's CPU provider has double kernels for, ``alpha`` and ``beta``
    as doubles (the op form's attributes are float32)."""
    c = lambda value: e.const(value, np.float64)
    if key == "leakyrelu":
        return lambda v: e.op("Where", e.op("GreaterOrEqual", v, c(0.0)), v, e.op("Mul", v, c(alpha)))
    if key == "thresholdedrelu":
        return lambda v: e.op("Where", e.op("Greater", v, c(alpha)), v, c(0.0))
    if key == "hardsigmoid":
        return lambda v: e.op("Min", e.op("Max", e.op("Add", e.op("Mul", v, c(alpha)), c(beta)), c(0.0)), c(1.0))
    if key == "elu":
        return lambda v: e.op("Where", e.op("Greater", v, c(0.0)), v,
                              e.op("Mul", e.op("Sub", e.op("Exp", e.op("Min", v, c(0.0))), c(1.0)), c(alpha)))
    if key == "softsign":
        return lambda v: e.op("Div", v, e.op("Add", e.op("Abs", v), c(1.0)))
    if key == "softplus":  # max(x, 0) + log1p(exp(-|x|))
        return lambda v: e.op("Add", e.op("Relu", v), log1p(e, e.op("Exp", e.op("Neg", e.op("Abs", v)))))
    return op_activation(e, key, alpha, beta)  # Sigmoid, Tanh, Relu; Affine and ScaledTanh in Mul, Add, Tanh


def _refuse(node: onnx.NodeProto, why: str) -> BackendError:
    at = f" at {node_source(node)}" if node_source(node) else ""
    return BackendError(f"onnxruntime has no double kernel for {node.op_type} and graphc writes it out only where "
                        f"{why}: {node_label(node.name)}{at}; run it in float32 or on the numpy backend")


def _as_ir(node: onnx.NodeProto, types: dict, opset: int) -> ir.Node:
    """``node`` as an onnx-ir node in a graph of its own: its inputs typed as ``types`` has them, its named
    outputs the graph's (``write_out`` writes those)."""
    values = {}
    for name in dict.fromkeys(n for n in node.input if n):
        dtype, dims = types.get(name, (None, None))
        values[name] = ir.Value(name=name, type=ir.TensorType(ir.DataType(dtype)) if dtype else None,
                                shape=ir.Shape(dims) if dims is not None else None)
    made = ir.Node("", node.op_type, [values.get(n) for n in node.input], name=node.name, num_outputs=len(node.output),
                   attributes=[ir.serde.deserialize_attribute(a) for a in node.attribute])
    for value, name in zip(made.outputs, node.output):
        value.name = name or None
    ir.Graph(list(values.values()), [v for v in made.outputs if v.name], nodes=[made], opset_imports={"": opset})
    return made


def _stamp(nodes, props) -> None:
    """Give ``nodes`` (and their bodies' nodes) the node's metadata: the user's line, for errors."""
    for node in nodes:
        node.metadata_props.extend(props)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _stamp(a.g.node, props)


def _recurrent(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    if w.opset < 9:
        raise _refuse(node, f"the model's opset is 9 or later (a Scan without a batch axis), not {w.opset}")
    made = _as_ir(node, types, w.opset)
    unknown = unknown_activations(made)
    if unknown:
        raise _refuse(node, f"it knows its activations (ONNX has none named {unknown})")
    graph = made.graph
    outs = write_out(Emitter(graph, w.opset, w.prefix.rstrip("/")), made, activation=_double_activation)
    for value, name in zip(outs, node.output):
        if value is not None:
            value.name = name
    written = [ir.serde.serialize_node(n) for n in graph if n is not made]
    _stamp(written, node.metadata_props)
    w.nodes.extend(written)


LOWERINGS = {"RNN": _recurrent, "GRU": _recurrent, "LSTM": _recurrent}
