"""Flat JSON tensor ``data`` parsed a slice at a time, so that a large request does not hold the GIL.

pydantic (and ``json.loads``) parse a whole body in one call holding the GIL, so the event loop on
the other thread, health checks included, waits for all of it: 32 MB of flat one-digit numbers held
it 0.5 s quiet and 2.2-2.6 s on a loaded machine. Here the large flat ``"data": [...]`` arrays are cut
out of the body, the rest (the structure: small) is validated by the schema as before, and each array
is parsed ``CHUNK_BYTES`` at a time (``json.loads`` and numpy), the GIL free between slices.

This is a fast path only: it returns a request only when the whole body is one the schema accepts
with these exact arrays (every element of the datatype's JSON type and range, as ``schemas`` checks).
Anything else (an array inside a string or a parameter, a bad number, a repeated key, a value out of
range) returns None, and the caller parses the body the old way, so replies and messages are the same.
"""

from __future__ import annotations

import json
import re

import numpy as np
from pydantic import ValidationError

from graphc.model.dtypes import to_numpy
from graphc.serving.kserve.repeated_keys import TOKEN, key_of, repeated_key
from graphc.serving.kserve.schemas import DATATYPES, FLOAT_BOUNDS, InferRequest

# Bodies this large and up take the fast path: below it the one-call parse holds the loop < 5 ms.
INCREMENTAL_BYTES = 1 << 18
# Bytes of an array parsed per slice: about 1 ms of json.loads and numpy, holding the GIL.
CHUNK_BYTES = 1 << 18
_DATA = re.compile(rb'"data"[ \t\n\r]*:[ \t\n\r]*\[')
# What a flat array of numbers or of booleans may hold (JSON whitespace included); a letter of
# NaN or Infinity is not in either, so non-finite numbers (which the schema refuses) are never taken.
_NUMBER_BYTES, _BOOL_BYTES = b"-+.0123456789eE, \t\n\r", b"truefals, \t\n\r"
_BY_DTYPE = {to_numpy(dtype): datatype for datatype, dtype in DATATYPES.items()}


def parse_flat(text: bytes) -> InferRequest | None:
    """The request in ``text`` with each input's flat ``data`` as a 1-D numpy array of its
    datatype, or None where the body is not plainly valid (then parse it whole for the error)."""
    spans = [(m.end() - 1, text.find(b"]", m.end())) for m in _DATA.finditer(text)]
    spans = [(start, end) for start, end in spans if end > 0 and text.find(b"[", start + 1, end) < 0]
    if not spans:
        return None
    parts, opens, cut, length = [], set(), 0, 0
    for start, end in spans:  # the skeleton: each array left empty, "data":[]
        parts.append(text[cut:start + 1])
        length += len(parts[-1])
        opens.add(length - 1)
        cut = end
    parts.append(text[cut:])
    skeleton = b"".join(parts)
    try:
        request = InferRequest.model_validate_json(skeleton)
    except ValidationError:
        return None
    owners = _input_data_owners(skeleton, opens)
    if owners is None or repeated_key(skeleton) is not None:
        return None
    for (start, end), index in zip(spans, owners):
        item = request.inputs[index]
        array = _parse_array(text, start + 1, end, item.datatype)
        if array is None:
            return None
        item.data = array
    return request


def _input_data_owners(skeleton: bytes, opens: set[int]) -> list[int] | None:
    """For each '[' at an offset in ``opens``, in order, the index of the input whose ``data`` it
    opens (``inputs[i].data`` of the top object); None if one opens anything else or is in a string."""
    owners: list[int] = []
    stack: list[list] = []  # per open container: [its key or index in its parent, keys (object) or count (list)]
    key = b""
    for match in TOKEN.finditer(skeleton):
        if match.lastindex:
            key = key_of(match)
            continue
        token = match.group()
        if token in (b"{", b"["):
            place = key
            if stack and type(stack[-1][1]) is int:
                place, stack[-1][1] = stack[-1][1], stack[-1][1] + 1
            if match.start() in opens:
                if not (len(stack) == 3 and key == b"data" and stack[1][0] == b"inputs"
                        and type(stack[1][1]) is int and type(stack[2][1]) is not int):
                    return None
                owners.append(stack[2][0])
            stack.append([place, 0 if token == b"[" else None])
        elif token in (b"}", b"]"):
            stack.pop()
    return owners if len(owners) == len(opens) else None


def _parse_array(text: bytes, start: int, end: int, datatype: str) -> np.ndarray | None:
    """The numbers (or booleans) in ``text[start:end]``, between a flat array's brackets, parsed
    ``CHUNK_BYTES`` at a time, as a 1-D array of ``datatype``; None unless every element is of its
    JSON type and range."""
    dtype = to_numpy(DATATYPES[datatype])
    allowed = _BOOL_BYTES if dtype.kind == "b" else _NUMBER_BYTES
    pieces = []
    while True:
        chunk = text[start:min(start + CHUNK_BYTES, end)]
        if start + len(chunk) < end:  # cut after the last whole number
            comma = chunk.rfind(b",")
            if comma < 0:  # one number longer than a chunk
                return None
            chunk = chunk[:comma]
        if chunk.translate(None, allowed):
            return None
        try:
            values = json.loads(b"[%s]" % chunk)
        except ValueError:  # a number cut in two, or not JSON
            return None
        piece = _typed(values, dtype)
        if piece is None or (not values and (pieces or start + len(chunk) < end)):  # blank between commas
            return None
        pieces.append(piece)
        start += len(chunk) + 1
        if start > end:
            return np.concatenate(pieces)


def _typed(values: list, dtype: np.dtype) -> np.ndarray | None:
    """``values`` (from ``json.loads``) as ``dtype``, or None where the schema would refuse one."""
    if not values:
        return np.empty(0, dtype)
    try:
        if dtype.kind == "b":  # the bytes were letters of true and false only: JSON made them bools
            return np.array(values, dtype)
        if dtype.kind in "iu":
            array = np.array(values)
            info = np.iinfo(dtype)
            if array.dtype.kind not in "iu" or array.min() < info.min or array.max() > info.max:
                return None
            return array.astype(dtype)
        array = np.array(values, dtype=np.float64)
    except (OverflowError, ValueError, TypeError):
        return None
    if not np.all(np.abs(array) < FLOAT_BOUNDS[_BY_DTYPE[dtype]]):  # NaN fails too
        return None
    return array.astype(dtype)
