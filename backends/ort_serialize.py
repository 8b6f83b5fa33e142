"""A model handed to onnxruntime: its bytes, or, past protobuf's 2 GiB limit, a file with its large
initializers in external data (``onnxruntime.OrtExecutable`` opens what this gives)."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import EncodeError

from graphc.model import ir_version_for

PROTOBUF_LIMIT = (1 << 31) - (1 << 20)  # a serialized message must stay below 2 GiB


def serialize_for_ort(model: onnx.ModelProto, folder: Path) -> bytes | str:
    """The model's bytes, stamped with the lowest IR version its opsets need (no copy of it).
    A model over protobuf's 2 GiB limit is written to ``folder`` instead, its large
    initializers in external data, and onnxruntime opens it from that path."""
    saved = model.ir_version
    model.ir_version = ir_version_for({o.domain: o.version for o in model.opset_import})
    try:
        try:
            data = model.SerializeToString()
        except EncodeError:  # over 2 GiB (protobuf cannot even size such a message)
            data = None
        if data is not None and len(data) < PROTOBUF_LIMIT:
            return data
        return str(save_with_external_data(model, folder / "model.onnx"))
    finally:
        model.ir_version = saved


def save_with_external_data(model: onnx.ModelProto, path: Path) -> Path:
    """Write ``model`` with its initializers' raw data of 1 MiB or more in ``<path>.data``,
    leaving ``model`` as it was (onnx's own converter moves the data out of the proto it is given)."""
    moved: list[tuple[onnx.TensorProto, bytes, bool]] = []
    try:
        with open(f"{path}.data", "wb") as f:
            for tensor in model.graph.initializer:
                raw = tensor.raw_data if tensor.HasField("raw_data") else b""
                if len(raw) < (1 << 20):
                    continue
                offset = f.tell()
                f.write(raw)
                moved.append((tensor, raw, tensor.HasField("data_location")))
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", f"{path.name}.data"), ("offset", str(offset)), ("length", str(len(raw)))):
                    tensor.external_data.add(key=key, value=value)
        path.write_bytes(model.SerializeToString())
    finally:
        for tensor, raw, had_location in moved:
            tensor.raw_data = raw
            tensor.ClearField("data_location")
            if had_location:
                tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    return path


__all__ = ["PROTOBUF_LIMIT", "save_with_external_data", "serialize_for_ort"]
