"""Small helpers every pass shares over onnx-ir values and graphs: the ai.onnx opset, a
value's shape as a tuple, its constant as numpy, a node's constant axes, a value swapped for
another, a node's attributes as plain values, fresh names, which nodes draw random numbers,
which nodes stop gradients, which nodes compute some values, a node's subgraphs and what they read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

__all__ = ["AUTOGRAD_DOMAIN", "AUTOGRAD_KEY", "BUFFER_UPDATE_KEY", "BUFFER_WRITE_KEY", "CLASS_LABELS_KEY", "DROPPED_MARKS_KEY",
           "EPSILON_KEY", "EXACT_KEYS", "EXCHANGE_KEY", "FAKE_QUANTIZE_KEY", "FUSED_GRADIENT_KEY", "INFERENCE_ONLY_KEY",
           "MAX_NORM_KEY",
           "MAX_NORM_LOOKUP_KEY", "MAX_NORM_ROWS_KEY", "MOMENTUM_KEY", "NO_DERIVATIVE_KEY", "PROBABILITIES_KEY",
           "RANDOM_OPS", "STOP_GRADIENT_KEY", "SYNC_BATCHNORM_KEY", "ancestors", "attr", "autograd_bound_names", "autograd_function_label", "const_array",
           "const_axes", "const_scalar", "draws_random", "drop_autograd_functions", "exact_attribute",
           "exact_attributes", "exact_float", "exchange_kind", "fixed_array", "fresh_name", "holds_autograd_functions",
           "needed_values", "node_attrs", "onnx_opset", "rebind_autograd_copy", "replace_value", "static_shape", "stops_gradient",
           "subgraph_reads", "subgraphs"]

Dim = int | str | None
StaticShape = tuple[Dim, ...]


def onnx_opset(owner: ir.Model | ir.Graph | ir.Function | Mapping[str, int], default: int) -> int:
    """The ai.onnx opset ``owner`` (a model, graph, function or its opset imports) imports under
    ``""`` or ``"ai.onnx"``; ``default`` when it imports none."""
    opsets = owner if isinstance(owner, Mapping) else owner.opset_imports
    opset = opsets.get("")
    return opsets.get("ai.onnx", default) if opset is None else opset


def static_shape(value: ir.Value) -> StaticShape | None:
    """The value's shape as ints (known), strs (symbolic) and None (unknown); None if rank unknown."""
    if value.shape is None:
        return None
    return tuple(d if isinstance(d, int) else d.value for d in value.shape)


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value as numpy if it is an initializer (a graph input's default included) or a
    ``Constant``'s output, else None."""
    if value is None:
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


# node metadata: an Identity that passes its value forward and no gradient back (``gc.detach``);
# ONNX has no stop-gradient op, so the mark is on the node and survives save and load
STOP_GRADIENT_KEY = "graphc.stop_gradient"

# node metadata: the torch function (``"special.airy_ai"``) whose result the node makes and that torch 2.13
# defines no derivative for; autodiff refuses a path through the node, naming it (``autodiff.core``)
NO_DERIVATIVE_KEY = "graphc.no_derivative"

# node metadata of a ``gc.autograd.Function``'s output (a stop-gradient Identity): a JSON record of its
# region (``autodiff/autograd_functions``), whose backward is a model-local function of this domain
AUTOGRAD_KEY = "graphc.autograd_function"
AUTOGRAD_DOMAIN = "graphc.autograd"
# model metadata: a JSON record of the gradient marks level 3 dropped: ``functions``, the Functions whose
# marks and backwards went (``autograd_function_label``), and ``stop_gradients``, how many other stop-gradient
# marks; autodiff refuses such a model (``autograd_functions.refuse_dropped``): it would send gradients
# through the forwards' nodes and where the marks stopped them
DROPPED_MARKS_KEY = "graphc.dropped_gradient_marks"
# model metadata of every model ``gc.optimize`` rewrote at level 3: a JSON record whose ``folded_parameters``
# names the floating-point initializers (parameters, BatchNorm statistics) it folded, merged or dropped;
# autodiff refuses such a model (``autograd_functions.refuse_dropped``): their gradients would be wrong or missing
INFERENCE_ONLY_KEY = "graphc.inference_only"


def autograd_function_label(record: Mapping) -> str:
    """A ``gc.autograd.Function``'s record (``AUTOGRAD_KEY``) as ``"Fn (applied at file:line)"``."""
    return f"{record['class']} (applied at {record['source']})"


# node metadata of a fake quantization's QuantizeLinear + DequantizeLinear lowering (``gc.fake_quantize_*``):
# ``"quantize"`` on the QuantizeLinear of ``x * (1 / scale)`` with scale 1 (torch's rounding), ``"output"`` on
# the Add of the value (input 0) and its straight-through gradient path (input 1, zero forward but for torch's
# per-channel int64 overflow); the inference export quantizes ``x`` by the scale itself and drops input 1
FAKE_QUANTIZE_KEY = "graphc.fake_quantize"

# node metadata of a ``binary_cross_entropy``'s range check (its Where): the graph inputs it reads as
# probabilities, directly ("p,y"), which the Trainer checks on the host before a step
PROBABILITIES_KEY = "graphc.probabilities"

# node metadata of a ``cross_entropy`` / ``nll_loss``'s class-label range test (its And): "NAME:C:IGNORE",
# the graph input it reads as class labels directly, the class count (empty where not static) and the
# ignore index, which the Trainer checks on the host before a step (the graph counts a label outside
# [0, C) in the mean's divisor with a loss of 0, where torch raises)
CLASS_LABELS_KEY = "graphc.class_labels"

# node metadata of the last node of a fused kernel that a pass wrote out (autocast's flash attention):
# autodiff takes the kernel's backward there, the rule of that name in ``FUSED_RULES``, and sends
# nothing through the kernel's other nodes
FUSED_GRADIENT_KEY = "graphc.fused_gradient"
# node metadata of a Scan ("true") whose gradient is taken in reverse mode at any length (``grad_scan``
# does not unroll it): an RNN/GRU/LSTM written out as a Scan, which is faster so (``autodiff/recurrent``)
REVERSE_MODE_KEY = "graphc.reverse_mode"


def holds_autograd_functions(model: ir.Model) -> bool:
    """Whether ``model`` has a ``gc.autograd.Function`` backward (an ``AUTOGRAD_DOMAIN`` function) or
    imports the domain: what ``drop_autograd_functions`` drops."""
    return any(key[0] == AUTOGRAD_DOMAIN for key in model.functions) or AUTOGRAD_DOMAIN in model.opset_imports


def drop_autograd_functions(model: ir.Model) -> bool:
    """Drop the ``gc.autograd.Function`` backwards (``AUTOGRAD_DOMAIN``'s functions, which no node calls)
    and the domain's import from ``model``, in place: a graph no pass differentiates again is plain
    ONNX without them. Returns whether there were any (``holds_autograd_functions``)."""
    held = holds_autograd_functions(model)
    for key in [key for key in model.functions if key[0] == AUTOGRAD_DOMAIN]:
        del model.functions[key]
    model.opset_imports.pop(AUTOGRAD_DOMAIN, None)
    return held


def _rebind_autograd(graph: ir.Graph | None, old: str, new: str) -> None:
    """The ``gc.autograd.Function`` records on ``graph``'s markers that bind the value named ``old``
    (an input its gradient goes to, a forward value its backward reads) bind ``new`` instead. Only a
    graph importing ``AUTOGRAD_DOMAIN`` (its model holds the backwards) is searched: a search of every
    node per call took 4.3 % of ResNet-50's ``generate`` (187 calls, 71-77 ms of 1.6-1.8 s CPU)."""
    if graph is None or AUTOGRAD_DOMAIN not in graph.opset_imports:
        return
    for node in graph:
        text = node.metadata_props.get(AUTOGRAD_KEY)
        if text is None or json.dumps(old) not in text:
            continue
        record = _renamed(json.loads(text), lambda name: new if name == old else name)
        node.metadata_props[AUTOGRAD_KEY] = json.dumps(record)


def rebind_autograd_copy(node: ir.Node, names: Mapping[str, str]) -> None:
    """A copy of a ``gc.autograd.Function`` marker (a loop body's step unrolled or taped, an If branch
    cloned for its gradient) binds the copies of the values its original bound: ``names`` maps an
    original's name to its copy's (a value it does not name, read from outside the copied body, stays)."""
    text = node.metadata_props.get(AUTOGRAD_KEY)
    if text is None:
        return
    node.metadata_props[AUTOGRAD_KEY] = json.dumps(_renamed(json.loads(text), lambda name: names.get(name, name)))


def autograd_bound_names(record: dict) -> set[str]:
    """The names a ``gc.autograd.Function`` record binds (``inputs``, ``reads``), its variants' too."""
    return {name for part in (record, *record.get("variants", ())) for key in ("inputs", "reads") for name in part[key]}


def _renamed(record: dict, rename: Callable[[str], str]) -> dict:
    """``record`` (and its variants, ``graphc.dsl.autograd``'s backwards given fewer gradients) binding
    ``rename(name)`` for each name it binds."""
    for part in (record, *record.get("variants", ())):
        for key in ("inputs", "reads"):
            part[key] = [rename(name) for name in part[key]]
    return record


def stops_gradient(node: ir.Node) -> bool:
    """Whether ``node`` is a ``gc.detach`` Identity: autodiff sends no gradient through it."""
    return node.op_type == "Identity" and node.metadata_props.get(STOP_GRADIENT_KEY) == "true"


# node metadata of a ``gc.nn.SyncBatchNorm``'s BatchNormalization ("true"): its training graphs
# normalise by the statistics of every data-parallel worker's shard (``training.sync_batchnorm``)
SYNC_BATCHNORM_KEY = "graphc.sync_batchnorm"

# BatchNormalization node metadata: ``repr`` of a float64 input's eps and ONNX momentum (torch's
# 1 - momentum) where its float32 attribute cannot hold them (1e-5 is 9.99999974e-6 there, 0.9 is
# 0.899999976), which ``exact_attribute`` reads for the attribute
EPSILON_KEY = "graphc.epsilon"
MOMENTUM_KEY = "graphc.momentum"
EXACT_KEYS = {"epsilon": EPSILON_KEY, "momentum": MOMENTUM_KEY}


def exact_attribute(name: str, value: float, metadata: Mapping[str, str]) -> float:
    """A BatchNormalization's float attribute ``name`` (``value``), or the double its node ``metadata``
    records (``EXACT_KEYS``) where the attribute is that double (rounded to float32 once saved); an
    inference node with the eps added to its variance input (``epsilon=0``, as ``ops_nn.batch_norm``
    captures it) keeps 0."""
    exact = metadata.get(EXACT_KEYS.get(name, ""))
    return float(exact) if exact is not None and value in (float(exact), float(np.float32(exact))) else value


def exact_float(node: ir.Node, name: str, default: float) -> float:
    """``node``'s float attribute ``name`` (``default`` where it has none) as ``exact_attribute`` reads it."""
    return exact_attribute(name, node.attributes.get_float(name, default), node.metadata_props)


def exact_attributes(node: onnx.NodeProto, attrs: dict) -> dict:
    """``attrs`` (``node``'s attributes as values) with those named in ``EXACT_KEYS`` as
    ``exact_attribute`` reads them from ``node``'s metadata; ``attrs`` itself where it has none."""
    metadata = {e.key: e.value for e in node.metadata_props}
    if not metadata:
        return attrs
    exact = {name: exact_attribute(name, attrs[name], metadata) for name in EXACT_KEYS.keys() & attrs.keys()}
    return {**attrs, **exact}


# node metadata of an Identity that marks a data-parallel exchange: "gather", every worker's input
# ([1, ...]) stacked in rank order; "gather_grad", its adjoint (each worker's share-weighted
# cotangents summed, over this worker's share, its own row: ``runtime.staged``). In one process
# both are the identity. The text is from when the exchanges were all-reduces, kept as saved
# artifacts carry it
EXCHANGE_KEY = "graphc.all_reduce"


def exchange_kind(node: ir.Node) -> str | None:
    """``"gather"`` or ``"gather_grad"`` for an exchange Identity (``EXCHANGE_KEY``), else None."""
    return node.metadata_props.get(EXCHANGE_KEY) if node.op_type == "Identity" else None


# node metadata of a module buffer written in a training-mode forward (``self.u.copy_(new)``): each
# write is a stop-gradient Identity marked with the buffer's name (``BUFFER_WRITE_KEY``), the last
# one, whose output is the buffer's value after the forward, ``BUFFER_UPDATE_KEY`` too
BUFFER_WRITE_KEY = "graphc.buffer_write"
BUFFER_UPDATE_KEY = "graphc.buffer_update"

# node metadata of an embedding lookup with torch's ``max_norm`` (``F.embedding``): the weight with the
# rows looked up renormalised, a stop-gradient Identity marked "<param> at <the user's line>"; the
# training graphs step the param from its last such value, as torch's optimizer steps it
MAX_NORM_KEY = "graphc.max_norm"
# node metadata of such a lookup whose write-back is not in the graph (its rows' stop-gradient Identity):
# JSON {"param", "at", and, where capture dropped an unread write-back, the names of the "weight" value
# and the "indices" it looked up, for the training graphs to write it back; inside a control-flow body
# that cannot carry a weight from outside it out (an If or Loop in a ``gc.vmap`` body; a vmap body reading a
# table it closes over besides its lookups), neither: the training graphs refuse it}
MAX_NORM_ROWS_KEY = "graphc.max_norm_rows"
# node metadata of such a lookup's Gather of the weight: JSON {"max_norm", "norm_type"}, which the
# inference and eval graphs compare to drop a control-flow body's carried weight (``max_norm_carries``)
MAX_NORM_LOOKUP_KEY = "graphc.max_norm_lookup"


# ops whose kernels draw random numbers: each run draws anew, two equal nodes are two draws
RANDOM_OPS = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Bernoulli",
                        "Multinomial"})


def draws_random(node: ir.Node) -> bool:
    """Whether ``node`` draws random numbers, so no pass may fold it or merge it with an equal
    node: an op of ``RANDOM_OPS``, or a Dropout that may run in training mode (its
    ``training_mode`` input is neither absent nor a constant false no caller can feed)."""
    if node.op_type in RANDOM_OPS:
        return True
    if node.op_type != "Dropout" or len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    mode = node.inputs[2]
    array = None if mode.is_graph_input() else const_array(mode)
    return array is None or bool(np.any(array))


def const_scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant (an initializer or a ``Constant``'s output) that is
    not a graph input (a fed one may differ), else None."""
    if value is None or value.is_graph_input():
        return None
    array = const_array(value)
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def fixed_array(value: ir.Value | None) -> np.ndarray | None:
    """The numpy value of a constant no caller can override (its ``const_value`` is set and it
    is not a graph input, so an initializer a caller may feed does not count), else None; None
    too for external data that is not available."""
    if value is None or value.const_value is None or value.is_graph_input():
        return None
    try:
        return value.const_value.numpy()
    except FileNotFoundError:
        return None


def const_axes(node: ir.Node, read: Callable[[ir.Value], np.ndarray | None] = fixed_array) -> list[int] | None:
    """A node's constant axes: its ``axes`` input as ``read`` gives it (``fixed_array`` by default;
    ``const_array`` also reads a ``Constant``'s output that no pass has folded) or, where its
    opset has none, the attribute; [] when neither is given, None when the input is not constant."""
    if len(node.inputs) > 1:
        if node.inputs[1] is None:
            return []
        array = read(node.inputs[1])
        return None if array is None else [int(a) for a in np.asarray(array).ravel()]
    attr = node.attributes.get("axes")
    return [] if attr is None else [int(a) for a in attr.value]


def replace_value(old: ir.Value, new: ir.Value, uses: Iterable | None = None,
                  suffix: str = "replaced") -> None:
    """Uses of ``old`` read ``new`` (only ``uses`` where given: those taken before ``new``'s nodes
    read ``old`` too); a graph output ``old`` becomes ``new`` under the old name, ``old`` renamed
    ``<name>/<suffix>``. A ``gc.autograd.Function`` bound to ``old`` by name is bound to ``new``."""
    graph, before = old.graph, old.name
    name = old.name if old.is_graph_output() else None
    if uses is None:
        old.replace_all_uses_with(new, replace_graph_outputs=True)
    else:
        for use in uses:
            use.node.replace_input_with(use.idx, new)
        if name is not None:
            outputs = old.graph.outputs
            outputs[outputs.index(old)] = new
    if name is not None:
        old.name = f"{name}/{suffix}"
        new.name = name
    if before and new.name and new.name != before:
        _rebind_autograd(graph, before, new.name)


def attr(node: ir.Node, name: str, default=None):
    """The value of ``node``'s attribute ``name``; ``default`` where it has none."""
    a = node.attributes.get(name)
    return default if a is None else a.value


def node_attrs(node: ir.Node, drop: Sequence[str] = ()) -> dict:
    """The node's attributes as ``onnx.helper.make_node`` keywords, less ``drop``."""
    from onnx import helper

    return {k: helper.get_attribute_value(ir.serde.serialize_attribute(a)) for k, a in node.attributes.items()
            if k not in drop}


def fresh_name(taken: set[str], stem: str, sep: str = "_") -> str:
    """``stem``, or ``stem<sep><n>`` for the first n from 1 that makes it new to ``taken``
    (which gets it)."""
    name, n = stem, 0
    while name in taken:
        n += 1
        name = f"{stem}{sep}{n}"
    taken.add(name)
    return name


def ancestors(values: Iterable[ir.Value]) -> set[ir.Node]:
    """The nodes that compute ``values`` (their producers included), in this graph."""
    found: set[ir.Node] = set()
    todo = [v.producer() for v in values]
    while todo:
        node = todo.pop()
        if node is not None and node not in found:
            found.add(node)
            todo.extend(v.producer() for v in node.inputs if v is not None)
    return found


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node``'s attributes hold (an If's branches, a Loop's or Scan's body); [] for none."""
    return [g for a in node.attributes.values()
            for g in ([a.value] if a.type == ir.AttributeType.GRAPH else
                      list(a.value) if a.type == ir.AttributeType.GRAPHS else [])]


def needed_values(graph: ir.Graph, outputs: Sequence[ir.Value]) -> tuple[set[ir.Value], dict[ir.Node, list[ir.Value]]]:
    """The values ``graph``'s nodes compute ``outputs`` from (``outputs``, ``graph``'s inputs and outer
    values included), a value a subgraph captures expanded as a node input is; and the values each of those
    nodes with subgraphs reads in them (``subgraph_reads``)."""
    found: set[ir.Value] = set()
    reads: dict[ir.Node, list[ir.Value]] = {}
    expanded: set[ir.Node] = set()
    todo = list(outputs)
    while todo:
        value = todo.pop()
        if value in found:
            continue
        found.add(value)
        node = value.producer()
        if node is None or node in expanded or node.graph is not graph:
            continue
        expanded.add(node)
        todo.extend(v for v in node.inputs if v is not None)
        if subgraphs(node):
            reads[node] = subgraph_reads(node)
            todo.extend(reads[node])
    return found, reads


def subgraph_reads(node: ir.Node) -> list[ir.Value]:
    """The values a node's subgraphs' nodes read (the outer ones they capture among them)."""
    return [v for sub in subgraphs(node) for n in ir.traversal.RecursiveGraphIterator(sub) for v in n.inputs
            if v is not None]
