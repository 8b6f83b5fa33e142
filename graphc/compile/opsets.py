"""Converting a model to another ai.onnx opset (servers often run an older onnxruntime)."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnx_ir as ir

from graphc.errors import PassError
from graphc.model import EMITTED_OPSETS, Model, load
from graphc.model.file import all_graphs, clip_bounds_like_input, tensor_types
from graphc.passes.autodiff.model import fold_integer_values, infer_shapes, localize_outer_constants
from graphc.passes.functions import expand_functions

__all__ = ["OpsetError", "convert_opset"]


def emitted_opset(model: Model, what: str) -> Model:
    """``model`` itself where graphc emits its opset's ops; converted down to the newest such
    opset where it is newer (``onnx.helper.make_model`` stamps onnx's newest, 28 with onnx 1.23),
    so that ``what`` (training graphs, gradient graphs) can be built from it."""
    newest = EMITTED_OPSETS[-1]
    if model.opset <= newest:
        return model
    return convert_opset(model, newest, hint=f"{what} are built at ai.onnx opset {newest} or older")


class OpsetError(PassError):
    """A model cannot be converted to the opset asked for (the CLI names its ``--opset``)."""


def convert_opset(model: Model, target: int, hint: str = "") -> Model:
    """``model`` at ai.onnx opset ``target`` (onnx's version converter). Ops ONNX added after
    ``target`` but defines as functions of older ops (Gelu from 20, ...) are first replaced by
    their function body. Raises ``OpsetError`` (a ``PassError``) naming the model, both opsets and
    why; where an op has no conversion below an opset, the lowest opset the model converts to."""
    current = model.opset
    if target == current:
        return model
    if not 1 <= target <= onnx.defs.onnx_opset_version():
        raise OpsetError(f"cannot convert model {model.name!r} to opset {target}: onnx {onnx.__version__} knows "
                         f"ai.onnx opsets 1 to {onnx.defs.onnx_opset_version()}")
    if target < current:
        model = _with_integer_inputs_folded(model)
    try:
        converted = _converted(model, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors from C++
        raise OpsetError(f"cannot convert model {model.name!r} from opset {current} to {target}: "
                         f"{_why_not(exc, model, target)}" + (f"; {hint}" if hint else "")) from None
    return load(converted)


def _converted(model: Model, target: int) -> onnx.ModelProto:
    proto = _without_newer_functions(model, target)
    for node in proto.graph.node:
        if node.domain in ("", "ai.onnx") and not _exists_at(node.op_type, target):
            raise ValueError(f"{node.op_type} node {node.name!r}: ONNX has no {node.op_type} before opset "
                             f"{onnx.defs.get_schema(node.op_type).since_version} and no function body for it")
    proto = _with_outer_constants_localized(proto)
    held = _hold_back(proto, model.opset, target)
    converted = onnx.version_converter.convert_version(proto, target)
    clip_bounds_like_input(converted)
    _restore(converted, held, target)
    _drop_default_attributes_unknown_at(converted, model.opset, target)
    _drop_unread_initializers(converted.graph)
    return converted


def _drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """Drop the initializers no node (nor subgraph) reads and no output or input names: the
    converter's adapters turn inputs into attributes (ReduceMean's axes below opset 18) and leave
    their initializers behind, which onnxruntime warns about and removes."""
    read = {name for g in all_graphs(graph) for node in g.node for name in node.input}
    read |= {v.name for v in (*graph.output, *graph.input)}
    keep = [t for t in graph.initializer if t.name in read]
    if len(keep) < len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)


# onnx's converter stops at an op version it has no adapter from (down) or to (up) with a C++ assertion
_NO_ADAPTER = re.compile(r"No Adapter (From|To) Version \$(\d+) for (\w+)")


def _why_not(exc: Exception, model: Model, target: int) -> str:
    """``exc``'s message; the converter's assertion ("...BaseConverter.h:66: adapter_lookup:
    Assertion `false` failed: No Adapter From Version $14 for Relu") as the op and the opset it
    stops at, and going down, the lowest opset ``model`` converts to."""
    found = _NO_ADAPTER.search(str(exc))
    if found is None:
        return str(exc)
    way, version, op = found[1], int(found[2]), found[3]
    if way == "To":
        return f"onnx {onnx.__version__}'s version converter cannot take {op} to opset {version}"
    said = f"onnx {onnx.__version__}'s version converter takes {op} no lower than opset {version}"
    while True:  # each try converts, or stops at an op newer still
        try:
            _converted(model, version)
            return f"{said}; the lowest opset this model converts to is {version}"
        except Exception as exc:  # noqa: BLE001
            found = _NO_ADAPTER.search(str(exc))
            if found is None or found[1] != "From" or int(found[2]) <= version:
                return said
            version = int(found[2])


# Downgrades onnx's version converter has no adapter for (it stops with "No Adapter To Version"),
# each a rewrite of one node into its form at the target opset, or a ValueError when the node
# uses what the older op lacks. Those nodes sit in a private domain while the converter runs.
_HELD = "graphc.held_back"


def _pad_down(node: onnx.NodeProto, target: int, shapes: dict) -> None:
    if len(node.input) > 3 and node.input[3]:
        raise ValueError(f"Pad node {node.name!r} names its axes, which Pad takes only from opset 18")
    if any(a.name == "mode" and a.s == b"wrap" for a in node.attribute) and target < 19:
        raise ValueError(f"Pad node {node.name!r} pads in 'wrap' mode, which exists only from opset 19")


def _split_down(node: onnx.NodeProto, target: int, shapes: dict) -> None:
    count = next((a.i for a in node.attribute if a.name == "num_outputs"), None)
    if count is None:
        return
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    shape = shapes.get(node.input[0])
    dim = shape[axis] if shape is not None and -len(shape) <= axis < len(shape) else None
    if not isinstance(dim, int):
        raise ValueError(f"Split node {node.name!r} splits into num_outputs={count} parts along a dim that is not "
                         "static; Split before opset 18 needs the sizes")
    chunk = -(-dim // count)
    sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
    kept = [a for a in node.attribute if a.name != "num_outputs"]
    del node.attribute[:]
    node.attribute.extend(kept)
    name = f"{node.output[0]}_split_sizes"
    shapes["__initializers__"].append(onnx.numpy_helper.from_array(np.array(sizes, np.int64), name))
    node.input.append(name)


def _grid_sample_down(node: onnx.NodeProto, target: int, shapes: dict) -> None:
    shape = shapes.get(node.input[0])
    if shape is None or len(shape) != 4:
        raise ValueError(f"GridSample node {node.name!r} samples a {len(shape) if shape else 'non-4'}-D input, which "
                         "GridSample takes only from opset 20")
    for a in node.attribute:
        if a.name == "mode":
            a.s = {b"linear": b"bilinear", b"cubic": b"bicubic"}.get(a.s, a.s)


_DOWNGRADES = {  # op -> (the opset its form changed, the rewrite to the form before)
    "Pad": (18, _pad_down), "Split": (18, _split_down), "GridSample": (20, _grid_sample_down),
    "ConstantOfShape": (20, lambda node, target, shapes: None),  # 20 only adds dtypes
}


def _hold_back(proto: onnx.ModelProto, current: int, target: int) -> list[str]:
    """Move, in place, the nodes (subgraphs included) of ``_DOWNGRADES`` ops whose form changed between
    ``target`` and ``current`` into a private domain; returns their op types in node order."""
    held = []
    for node in _nodes(proto.graph):
        since = _DOWNGRADES.get(node.op_type, (None,))[0]
        if node.domain in ("", "ai.onnx") and since is not None and target < since <= current:
            held.append(node.op_type)
            node.op_type, node.domain = f"{node.op_type}_{len(held) - 1}", _HELD
    if held:
        proto.opset_import.append(onnx.helper.make_opsetid(_HELD, 1))
    return held


def _nodes(graph: onnx.GraphProto):
    for g in all_graphs(graph):
        yield from g.node


def _restore(proto: onnx.ModelProto, held: list[str], target: int) -> None:
    """Put held-back nodes back into ai.onnx in their form at ``target``."""
    if not held:
        return
    types = tensor_types(proto, subgraphs=True)
    if types is None:
        raise ValueError("onnx's shape inference fails on the converted model")
    shapes: dict = {name: dims for name, (_, dims) in types.items()}
    shapes["__initializers__"] = []
    for node in _nodes(proto.graph):
        if node.domain == _HELD:
            op = held[int(node.op_type.rsplit("_", 1)[1])]
            node.op_type, node.domain = op, ""
            _DOWNGRADES[op][1](node, target, shapes)
    proto.graph.initializer.extend(shapes["__initializers__"])
    kept = [o for o in proto.opset_import if o.domain != _HELD]
    del proto.opset_import[:]
    proto.opset_import.extend(kept)


def _drop_default_attributes_unknown_at(proto: onnx.ModelProto, current: int, target: int) -> None:
    """Remove, in place, attributes the converter leaves on a node although its op at ``target``
    has no such attribute (ReduceMean's ``noop_with_empty_axes`` going from 18 to 17), when
    they hold the default of the op at ``current`` and so change nothing. Any other such
    attribute raises: the model cannot mean the same at ``target``."""
    for node in _nodes(proto.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        old, new = onnx.defs.get_schema(node.op_type, current), onnx.defs.get_schema(node.op_type, target)
        kept = []
        for attribute in node.attribute:
            if attribute.name in new.attributes:
                kept.append(attribute)
                continue
            default = old.attributes[attribute.name].default_value if attribute.name in old.attributes else None
            if default is None or not default.HasField("name") or \
                    onnx.helper.get_attribute_value(default) != onnx.helper.get_attribute_value(attribute):
                raise ValueError(f"{node.op_type} node {node.name!r}: attribute {attribute.name!r} has no "
                                 f"equivalent at opset {target}")
        if len(kept) != len(node.attribute):
            del node.attribute[:]
            node.attribute.extend(kept)


def _with_outer_constants_localized(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with each subgraph given Constants of its own for the small integer constants it
    reads from an enclosing graph (``localize_outer_constants``): the converter's adapters that turn
    an input into an attribute (Reduce* axes, Squeeze/Unsqueeze axes, Split sizes going below
    opset 13/18) look for the constant in the node's own graph only, and stop with an assertion
    for an outer one (torch.onnx's dynamo exporter writes EmbeddingBag's ReduceSum that way).
    ``proto`` itself where nothing is copied."""
    copy = ir.serde.deserialize_model(proto)
    return ir.serde.serialize_model(copy) if localize_outer_constants(copy) else proto


def _with_integer_inputs_folded(model: Model) -> Model:
    """``model`` with the integer values it computes from constants alone (ReduceMean axes as
    ``Reshape(Constant)``, as torch.onnx's dynamo exporter writes them with ``optimize=False``)
    made initializers: the converter's adapters that turn such an input into an attribute take
    only an initializer or a Constant. A copy when anything folds, else ``model`` itself."""
    copy = infer_shapes(model.ir)
    return Model(copy) if fold_integer_values(copy) else model


def _exists_at(op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return False
    return True


def _without_newer_functions(model: Model, target: int) -> onnx.ModelProto:
    """The model as a proto, each node whose op ONNX added after opset ``target`` but defines as
    a function of older ops replaced by onnx's own body: the converter has no adapter for an op
    with no earlier version. ``model`` itself is not changed."""
    if all(_exists_at(node.op_type, target) for node in model.ir.graph if node.domain in ("", "ai.onnx")):
        return model.proto
    proto = model.proto
    try:  # context-dependent bodies (RMSNormalization, Attention, ...) need their inputs' types
        proto = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # noqa: BLE001 - without types those nodes just stay (and the converter says so)
        pass
    copy = ir.serde.deserialize_model(proto)
    if not expand_functions(copy, lambda node: not _exists_at(node.op_type, target)):
        return model.proto
    # a body computes some inputs at run time from shapes (RMSNormalization's reduce axes from
    # the rank): folded to constants, they are what the converter's adapters need
    from graphc.compile.optimize import optimize

    return optimize(Model(copy), level=1).proto
