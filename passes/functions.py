"""Expanding ONNX function ops into the ops ONNX defines them with.

Many newer ops (Gelu, Mish, RMSNormalization, Attention, RotaryEmbedding, ...) are defined by the
standard as functions of older ops, and onnx ships each definition (``OpSchema.function_body``,
or built per node for context-dependent ones). Replacing such a node by that body, inlined, keeps
the model's meaning exactly. graphc does it where a consumer lacks the op: the version converter
when it brings a model down to an opset that predates the op, and autodiff for ops without a
gradient rule (the body's ops have rules).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.shape_inference
import onnx_ir as ir
from onnx_ir.passes.common import InlinePass

from graphc.passes.values import fresh_name, onnx_opset

__all__ = ["EXPANDED_FROM", "expand_functions", "has_function"]

_STANDARD = ("", "ai.onnx")
_PRIVATE = "graphc.expand"  # the domain the bodies live in until they are inlined
EXPANDED_FROM = "graphc.expanded_from"  # metadata of an inlined body node: the op it came from


def has_function(node: ir.Node | onnx.NodeProto, opset: int) -> bool:
    """Whether ONNX defines ``node``'s op (at ``opset``) as a function of other ops."""
    schema = _schema(node, opset)
    return schema is not None and (schema.has_function or schema.has_context_dependent_function)


def expand_functions(model: ir.Model, select: Callable[[ir.Node], bool]) -> int:
    """Replace, in place, every main-graph node of a standard op that ``select`` picks and that
    ONNX defines as a function by that function's body. Returns how many nodes were expanded.
    A context-dependent body needs the types of the node's inputs: a node whose inputs are
    untyped is left as it is."""
    opset = onnx_opset(model, 1)
    taken = {v.name for n in model.graph for v in n.outputs} | {v.name for v in model.graph.inputs}
    count = 0
    for _ in range(8):  # a body may use another function op (SwiGLU uses Swish): expand again
        expanded = 0
        for node in list(model.graph):
            if node.domain not in _STANDARD or not select(node):
                continue
            body = _body(node, opset)
            try:
                function = None if body is None else ir.serde.deserialize_function(body)
            except Exception:  # noqa: BLE001 - a body onnx-ir cannot read: the node stays
                function = None
            if function is None:
                continue
            function.name, function.domain = f"{node.op_type}_{count + expanded}", _PRIVATE
            for i, out in enumerate(node.outputs):  # a skipped output the body binds gets a name
                if not out.name:
                    out.name = fresh_name(taken, f"{function.name}_unused_{i}")
            origin = f"{node.op_type} node {node.name!r}"
            for inner in function:  # errors about a body node then name the op it came from
                inner.metadata_props.update(node.metadata_props)
                inner.metadata_props.setdefault(EXPANDED_FROM, origin)
            _fill_default_attributes(node, opset)
            model.functions[function.identifier()] = function
            node.op_type, node.domain, node.version = function.name, _PRIVATE, None
            expanded += 1
        if not expanded:
            break
        model.opset_imports[_PRIVATE] = 1
        InlinePass()(model)
        model.opset_imports.pop(_PRIVATE, None)
        count += expanded
    return count


def _fill_default_attributes(node: ir.Node, opset: int) -> None:
    """Give the call node every attribute its schema defaults (a body reads them by reference)."""
    schema = _schema(node, opset)
    for name, attribute in (schema.attributes.items() if schema is not None else ()):
        if name not in node.attributes and attribute.default_value.HasField("name"):
            default = onnx.AttributeProto()
            default.CopyFrom(attribute.default_value)
            default.name = name
            node.attributes[name] = ir.serde.deserialize_attribute(default)


def _schema(node: ir.Node, opset: int) -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return None


def _body(node: ir.Node, opset: int) -> onnx.FunctionProto | None:
    """The function body ONNX registers for ``node``'s op as of ``opset`` (a definition holds
    from the opset it is registered for until the next one: ops a body uses may change between
    opsets, so the one for the model's opset is asked for), importing that opset."""
    schema = _schema(node, opset)
    if schema is None:
        return None
    body = onnx.FunctionProto()
    try:
        if schema.has_context_dependent_function:
            inputs = [v for v in node.inputs if v is not None]
            version = _registered(schema.context_dependent_function_opset_versions, opset)
            if version is None or any(v.type is None for v in inputs):
                return None
            types = [ir.serde.serialize_value(v).type.SerializeToString() for v in inputs]
            body.ParseFromString(schema.get_context_dependent_function_with_opset_version(
                version, ir.serde.serialize_node(node).SerializeToString(), types))
        elif schema.has_function:
            version = _registered(schema.function_opset_versions, opset)
            if version is None:
                return None
            body.ParseFromString(schema.get_function_with_opset_version(version))
        else:
            return None
    except Exception:  # noqa: BLE001 - onnx has no body for this node or these inputs: it stays
        return None
    if not body.node:
        return None
    # outputs the node does not take (Attention's present_key ... without a past) go; a body may
    # leave them unbound: an unbound one the node skips (an empty name) gets a placeholder
    del body.output[len(node.outputs):]
    bound = {o for n in body.node for o in n.output} | set(body.input)
    for name, value in zip(body.output, node.outputs):
        if name not in bound:
            if value.uses() or value.is_graph_output():
                return None
            body.node.append(onnx.helper.make_node("Constant", [], [name], value=onnx.helper.make_tensor(name, 1, [0], [])))
    del body.opset_import[:]
    body.opset_import.append(onnx.helper.make_opsetid("", opset))
    return _typed(body, node, schema)


def _typed(body: onnx.FunctionProto, node: ir.Node, schema: onnx.defs.OpSchema) -> onnx.FunctionProto:
    """``body`` with its float32 Constants in the type of the node's float inputs where onnx writes
    them float32 whatever that type is and the body then fails type inference
    (MeanVarianceNormalization's epsilon, added to a double or float16 input); ``body`` as it is
    where it type-checks, its inputs are untyped, or retyping does not make it type-check."""
    inputs = [v for v in node.inputs if v is not None]
    floats = {v.dtype for v in inputs if v.dtype is not None and v.dtype.is_floating_point()}
    # only a body whose float inputs share one type other than float32 can need retyping: the
    # usual float32 body is returned without running onnx's inference on it
    if len(floats) != 1 or (dtype := floats.pop()) == ir.DataType.FLOAT or _infers(body, inputs, node, schema):
        return body
    retyped = onnx.FunctionProto()
    retyped.CopyFrom(body)
    for inner in retyped.node:
        if inner.op_type == "Constant" and inner.domain in _STANDARD:
            _retype_constant(inner, dtype.numpy())
    return retyped if _infers(retyped, inputs, node, schema) else body


def _infers(body: onnx.FunctionProto, inputs: list[ir.Value], node: ir.Node, schema: onnx.defs.OpSchema) -> bool:
    """Whether onnx's type inference accepts ``body`` on the node's input types and attributes
    (true where an input is untyped: nothing to check against)."""
    if any(v.type is None for v in inputs):
        return True
    attributes = {name: a.default_value for name, a in schema.attributes.items() if a.default_value.HasField("name")}
    for name, attribute in node.attributes.items():
        attributes[name] = ir.serde.serialize_attribute(attribute)
    types = [ir.serde.serialize_value(v).type for v in inputs]
    try:
        onnx.shape_inference.infer_function_output_types(body, types, list(attributes.values()))
    except onnx.shape_inference.InferenceError:
        return False
    return True


def _retype_constant(node: onnx.NodeProto, dtype) -> None:
    """A float32 ``Constant`` (``value``, ``value_float`` or ``value_floats``) turned, in place,
    into one of ``dtype``."""
    for i, attribute in enumerate(node.attribute):
        if attribute.ref_attr_name:  # the node's own attribute (MeanVarianceNormalization's axes)
            continue
        value = onnx.helper.get_attribute_value(attribute)
        if attribute.name == "value" and value.data_type == onnx.TensorProto.FLOAT:
            array = onnx.numpy_helper.to_array(value)
        elif attribute.name in ("value_float", "value_floats"):
            array = np.asarray(value, np.float32)
        else:
            continue
        tensor = onnx.numpy_helper.from_array(array.astype(dtype), attribute.name)
        node.attribute[i].CopyFrom(onnx.helper.make_attribute("value", tensor))


def _registered(versions, opset: int) -> int | None:
    """The latest opset a body is registered for, up to ``opset`` (it holds until the next)."""
    earlier = [v for v in versions if v <= opset]
    return max(earlier) if earlier else None
