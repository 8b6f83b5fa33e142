"""Large JSON infer requests parsed with the GIL let go between slices: each input's ``"data"`` array
(flat, or nested lists of numbers or booleans) ``CHUNK_BYTES`` at a time, the rest by the schema.

pydantic and ``json.loads`` parse a body in one call holding the GIL, so the event loop's other
connections, health checks included, wait for all of it (32 MB of one-digit numbers: 0.57 s on a quiet
machine, 1.8-2.2 s on a loaded one). ``parse_flat`` finds the arrays (``json_slices.FlatArray``, string
aware, and ``NestedArray``, bracket by bracket, strings in its rows skipped; nested data broken off by a JSON
error is judged at the break, ``_ending``; with an object or an element beside a list it stays in the
structure), cuts them out, matches each to its input (``_input_data_owners``) and
parses it a slice at a time (``_Scan``; ``_NestedScan`` joins small rows and shapes them as numpy would,
``nested_shape``). The structure left, each array cut down to its first ``HEAD`` elements and its first
refused element, is validated by the schema (``request_errors.validate_header``), which words an error
at its index in the whole array. A JSON error is found by pydantic's parser in its slice (or in the
structure: ``_structure_error``), its line and column counted in the whole body, so a bad body gets the
whole parse's reply. What cannot be judged this way (no input's array found, a '"data": [' in a string,
strings beside objects in one array, an element the schema takes but the numpy check refuses) gets
None: parse it whole. What is parsed in one call is at most ``MAX_STRUCTURE_BYTES`` (else a 413).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pydantic_core
from pydantic import TypeAdapter, ValidationError

from graphc.model.dtypes import to_numpy
from graphc.serving.kserve import json_slices
from graphc.serving.kserve.json_slices import FlatArray, NestedArray
from graphc.serving.kserve.nested_shape import numpy_shape
from graphc.serving.kserve.repeated_keys import TOKEN, walk
from graphc.serving.kserve.request_errors import describe_errors, validate_header
from graphc.serving.kserve.schemas import DATATYPES, ELEMENT_LISTS, FLOAT_BOUNDS, InferRequest

# Bodies this large and up take the fast path: below it the one-call parse holds the loop < 5 ms.
INCREMENTAL_BYTES = 1 << 18
# And bodies with this many lists and objects: validating each holds the GIL 3-18 us, so 65,000 rows
# of ``[7]`` (260 KB) held it 180-250 ms (24-27 ms sliced).
INCREMENTAL_CONTAINERS = 1 << 10
# Bytes of an array parsed per slice: about 1 ms of json.loads and numpy, holding the GIL.
CHUNK_BYTES = 1 << 18
_DATA = re.compile(rb'"data"[ \t\n\r]*:[ \t\n\r]*\[')
# What a flat array of numbers or of booleans may hold (JSON whitespace included); a letter of
# NaN or Infinity is not in either, so non-finite numbers (which the schema refuses) are never taken.
_NUMBER_BYTES, _BOOL_BYTES = b"-+.0123456789eE, \t\n\r", b"truefals, \t\n\r"
_JSON_LIST = TypeAdapter(list)  # pydantic's JSON parser, for its verdict and message on a slice
_JSON_ANY = TypeAdapter(Any)  # and on the structure
HEAD = 5  # elements of each array kept in the body cut down for the schema
# Bytes of a large request's JSON parsed in one call (what is left once its inputs' data arrays are
# cut out, with any element refused in them, or a body they cannot be cut from): that call holds the GIL, so every other
# connection: 4-21 ms at this size (1 MiB of a string, of whitespace, of an array of numbers).
MAX_STRUCTURE_BYTES = 1 << 20
_AT = re.compile(r" at line (\d+) column (\d+)$")


class StructureTooLarge(ValueError):
    """A request whose JSON outside its inputs' data passes ``MAX_STRUCTURE_BYTES`` (a 413)."""


def parse_flat(text: bytes) -> InferRequest | str | None:
    """The request in ``text`` with each input's ``data`` as a numpy array of its datatype (1-D where
    flat, shaped as numpy shapes nested lists, or ``Ragged``), or the message refusing it (as the
    whole-body parse words it), or None: parse it whole. ``StructureTooLarge`` where what is left to
    parse in one piece passes ``MAX_STRUCTURE_BYTES``."""
    arrays = _data_arrays(text)
    skeleton = _arrays_replaced(text, arrays)
    check_structure(len(skeleton))
    try:
        structure = pydantic_core.from_json(skeleton)
    except ValueError:
        return _structure_error(text, arrays, skeleton)
    owners = _input_data_owners(skeleton, arrays)
    arrays = [array for array, owner in zip(arrays, owners) if owner is not None]  # the others stay in the structure
    owners = [owner for owner in owners if owner is not None]
    if not arrays:
        return None
    values, data_at, shorts, refused = [], {}, [], 0
    for array, owner in zip(arrays, owners):
        scan = _scan(array, _datatype(structure, owner))
        if scan.verdict is not None:  # a JSON error (the first: the arrays before are JSON) or no slicing
            return scan.verdict or None
        values.append(scan.array)
        shorts.append(scan.kept_elements())
        data_at.pop(owner, None)  # the input's last "data" is the one the parser keeps
        if scan.bad is not None:
            data_at[owner] = scan.bad_paths()
            refused += len(json.dumps(scan.refused_element()))
    header = _arrays_replaced(text, arrays, shorts)
    # the structure (with any data that is not an input's) and the refused elements, quoted in one piece;
    # not the few normalised numbers at the head of each array
    check_structure(len(header) - sum(map(len, shorts)) + refused)
    parsed = validate_header(header, data_at)
    if isinstance(parsed, InferRequest):
        if data_at:  # the schema took an element the slice's element type refused: not ours to judge
            return None
        for owner, array in zip(owners, values):
            parsed.inputs[owner].data = array
    return parsed


def _data_arrays(text: bytes) -> list[FlatArray | NestedArray]:
    """Each ``"data": [`` array of ``text`` that is flat (one the body ends in is the last) or nested
    lists of elements (``NestedArray``)."""
    arrays: list[FlatArray | NestedArray] = []
    at = 0
    while (key := text.find(b'"data"', at)) >= 0:
        match = _DATA.match(text, key)
        at = key + 1
        if match is not None:
            array = FlatArray(text, match.end() - 1)
            if not array.flat:
                array = NestedArray(text, match.end() - 1)
                if array.end < 0 and _ending(array) is None:  # not lists of elements alone: it stays in the structure
                    continue
            arrays.append(array)
            if array.end < 0:
                break
            at = array.end
    return arrays


def _ending(bounds: NestedArray) -> str | None:
    """Set and return ``bounds.ending``: the message of the JSON error at which its lists break off
    (the body ends in them, a stray or missing comma), placed in the body; None where the JSON there is
    valid so far (an element beside a list, an object: the schema's to judge, in the structure), or
    too long to parse in one call."""
    if bounds.tail is None:  # (nested past MAX_DEPTH)
        return None
    (prefix, at, cut), text = bounds.tail, bounds.text
    if cut == len(text) and prefix.endswith(b"["):  # the body ends in a row: a flat array it ends in
        bounds.ending = _Scan(FlatArray(text, at - 1), None).verdict or None
    elif cut - at <= CHUNK_BYTES:
        mini = prefix + text[at:cut]
        try:
            _JSON_ANY.validate_json(mini)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            offset = _error_offset(error, mini)
            # (the lists' end within the body is the piece's, not an error of the whole parse)
            if offset is not None and (cut == len(text) or "EOF while parsing" not in error["msg"]):
                bounds.ending = _placed_json_error(error, text, at - len(prefix) + offset)
    return bounds.ending


def check_structure(size: int) -> None:
    """Refuse (``StructureTooLarge``) a JSON part whose ``size`` bytes, what is parsed in one call
    holding the GIL, pass ``MAX_STRUCTURE_BYTES``."""
    if size > MAX_STRUCTURE_BYTES:
        raise StructureTooLarge(
            f"the request's JSON holds {size} bytes outside its inputs' data arrays of numbers (parsed in one piece), "
            f"more than the server's limit of {MAX_STRUCTURE_BYTES}; send tensor data as each input's \"data\" "
            "array of numbers or booleans, or as binary data")


def _structure_error(text: bytes, arrays: list[FlatArray | NestedArray], skeleton: bytes) -> str | None:
    """The message of the first JSON error of ``text``, whose ``skeleton`` (``arrays`` emptied) is not
    JSON: one in an array before the skeleton's error, else that error placed in ``text``; None: parse
    it whole."""
    if not set(_skeleton_opens(arrays)) <= {match.start() for match in TOKEN.finditer(skeleton) if match.group() == b"["}:
        return None  # a '"data": [' in a string was taken for an array
    try:
        _JSON_ANY.validate_json(skeleton)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
    else:  # pydantic's validator takes what from_json refused (no case known): its reply is the whole parse's
        return None
    offset = _error_offset(error, skeleton)  # in the skeleton, then in the text as each array before it is put back
    if offset is None:
        return None
    for array in arrays:
        if array.start > offset:  # (an EOF error is at the body's last byte, an array's '[' in the skeleton)
            break
        offset += array.stop - array.start - 1
        scan = _scan(array, None)
        if scan.verdict is not None:
            return scan.verdict or None
    return _placed_json_error(error, text, offset)


def _arrays_replaced(text: bytes, arrays: list[FlatArray | NestedArray], contents: list[bytes] | None = None) -> bytes:
    """``text`` with the elements of each of ``arrays`` replaced by its ``contents`` (none: emptied)."""
    parts, cut = [], 0
    for array, content in zip(arrays, contents or [b""] * len(arrays)):
        parts += [text[cut:array.start + 1], content]
        cut = array.stop
    parts.append(text[cut:])
    return b"".join(parts)


def _skeleton_opens(arrays: list[FlatArray]) -> list[int]:
    """Where each array's '[' is in the skeleton (``arrays`` emptied)."""
    opens, length = [], 0
    for array in arrays:
        opens.append(array.start - length)
        length += array.stop - array.start - 1
    return opens


def _input_data_owners(skeleton: bytes, arrays: list[FlatArray]) -> list[int | None]:
    """For each array's '[' (emptied in ``skeleton``), in order, the index of the input whose ``data``
    it opens (``inputs[i].data`` of the top object); None for one that opens anything else or is in a string."""
    owners = dict.fromkeys(_skeleton_opens(arrays))
    for key, offset, stack in walk(skeleton):
        # stack: the top object, "inputs", an input, its "data"
        if key is None and offset in owners and len(stack) == 4 and stack[1][0] == b"inputs" \
                and type(stack[1][1]) is int and type(stack[2][1]) is set and stack[3][0] == b"data":
            owners[offset] = stack[2][0]
    return list(owners.values())


def _datatype(structure: object, owner: int) -> str | None:
    """The datatype ``inputs[owner]`` of the parsed skeleton names, if the schema knows it (else its
    data is not validated element by element)."""
    inputs = structure.get("inputs") if isinstance(structure, dict) else None
    item = inputs[owner] if isinstance(inputs, list) and owner < len(inputs) else None
    datatype = item.get("datatype") if isinstance(item, dict) else None
    return datatype if isinstance(datatype, str) and datatype in DATATYPES else None


class _Scan:
    """A ``FlatArray`` parsed a slice at a time. ``array``: its elements as ``datatype`` (None once one
    is refused, or without a datatype); ``bad``: the index and value of the first element the schema
    refuses for ``datatype``; ``verdict``: the message of its first JSON error, or "" where the
    slice's values cannot be judged here, else None; ``head``: its first HEAD elements as JSON parsed
    them."""

    def __init__(self, bounds: FlatArray, datatype: str | None):
        self.array: np.ndarray | None = None
        self.bad: tuple[int, object] | None = None
        self.verdict: str | None = None
        self.head: list = []
        self._bounds, self._datatype = bounds, datatype
        if bounds.objects and bounds.strings:  # a ',' in an object cannot be told from one between elements
            self.verdict = ""
            return
        pieces, count = [], 0
        for at, cut in _slices(bounds):
            piece = self._piece(at, cut, count)
            if piece is None:
                return
            if self.bad is None and datatype is not None:
                pieces.append(piece)
            count += len(piece)
        if self.bad is None and datatype is not None:
            self.array = _joined(pieces, to_numpy(DATATYPES[datatype]))

    def _piece(self, at: int, cut: int, count: int) -> np.ndarray | list | None:
        """The elements of the slice ``text[at:cut]`` (after ``count`` elements): typed where plainly
        valid, else as ``_parsed_piece`` gives them; None with ``verdict`` set."""
        chunk, first, last = self._bounds.text[at:cut], at == self._bounds.start + 1, cut == self._bounds.stop
        datatype = self._datatype if self.bad is None else None
        # (the last slice of an array the body ends in is parsed by pydantic, for its JSON error)
        plain = _plain_values(chunk, datatype, first, last) if self._bounds.end >= 0 or not last else None
        if plain is None:
            return self._parsed_piece(chunk, at, count, first, last)
        values, piece = plain
        self.head += values[:HEAD - len(self.head)]
        return piece

    def _parsed_piece(self, chunk: bytes, at: int, count: int, first: bool, last: bool) -> np.ndarray | list | None:
        """``chunk`` (at ``at`` in the body, after ``count`` elements), which is not plain data of its
        type, parsed by pydantic's parser in its place in the array (the last slice of one the body ends
        in with nothing after it): its values (typed, where all are of the datatype), or None with
        ``verdict`` set."""
        suffix = b",0]" if not last else b"]" if self._bounds.end >= 0 else b""  # the elements around it
        prefix = b"[" if first else b"[0,"
        mini = prefix + chunk + suffix
        try:
            values = _JSON_LIST.validate_json(mini)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            offset = _error_offset(error, mini)
            self.verdict = "" if offset is None else _placed_json_error(error, self._bounds.text, at - len(prefix) + offset)
            return None
        values = values[0 if first else 1:len(values) if last else -1]
        self.head += values[:HEAD - len(self.head)]
        if self.bad is not None or self._datatype is None:
            return values
        try:
            ELEMENT_LISTS[self._datatype].validate_json(b"[%s]" % chunk)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            self.bad = (count + error["loc"][0], error["input"])
            return values
        typed = _typed(values, self._datatype)
        if typed is None:  # the schema takes what the numpy check refuses: parse it whole
            self.verdict = ""
        return typed

    def kept_elements(self) -> bytes:
        """What of the array a message may quote: its first HEAD elements (an input's repr shows 4, then
        "..."), and the bad one."""
        return json.dumps(self.head if self.bad is None or self.bad[0] < HEAD else [*self.head, self.bad[1]])[1:-1].encode()

    def bad_paths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The bad element's index in the array cut down to ``kept_elements``, and in the whole array."""
        return (min(self.bad[0], HEAD),), (self.bad[0],)

    def refused_element(self) -> object:
        """The first element the schema refuses, as JSON parsed it."""
        return self.bad[1]


def _slices(bounds: FlatArray) -> Iterator[tuple[int, int]]:
    """(start, end) in the body of each slice of a flat array's elements: ``CHUNK_BYTES`` or less, cut
    at the ',' after its last whole element (an element longer than a slice: at the ',' after it)."""
    at, end = bounds.start + 1, bounds.stop
    while at <= end:
        cut = end
        if at + CHUNK_BYTES < end:
            cut = bounds.last_comma(at, at + CHUNK_BYTES)
            cut = bounds.next_comma(at + CHUNK_BYTES, end) if cut < 0 else cut
        yield at, cut
        at = cut + 1


def _joined(pieces: list[np.ndarray | list], dtype: np.dtype) -> np.ndarray:
    """``pieces`` of elements in one array of ``dtype``, copied a piece at a time (concatenating 100 MB
    at once held the GIL 13 ms)."""
    array = np.empty(sum(map(len, pieces)), dtype)
    done = 0
    for piece in pieces:
        array[done:done + len(piece)] = piece
        done += len(piece)
    return array


class _NestedScan:
    """A ``NestedArray`` parsed a slice at a time: its rows of at most ``CHUNK_BYTES`` joined a slice's
    worth at a time, a larger one as a flat array; a slice that is not plainly valid is parsed row by
    row as a flat array. ``array``, ``verdict`` as ``_Scan``'s, the array shaped as numpy shapes the
    lists (``Ragged`` where it refuses them); ``bad``: the path (an index in each list) to the first
    element the schema refuses, and the element."""

    def __init__(self, bounds: NestedArray, datatype: str | None):
        self.bounds, self.datatype, self.verdict, self.bad, self.array = bounds, datatype, None, None, None
        self.sizes = [0] * len(bounds.rows)
        self.pieces: list = []
        self.bad_head, self.bad_value = [], None  # the first HEAD elements of the bad element's row, it
        text, group, size = bounds.text, [], 0
        for row, (start, end) in enumerate(bounds.rows):
            if end - start > CHUNK_BYTES:
                if not self._parse_rows(group) or not self._parse_rows([row]):
                    return
                group, size = [], 0
            elif text[start:end].strip(b" \t\n\r"):  # (an empty list adds no elements)
                group.append(row)
                size += end - start + 1
                if size > CHUNK_BYTES:
                    if not self._parse_rows(group):
                        return
                    group, size = [], 0
        if not self._parse_rows(group):
            return
        if bounds.end < 0:  # its lists break off at a JSON error, after any of its rows'
            self.verdict = bounds.ending
            return
        if self.bad is not None or datatype is None:
            return
        shape = numpy_shape(bounds.tree, self.sizes)
        if isinstance(shape, tuple):
            shape = _joined(self.pieces, to_numpy(DATATYPES[datatype])).reshape(shape)
        self.array = shape

    def _parse_rows(self, rows: list[int]) -> bool:
        """Parse ``rows`` (small ones joined, if plainly valid, else each as a flat array); False once
        ``verdict`` is set."""
        text, spans = self.bounds.text, [self.bounds.rows[row] for row in rows]
        datatype = self.datatype if self.bad is None else None
        if len(rows) > 1 or rows and spans[0][1] - spans[0][0] <= CHUNK_BYTES:
            plain = _plain_values(b",".join(text[start:end] for start, end in spans), datatype, True, True)
            if plain is not None:
                self._keep(rows, plain[1], [text.count(b",", start, end) + 1 for start, end in spans])
                return True
        for row, (start, _) in zip(rows, spans):
            scan = _Scan(FlatArray(text, start - 1), self.datatype if self.bad is None else None)
            if scan.verdict is not None:
                self.verdict = scan.verdict
                return False
            if scan.bad is not None and self.bad is None:
                self.bad, self.bad_head, self.bad_value = (*self._row_path(row), scan.bad[0]), scan.head, scan.bad[1]
            self._keep([row], scan.array, [len(scan.head) if scan.array is None else len(scan.array)])
        return True

    def _keep(self, rows: list[int], piece, sizes: list[int]) -> None:
        """Note ``rows``' ``sizes``; keep ``piece``, their elements, while no element is refused."""
        for row, size in zip(rows, sizes):
            self.sizes[row] = size
        if self.bad is None and self.datatype is not None:
            self.pieces.append(piece)

    def _row_path(self, row: int) -> tuple[int, ...]:
        """The index in each list of the lists that hold ``row``."""
        def find(node, path):
            if isinstance(node, int):
                return path if node == row else None
            for index, child in enumerate(node):
                found = find(child, (*path, index))
                if found is not None:
                    return found
            return None
        return find(self.bounds.tree, ())

    def kept_elements(self) -> bytes:
        """The lists cut down for the schema: the first HEAD items of the top list, each ``[]`` if empty
        else ``[[]]`` (which the schema takes as it takes the item; a message shows none of an item's
        items), and down the path to the bad element the same, that path's list in place of the rest,
        and the first HEAD elements of its row and it."""
        def cut(node, path):
            if isinstance(node, int):  # the bad element's row
                return self.bad_head if path[0] < HEAD else [*self.bad_head, self.bad_value]
            items = [[] if isinstance(child, int) and self.sizes[child] == 0 else [[]] for child in node[:HEAD]]
            if path:
                items[min(path[0], HEAD):] = [cut(node[path[0]], path[1:])]
            return items
        return json.dumps(cut(self.bounds.tree, self.bad or ()))[1:-1].encode()

    def bad_paths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The bad element's path in the lists cut down to ``kept_elements``, and in the whole array."""
        return tuple(min(index, HEAD) for index in self.bad), self.bad

    def refused_element(self) -> object:
        """The first element the schema refuses, as JSON parsed it."""
        return self.bad_value


def _scan(array: FlatArray | NestedArray, datatype: str | None) -> _Scan | _NestedScan:
    """``array`` parsed a slice at a time, its elements as ``datatype``'s (None: checked as JSON only)."""
    return _NestedScan(array, datatype) if isinstance(array, NestedArray) else _Scan(array, datatype)


def _plain_values(chunk: bytes, datatype: str | None, first: bool, last: bool) -> tuple[list, np.ndarray | list] | None:
    """The elements of ``chunk``, an array's slice, where it is plainly valid (numbers or booleans
    only, no blank element, each of ``datatype``'s JSON type and range; None: any number or boolean):
    as ``json.loads`` parsed them (a scan's head is taken from these: the slice is parsed once) and
    as ``datatype``'s array (the list where None)."""
    allowed = _NUMBER_BYTES + _BOOL_BYTES if datatype is None else _BOOL_BYTES if datatype == "BOOL" else _NUMBER_BYTES
    if chunk.translate(None, allowed):
        return None
    try:
        values = json.loads(b"[%s]" % chunk)
    except ValueError:  # not JSON
        return None
    if not values and not (first and last):  # blank between commas
        return None
    piece = values if datatype is None else _typed(values, datatype)
    return None if piece is None else (values, piece)


def _error_offset(error: dict, mini: bytes) -> int | None:
    """Where in ``mini`` the JSON ``error`` pydantic found in it is (its message's line and column),
    or None where it names no place."""
    where = _AT.search(error["msg"])
    if where is None:
        return None
    lines = mini.split(b"\n", int(where[1]) - 1)[:int(where[1]) - 1]
    return sum(map(len, lines)) + len(lines) + int(where[2]) - 1


def _placed_json_error(error: dict, text: bytes, offset: int) -> str:
    """The message of the JSON ``error`` with its place, ``offset`` in ``text``, as line and column."""
    where = _AT.search(error["msg"])
    # (an error just past a newline is at that newline: column 0 of the next line)
    line, column = json_slices.count(text, b"\n", 0, offset + 1) + 1, offset - text.rfind(b"\n", 0, offset + 1)
    return describe_errors([{**error, "msg": f"{error['msg'][:where.start()]} at line {line} column {column}"}])


def _typed(values: list, datatype: str) -> np.ndarray | None:
    """``values`` (from ``json.loads``) as ``datatype``'s numpy dtype, or None where the schema would
    refuse one."""
    dtype = to_numpy(DATATYPES[datatype])
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
    if not np.all(np.abs(array) < FLOAT_BOUNDS[datatype]):  # NaN fails too
        return None
    return array.astype(dtype)
