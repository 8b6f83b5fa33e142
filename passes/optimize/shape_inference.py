"""ONNX shape inference inside the optimization loop: types and shapes for values that lack
them, and static dims for values whose dims folding has made computable."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from graphc.passes.optimize.library import DEAD, DEDUP, IDENTITY, SHAPES
from graphc.passes.optimize.pipeline import Declared, all_nodes

__all__ = ["ShapeInference"]


class ShapeInference(Declared, ir.passes.InPlacePass):
    """ONNX shape inference with data propagation (one C++ call, through onnx-ir's helper that
    leaves big initializer data out), read back into the values that need it:

    1. a value with no type or shape gets the inferred ones;
    2. a dim that is not static becomes the inferred static dim (same rank). This is what lets
       shape arithmetic fold on static shapes: an exporter computes a ``Pad``'s pads or a
       ``Reshape``'s shape with Shape/Mod/Div/Range/... arithmetic that ONNX inference cannot
       evaluate, so the output's dims are unknown when the loop starts; once the folder has made
       the pads constant, inference finds the output's static dims, and the ``Shape`` of that
       output (and everything computed from it) folds in the next round.

    Sound: ONNX inference derives each dim from the graph's declared input shapes, so a static
    dim it finds holds for every valid input. It never sees the data of an initializer that is
    also a graph input (a default a caller may feed), so no dim follows from a default. A dim that is a symbol of a graph input (``N``)
    is never replaced, and a rank is never changed. Runs only when some value is worth inferring
    (``_pending``) and, after the first run, the inputs of that value's node changed since
    inference last saw it (a new node, an input now constant or with a new shape): a gradient
    graph's values that inference cannot annotate do not make every round pay for it again. Only those values are read back from the result,
    not the whole model as onnx-ir's ShapeInferencePass does, which costs several times the
    inference.

    ``source``: a ``ModelProto`` of the very model this pass will first see (``gc.optimize`` has
    one at hand: the caller's proto, or the serialized copy it deserializes). The first inference
    then runs on it directly instead of serializing the IR model again, when it is small enough
    (``SOURCE_BYTES``) that the C++ call's own copy of it costs less than that serialization."""

    name = "ShapeInference"
    effect = SHAPES
    # what can give inference something new: nodes changed or added, constants folded. Removing
    # dead nodes, merging equal initializers or bypassing an Identity cannot; a second run
    # right after itself finds what the first found.
    ignores = frozenset({DEAD, DEDUP, IDENTITY})
    idempotent = True
    SOURCE_BYTES = 1 << 20

    def __init__(self, source: onnx.ModelProto | None = None):
        super().__init__()
        self.source = source
        self._seen: dict[ir.Value, tuple] = {}  # pending value -> its node's inputs when inferred

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        symbols = {d.value for v in model.graph.inputs if v.shape is not None for d in v.shape
                   if isinstance(d, ir.SymbolicDim) and d.value is not None}
        pending = _pending(all_nodes(model.graph), symbols)
        source, self.source = self.source, None  # one use: the model changes after this pass
        inputs = {name: _inputs_seen(v.producer()) for name, v in pending.items()}
        if all(self._seen.get(v) == inputs[name] for name, v in pending.items()):
            return ir.passes.PassResult(model, False)
        self._seen.update((v, inputs[name]) for name, v in pending.items())
        infer = lambda proto: onnx.shape_inference.infer_shapes(proto, data_prop=True)  # noqa: E731
        try:
            if source is not None and source.ByteSize() <= self.SOURCE_BYTES and not _feedable_defaults(model):
                inferred = infer(source)
            else:
                inferred = _infer_without_big_data(infer, model)
        except Exception:  # noqa: BLE001 - inference is an aid; without it rewrites just fire less
            return ir.passes.PassResult(model, False)
        modified = False
        seen: dict[bytes, tuple] = {}
        for info in inferred.graph.value_info:
            value = pending.get(info.name)
            if value is not None and info.type.HasField("tensor_type"):
                # what deserialize_value_info_proto reads, without building a Value
                type_, shape = _read_back(info.type, seen)
                modified |= _update(value, type_, shape, symbols)
        return ir.passes.PassResult(model, modified)


def _inputs_seen(node: ir.Node) -> tuple:
    """What inference reads off ``node``'s inputs: which values, whether constant, their shapes."""
    return tuple((v, v.const_value is not None, None if v.shape is None else tuple(v.shape))
                 if v is not None else None for v in node.inputs)


def _pending(nodes: list[ir.Node], symbols: set[str]) -> dict[str, ir.Value]:
    """The values worth inferring, by name: those with no type or no shape, and those with a dim
    that is neither static nor a graph input's symbol unless their node reads a value with a
    symbol's dim or with such a dim itself (a ``Reshape(x[N, 5, 8], [-1, 8])`` and everything
    computed from it: that dim follows from N, so inference would find nothing new; a cost
    choice, which cannot make a dim wrong). ``nodes`` in graph order, producers first."""
    pending: dict[str, ir.Value] = {}
    symbolic: set[ir.Value] = set()  # values with a dim that follows from an input symbol
    for node in nodes:
        if node.op_type == "Constant":  # typed by the folder from its tensor
            continue
        tainted = any(v in symbolic or (v is not None and v.shape is not None
                                        and any(getattr(d, "value", None) in symbols for d in v.shape))
                      for v in node.inputs)
        for value in node.outputs:
            if value.type is None or value.shape is None:
                pending[value.name] = value
            elif any(not isinstance(d, int) and d.value not in symbols for d in value.shape):
                if tainted:
                    symbolic.add(value)
                else:
                    pending[value.name] = value
    pending.pop("", None)
    pending.pop(None, None)
    return pending


def _update(value: ir.Value, type_: ir.TypeProtocol | None, shape: ir.Shape | None, symbols: set[str]) -> bool:
    """Take what inference adds to ``value`` (see ``ShapeInference``); whether it added anything."""
    changed = False
    if value.type is None and type_ is not None:
        value.type = type_
        changed = True
    if shape is None:
        return changed
    if value.shape is None:
        value.shape = shape
        return True
    old = value.shape
    if len(old) != len(shape):
        return changed
    dims = [new if not isinstance(dim, int) and isinstance(new, int) and dim.value not in symbols else dim
            for dim, new in zip(old, shape)]
    if dims == list(old):
        return changed
    value.shape = ir.Shape(dims, denotations=[old.get_denotation(i) for i in range(len(old))])
    return True


def _tensor_type(proto: onnx.TypeProto) -> ir.TypeProtocol | None:
    """``ir.serde.deserialize_type_proto_for_type`` of a ``tensor_type`` proto, without the
    serde layer's generic dispatch and error wrapping (it runs for every inferred value)."""
    tensor = proto.tensor_type
    if not tensor.HasField("elem_type"):
        return None
    return ir.TensorType(ir.DataType(tensor.elem_type),
                         denotation=proto.denotation if proto.HasField("denotation") else None)


def _tensor_shape(proto: onnx.TypeProto) -> ir.Shape | None:
    """``ir.serde.deserialize_type_proto_for_shape`` of a ``tensor_type`` proto, the same
    frozen ``Shape`` (int, named or unknown dims, dim denotations), built directly."""
    tensor = proto.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims: list = []
    denotations: list = []
    for dim in tensor.shape.dim:
        which = dim.WhichOneof("value")
        dims.append(dim.dim_value if which == "dim_value"
                    else ir.SymbolicDim(dim.dim_param if which == "dim_param" else None))
        denotations.append(dim.denotation if dim.HasField("denotation") else None)
    return ir.Shape(dims, denotations=denotations, frozen=True)


def _read_back(proto: onnx.TypeProto, seen: dict[bytes, tuple]) -> tuple[ir.TypeProtocol | None, ir.Shape | None]:
    """``(_tensor_type(proto), _tensor_shape(proto))``, with the proto read once per distinct
    ``TypeProto`` (``seen``: serialized proto -> what it holds): a model's values share a few
    dozen types and shapes, and reading one back costs several times the lookup. Each value
    still gets its own ``TensorType`` (``Value.dtype``'s setter changes it in place); the shape,
    frozen, is shared, which onnx-ir documents as safe -- except one with a dim denotation
    (``Shape.set_denotation`` ignores freezing), read anew each time."""
    key = proto.SerializeToString()
    known = seen.get(key)
    if known is None:
        type_, shape = _tensor_type(proto), _tensor_shape(proto)
        shared = not any(dim.HasField("denotation") for dim in proto.tensor_type.shape.dim)
        seen[key] = (None if type_ is None else (type_.dtype, type_.denotation), shape if shared else None, shared)
        return type_, shape
    dtype, shape, shared = known
    type_ = None if dtype is None else ir.TensorType(dtype[0], denotation=dtype[1])
    return type_, shape if shared else _tensor_shape(proto)


def _feedable_defaults(model: ir.Model) -> bool:
    """Whether an initializer of ``model`` is also a graph input (its data only a default)."""
    return any(v.is_graph_input() for v in model.graph.initializers.values())


BIG_TENSOR_BYTES = 1000  # an initializer's data above this is left out of the inference call


def _infer_without_big_data(infer, model: ir.Model) -> onnx.ModelProto:
    """``infer`` run on ``model`` serialized with every initializer also a graph input (typed
    and shaped) and big ones without their data, so a model over protobuf's 2 GiB limit still
    goes through, nor those a caller may feed (already graph inputs: their data is a default,
    which data propagation would take for the value); ``model`` is left as it was. (What onnx-ir's ``ShapeInferencePass`` does
    through a private helper; this pass needs the inferred proto itself, not its merge.)"""
    graph = model.graph
    initializers = tuple(graph.initializers.values())
    tensors = {v.name: v.const_value for v in initializers}
    inputs = len(graph.inputs)
    for value in initializers:
        tensor = value.const_value
        if tensor is not None:
            value.shape = value.shape if value.shape is not None else tensor.shape
            value.dtype = value.dtype if value.dtype is not None else tensor.dtype
        feedable = value.is_graph_input()
        if not feedable:
            graph.inputs.append(value)
        if tensor is None or tensor.nbytes > BIG_TENSOR_BYTES or feedable:
            value.const_value = None
            graph.initializers.pop(value.name)
    try:
        return infer(ir.serde.serialize_model(model))
    finally:
        for value in initializers:
            value.const_value = tensors[value.name]
            if value.name not in graph.initializers:
                if value.const_value is not None:
                    graph.register_initializer(value)
                else:
                    graph.initializers.add(value)
        kept = graph.inputs[:inputs]
        graph.inputs.clear()
        graph.inputs.extend(kept)
