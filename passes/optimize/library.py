# Over 500 lines: level 1's cleanup loop, one pass per library cleanup, several written here
# with the library's effects at a fraction of its cost; each says which library pass it matches.
"""The generic cleanups graphc takes from onnx-ir and onnxscript instead of writing them again.

Only their public APIs are used (written against onnx-ir 1.1 and onnxscript 0.7, pinned in
pyproject.toml). Where a library pass is wrong for graphc or costs most of the pipeline, the
pass is graphc's own, with the same effects, and says why.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import fold_constants_ir

from graphc.passes.optimize.pipeline import SUBGRAPH_OPS, Declared, LibraryPass, all_nodes
from graphc.passes.values import AUTOGRAD_KEY, draws_random, onnx_opset, stops_gradient

__all__ = ["CommonSubexpressionElimination", "DeduplicateConstants", "IdentityElimination",
           "LiftConstantsToInitializers", "RemoveUnusedNodes", "cleanup_passes",
           "finish_passes", "fold_constants_pass", "parameter_names"]

# Below level 3 folding is bounded so the model never balloons: a node whose constant input
# has more elements than INPUT_LIMIT is left alone (level 3 folds it), and no folded result
# larger than OUTPUT_LIMIT elements is stored (onnxscript's own defaults, named here).
_FOLD_DEFAULTS = inspect.signature(fold_constants_ir).parameters
INPUT_LIMIT = _FOLD_DEFAULTS["input_size_limit"].default
OUTPUT_LIMIT = _FOLD_DEFAULTS["output_size_limit"].default
SMALL_CONSTANT = 1024  # elements: a ConstantOfShape up to this size is folded

# Effects (``Pipeline``): the only change a pass with that ``effect`` makes.
DEAD = "dead"    # removes nodes no output depends on, unused initializers and optional outputs
DEDUP = "dedup"  # points the uses of an initializer at a byte-identical one and drops it
IDENTITY = "identity"  # points the uses of an Identity's output at its input and drops the node
SHAPES = "shapes"  # gives values types and shapes (static dims included): no node changes


class FoldConstants(Declared, ir.passes.InPlacePass):
    """onnxscript's constant folder (``fold_constants_ir``) as a pipeline pass.

    What can enable it again (``Pipeline``): merging equal initializers (``DEDUP``) never can,
    nor can identity elimination (``IDENTITY``): the folder itself points every use of an
    Identity's output at its input as it visits (onnxscript's Identity evaluator), so removing
    the Identity shows it no constant input it has not already seen.
    Dead-node removal (``DEAD``) can only through the folder's size gates, which count the
    uses of a node's constant inputs (with ``size_gated``: below level 3): a node whose inputs
    are all constant may fold once a dead use of a big input is gone. So after each run the
    pass notes whether any such node is left (``_blocked``; checked in flat graphs, assumed
    with functions or subgraphs); with none, removing nodes cannot make one (it creates no
    constant), and dead-node removal is ignored until the folder runs again. It folds in node
    order, so what a fold makes constant folds in the same run (``idempotent``).

    Two local fixes: onnxscript 0.7's SplitToSequence evaluator (since microsoft/onnxscript#2544)
    fails the whole fold on a split that is not constant but has a static shape of rank other
    than 1 (it reads ``.ndim`` of the missing value): such a split's shape is hidden from the
    folder while it runs, so it leaves the node alone, as it does for an unknown shape. And its
    Identity evaluator bypasses every Identity, whatever ``should_fold`` says: a ``gc.detach``
    Identity (``stops_gradient``) is moved to a domain the model does not import while it runs,
    which the folder skips, so the stop-gradient mark stays where autodiff will look for it."""

    name = "FoldConstants"
    idempotent = True

    def __init__(self, should_fold, input_size_limit: int, output_size_limit: int, size_gated: bool):
        super().__init__()
        self.should_fold, self.size_gated = should_fold, size_gated
        self.input_size_limit, self.output_size_limit = input_size_limit, output_size_limit
        self.structural = size_gated  # unlimited (level 3), it reports modified spuriously
        self._blocked = True

    @property
    def ignores(self) -> frozenset[str]:
        return frozenset({DEDUP, IDENTITY} if self.size_gated and self._blocked else {DEDUP, IDENTITY, DEAD})

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        hidden = [(v, v.shape) for v in _unfoldable_splits(model)]
        for value, _ in hidden:
            value.shape = None
        stops = [(node, node.domain) for node in all_nodes(model.graph) if stops_gradient(node)]
        for node, _ in stops:
            node.domain = _UNIMPORTED
        try:
            result = fold_constants_ir(model, onnx_shape_inference=False, input_size_limit=self.input_size_limit,
                                       output_size_limit=self.output_size_limit, should_fold=self.should_fold)
        finally:
            for value, shape in hidden:
                value.shape = shape
            for node, domain in stops:
                node.domain = domain
        if self.size_gated:
            self._blocked = _has_constant_node(model)
        return ir.passes.PassResult(model, result.modified)


_UNIMPORTED = "graphc.unimported"  # a domain no model imports: the folder leaves its nodes alone


def _unfoldable_splits(model: ir.Model) -> list[ir.Value]:
    """The non-constant ``split`` inputs of static rank other than 1 of SplitToSequence nodes
    (see ``FoldConstants``)."""
    nodes = [*all_nodes(model.graph), *(n for function in model.functions.values() for n in function)]
    splits = [n.inputs[1] for n in nodes if n.op_type == "SplitToSequence" and len(n.inputs) > 1]
    return [v for v in splits if v is not None and v.shape is not None and v.shape.is_static()
            and len(v.shape) != 1 and ir.convenience.get_const_tensor(v) is None]


def _has_constant_node(model: ir.Model) -> bool:
    """Whether a node other than ``Constant`` reads only constants (initializers included),
    or the model has functions or subgraphs (not searched: assumed so)."""
    if model.functions:
        return True
    for node in model.graph:
        if node.op_type in SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            return True
        if node.op_type == "Constant":
            continue
        inputs = [v for v in node.inputs if v is not None]
        if inputs and all(v.const_value is not None for v in inputs):
            return True
    return False


def fold_constants_pass(protected: frozenset[str] = frozenset(), level: int = 1) -> FoldConstants:
    """onnxscript's constant folder: evaluates nodes whose inputs are all constants (never graph
    inputs, so initializers a caller may override stay live) with the ONNX reference evaluator,
    and partially evaluates shape ops (``Shape``, ``Gather``/``Concat`` of shapes, ``Size``)
    from the static dims it knows, keeping symbolic dims symbolic. It also turns a ``Dropout``
    that the ONNX spec defines as identity (opset >= 12, no or false ``training_mode``, or ratio
    0) into Identity. A node that draws random numbers (``draws_random``: a training-mode
    Dropout, Bernoulli, RandomUniform, ...) is never folded, at any level: its value differs
    from run to run.

    Below level 3, nodes reading a ``protected`` initializer (a parameter) are not folded, so
    the parameter keeps its name and layout for state dicts and a later
    ``gc.training.generate``, and folding stops at ``INPUT_LIMIT``/``OUTPUT_LIMIT`` elements
    (a shared weight is never stored twice). At level 3 (inference export) weights are final:
    every constant subgraph is folded whatever its size -- constant weight transposes, slices
    and reshapes are pre-applied, so the runtime never does them at load or run time."""

    def should_fold(node: ir.Node) -> bool | None:
        if draws_random(node):
            return False
        if protected and any(v is not None and v.name in protected and v.is_initializer() for v in node.inputs):
            return False
        if node.op_type == "Identity":
            # the folder's Identity evaluator already points every use at the input; folding it
            # too would copy a constant input (a whole weight, at level 3) for dedup to merge back
            return False
        if node.op_type == "DequantizeLinear":
            # a quantized model's int8 weights stay int8 for onnxruntime's QDQ fusions (QLinearConv ...).
            # Folded to float, ort 1.31 requantizes the weight itself (not the trained int8 values) and ran
            # slower: scripts/bench_qat_int8.py, 2 threads, QAT ResNet 32-64-128, batch 32: 64 px 53 ms kept
            # vs 68 ms folded, 128 px 96 vs 160 ms (float32 model: 152 and 449 ms)
            return False
        if node.op_type == "ConstantOfShape" and node.inputs and node.inputs[0] is not None:
            # onnxscript never folds these (a big one would bloat the file); a small one is
            # just a constant, e.g. the seed gradient of a scalar loss
            dims = node.inputs[0].const_value
            return dims is not None and int(np.prod(dims.numpy())) <= SMALL_CONSTANT or None
        return True if level >= 3 else None

    # level 3: every node reading only constants folds, whatever its size or uses
    return FoldConstants(should_fold, INPUT_LIMIT, 2**62 if level >= 3 else OUTPUT_LIMIT, size_gated=level < 3)


def parameter_names(model: ir.Model) -> frozenset[str]:
    """The model's floating-point initializers: its parameters and BatchNorm statistics."""
    return frozenset(name for name, v in model.graph.initializers.items()
                     if v.dtype is not None and v.dtype.is_floating_point())


class DeduplicateConstants(Declared, ir.passes.InPlacePass):
    """Merges byte-identical initializers (same dtype, shape and bytes) of one graph into the
    first, except graph inputs/outputs and the ``protected`` names. Sound for constants: every
    use reads the same values. Parameters are protected below level 3: two zero-initialised
    biases are distinct parameters that a later ``gc.training.generate`` trains apart and a state
    dict addresses by name, and onnxruntime's training-mode BatchNormalization may update its
    running statistics in place, so a scale merged with a running variance would be overwritten.
    (onnx-ir's DeduplicateInitializersPass has no such exception; level 3 uses it.)"""

    name = "DeduplicateInitializers"
    # one run merges every duplicate; removing dead nodes or annotating shapes creates no new one
    effect, idempotent, ignores = DEDUP, True, frozenset({DEAD, SHAPES})

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


class CommonSubexpressionElimination(Declared, ir.passes.InPlacePass):
    """onnx-ir's CSE (``CommonSubexpressionEliminationPass``, main graph: two nodes with the
    same op, inputs and attributes compute the same values, so the second's uses read the
    first's outputs; control flow, random ops and tensor attributes over ``size_limit``
    elements are left alone; graphc's random ops are ``draws_random``'s, which adds Bernoulli
    and training-mode Dropout to onnx-ir's list), with the same keys and effects, only cheaper: a small tensor
    attribute (an exported graph's many ``Constant`` nodes) is keyed by its dtype, shape and
    serialized bytes instead of a numpy copy, and the per-node key is built in one pass over
    the attributes. Sound: the redirected uses read values equal to the ones they read before."""

    name = "CommonSubexpressionElimination"
    ignores = frozenset({DEAD, SHAPES})  # two live nodes equal now were equal before; keys hold no shape
    size_limit = 10  # elements of a tensor attribute, as onnx-ir's pass

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        graph = model.graph
        seen: dict[tuple, ir.Node] = {}
        for node in graph:
            key = self._key(node)
            if key is None:
                continue
            first = seen.setdefault(key, node)
            if first is not node:
                _replace_node(graph, node, first.outputs)
                modified = True
        return ir.passes.PassResult(model, modified)

    def _key(self, node: ir.Node) -> tuple | None:
        if draws_random(node):  # any domain, as onnx-ir's pass
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
        # a gc.detach Identity is not a plain one: merging the two would drop or add a stop-gradient; nor is a
        # gc.autograd.Function's marker (its record), which an identity Function (a hook's) puts beside a detach
        return (node.op_identifier(), len(node.outputs), tuple(map(id, node.inputs)), tuple(attributes),
                stops_gradient(node), node.metadata_props.get(AUTOGRAD_KEY))


def _replace_node(graph: ir.Graph, node: ir.Node, values: Sequence[ir.Value]) -> None:
    """Remove ``node``, its outputs' uses reading ``values`` instead (as onnx-ir's CSE does): a
    graph output among them keeps its name, through an Identity when the new value is itself
    a graph input or output, else by renaming the new value."""
    if any(v.is_graph_output() for v in node.outputs):
        replacement = dict(zip(node.outputs, values))
        for i, output in enumerate(graph.outputs):
            new = replacement.get(output)
            if new is None:
                continue
            if new.is_graph_output() or new.is_graph_input():
                identity = ir.node("Identity", inputs=[new], outputs=[
                    ir.Value(name=output.name, type=output.type, shape=output.shape)])
                graph.outputs[i] = identity.outputs[0]
                graph.insert_before(node, identity)
            else:
                new.name = output.name
                graph.outputs[i] = new
    ir.convenience.replace_all_uses_with(node.outputs, values)
    graph.remove(node, safe=True)


class IdentityElimination(Declared, ir.passes.InPlacePass):
    """onnx-ir's identity elimination (``IdentityEliminationPass``: ``y = Identity(x)``, uses of
    y read x; a graph-output y renames x; x takes y's shape where it knows more), except where
    that is wrong, when y is an output of its graph: if x is itself a graph output (or feeds
    two output Identities), renaming x would merge two outputs into one name; if no node of
    y's own graph produces x (x is an outer-scope value in an If/Loop body, or an
    initializer), the body would return a value it does not compute, which ONNX forbids, and
    the renaming would rename the outer value. Such a node stays, and so does a ``gc.detach``
    Identity (``stops_gradient``) until level 3 drops its mark (``StopGradientRemoval``).
    (Written here because the library pass has no hook for those conditions.)"""

    name = "IdentityElimination"
    effect = IDENTITY
    # it acts on Identity nodes by whether their input/output is a graph input, output or
    # initializer: neither dead-node removal, initializer merging nor shape inference changes that
    ignores = frozenset({DEAD, DEDUP, SHAPES})

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions and not any(n.op_type == "Identity" for n in all_nodes(model.graph)):
            return ir.passes.PassResult(model, False)
        modified = False
        for owner in (model.graph, *model.functions.values()):
            for node in ir.traversal.RecursiveGraphIterator(owner):
                modified |= _eliminate_identity(node)
        return ir.passes.PassResult(model, modified)


def _eliminate_identity(node: ir.Node) -> bool:
    if node.op_type != "Identity" or node.domain != "" or len(node.inputs) != 1 or len(node.outputs) != 1 \
            or stops_gradient(node):
        return False
    x, y = node.inputs[0], node.outputs[0]
    if x is None:
        return False
    if y.is_graph_output():
        producer = x.producer()
        if x.is_graph_input() or x.is_initializer() or x.is_graph_output() or producer is None \
                or producer.graph is not node.graph:
            return False
    x.shape = _merge_shapes(x.shape, y.shape)
    if x.type is None:
        x.type = y.type
    output = y.is_graph_output()
    ir.convenience.replace_all_uses_with(y, x, replace_graph_outputs=True)
    if output:
        x.name = y.name
    node.graph.remove(node, safe=True)
    return True


def _merge_shapes(known: ir.Shape | None, other: ir.Shape | None) -> ir.Shape | None:
    """Per dim, the one that says more (an int over a symbol, a named symbol over an unknown)."""
    if known is None or other is None:
        return other if known is None else known
    if len(known) != len(other):
        raise ValueError(f"Shapes must have the same rank, got {len(known)} and {len(other)}.")

    def merge(a, b):
        if a == b or not isinstance(a, ir.SymbolicDim):
            return a
        if not isinstance(b, ir.SymbolicDim) or a.value is None:
            return b
        return a

    return ir.Shape([merge(a, b) for a, b in zip(known, other)])


class TopologicalSort(Declared, ir.passes.InPlacePass):
    """onnx-ir's stable topological sort (``TopologicalSortPass``), skipped when the main graph
    is already in order and holds no subgraph (the sort would keep every node where it is)."""

    name = "TopologicalSort"
    structural = False  # the library pass reports modified when it only re-sorted

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if not model.functions and _in_order(model.graph):
            return ir.passes.PassResult(model, False)
        return common.TopologicalSortPass()(model)


def _in_order(graph: ir.Graph) -> bool:
    seen: set[int] = set()
    for node in graph:
        if node.op_type in SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
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
    return [CommonSubexpressionElimination(), fold, IdentityElimination(), RemoveUnusedNodes(),
            dedup_pass(protected, level)]


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
    """onnx-ir's unused-optional-output removal with the schema lookup cached per op and
    opset (the lookup is most of its cost; it runs for every live node on every sweep):
    unused optional outputs lose their names, trailing unnamed ones go. A BatchNormalization
    keeps its statistics outputs unless it is known to run in inference mode (from opset 14,
    ``training_mode`` absent or 0, then dropped): in training mode they change Y's meaning."""
    if node.domain not in ("", "onnx.ai"):
        return
    optional = _optional_outputs(node, opset)
    if node.op_type == "BatchNormalization":
        mode = node.attributes.get("training_mode")
        if opset < 14 or (mode is not None and (mode.is_ref() or mode.type != ir.AttributeType.INT
                                                or mode.as_int() != 0)):
            return
        node.attributes.pop("training_mode", None)
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
    """onnx-ir's dead-node sweep of one graph, same order and effects (trailing ``None`` inputs
    of live nodes dropped, unused optional outputs trimmed)."""
    graph_outputs = frozenset(graph.outputs)
    if not subgraph:
        opset = onnx_opset(graph, opset)
    count = 0
    for node in reversed(graph):
        if not any(out in graph_outputs or out.uses() for out in node.outputs):
            graph.remove(node, safe=True)
            count += 1
            continue
        inputs = node.inputs
        if inputs and inputs[-1] is None:
            count_in = len(inputs)
            while count_in and inputs[count_in - 1] is None:
                count_in -= 1
            node.resize_inputs(count_in)
        if opset is not None:
            _trim_optional_outputs(node, graph_outputs, opset)
        if node.op_type in SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    count += _sweep(attr.as_graph(), opset, subgraph=True)
                elif attr.type == ir.AttributeType.GRAPHS:
                    for body in attr.as_graphs():
                        count += _sweep(body, opset, subgraph=True)
    return count


class RemoveUnusedNodes(Declared, ir.passes.InPlacePass):
    """onnx-ir's dead-code elimination (``RemoveUnusedNodesPass``) with the same effects, only cheaper: nodes none of whose
    outputs is used or a graph output are removed, walking each graph backwards so a dead chain
    goes in one sweep (subgraphs and functions included); on live nodes trailing ``None`` inputs
    are dropped and unused optional outputs (per the op's schema) are unnamed and trailing ones
    trimmed; initializers nothing uses that are not graph inputs/outputs are dropped. Sound: no
    output depends on anything removed, and an optional output may be omitted by the spec.
    The schema lookup per op and opset is cached (onnx-ir looks it up for every live node on
    every sweep, which is most of its cost); subgraphs are looked for only in ops that can
    have them (``all_nodes``)."""

    name = "RemoveUnusedNodes"
    # one sweep removes every dead node (it walks the graph backwards); merging initializers
    # or annotating shapes leaves no output unused
    effect, idempotent, ignores = DEAD, True, frozenset({DEDUP, SHAPES})

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


def dedup_pass(protected: frozenset[str], level: int) -> ir.passes.PassBase:
    """Initializer dedup: ``DeduplicateConstants`` below level 3, onnx-ir's pass (parameters
    too) at level 3."""
    if level >= 3:
        return LibraryPass(common.DeduplicateInitializersPass(), "DeduplicateInitializers", effect=DEDUP,
                           idempotent=True, ignores=frozenset({DEAD, SHAPES}))
    return DeduplicateConstants(protected)


class LiftConstantsToInitializers(Declared, ir.passes.InPlacePass):
    """onnx-ir's ``LiftConstantsToInitializersPass`` (every ``Constant`` node that is not a
    graph output becomes an initializer of its graph, same name). Sound: the initializer holds
    the very tensor the node produced. Every initializer's shape annotation is then its
    tensor's: a value the folder made constant keeps the dims inference gave it while it was
    computed (``unk__6`` for a Range's length), which a reader of the model (training's
    parameter layout) would take for the tensor's."""

    name = "LiftConstantsToInitializers"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        result = common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if tensor is not None and (value.shape is None or tuple(value.shape) != tuple(tensor.shape)):
                value.shape = ir.Shape(tensor.shape)
        return result


class OutputFix(Declared, ir.passes.InPlacePass):
    """onnx-ir's ``OutputFixPass`` (an Identity for a value listed twice as a graph output, and
    for a subgraph input returned as the subgraph's output), except for a main-graph input that is
    also a main-graph output: ONNX allows that (``onnx.checker`` accepts it), and the library's
    Identity would take the output's name and rename the input (``x`` to ``x_orig``)."""

    name = "OutputFix"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        outputs = model.graph.outputs
        passed = [(i, v) for i, v in enumerate(outputs) if v.is_graph_input()]
        for i, _ in reversed(passed):
            outputs.pop(i)
        result = common.OutputFixPass()(model)
        for i, value in passed:
            outputs.insert(i, value)
        return result


def finish_passes(protected: frozenset[str] = frozenset(), level: int = 1) -> list[ir.passes.PassBase]:
    """Run once after the loop: constants become initializers (a ``Constant`` node costs a kernel
    launch in some runtimes; an initializer costs nothing), a value listed twice as an output gets
    an Identity (``OutputFix``), then a stable topological sort. (No second shape inference: values the rewrites created may lack a
    shape annotation, which no runtime needs; the graph's inputs/outputs keep theirs.)"""
    return [
        LiftConstantsToInitializers(),
        dedup_pass(protected, level),
        RemoveUnusedNodes(),
        OutputFix(),
        TopologicalSort(),
    ]
