"""Flat JSON tensor ``data`` parsed a slice at a time, so that a large request does not hold the GIL.

pydantic (and ``json.loads``) parse a whole body in one call holding the GIL, so the event loop on
the other thread, health checks included, waits for all of it: 32 MB of flat one-digit numbers held
it 0.5 s quiet and 2.2-2.6 s on a loaded machine. Here the large flat ``"data": [...]`` arrays are cut
out of the body, the rest (the structure: small) is validated by the schema as before, and each array
is parsed ``CHUNK_BYTES`` at a time (``json.loads`` and numpy), the GIL free between slices.

A bad body is answered from slices too, with the reply the whole-body parse gives: a slice that
is not plainly valid is parsed by pydantic's own parser (the first JSON error, its line and column
counted in the whole body), its first element of a wrong type or range found by the schema's element
type, and the structure is validated with each array cut down to that element. A body whose arrays
cannot be told apart from the rest this way (one in a string or a parameter, a string in one, a
structure that is not JSON) gets None: parse it whole.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pydantic_core
from pydantic import TypeAdapter, ValidationError

from graphc.model.dtypes import to_numpy
from graphc.serving.kserve.repeated_keys import walk
from graphc.serving.kserve.request_errors import describe_errors, validate_header
from graphc.serving.kserve.schemas import DATATYPES, ELEMENT_LISTS, FLOAT_BOUNDS, InferRequest

# Bodies this large and up take the fast path: below it the one-call parse holds the loop < 5 ms.
INCREMENTAL_BYTES = 1 << 18
# Bytes of an array parsed per slice: about 1 ms of json.loads and numpy, holding the GIL.
CHUNK_BYTES = 1 << 18
_DATA = re.compile(rb'"data"[ \t\n\r]*:[ \t\n\r]*\[')
# What a flat array of numbers or of booleans may hold (JSON whitespace included); a letter of
# NaN or Infinity is not in either, so non-finite numbers (which the schema refuses) are never taken.
_NUMBER_BYTES, _BOOL_BYTES = b"-+.0123456789eE, \t\n\r", b"truefals, \t\n\r"
_BY_DTYPE = {to_numpy(dtype): datatype for datatype, dtype in DATATYPES.items()}
_JSON_LIST = TypeAdapter(list)  # pydantic's JSON parser, for its verdict and message on a slice
HEAD = 5  # elements of each array kept in the body cut down for the schema
_AT = re.compile(r" at line (\d+) column (\d+)$")


def parse_flat(text: bytes) -> InferRequest | str | None:
    """The request in ``text`` with each input's flat ``data`` as a 1-D numpy array of its datatype,
    or the message refusing it (as the whole-body parse words it), or None: parse it whole."""
    spans = [(m.end() - 1, text.find(b"]", m.end())) for m in _DATA.finditer(text)]
    spans = [(start, end) for start, end in spans if end > 0 and text.find(b"[", start + 1, end) < 0]
    if not spans:
        return None
    skeleton = _cut(text, spans, [b""] * len(spans))
    try:
        structure = pydantic_core.from_json(skeleton)
    except ValueError:
        return None
    owners = _input_data_owners(skeleton, spans)
    if owners is None:
        return None
    arrays, data_at, shorts = [], {}, []
    for (start, end), owner in zip(spans, owners):
        scan = _Scan(text, start, end, _datatype(structure, owner))
        if scan.verdict is not None:  # a JSON error (the first: the arrays before are JSON) or no slicing
            return scan.verdict or None
        arrays.append(scan.array)
        # What a message may quote: the first HEAD elements (an input's repr shows 4, then "..."), the bad one.
        short = scan.head if scan.bad is None or scan.bad[0] < HEAD else [*scan.head, scan.bad[1]]
        shorts.append(json.dumps(short)[1:-1].encode())
        data_at.pop(owner, None)  # the input's last "data" is the one the parser keeps
        if scan.bad is not None:
            data_at[owner] = (min(scan.bad[0], HEAD), scan.bad[0])
    parsed = validate_header(_cut(text, spans, shorts), data_at)
    if isinstance(parsed, InferRequest):
        if data_at:  # the schema took an element the slice's element type refused: not ours to judge
            return None
        for owner, array in zip(owners, arrays):
            parsed.inputs[owner].data = array
    return parsed


def _cut(text: bytes, spans: list[tuple[int, int]], contents: list[bytes]) -> bytes:
    """``text`` with the array between each span's brackets replaced by its ``contents``."""
    parts, cut = [], 0
    for (start, end), content in zip(spans, contents):
        parts += [text[cut:start + 1], content]
        cut = end
    parts.append(text[cut:])
    return b"".join(parts)


def _input_data_owners(skeleton: bytes, spans: list[tuple[int, int]]) -> list[int] | None:
    """For each span's '[' (emptied in ``skeleton``), in order, the index of the input whose ``data``
    it opens (``inputs[i].data`` of the top object); None if one opens anything else or is in a string."""
    opens, length = set(), 0
    for index, (start, end) in enumerate(spans):  # where each '[' is in the skeleton
        opens.add(start - length)
        length += end - start - 1
    owners: list[int] = []
    for key, offset, stack in walk(skeleton):
        if key is None and offset in opens:  # stack: the top object, "inputs", an input, its "data"
            if not (len(stack) == 4 and stack[1][0] == b"inputs" and type(stack[1][1]) is int
                    and type(stack[2][1]) is set and stack[3][0] == b"data"):
                return None
            owners.append(stack[2][0])
    return owners if len(owners) == len(opens) else None


def _datatype(structure: object, owner: int) -> str | None:
    """The datatype ``inputs[owner]`` of the parsed skeleton names, if the schema knows it (else its
    data is not validated element by element)."""
    inputs = structure.get("inputs") if isinstance(structure, dict) else None
    item = inputs[owner] if isinstance(inputs, list) and owner < len(inputs) else None
    datatype = item.get("datatype") if isinstance(item, dict) else None
    return datatype if isinstance(datatype, str) and datatype in DATATYPES else None


class _Scan:
    """The flat array between the brackets at ``start`` and ``end`` of ``text``, parsed a slice at a
    time. ``array``: its elements as ``datatype`` (None once one is refused); ``bad``: the index and
    value of the first element the schema refuses for ``datatype``; ``verdict``: the message of its
    first JSON error, or "" where it cannot be sliced (a string or an element longer than a slice in
    it), else None."""

    def __init__(self, text: bytes, start: int, end: int, datatype: str | None):
        self.array: np.ndarray | None = None
        self.bad: tuple[int, object] | None = None
        self.verdict: str | None = None
        self.head: list = []  # the first HEAD elements, as JSON parsed them
        dtype = to_numpy(DATATYPES[datatype]) if datatype is not None else None
        pieces, count, at = [], 0, start + 1
        while at <= end:
            chunk = text[at:min(at + CHUNK_BYTES, end)]
            last = at + len(chunk) == end
            if not last:  # cut after the last whole element
                comma = chunk.rfind(b",")
                if comma < 0:
                    self.verdict = ""
                    return
                chunk = chunk[:comma]
            first = at == start + 1
            piece = _plain(chunk, dtype if self.bad is None else None, first, last)
            if piece is None:
                piece = self._slice(text, chunk, at, datatype, count, first, last)
                if piece is None:
                    return
            if len(self.head) < HEAD:
                self.head += json.loads(b"[%s]" % b",".join(chunk.split(b",", HEAD)[:HEAD]))[:HEAD - len(self.head)]
            if self.bad is None and dtype is not None:
                pieces.append(piece)
            count += len(piece)
            at += len(chunk) + 1
        if self.bad is None and dtype is not None:
            self.array = np.concatenate(pieces)

    def _slice(self, text: bytes, chunk: bytes, at: int, datatype: str | None, count: int, first: bool,
               last: bool) -> np.ndarray | list | None:
        """``chunk`` (at ``at`` in ``text``, after ``count`` elements), which is not plain data of its
        type, parsed by pydantic's parser in its place in the array: its values (typed, where all are
        of ``datatype``), or None with ``verdict`` set."""
        if b'"' in chunk:  # a cut at a comma may have split a string
            self.verdict = ""
            return None
        prefix, suffix = (b"[" if first else b"[0,"), (b"]" if last else b",0]")  # the elements around it
        mini = prefix + chunk + suffix
        try:
            values = _JSON_LIST.validate_json(mini)
        except ValidationError as exc:
            self.verdict = _json_error(exc.errors(include_url=False)[0], text, at - len(prefix), mini)
            return None
        values = values[0 if first else 1:len(values) if last else -1]
        if self.bad is not None or datatype is None:
            return values
        try:
            ELEMENT_LISTS[datatype].validate_json(b"[%s]" % chunk)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            self.bad = (count + error["loc"][0], error["input"])
            return values
        typed = _typed(values, to_numpy(DATATYPES[datatype]))
        if typed is None:  # the schema takes what the numpy check refuses: parse it whole
            self.verdict = ""
        return typed


def _plain(chunk: bytes, dtype: np.dtype | None, first: bool, last: bool) -> np.ndarray | list | None:
    """The elements of ``chunk``, an array's slice, where it is plainly valid: numbers or booleans
    only, no blank element, each of ``dtype``'s JSON type and range (None: any number or boolean)."""
    allowed = _NUMBER_BYTES + _BOOL_BYTES if dtype is None else _BOOL_BYTES if dtype.kind == "b" else _NUMBER_BYTES
    if chunk.translate(None, allowed):
        return None
    try:
        values = json.loads(b"[%s]" % chunk)
    except ValueError:  # not JSON
        return None
    if not values and not (first and last):  # blank between commas
        return None
    return values if dtype is None else _typed(values, dtype)


def _json_error(error: dict, text: bytes, base: int, mini: bytes) -> str:
    """The message of the JSON ``error`` pydantic found in ``mini``, which stands at ``base`` of
    ``text``, with its line and column counted in ``text``; "" where it names no place."""
    where = _AT.search(error["msg"])
    if where is None:
        return ""
    lines = mini.split(b"\n")[:int(where[1]) - 1]
    offset = base + sum(map(len, lines)) + len(lines) + int(where[2]) - 1
    line, column = text.count(b"\n", 0, offset) + 1, offset - text.rfind(b"\n", 0, offset)
    return describe_errors([{**error, "msg": f"{error['msg'][:where.start()]} at line {line} column {column}"}])


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
