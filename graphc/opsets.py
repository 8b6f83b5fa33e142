"""Converting a model to another ai.onnx opset (servers often run an older onnxruntime)."""

from __future__ import annotations

import onnx
import onnx.inliner

from graphc.errors import GraphError
from graphc.model import Model, load

__all__ = ["convert_opset"]


def convert_opset(model: Model, target: int, hint: str = "") -> Model:
    """``model`` at ai.onnx opset ``target`` (onnx's version converter). Ops ONNX added after
    ``target`` but defines as functions of older ops (Gelu from 20, ...) are first replaced by
    their function body. Raises ``GraphError`` naming the model, both opsets and why."""
    current = model.opset
    if target == current:
        return model
    try:
        converted = onnx.version_converter.convert_version(_expand_newer_ops(model.proto, current, target), target)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors from C++
        raise GraphError(f"cannot convert model {model.name!r} from opset {current} to {target}: {exc}"
                         + (f"; {hint}" if hint else "")) from None
    return load(converted)


_EXPANDED = "graphc.expanded"  # private domain of the functions inlined below


def _expand_newer_ops(proto: onnx.ModelProto, current: int, target: int) -> onnx.ModelProto:
    """``proto`` with each main-graph node whose op ONNX added after opset ``target`` but defines
    as a function of older ops (Gelu from 20, Mish, RMSNormalization, ...) replaced by that
    function body, onnx's own definition, which the version converter can then bring down (it
    has no adapter for an op with no earlier version). ``proto`` itself is not changed."""
    newer = [i for i, node in enumerate(proto.graph.node)
             if node.domain in ("", "ai.onnx") and not _exists_at(node.op_type, target)]
    if not newer:
        return proto
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    typed = _value_types(copy)
    functions = []
    for i in newer:
        node = copy.graph.node[i]
        schema = onnx.defs.get_schema(node.op_type, current)
        body = onnx.FunctionProto()
        if schema.has_context_dependent_function:
            types = [typed.get(name) for name in node.input if name]
            if any(t is None for t in types):
                continue
            body.ParseFromString(schema.get_context_dependent_function(
                node.SerializeToString(), [t.SerializeToString() for t in types]))
        elif schema.has_function:
            body.CopyFrom(schema.function_body)
        else:
            continue  # the converter then says which op it cannot bring down
        body.name, body.domain = f"{node.op_type}_{len(functions)}", _EXPANDED
        node.op_type, node.domain = body.name, _EXPANDED
        functions.append(body)
    if not functions:
        return proto
    copy.functions.extend(functions)
    copy.opset_import.append(onnx.helper.make_opsetid(_EXPANDED, 1))
    inlined = onnx.inliner.inline_local_functions(copy, convert_version=True)  # bodies to the model's opset
    kept = [o for o in inlined.opset_import if o.domain != _EXPANDED]
    del inlined.opset_import[:]
    inlined.opset_import.extend(kept)
    return inlined


def _exists_at(op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return False
    return True


def _value_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    inferred = onnx.shape_inference.infer_shapes(proto)
    graph = inferred.graph
    types = {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}
    for tensor in graph.initializer:
        types.setdefault(tensor.name, onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    return types
