"""KServe v2 / Open Inference Protocol tensors: JSON and the binary tensor data extension.

A request body is a JSON header, optionally followed by raw tensor bytes (its length then comes
in the ``Inference-Header-Content-Length`` HTTP header and each binary input says its size in
``parameters.binary_data_size``). Payloads go straight between bytes and numpy
(``np.frombuffer`` / ``ndarray.tobytes``); JSON ``data`` goes through one ``np.asarray``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from graphc.dtypes import as_dtype, to_numpy

# KServe datatype <-> graphc dtype name: every numeric type the protocol has. BYTES (strings)
# is not served (a model with a string input or output is refused when the server loads it).
DATATYPES: dict[str, str] = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "BF16": "bfloat16", "FP32": "float32", "FP64": "float64",
}
_BY_DTYPE = {dtype: datatype for datatype, dtype in DATATYPES.items()}
# Wire dtypes are little-endian whatever the host is.
_WIRE = {datatype: to_numpy(dtype).newbyteorder("<") if to_numpy(dtype).itemsize > 1 else to_numpy(dtype)
         for datatype, dtype in DATATYPES.items()}


class ProtocolError(Exception):
    """A request the server rejects; ``status`` is the HTTP code (4xx), the message names why."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


_BY_NUMPY = {np.dtype(to_numpy(dtype)): datatype for datatype, dtype in DATATYPES.items()}


def datatype_of(dtype: Any) -> str:
    """KServe datatype of a graphc/numpy dtype: ``"float32"`` -> ``"FP32"``."""
    if isinstance(dtype, np.dtype) and dtype in _BY_NUMPY:  # the per-output fast path
        return _BY_NUMPY[dtype]
    return _BY_DTYPE[str(as_dtype(dtype))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RequestInput(_Strict):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: Any = None


class RequestOutput(_Strict):
    name: str
    parameters: dict[str, Any] | None = None


class InferRequest(_Strict):
    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


class DecodedRequest:
    """What a request asks for: input arrays, and each wanted output with ``binary`` or not."""

    __slots__ = ("id", "inputs", "outputs", "binary_default")

    def __init__(self, id: str | None, inputs: dict[str, np.ndarray],
                 outputs: tuple[dict[str, bool] | None, bool]):
        self.id = id
        self.inputs = inputs
        self.outputs, self.binary_default = outputs  # outputs None: every model output


def decode_request(body: bytes, header_length: int | None) -> DecodedRequest:
    """Parse an infer request body (JSON, or JSON + binary tensors) into numpy arrays."""
    if header_length is None:
        header, binary = body, memoryview(b"")
    else:
        if header_length < 0 or header_length > len(body):
            raise ProtocolError(f"Inference-Header-Content-Length is {header_length}, but the body has "
                                f"only {len(body)} bytes")
        view = memoryview(body)
        header, binary = view[:header_length], view[header_length:]
    request = _parse_header(header)
    inputs: dict[str, np.ndarray] = {}
    offset = 0
    for item in request.inputs:
        if item.name in inputs:
            raise ProtocolError(f"input {item.name!r} is given twice")
        array, offset = _decode_input(item, binary, offset)
        inputs[item.name] = array
    if offset != len(binary):
        raise ProtocolError(f"the request carries {len(binary) - offset} bytes of binary data that no "
                            "input claims (check each input's binary_data_size)")
    return DecodedRequest(request.id, inputs, _requested_outputs(request))


def _parse_header(header: bytes | memoryview) -> InferRequest:
    try:
        return InferRequest.model_validate_json(bytes(header))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "request"
        if first["type"] in ("json_invalid", "json_type"):
            raise ProtocolError(f"malformed JSON in the request header: {first['msg']}") from None
        raise ProtocolError(f"invalid infer request: {where}: {first['msg']}") from None


def _wire_dtype(item: RequestInput) -> np.dtype:
    if item.datatype == "BYTES":
        raise ProtocolError(f"input {item.name!r}: datatype BYTES (strings) is not supported; "
                            f"use one of {', '.join(DATATYPES)}")
    if item.datatype not in _WIRE:
        raise ProtocolError(f"input {item.name!r}: unknown datatype {item.datatype!r}; "
                            f"expected one of {', '.join(DATATYPES)}")
    return _WIRE[item.datatype]


def _decode_input(item: RequestInput, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
    """One input tensor, from the binary section at ``offset`` or from its JSON ``data``."""
    dtype = _wire_dtype(item)
    if any(d < 0 for d in item.shape):
        raise ProtocolError(f"input {item.name!r}: shape {item.shape} has a negative dim")
    count = math.prod(item.shape)
    size = (item.parameters or {}).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"input {item.name!r}: binary_data_size must be a non-negative integer, got {size!r}")
        if offset + size > len(binary):
            raise ProtocolError(f"input {item.name!r}: binary data truncated: binary_data_size is {size} bytes "
                                f"but only {len(binary) - offset} bytes are left in the body")
        if size != count * dtype.itemsize:
            raise ProtocolError(f"input {item.name!r}: shape {item.shape} of {item.datatype} needs "
                                f"{count * dtype.itemsize} bytes, binary_data_size is {size}")
        array = np.frombuffer(binary[offset:offset + size], dtype=dtype).reshape(item.shape)
        return array, offset + size
    if item.data is None:
        raise ProtocolError(f"input {item.name!r} has neither 'data' nor parameters.binary_data_size")
    return _json_array(item, dtype, count), offset


# target kind -> the kinds of JSON data it accepts (bfloat16, from ml_dtypes, is kind "V")
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "V": "iuf"}


def _json_array(item: RequestInput, dtype: np.dtype, count: int) -> np.ndarray:
    try:
        array = np.asarray(item.data)
        if dtype.kind in "iu" and array.dtype.kind in "fO":
            # integers past int64 (numpy reads them as floats, losing digits): keep the exact ints
            exact = np.asarray(item.data, dtype=object)
            if all(isinstance(v, int) and not isinstance(v, bool) for v in exact.flat):
                array = exact
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProtocolError(f"input {item.name!r}: data is not a rectangular list of numbers: {exc}") from None
    if array.size != count:
        raise ProtocolError(f"input {item.name!r}: shape {item.shape} needs {count} elements, "
                            f"data has {array.size}")
    kind = "i" if array.dtype == object else array.dtype.kind  # object: the exact ints above
    if array.size and kind not in _JSON_KINDS[dtype.kind]:
        found = {"b": "booleans", "i": "integers", "u": "integers", "f": "non-integer numbers"}.get(
            kind, "non-numbers")
        raise ProtocolError(f"input {item.name!r}: datatype {item.datatype} but the data holds {found}")
    if array.size and dtype.kind in "iu":  # numpy would wrap an out-of-range integer silently
        info, low, high = np.iinfo(dtype), array.min(), array.max()
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise ProtocolError(f"input {item.name!r}: data does not fit {item.datatype}: {bad} is outside "
                                f"[{info.min}, {info.max}]")
    return array.astype(dtype, copy=False).reshape(item.shape)


def _requested_outputs(request: InferRequest) -> tuple[dict[str, bool] | None, bool]:
    """(each listed output -> binary or not, or None for all outputs; the default format)."""
    default = bool((request.parameters or {}).get("binary_data_output", False))
    if not request.outputs:  # absent or empty: every output
        return None, default
    return {out.name: bool((out.parameters or {}).get("binary_data", default)) for out in request.outputs}, default


def encode_response(model_name: str, model_version: str, request: DecodedRequest,
                    results: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the JSON header's length."""
    outputs, chunks = [], []
    wanted = request.outputs
    for name in (results if wanted is None else wanted):
        array = np.asarray(results[name])
        binary = request.binary_default if wanted is None else wanted[name]
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)}
        if binary:
            raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = array.ravel().tolist()
        outputs.append(entry)
    head: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        head["id"] = request.id
    head["outputs"] = outputs
    header = json.dumps(head, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
