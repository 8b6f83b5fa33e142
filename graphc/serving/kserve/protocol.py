"""KServe v2 / Open Inference Protocol tensors: JSON and the binary tensor data extension.

A request body is a JSON header, optionally followed by raw tensor bytes (its length then comes
in the ``Inference-Header-Content-Length`` HTTP header and each binary input says its size in
``parameters.binary_data_size``). Payloads go straight between bytes and numpy
(``np.frombuffer`` / ``ndarray.tobytes``); JSON ``data``, checked element by element by the
schema (``graphc.serving.kserve.schemas``), goes through one ``np.array``. Every error raised here is a
``ProtocolError`` made outside any ``except`` block, so it holds no reference to the request.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from graphc.model.dtypes import as_dtype, to_numpy
from graphc.serving.kserve import flat_data, json_slices
from graphc.serving.kserve.nested_shape import MAX_DIMS
from graphc.serving.kserve.request_errors import validate_header
from graphc.serving.kserve.schemas import DATATYPES, InferRequest

_BY_DTYPE = {dtype: datatype for datatype, dtype in DATATYPES.items()}
# Wire dtypes are little-endian whatever the host is.
_WIRE = {datatype: to_numpy(dtype).newbyteorder("<") if to_numpy(dtype).itemsize > 1 else to_numpy(dtype)
         for datatype, dtype in DATATYPES.items()}
_BY_NUMPY = {np.dtype(to_numpy(dtype)): datatype for datatype, dtype in DATATYPES.items()}


class ProtocolError(Exception):
    """A request the server rejects; ``status`` is the HTTP code (4xx; 500 where a model contradicts its
    config), the message names why."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def datatype_of(dtype: Any) -> str:
    """KServe datatype of a graphc/numpy dtype: ``"float32"`` -> ``"FP32"``."""
    if isinstance(dtype, np.dtype) and dtype in _BY_NUMPY:  # the per-output fast path
        return _BY_NUMPY[dtype]
    return _BY_DTYPE[str(as_dtype(dtype))]


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


# Lists and objects a request's JSON may hold. Validating one costs 100 times a number's time
# (3-18 us, 2 shared CPUs), all of it holding the GIL, so the event loop too: 32 MB of
# ``"outputs": [{"name": "y", "parameters": {}}, ...]`` or of nested ``[[1], [1], ...]`` data held
# every connection, health checks included, for 38 s. At this many the worst stall is 1.5 s (flat
# numbers, parsed a slice at a time by ``flat_data``, stall < 0.11 s); a nested [1, 224, 224, 3] image holds 50,401
# (they are counted a slice at a time: one count over 27 MB held the GIL 6-8 ms).
MAX_JSON_CONTAINERS = 1 << 16


def _parse_header(header: bytes | memoryview) -> InferRequest:
    text = bytes(header)
    containers = json_slices.count(text, b"[{")  # ones inside strings too: an upper bound
    if containers > MAX_JSON_CONTAINERS:
        raise ProtocolError(f"the request's JSON holds {containers} lists and objects ('[' and '{{' counted), more "
                            f"than the server's limit of {MAX_JSON_CONTAINERS}; send tensor data flat (row-major) "
                            "or as binary data", 413)
    parsed, too_large = None, None
    # data parsed a slice at a time, so the loop keeps the GIL: a large body, or one of many lists
    if len(text) >= flat_data.INCREMENTAL_BYTES or containers >= flat_data.INCREMENTAL_CONTAINERS:
        try:
            parsed = flat_data.parse_flat(text)
            if parsed is None:  # parsed whole, in one call
                flat_data.check_structure(len(text))
        except flat_data.StructureTooLarge as exc:
            too_large = str(exc)
    if too_large is not None:
        raise ProtocolError(too_large, 413)
    if parsed is None:
        parsed = validate_header(text)
    if isinstance(parsed, str):
        raise ProtocolError(parsed)  # raised outside any except: no __context__ holding the input
    return parsed


# numpy's limit on an array's extent in bytes: its nonzero dims' product times its item size, for an
# empty array too (so [2**32, 2**32, 0] holds no element and still cannot be made).
MAX_EXTENT = int(np.iinfo(np.intp).max)


def _check_shape(item: Any, dtype: np.dtype) -> None:
    """Refuse a shape no array can have, naming the input, its shape and the limit it passes: numpy's
    refusal quoted a reshape (``cannot reshape array of size 0 into shape ...``)."""
    if len(item.shape) > MAX_DIMS:
        message = (f"input {item.name!r}: shape {item.shape} has {len(item.shape)} dims, more than the limit of "
                   f"{MAX_DIMS} (numpy's)")
    else:
        extent = math.prod(dim or 1 for dim in item.shape) * dtype.itemsize
        if extent <= MAX_EXTENT:
            return
        message = (f"input {item.name!r}: shape {item.shape} of {item.datatype} spans {extent} bytes (its nonzero "
                   f"dims times {dtype.itemsize}), past the limit of {MAX_EXTENT} bytes (numpy's, 2**63 - 1) that "
                   "holds for an empty tensor too")
    raise ProtocolError(message)


def _decode_input(item: Any, binary: memoryview, offset: int) -> tuple[np.ndarray, int]:
    """One input tensor, from the binary section at ``offset`` or from its JSON ``data`` (its shape checked
    first: the reshape at the end cannot fail)."""
    dtype = _WIRE[item.datatype]
    _check_shape(item, dtype)
    count = math.prod(item.shape)
    size = item.parameters.binary_data_size if item.parameters is not None else None
    if size is not None:
        if item.data is not None:
            raise ProtocolError(f"input {item.name!r} has both 'data' and parameters.binary_data_size; send one")
        if offset + size > len(binary):
            raise ProtocolError(f"input {item.name!r}: binary data truncated: binary_data_size is {size} bytes "
                                f"but only {len(binary) - offset} bytes are left in the body")
        if size != count * dtype.itemsize:
            raise ProtocolError(f"input {item.name!r}: shape {item.shape} of {item.datatype} needs "
                                f"{count * dtype.itemsize} bytes, binary_data_size is {size}")
        raw = binary[offset:offset + size]
        if dtype == np.bool_:
            _check_bools(item.name, raw)
        return np.frombuffer(raw, dtype=dtype).reshape(item.shape), offset + size
    if item.data is None:
        raise ProtocolError(f"input {item.name!r} has neither 'data' nor parameters.binary_data_size")
    return _json_array(item, dtype, count).reshape(item.shape), offset


def _check_bools(name: str, raw: memoryview) -> None:
    """BOOL binary data is one byte per element, 0 or 1. numpy reads any other byte as a bool that is
    neither, on which the backends disagree (Not of byte 2 was 0 on numpy, 3 on onnxruntime, sent
    back as a BOOL byte of 3)."""
    codes = np.frombuffer(raw, np.uint8)
    if codes.size and codes.max() > 1:
        first = int(np.argmax(codes > 1))
        raise ProtocolError(f"input {name!r}: BOOL element {first} (flat index) is byte {codes[first]}; BOOL binary "
                            "data holds one byte per element, 0 (false) or 1 (true)")


def _json_array(item: Any, dtype: np.dtype, count: int) -> np.ndarray:
    """The flat array of ``data`` (a list, or the array ``flat_data`` parsed): the schema checked each
    element's type and range, so the conversion is exact; numpy checks that nested lists are rectangular."""
    try:
        array = np.asarray(item.data, dtype=dtype).ravel()
    except ValueError as exc:
        message = f"input {item.name!r}: data is not a rectangular list: {exc}"
    else:
        if array.size == count:
            return array
        message = f"input {item.name!r}: shape {item.shape} needs {count} elements, data has {array.size}"
    raise ProtocolError(message)


def _requested_outputs(request: InferRequest) -> tuple[dict[str, bool] | None, bool]:
    """(each listed output -> binary or not, or None for all outputs; the default format)."""
    default = bool(request.parameters is not None and request.parameters.binary_data_output)
    if not request.outputs:  # absent or empty: every output
        return None, default
    wanted: dict[str, bool] = {}
    for out in request.outputs:
        if out.name in wanted:
            raise ProtocolError(f"output {out.name!r} is requested twice in 'outputs'; list each output once")
        wanted[out.name] = default if out.parameters is None or out.parameters.binary_data is None \
            else out.parameters.binary_data
    return wanted, default


def encode_response(model_name: str, model_version: str, request: DecodedRequest,
                    results: dict[str, np.ndarray], max_bytes: int | None = None) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the JSON header's length. Past
    ``max_bytes`` (None: no limit) a ``ProtocolError`` names the output that crossed it: a binary
    tensor is counted before its bytes are copied, JSON ``data`` as it is written, a chunk at a time."""
    limit = _ReplyLimit(max_bytes)
    outputs, chunks = [], []
    wanted = request.outputs
    for name in (results if wanted is None else wanted):
        array = np.asarray(results[name])
        binary = request.binary_default if wanted is None else wanted[name]
        entry = json.dumps({"name": name, "datatype": datatype_of(array.dtype), "shape": list(array.shape)},
                           separators=(",", ":"))[:-1]
        if binary:
            limit.take(name, array.nbytes)
            raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            outputs.append(f'{entry},"parameters":{{"binary_data_size":{len(raw)}}}}}')
            chunks.append(raw)
        else:
            outputs.append(f'{entry},"data":[{",".join(_json_data(name, array.ravel(), limit))}]}}')
    head: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        head["id"] = request.id
    header = f'{json.dumps(head, separators=(",", ":"))[:-1]},"outputs":[{",".join(outputs)}]}}'.encode()
    limit.settle(len(header) + sum(map(len, chunks)))
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


# JSON ``data`` is written this many elements at a time: Python objects cost about 40 bytes of
# memory per number, so a reply over the limit never holds more than one chunk of them.
_JSON_CHUNK = 1 << 16


def _json_data(name: str, flat: np.ndarray, limit: _ReplyLimit) -> list[str]:
    """``flat``'s elements as JSON text, in chunks of ``_JSON_CHUNK`` joined by commas."""
    parts = []
    for start in range(0, flat.size, _JSON_CHUNK):
        parts.append(json.dumps(flat[start:start + _JSON_CHUNK].tolist(), separators=(",", ":"))[1:-1])
        limit.take(name, len(parts[-1]) + 1)
    return parts


class _ReplyLimit:
    """Bytes of a reply written so far against the server's limit for one reply."""

    def __init__(self, max_bytes: int | None):
        self.max_bytes, self.used = max_bytes, 0

    def take(self, output: str, size: int) -> None:
        """``size`` more bytes for ``output``."""
        self.used += size
        if self.max_bytes is not None and self.used > self.max_bytes:
            raise ProtocolError(f"output {output!r} takes the reply past {self._limit()}")

    def settle(self, size: int) -> None:
        """The whole reply's size, once written."""
        if self.max_bytes is not None and size > self.max_bytes:
            raise ProtocolError(f"the reply of {size} bytes exceeds {self._limit()}")

    def _limit(self) -> str:
        return (f"the server's limit of {self.max_bytes} bytes for one reply (--max-reply-bytes); ask for fewer or "
                "smaller outputs")


# An error quotes what the client sent (a name, a shape), which may be megabytes; past this many
# characters the middle of the message is left out, its start and end (what was expected) kept.
MAX_MESSAGE_CHARS = 4096


def brief(message: str) -> str:
    """``message``, its middle elided when longer than ``MAX_MESSAGE_CHARS``."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    head, tail = MAX_MESSAGE_CHARS * 3 // 4, MAX_MESSAGE_CHARS // 4
    return f"{message[:head]} ...({len(message) - head - tail} characters left out)... {message[-tail:]}"


def error_body(message: str) -> bytes:
    return json.dumps({"error": brief(message)}).encode()
