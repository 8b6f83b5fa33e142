"""The generic cleanups graphc takes from onnx-ir and onnxscript instead of writing them again."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnx_ir.passes.common import common_subexpression_elimination as _cse
from onnx_ir.passes.common import unused_removal as _unused_removal
from onnxscript.optimizer import _constant_folding

from graphc.passes.optimize.pipeline import _SUBGRAPH_OPS, all_nodes

__all__ = ["CommonSubexpressionElimination", "DeduplicateConstants", "IdentityElimination",
           "LiftConstantsToInitializers", "RemoveUnusedNodes", "cleanup_passes",
           "finish_passes", "fold_constants_pass", "parameter_names"]

# Below level 3 folding is bounded so the model never balloons: a node whose constant input
# has more elements than INPUT_LIMIT is left alone (level 3 folds it), and no folded result
# larger than OUTPUT_LIMIT elements is stored (onnxscript's own defaults, named here).
INPUT_LIMIT = _constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT
OUTPUT_LIMIT = _constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT
SMALL_CONSTANT = 1024  # elements: a ConstantOfShape up to this size is folded

# Effects (``Pipeline``): the only change a pass with that ``effect`` makes.
DEAD = "dead"    # removes nodes no output depends on, unused initializers and optional outputs
DEDUP = "dedup"  # points the uses of an initializer at a byte-identical one and drops it
IDENTITY = "identity"  # points the uses of an Identity's output at its input and drops the node
SHAPES = "shapes"  # gives values types and shapes (static dims included): no node changes


def _named(p: ir.passes.PassBase, name: str, structural: bool = True) -> ir.passes.PassBase:
    """Give a library pass the name the report shows; ``structural=False`` marks passes whose
    ``modified`` flag says nothing about the node list (sorting, type annotation)."""
    p.name = name
    p.structural = structural
    return p


def _names_unique(model: ir.Model) -> bool:
    """Whether ``model`` is a flat graph (no function, no subgraph) whose nodes and values all
    have names, no two alike: then onnx-ir's ``NameFixPass`` has nothing to do."""
    if model.functions:
        return False
    graph = model.graph
    node_names: set[str] = set()
    values: dict[int, str] = {}
    for value in (*graph.inputs, *graph.outputs, *graph.initializers.values()):
        values[id(value)] = value.name
    for node in graph:
        name = node.name
        if not name or name in node_names or node.op_type in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            return False
        node_names.add(name)
        for value in node.inputs:
            if value is not None:
                values[id(value)] = value.name
        for value in node.outputs:
            values[id(value)] = value.name
    names = set(values.values())
    return len(names) == len(values) and "" not in names and None not in names


class NameFix(common.NameFixPass):
    """onnx-ir's ``NameFixPass`` (unnamed nodes and values get names, a duplicate name gets a
    unique one), skipped when it would change nothing (``_names_unique``): the check is a
    fraction of the pass, and onnxscript's folder and rewriter run it after every change."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if _names_unique(model):
            return ir.passes.PassResult(model, False)
        return super().call(model)


class FoldConstants(_constant_folding.FoldConstantsPass):
    """onnxscript's ``FoldConstantsPass.call`` step for step, with ``NameFix`` for its closing
    ``NameFixPass`` (the same renaming, skipped when every name is already unique).

    What can enable it again (``Pipeline``): merging equal initializers (``DEDUP``) never can,
    nor can identity elimination (``IDENTITY``): the folder itself points every use of an
    Identity's output at its input as it visits (onnxscript's Identity evaluator), so removing
    the Identity shows it no constant input it has not already seen.
    Dead-node removal (``DEAD``) can only through the folder's size gates, which count the
    uses of a node's constant inputs (with ``size_gated``: below level 3): a node whose inputs
    are all constant may fold once a dead use of a big input is gone. So after each run the
    pass notes whether any such node is left (``_blocked``; checked in flat graphs, assumed
    with functions or subgraphs); with none, removing nodes cannot make one (it creates no
    constant), and dead-node removal is ignored until the folder runs again."""

    size_gated = True
    _blocked = True

    @property
    def ignores(self) -> frozenset[str]:
        return frozenset({DEDUP, IDENTITY} if self.size_gated and self._blocked else {DEDUP, IDENTITY, DEAD})

    def process_node(self, node: ir.Node, is_function: bool):
        """onnxscript's ``process_node``, answered early for a node it would leave alone: one
        with a non-constant input, no input it would redirect (a symbolic value that is an
        ``ir.Value``), not a ``Constant`` and no partial evaluator for its op. Such a node
        reaches none of the folder's rewrites; skipping its checks (attribute scans, evaluator
        lookup) saves about a tenth of the pass on an exported attention block."""
        if node.op_type != "Constant" and (node.domain, node.op_type) not in _EVALUATED:
            get = self._state.get_sym_value
            some_variable = False
            for value in node.inputs:
                if value is None:
                    continue
                sym = get(value)
                if sym is not None and isinstance(sym, ir.Value):
                    break
                some_variable = some_variable or value.const_value is None
            else:
                if some_variable:
                    return None
        try:
            return super().process_node(node, is_function)
        except RuntimeError as exc:
            # One of onnxscript's partial evaluators failed on a node it misreads (e.g.
            # SplitToSequence whose split is a graph input): the node is left as it is.
            if str(exc).startswith("Error during constant folding"):
                return None
            raise

    def _prepare_folded_tensor(self, node: ir.Node, output_name: str, output_array):
        """onnxscript's helper step for step (wrap, name, size gate), except that it builds the
        ``ir.Tensor`` directly: ``ir.tensor`` gets there too, after three runtime protocol
        checks that cost ten times the wrapping."""
        if not isinstance(output_array, np.ndarray):
            return None
        tensor = ir.Tensor(output_array, name=output_name)
        if output_array.size > self.output_size_limit:
            removed = 0
            for value in node.inputs:
                if value is not None and len(value.uses()) == 1:
                    array = _constant_folding._get_numpy_value(value)
                    if array is not None:
                        removed += array.size
            if output_array.size - removed > 0:
                return None
        return tensor

    def call(self, model: ir.Model) -> _constant_folding.FoldConstantsResult:
        self._reset()
        self._opset_imports = model.opset_imports
        self.visit_graph(model.graph)
        for function in model.functions.values():
            self.visit_function(function)
        if self._modified:
            NameFix()(model)
        if self.size_gated:
            self._blocked = _has_constant_node(model)
        return _constant_folding.FoldConstantsResult(model, self._modified, self._state.symbolic_value_map)


# ops with a partial evaluator in onnxscript's folder (Shape, Reshape, Gather, Cast, ...)
_EVALUATED = frozenset(_constant_folding.registry.op_evaluators)


def _has_constant_node(model: ir.Model) -> bool:
    """Whether a node other than ``Constant`` reads only constants (initializers included),
    or the model has functions or subgraphs (not searched: assumed so)."""
    if model.functions:
        return True
    for node in model.graph:
        if node.op_type in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            return True
        if node.op_type == "Constant":
            continue
        inputs = [v for v in node.inputs if v is not None]
        if inputs and all(v.const_value is not None for v in inputs):
            return True
    return False


def fold_constants_pass(protected: frozenset[str] = frozenset(), level: int = 1) -> ir.passes.PassBase:
    """onnxscript's constant folder: evaluates nodes whose inputs are all constants (never graph
    inputs, so initializers a caller may override stay live) with the ONNX reference evaluator,
    and partially evaluates shape ops (``Shape``, ``Gather``/``Concat`` of shapes, ``Size``)
    from the static dims it knows, keeping symbolic dims symbolic. It also turns a ``Dropout``
    that the ONNX spec defines as identity (opset >= 12, no or false ``training_mode``, or ratio
    0) into Identity; training-mode Dropout is left as is.

    Below level 3, nodes reading a ``protected`` initializer (a parameter) are not folded, so
    the parameter keeps its name and layout for state dicts and a later
    ``gc.training.generate``, and folding stops at ``INPUT_LIMIT``/``OUTPUT_LIMIT`` elements
    (a shared weight is never stored twice). At level 3 (inference export) weights are final:
    every constant subgraph is folded whatever its size -- constant weight transposes, slices
    and reshapes are pre-applied, so the runtime never does them at load or run time."""

    def should_fold(node: ir.Node) -> bool | None:
        if protected and any(v is not None and v.name in protected and v.is_initializer() for v in node.inputs):
            return False
        if node.op_type == "Identity":
            # the folder's Identity evaluator already points every use at the input; folding it
            # too would copy a constant input (a whole weight, at level 3) for dedup to merge back
            return False
        if node.op_type == "ConstantOfShape" and node.inputs and node.inputs[0] is not None:
            # onnxscript never folds these (a big one would bloat the file); a small one is
            # just a constant, e.g. the seed gradient of a scalar loss
            dims = node.inputs[0].const_value
            return dims is not None and int(np.prod(dims.numpy())) <= SMALL_CONSTANT or None
        return True if level >= 3 else None

    fold = FoldConstants(shape_inference=False, input_size_limit=INPUT_LIMIT,
                         output_size_limit=2**62 if level >= 3 else OUTPUT_LIMIT, should_fold=should_fold)
    fold.size_gated = level < 3  # level 3: every node reading only constants folds, whatever its uses
    return _named(fold, "FoldConstants", structural=level < 3)  # unlimited, it reports modified spuriously


def parameter_names(model: ir.Model) -> frozenset[str]:
    """The model's floating-point initializers: its parameters and BatchNorm statistics."""
    return frozenset(name for name, v in model.graph.initializers.items()
                     if v.dtype is not None and v.dtype.is_floating_point())


class DeduplicateConstants(ir.passes.InPlacePass):
    """Merges byte-identical initializers (same dtype, shape and bytes) of one graph into the
    first, except graph inputs/outputs and the ``protected`` names. Sound for constants: every
    use reads the same values. Parameters are protected below level 3: two zero-initialised
    biases are distinct parameters that a later ``gc.training.generate`` trains apart and a state
    dict addresses by name, and onnxruntime's training-mode BatchNormalization may update its
    running statistics in place, so a scale merged with a running variance would be overwritten.
    (onnx-ir's DeduplicateInitializersPass has no such exception; level 3 uses it.)"""

    name = "DeduplicateInitializers"

    def __init__(self, protected: frozenset[str] = frozenset()):
        super().__init__()
        self.protected = protected

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        graphs = {id(model.graph): model.graph}
        for node in all_nodes(model.graph):
            graphs.setdefault(id(node.graph), node.graph)
        for graph in graphs.values():
            modified |= self._dedup(graph)
        return ir.passes.PassResult(model, modified)

    def _dedup(self, graph: ir.Graph) -> bool:
        seen: dict[tuple, ir.Value] = {}
        modified = False
        for name, value in list(graph.initializers.items()):
            tensor = value.const_value
            if (tensor is None or name in self.protected or value.is_graph_input()
                    or value.is_graph_output() or value.dtype is None or value.dtype.is_string()):
                continue
            key = (value.dtype, tuple(tensor.shape), tensor.tobytes())
            first = seen.setdefault(key, value)
            if first is not value:
                ir.convenience.replace_all_uses_with(value, first)
                graph.initializers.pop(name)
                modified = True
        return modified


_ATTR_SEQUENCES = (ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS)
_ATTR_GRAPHS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


class CommonSubexpressionElimination(_cse.CommonSubexpressionEliminationPass):
    """onnx-ir's CSE (main graph: two nodes with the same op, inputs and attributes compute the
    same values, so the second's uses read the first's outputs; control flow, random ops and
    tensor attributes over ``size_limit`` elements are left alone), with the same keys and
    effects, only cheaper: a small tensor attribute (an exported graph's many ``Constant``
    nodes) is keyed by its dtype, shape and serialized bytes instead of a numpy copy, and the
    per-node key is built in one pass over the attributes. Sound: the redirected uses read
    values equal to the ones they read before."""

    name = "CommonSubexpressionElimination"
    ignores = frozenset({DEAD, SHAPES})  # two live nodes equal now were equal before; keys hold no shape

    def _eliminate_common_subexpression(self, graph: ir.Graph) -> bool:
        modified = False
        seen: dict[tuple, ir.Node] = {}
        for node in graph:
            key = self._key(node)
            if key is None:
                continue
            first = seen.setdefault(key, node)
            if first is not node:
                _cse._remove_node_and_replace_values(graph, remove_node=node, remove_values=node.outputs,
                                                     new_values=first.outputs)
                modified = True
        return modified

    def _key(self, node: ir.Node) -> tuple | None:
        if node.op_type in _NON_DETERMINISTIC:  # any domain, as onnx-ir's pass
            return None
        attributes = []
        for name, attr in node.attributes.items():
            kind, value = attr.type, attr.value
            if kind in _ATTR_GRAPHS:
                return None
            if kind in _ATTR_SEQUENCES:
                value = tuple(value)
            elif kind is ir.AttributeType.TENSOR:
                if value.size > self.size_limit:
                    return None
                value = (tuple(value.shape), value.dtype,
                         value.numpy().tobytes() if value.dtype == ir.DataType.STRING else value.tobytes())
            attributes.append((name, value))
        attributes.sort()
        return (node.op_identifier(), len(node.outputs), tuple(map(id, node.inputs)), tuple(attributes))


_NON_DETERMINISTIC = frozenset({"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
                                "Multinomial"})


class IdentityElimination(common.IdentityEliminationPass):
    """onnx-ir's identity elimination (``y = Identity(x)``: uses of y read x; a graph-output y
    renames x), except where that is wrong, when y is an output of its graph: if x is itself a
    graph output (or feeds two output Identities), renaming x would merge two outputs into one
    name; if no node of y's own graph produces x (x is an outer-scope value in an If/Loop body,
    or an initializer), the body would return a value it does not compute, which ONNX forbids,
    and the renaming would rename the outer value. Such a node stays."""

    name = "IdentityElimination"
    effect = IDENTITY
    # it acts on Identity nodes by whether their input/output is a graph input, output or
    # initializer: neither dead-node removal, initializer merging nor shape inference changes that
    ignores = frozenset({DEAD, DEDUP, SHAPES})

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # the base pass walks every graph and function but acts on Identity nodes only
        if not model.functions and not any(n.op_type == "Identity" for n in all_nodes(model.graph)):
            return ir.passes.PassResult(model, False)
        return super().call(model)

    def _try_eliminate_identity_node(self, node: ir.Node) -> bool:
        if (node.op_type == "Identity" and node.domain == "" and node.outputs[0].is_graph_output()
                and node.inputs and node.inputs[0] is not None):
            x = node.inputs[0]
            producer = x.producer()
            if x.is_graph_output() or producer is None or producer.graph is not node.graph:
                return False
        return super()._try_eliminate_identity_node(node)


class TopologicalSort(common.TopologicalSortPass):
    """onnx-ir's stable topological sort, skipped when the main graph is already in order and
    holds no subgraph (the sort would keep every node where it is)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions and _in_order(model.graph):
            return ir.passes.PassResult(model, False)
        return super().call(model)


def _in_order(graph: ir.Graph) -> bool:
    seen: set[int] = set()
    for node in graph:
        if node.op_type in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            return False  # a body reads outer values: leave it to the sort
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and id(producer) not in seen:
                return False
        seen.add(id(node))
    return True


def cleanup_passes(protected: frozenset[str] = frozenset(), level: int = 1) -> list[ir.passes.PassBase]:
    """Level 1's loop: CSE, fold, then drop what folding left behind. CSE comes first because
    exported graphs repeat small constants and shape chains: merging them first leaves the
    folder (the costliest pass) a third fewer nodes to visit in the first round, with the same
    results on every bench model. Each is sound by construction:
    identity elimination and CSE only redirect uses to an equal value (graph outputs keep their
    names), unused-node removal deletes nodes no output depends on, and initializer dedup merges
    byte-identical constants (``DeduplicateConstants``). Below level 3 the ``protected``
    parameters are neither folded nor merged; level 3 (inference) treats them as constants."""
    fold = fold_constants_pass(protected if level < 3 else frozenset(), level)
    # What can enable each (see Pipeline): merging equal initializers can only make the folder's
    # use-count size gates stricter; at level 3 it has none, so dead-node removal cannot
    # enable it either (see FoldConstants).
    fold.idempotent = True  # it folds in node order: what a fold makes constant folds in the same run
    return [CommonSubexpressionElimination(), fold, IdentityElimination(), remove_unused_pass(), dedup_pass(protected, level)]


# (domain, op_type, opset) -> which outputs the op's schema marks optional, or None when the
# schema is unknown, variadic in its outputs or has no optional output (nothing to trim)
_OPTIONAL_OUTPUTS: dict[tuple[str, str, int], tuple[bool, ...] | None] = {}


def _optional_outputs(node: ir.Node, opset: int) -> tuple[bool, ...] | None:
    key = (node.domain, node.op_type, opset)
    if key not in _OPTIONAL_OUTPUTS:
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, domain=node.domain)
        except Exception:  # noqa: BLE001 - no schema: onnx-ir skips the node too
            info = None
        else:
            options = [o.option for o in schema.outputs]
            variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
            optional = onnx.defs.OpSchema.FormalParameterOption.Optional
            info = (None if variadic in options or optional not in options
                    else tuple(o == optional for o in options))
        _OPTIONAL_OUTPUTS[key] = info
    return _OPTIONAL_OUTPUTS[key]


def _trim_optional_outputs(node: ir.Node, graph_outputs: frozenset[ir.Value], opset: int) -> None:
    """onnx-ir's ``_remove_unused_optional_outputs`` with the schema lookup cached per op and
    opset (the lookup is most of its cost; it runs for every live node on every sweep)."""
    if node.domain not in ("", "onnx.ai"):
        return
    if node.op_type == "BatchNormalization":  # depends on the node's attributes: onnx-ir's own
        _unused_removal._remove_unused_optional_outputs(node, graph_outputs, opset)
        return
    optional = _optional_outputs(node, opset)
    if optional is None:
        return
    outputs = node.outputs
    for i, out in enumerate(outputs):
        if i < len(optional) and optional[i] and out not in graph_outputs and not out.uses():
            out.name = ""
    count = len(outputs)
    while count and not outputs[count - 1].name:
        count -= 1
    if count != len(outputs):
        node.resize_outputs(count)


def _sweep(graph: ir.Graph | ir.Function, opset: int | None, subgraph: bool = False) -> int:
    """onnx-ir's ``_remove_unused_nodes_in_graph_like``, same order and effects."""
    graph_outputs = frozenset(graph.outputs)
    if not subgraph:
        opset = graph.opset_imports.get("", opset)
    count = 0
    for node in reversed(graph):
        if not any(out in graph_outputs or out.uses() for out in node.outputs):
            graph.remove(node, safe=True)
            count += 1
            continue
        inputs = node.inputs
        if inputs and inputs[-1] is None:
            _unused_removal._remove_trailing_empty_inputs(node)
        if opset is not None:
            _trim_optional_outputs(node, graph_outputs, opset)
        if node.op_type in _SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    count += _sweep(attr.as_graph(), opset, subgraph=True)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for body in attr.as_graphs():
                        count += _sweep(body, opset, subgraph=True)
    return count


class RemoveUnusedNodes(common.RemoveUnusedNodesPass):
    """onnx-ir's dead-code elimination with the same effects, only cheaper: nodes none of whose
    outputs is used or a graph output are removed, walking each graph backwards so a dead chain
    goes in one sweep (subgraphs and functions included); on live nodes trailing ``None`` inputs
    are dropped and unused optional outputs (per the op's schema) are unnamed and trailing ones
    trimmed; initializers nothing uses that are not graph inputs/outputs are dropped. Sound: no
    output depends on anything removed, and an optional output may be omitted by the spec.
    The schema lookup per op and opset is cached (onnx-ir looks it up for every live node on
    every sweep, which is most of its cost); subgraphs are looked for only in ops that can
    have them (``all_nodes``)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        count = _sweep(model.graph, None)
        graph = model.graph
        keep = frozenset(graph.outputs) | frozenset(graph.inputs)
        initializers = graph.initializers
        for init in list(initializers.values()):
            if not (init.uses() or init in keep):
                del initializers[init.name]
                count += 1
        for function in model.functions.values():
            count += _sweep(function, None)
        return ir.passes.PassResult(model, modified=bool(count))


def remove_unused_pass() -> ir.passes.PassBase:
    p = _named(RemoveUnusedNodes(), "RemoveUnusedNodes")
    # one sweep removes every dead node (it walks the graph backwards); merging initializers
    # or annotating shapes leaves no output unused
    p.effect, p.idempotent, p.ignores = DEAD, True, frozenset({DEDUP, SHAPES})
    return p


def dedup_pass(protected: frozenset[str], level: int) -> ir.passes.PassBase:
    if level >= 3:
        p = _named(common.DeduplicateInitializersPass(), "DeduplicateInitializers")
    else:
        p = DeduplicateConstants(protected)
    # one run merges every duplicate; removing dead nodes or annotating shapes creates no new one
    p.effect, p.idempotent, p.ignores = DEDUP, True, frozenset({DEAD, SHAPES})
    return p


class LiftConstantsToInitializers(common.LiftConstantsToInitializersPass):
    """onnx-ir's pass (every ``Constant`` node that is not a graph output becomes an
    initializer of its graph, same name), reading a ``value`` tensor attribute directly: the
    library's ``Attr.as_tensor`` first runs a runtime protocol check that costs most of the pass.
    Sound: the initializer holds the very tensor the node produced. Every initializer's shape
    annotation is then its tensor's: a value the folder made constant keeps the dims inference
    gave it while it was computed (``unk__6`` for a Range's length), which a reader of the model
    (training's parameter layout) would take for the tensor's."""

    name = "LiftConstantsToInitializers"

    def __init__(self):
        super().__init__(lift_all_constants=True, size_limit=0)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = super().call(model)
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and (value.shape is None or tuple(value.shape) != tuple(tensor.shape)):
                value.shape = ir.Shape(tensor.shape)
        return result

    def _constant_node_attribute_to_tensor(self, node, attr_name, attr_value, initializer_name):
        if attr_name == "value" and attr_value.type == ir.AttributeType.TENSOR:
            return attr_value.value
        return super()._constant_node_attribute_to_tensor(node, attr_name, attr_value, initializer_name)


def finish_passes(protected: frozenset[str] = frozenset(), level: int = 1) -> list[ir.passes.PassBase]:
    """Run once after the loop: constants become initializers (a ``Constant`` node costs a kernel
    launch in some runtimes; an initializer costs nothing), graph outputs that became an input or
    initializer get an Identity back (ONNX needs an output produced by a node), then a stable
    topological sort. (No second shape inference: values the rewrites created may lack a
    shape annotation, which no runtime needs; the graph's inputs/outputs keep theirs.)"""
    return [
        LiftConstantsToInitializers(),
        dedup_pass(protected, level),
        remove_unused_pass(),
        _named(common.OutputFixPass(), "OutputFix"),
        _named(TopologicalSort(), "TopologicalSort", structural=False),
    ]
