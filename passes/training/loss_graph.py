"""The loss after a model output, as the training and gradient graphs take it: ``append_loss``
splices a loss graph (``gc.losses``, captured by ``graphc.compile.training``) after the output,
with a new label input, or takes a scalar output as the loss; either way the loss value is named
``loss``. ``free_names`` makes the names such graphs add free in the model first."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import onnx_ir as ir

from graphc.errors import PassError
from graphc.passes.emit import Emitter
from graphc.passes.training import imports
from graphc.passes.values import onnx_opset

LOSS = "loss"


@dataclass
class LossArgs:
    """``output``: the model output the loss reads (or, with no ``build``, the scalar loss
    itself). ``build(output_value, opset)`` returns a model with two inputs (prediction,
    label) and one scalar output: the loss graph, spliced after ``output`` with its label input
    renamed ``label`` (``graphc.compile.training`` captures it from the DSL's ``gc.losses``)."""

    output: str
    label: str | None = None
    build: Callable[[ir.Value, int], ir.Model] | None = None


def free_names(graph: ir.Graph, reserved: Mapping[str, str]) -> None:
    """The ``reserved`` names (name -> what the graphs made from ``graph`` use it for) made free
    in ``graph``: a value inside the model that has one is renamed; a graph input, initializer or
    output of one is an error saying which."""
    interface = {**{v.name: "output" for v in graph.outputs}, **{n: "initializer" for n in graph.initializers},
                 **{v.name: "input" for v in graph.inputs}}
    clashes = [f"{interface[name]} {name!r} ({why})" for name, why in reserved.items() if name in interface]
    if clashes:
        raise PassError(f"the model's {', '.join(clashes)} has a name the graphs made from it give to their "
                        f"own value; rename it in the model")
    names = Emitter(graph, onnx_opset(graph, 0), "model")
    for node in ir.traversal.RecursiveGraphIterator(graph):
        for value in node.outputs:
            if value.name in reserved:
                value.name = names.fresh(value.name)


def append_loss(graph: ir.Graph, opset: int, loss: LossArgs) -> str | None:
    """Append the loss named ``loss``; returns the label input's name (None for a given loss)."""
    outputs = {v.name: v for v in graph.outputs}
    if loss.output not in outputs:
        raise PassError(f"loss output {loss.output!r} is not an output of the model; outputs: {sorted(outputs)}")
    out = outputs[loss.output]
    if loss.build is None:
        dims = list(out.shape) if out.shape is not None else []
        if not imports.is_float(out) or not all(d == 1 for d in dims):  # [] or [1, ...]
            raise PassError(f"loss {loss.output!r} must be a float scalar, got {out.dtype} {out.shape}")
        if out.name != LOSS:
            Emitter(graph, opset, "loss").op("Identity", out, name=LOSS)
        return None
    if loss.label in {v.name for v in graph.inputs} | set(graph.initializers) | set(outputs):
        raise PassError(f"the name {loss.label!r} is already used in the model; choose another label name")
    _splice_loss(graph, loss.build(out, opset).graph, out, loss.label)
    return loss.label


def _splice_loss(graph: ir.Graph, loss_graph: ir.Graph, out: ir.Value, label_name: str) -> None:
    """Move the nodes of ``loss_graph`` (inputs: prediction, label) into ``graph``: the
    prediction becomes ``out``, the label a new input, the output ``loss``; the moved nodes and
    values are prefixed ``loss/`` so no name collides with the model's."""
    pred, label = loss_graph.inputs
    result = loss_graph.outputs[0]
    if loss_graph.initializers or result.producer() is None:
        raise PassError("a loss graph must compute its output with nodes and hold no initializers")
    nodes = list(loss_graph)
    loss_graph.inputs.clear()
    loss_graph.outputs.clear()
    loss_graph.remove(nodes)
    for node in nodes:
        node.name = f"loss/{node.name}"
        for value in node.outputs:
            value.name = f"loss/{value.name}"
        graph.append(node)
    pred.replace_all_uses_with(out)
    label.name = label_name
    graph.inputs.append(label)
    result.name = LOSS
