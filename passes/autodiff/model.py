"""``gradient_model``: a model whose outputs add ``<param>_grad`` (what ``gc.grad`` returns)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir

from graphc.errors import AutodiffError
from graphc.passes.autodiff.autograd_functions import refuse_dropped
from graphc.passes.autodiff.builder import FLOAT_TYPES, const_array, folded_array
from graphc.passes.autodiff.ceil_pools import floor_ceil_pools
from graphc.passes.autodiff.core import DEFAULT_OPSET, backward
from graphc.passes.autodiff.loops import lower_sequences, unroll_static_loops
from graphc.passes.autodiff.recurrent import unroll_recurrent
from graphc.passes.autodiff.registry import RULES
from graphc.passes.evaluate import run_graph
from graphc.passes.functions import expand_functions
from graphc.passes.infer import correct_onnx_inference
from graphc.passes.values import BUFFER_WRITE_KEY, drop_autograd_functions, fresh_name, onnx_opset


def infer_shapes(model: ir.Model) -> ir.Model:
    """A copy of ``model`` with inferred value shapes and types (the original if inference fails),
    what onnx infers wrong corrected (``correct_onnx_inference``)."""
    proto = ir.serde.serialize_model(model)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001  (inference is best effort: rules fall back to Shape ops)
        pass
    new = ir.serde.deserialize_model(proto)
    correct_onnx_inference(new.graph, onnx_opset(new, DEFAULT_OPSET))
    return new


_INTEGERS = frozenset({ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL})  # and conditions
_LOCAL_SIZE = 64  # elements at most of a constant copied into a subgraph: axes, shapes, pads, repeats


def localize_outer_constants(model: ir.Model) -> int:
    """Give each subgraph (If branches, Loop and Scan bodies) a Constant of its own for each
    small integer constant it reads from an outer graph (an Unsqueeze's axes, a Reshape's shape,
    a Tile's repeats): onnx's shape inference reads no data across scopes, so a branch's
    Unsqueeze by a main-graph axes constant, and everything after it, went unshaped, and
    rules that need static shapes (Tile's) failed. In place; returns how many constants were
    copied."""
    nodes = [n for n in ir.traversal.RecursiveGraphIterator(model.graph) if n.graph is not model.graph]
    if not nodes:
        return 0
    taken = {v.name for n in ir.traversal.RecursiveGraphIterator(model.graph) for v in n.outputs}
    taken |= {v.name for v in [*model.graph.inputs, *model.graph.initializers.values()]}
    copies: dict[tuple[int, ir.Value], ir.Value] = {}
    for node in nodes:
        for i, value in enumerate(node.inputs):
            if value is None or value.graph is node.graph or value.is_graph_input():
                continue
            array = const_array(value)
            if array is None or array.size > _LOCAL_SIZE or array.dtype.kind not in "iub":
                continue
            key = (id(node.graph), value)
            if key not in copies:
                const = ir.node("Constant", [], attributes={"value": ir.tensor(array)},
                                name=fresh_name(taken, f"{value.name}_local/Constant"))
                const.outputs[0].name = fresh_name(taken, f"{value.name}_local")
                const.outputs[0].type, const.outputs[0].shape = value.type, ir.Shape(array.shape)
                node.graph.insert_before(node, const)
                copies[key] = const.outputs[0]
            node.replace_input_with(i, copies[key])
    return len(copies)


def fold_integer_values(model: ir.Model) -> int:
    """Replace integer and boolean values the model computes from constants alone (pads, shapes,
    axes that exporters build with ConstantOfShape/Concat/Transpose/Cast, the Shape of a static
    value, a rank test) by initializers, so that shape inference, which cannot evaluate such
    chains, sees them; an If whose condition is then constant is replaced by its branch; and
    subgraphs get copies of the small integer constants they read from outer graphs
    (``localize_outer_constants``). Only integers and booleans: float subgraphs of weights stay
    as they are (their initializers are the params). Needs dtypes (run shape inference first);
    returns how many nodes went away or were copied."""
    return _fold_main_graph(model.graph) + localize_outer_constants(model)


def _fold_main_graph(graph: ir.Graph) -> int:
    """``fold_integer_values`` on ``graph``'s own nodes, without the subgraph copies; returns how
    many nodes went away."""
    taken = {v.name for n in graph for v in n.outputs} | set(graph.initializers) | {v.name for v in graph.inputs}
    count, folded_here = 0, set()
    # buffers a training-mode forward writes (a call counter): state from step to step, not constants
    state = {n.metadata_props[BUFFER_WRITE_KEY] for n in graph if BUFFER_WRITE_KEY in n.metadata_props}
    for node in list(graph):  # in order: a folded producer makes its consumers constant too
        outputs = [v for v in node.outputs if v.name]
        if (node.op_type == "Constant" or not outputs or any(v.dtype not in _INTEGERS for v in outputs)
                or any(v.is_graph_output() for v in outputs)
                or (node.op_type != "Shape" and any(v is not None and (const_array(v) is None or v.name in state)
                                                    for v in node.inputs))):
            continue
        arrays = [folded_array(v) for v in outputs]
        if any(a is None for a in arrays):
            continue
        for value, array in zip(outputs, arrays):
            name = fresh_name(taken, f"{value.name}_folded")
            folded = ir.Value(name=name, type=value.type, shape=ir.Shape(array.shape), const_value=ir.tensor(array))
            graph.register_initializer(folded)
            value.replace_all_uses_with(folded)
            folded_here.add(folded)
        graph.remove(node, safe=True)
        count += 1
    return count + _inline_constant_ifs(graph, folded_here)


def _inline_constant_ifs(graph: ir.Graph, conditions: set[ir.Value]) -> int:
    """Replace each main-graph If whose condition is one of ``conditions`` (values just folded:
    a test the exporter computed from constants, as TorchScript writes rank tests for
    torch.tile) by the nodes of the branch it takes; returns how many."""
    count = 0
    for node in list(graph):
        if node.op_type != "If" or node.inputs[0] not in conditions or any(v.is_graph_output() for v in node.outputs):
            continue
        branch = node.attributes["then_branch" if bool(node.inputs[0].const_value.numpy()) else "else_branch"].value
        for name, value in list(branch.initializers.items()):
            branch.initializers.pop(name)
            graph.register_initializer(value)
        for inner in list(branch):
            branch.remove(inner)
            graph.insert_before(node, inner)
        for out, value in zip(node.outputs, list(branch.outputs)):
            out.replace_all_uses_with(value)
        branch.outputs.clear()  # the moved values are no longer outputs of a (dead) branch
        graph.remove(node, safe=True)
        count += 1
    return count


def fill_unknown_ranks(model: ir.Model) -> bool:
    """Give values whose rank shape inference could not find (a Reshape to a shape computed
    from Shape/Slice/Concat, as torch.onnx writes attention) the rank they have when the model
    runs once on a small dummy batch (symbolic dims set to 2) with the compile-time evaluator.
    Dims stay unknown: only the rank is recorded, which does not depend on the batch. Returns
    whether any value changed."""
    graph = model.graph
    unknown = [v for node in graph for v in node.outputs
               if v.shape is None and v.name and isinstance(v.type, ir.TensorType)]  # not sequences
    if not unknown:
        return False
    try:
        feeds = {v: _dummy(v) for v in graph.inputs if not v.is_initializer()}
        values = run_graph(graph, feeds, onnx_opset(model, DEFAULT_OPSET))
    except Exception:  # noqa: BLE001 - a probe that fails leaves the ranks unknown
        return False
    for value in unknown:
        value.shape = ir.Shape([None] * np.ndim(values[value]))
    return True


def _dummy(value: ir.Value) -> np.ndarray:
    if value.shape is None:
        raise ValueError(f"input {value.name!r} has no shape; cannot probe ranks")
    dims = [d if isinstance(d, int) else 2 for d in value.shape]
    return np.zeros(dims, dtype=value.dtype.numpy())


def body_constants_as_nodes(model: ir.Model) -> int:
    """Each subgraph's initializers (``gc.optimize`` folds a Loop or Scan body's constants into them) as Constant
    nodes at the subgraph's start, under their names: the gradient copies a body's nodes (unrolled steps, the
    reverse-mode backward, a Function's region), never its initializers. In place; returns how many."""
    count = 0
    for sub in [a.value for n in ir.traversal.RecursiveGraphIterator(model.graph) for a in n.attributes.values()
                if a.type == ir.AttributeType.GRAPH]:
        for name, value in list(sub.initializers.items()):
            if value.is_graph_input():
                continue
            node = ir.node("Constant", [], attributes={"value": value.const_value}, name=f"{name}/Constant")
            if len(sub):
                sub.insert_before(sub[0], node)
            else:
                sub.append(node)
            value.replace_all_uses_with(node.outputs[0], replace_graph_outputs=True)
            sub.initializers.pop(name)
            node.outputs[0].name, node.outputs[0].type, node.outputs[0].shape = name, value.type, value.shape
            count += 1
    return count


# function ops autodiff leaves alone: integer index builders with no gradient to give (Range's
# body is a Loop, which would hide the ranks of everything computed from it)
_KEEP_UNEXPANDED = frozenset({"Range"})


def expand_for_autodiff(model: ir.Model) -> int:
    """Rewrite, in place, ops without a gradient rule into ops with rules: ONNX function ops
    into their bodies (``expand_functions``), bodies' initializers as Constants
    (``body_constants_as_nodes``), RNN/GRU/LSTM unrolled (``unroll_recurrent``), Loops whose
    step count the constants decide unrolled (``unroll_static_loops``; the Ifs in their copies
    then fold), sequences of a known length as tensors (``lower_sequences``); and
    ceil_mode pools onnxruntime would mis-shape as floor pools (``floor_ceil_pools``).
    Returns how many nodes were rewritten."""
    count = (body_constants_as_nodes(model)
             + expand_functions(model, lambda node: node.op_type not in RULES and node.op_type not in _KEEP_UNEXPANDED)
             + unroll_recurrent(model) + floor_ceil_pools(model))
    loops = unroll_static_loops(model)
    if loops:
        while _fold_main_graph(model.graph):  # an inlined If may hold another If that now folds
            pass
        localize_outer_constants(model)  # once: folding reads and writes the main graph only
    return count + loops + lower_sequences(model)


def gradient_model(model: ir.Model, loss: str, wrt: Sequence[str] | None = None) -> ir.Model:
    """A new model: ``model``'s inputs plus each ``wrt`` parameter as an input (its initializer
    is the default), and ``model``'s outputs plus ``"<param>_grad"`` for each. The backward reads
    recomputed copies of the values of ``gc.utils.checkpoint`` regions, as the training graphs'.

    ``loss`` names a scalar float output. ``wrt`` names initializers (or float graph inputs);
    by default every floating-point initializer. The input model is not modified.
    """
    from graphc.passes.training.recompute import recompute  # which imports this package

    refuse_dropped(model)
    new = infer_shapes(model)
    graph = new.graph
    outputs = {v.name: v for v in graph.outputs}
    if loss not in outputs:
        raise AutodiffError(f"loss {loss!r} is not an output of the model; outputs: {sorted(outputs)}")
    if wrt is None:
        wrt = [name for name, v in graph.initializers.items() if v.dtype in FLOAT_TYPES]
    inputs = {v.name: v for v in graph.inputs}
    taken = {v.name for v in graph.outputs} | set(inputs)
    for name in wrt:
        if name not in graph.initializers and name not in inputs:
            raise AutodiffError(f"cannot differentiate with respect to {name!r}: no initializer or input "
                                f"has that name; initializers: {sorted(graph.initializers)}")
        if f"{name}_grad" in taken:
            raise AutodiffError(f"output name {name + '_grad'!r} is already used in the model")
        if name not in inputs:  # before the passes, so none reads a param's initial value as a constant
            inputs[name] = graph.initializers[name]
            graph.inputs.append(inputs[name])
    if fold_integer_values(new):
        new = infer_shapes(new)
    if expand_for_autodiff(new):
        new = infer_shapes(new)
        fill_unknown_ranks(new)
    graph = new.graph
    values = {v.name: v for v in graph.inputs}
    params = [values[name] for name in wrt]
    forward = {node.name for node in graph}
    grads = backward(graph, {v.name: v for v in graph.outputs}[loss], params, functions=new.functions)
    recompute(graph, forward, onnx_opset(new, DEFAULT_OPSET), everywhere=False)  # checkpoint regions, as generate's
    drop_autograd_functions(new)  # the Functions' backwards are in the graph now: plain ONNX
    for p in params:
        node = ir.node("Identity", [grads[p.name]], name=f"{p.name}_grad/Identity")
        node.outputs[0].name = f"{p.name}_grad"
        node.outputs[0].shape, node.outputs[0].type = p.shape, p.type
        graph.append(node)
        graph.outputs.append(node.outputs[0])
    return new
