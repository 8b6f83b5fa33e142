"""Triton's model configuration: ``config.pbtxt`` parsed with protobuf's ``text_format``, and the
JSON Triton's ``GET /v2/models/{name}/config`` answers with (``tritonclient``'s ``get_model_config``).

The message type is built here, with the field names, types and nesting of Triton's
``inference.ModelConfig`` for the fields an ONNX deployment uses (``_MESSAGES``): Triton's own
proto ships only with its gRPC client, too heavy a dependency for one message. Fields outside
that set are skipped, and ``parse`` names the first one it skipped. JSON is protobuf's
``json_format`` with proto field names and every field present (as Triton prints a config),
64-bit integers as numbers.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, text_format
from google.protobuf.descriptor import FieldDescriptor

__all__ = ["ConfigError", "ModelConfig", "complete", "parse", "to_json"]

_F = descriptor_pb2.FieldDescriptorProto
_ENUMS = {
    "DataType": ["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
                 "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING",
                 "TYPE_BF16"],
    "Format": ["FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW"],
    "Kind": ["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"],
    "ModelPriority": ["PRIORITY_DEFAULT", "PRIORITY_MAX", "PRIORITY_MIN"],
}
# message -> its fields: (name, type: a scalar's name, an enum's or a message's; "*" repeated, "{}" a map to a message)
_MESSAGES: dict[str, list[tuple[str, str]]] = {
    "ModelConfig": [
        ("name", "string"), ("platform", "string"), ("backend", "string"), ("runtime", "string"),
        ("version_policy", "ModelVersionPolicy"), ("max_batch_size", "int32"), ("input", "ModelInput*"),
        ("output", "ModelOutput*"), ("instance_group", "ModelInstanceGroup*"), ("default_model_filename", "string"),
        ("dynamic_batching", "ModelDynamicBatching"), ("parameters", "ModelParameter{}"),
        ("model_transaction_policy", "ModelTransactionPolicy"), ("response_cache", "ModelResponseCache"),
        ("optimization", "ModelOptimizationPolicy"), ("model_warmup", "ModelWarmup*"),
        ("cc_model_filenames", "string{}"), ("metric_tags", "string{}"),
        ("model_repository_agents", "ModelRepositoryAgents")],
    "ModelVersionPolicy": [("latest", "Latest"), ("all", "All"), ("specific", "Specific")],
    "Latest": [("num_versions", "uint32")],
    "All": [],
    "Specific": [("versions", "int64*")],
    "ModelInput": [("name", "string"), ("data_type", "DataType"), ("format", "Format"), ("dims", "int64*"),
                   ("reshape", "ModelTensorReshape"), ("is_shape_tensor", "bool"), ("allow_ragged_batch", "bool"),
                   ("optional", "bool")],
    "ModelOutput": [("name", "string"), ("data_type", "DataType"), ("dims", "int64*"),
                    ("reshape", "ModelTensorReshape"), ("label_filename", "string"), ("is_shape_tensor", "bool")],
    "ModelTensorReshape": [("shape", "int64*")],
    "ModelInstanceGroup": [("name", "string"), ("kind", "Kind"), ("count", "int32"), ("gpus", "int32*"),
                           ("profile", "string*"), ("passive", "bool"), ("host_policy", "string")],
    "ModelDynamicBatching": [("preferred_batch_size", "int32*"), ("max_queue_delay_microseconds", "uint64"),
                             ("preserve_ordering", "bool"), ("priority_levels", "uint64"),
                             ("default_priority_level", "uint64")],
    "ModelParameter": [("string_value", "string")],
    "ModelTransactionPolicy": [("decoupled", "bool")],
    "ModelResponseCache": [("enable", "bool")],
    "ModelOptimizationPolicy": [("graph", "Graph"), ("priority", "ModelPriority"), ("cuda", "Cuda"),
                                ("execution_accelerators", "ExecutionAccelerators"),
                                ("input_pinned_memory", "PinnedMemoryBuffer"),
                                ("output_pinned_memory", "PinnedMemoryBuffer"),
                                ("gather_kernel_buffer_threshold", "uint32"), ("eager_batching", "bool")],
    "Graph": [("level", "int32")],
    "Cuda": [("graphs", "bool"), ("busy_wait_events", "bool"), ("output_copy_stream", "bool")],
    "ExecutionAccelerators": [("gpu_execution_accelerator", "Accelerator*"),
                              ("cpu_execution_accelerator", "Accelerator*")],
    "Accelerator": [("name", "string"), ("parameters", "string{}")],
    "PinnedMemoryBuffer": [("enable", "bool")],
    "ModelWarmup": [("name", "string"), ("batch_size", "uint32"), ("inputs", "WarmupInput{}"), ("count", "uint32")],
    "WarmupInput": [("data_type", "DataType"), ("dims", "int64*"), ("zero_data", "bool"), ("random_data", "bool"),
                    ("input_data_file", "string")],
    "ModelRepositoryAgents": [("agents", "Agent*")],
    "Agent": [("name", "string"), ("parameters", "string{}")],
}
_PACKAGE = "graphc.triton"
_SCALARS = {"string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL, "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32,
            "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64}
_UNKNOWN = re.compile(r'has no field named "(\w+)"')
_WIDE = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)  # json_format writes these as strings


class ConfigError(ValueError):
    """``config.pbtxt`` is not a valid Triton model configuration."""


def _field(message: descriptor_pb2.DescriptorProto, number: int, name: str, kind: str) -> None:
    field = message.field.add(name=name, number=number, json_name=name)
    field.label = _F.LABEL_REPEATED if kind.endswith(("*", "{}")) else _F.LABEL_OPTIONAL
    base = kind.rstrip("*{}")
    if kind.endswith("{}"):  # map<string, base>: a nested map-entry message
        entry = message.nested_type.add(name=f"{name.title()}Entry")
        entry.options.map_entry = True
        _field(entry, 1, "key", "string")
        _field(entry, 2, "value", base)
        field.type, field.type_name = _F.TYPE_MESSAGE, f".{_PACKAGE}.{message.name}.{entry.name}"
    elif base in _SCALARS:
        field.type = _SCALARS[base]
    else:
        field.type = _F.TYPE_ENUM if base in _ENUMS else _F.TYPE_MESSAGE
        field.type_name = f".{_PACKAGE}.{base}"


def _model_config_class() -> type:
    file = descriptor_pb2.FileDescriptorProto(name="graphc_triton_model_config.proto", package=_PACKAGE,
                                              syntax="proto3")
    for name, values in _ENUMS.items():
        enum = file.enum_type.add(name=name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for number, (field_name, kind) in enumerate(fields, 1):
            _field(message, number, field_name, kind)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.ModelConfig"))


ModelConfig = _model_config_class()


def parse(text: str, where: str = "config.pbtxt") -> tuple[Any, Optional[str]]:
    """``text`` as a ``ModelConfig`` message and the first field it skipped (None if none);
    ``ConfigError`` naming ``where`` and the line for text that is not a model configuration."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
        return config, None
    except text_format.ParseError as strict:
        unknown = _UNKNOWN.search(str(strict))
        if unknown is None:
            raise ConfigError(f"{where}: not a Triton model configuration: {strict}") from None
        skipped = f"{unknown.group(1)!r} (line {strict.GetLine()})"
    config = ModelConfig()
    try:
        text_format.Parse(text, config, allow_unknown_field=True)
    except text_format.ParseError as exc:  # protobuf skips no unknown field written as a list of messages
        raise ConfigError(f"{where}: cannot read the field {skipped}, not one graphc knows: {exc}") from None
    return config, skipped


def one_line(message: Any) -> str:
    """``message`` in text format on one line, as config.pbtxt writes it: ``latest { num_versions: 1 }``."""
    return text_format.MessageToString(message, as_one_line=True)


def complete(config: Any, derived: Any) -> Any:
    """``config`` with the fields it leaves unset taken from ``derived`` (the model's own
    interface, as Triton completes a config from the model); ``config`` itself is changed."""
    for field, value in derived.ListFields():
        current = getattr(config, field.name)
        if _repeated(field):
            if not current:
                current.MergeFrom(value)  # a list or a map
        elif field.message_type is not None:
            if not config.HasField(field.name):
                current.CopyFrom(value)
        elif not current:
            setattr(config, field.name, value)
    return config


def _repeated(field: FieldDescriptor) -> bool:
    # ``label`` is gone in protobuf 7, ``is_repeated`` new in 5.29: onnx accepts either
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == FieldDescriptor.LABEL_REPEATED


def to_json(config: Any) -> dict[str, Any]:
    """``config`` as Triton's config route answers: proto field names, every field present."""
    body = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    return _numbers(body, config.DESCRIPTOR)


def _numbers(body: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    """``body`` with the 64-bit integers json_format wrote as strings turned back into numbers."""
    for name, value in body.items():
        field = descriptor.fields_by_name[name]
        if field.cpp_type in _WIDE:
            body[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and field.message_type.GetOptions().map_entry:
            inner = field.message_type.fields_by_name["value"].message_type
            body[name] = {k: _numbers(v, inner) for k, v in value.items()} if inner else value
        elif field.message_type is not None:
            body[name] = [_numbers(v, field.message_type) for v in value] if isinstance(value, list) \
                else _numbers(value, field.message_type)
    return body
