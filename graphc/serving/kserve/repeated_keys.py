"""Keys given twice in one JSON object of a request. JSON parsers (pydantic's among them) keep the
last value of a repeated key, so ``{"inputs": [A], "inputs": [B]}`` would run on B alone and a
tensor with two ``"data"`` on its second; RFC 8259 leaves what a repeated name means open, so the
server refuses them (400 naming the key and where it is).

The scan runs on a request the schema found valid: tensor ``data`` (numbers, booleans, lists) is
dropped first, and outside strings the rest holds only structure, numbers and literals, so one
regular expression steps from string to string and bracket to bracket.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

# a string, with the ':' after it when it is a key (group 1); or a bracket
TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?|[{}\[\]]', re.DOTALL)
# A tensor's ``data``, which the schema found to hold numbers, booleans and lists only (none of
# these characters can end a string: a '"' in one is escaped, so '"data"' is always a key). A
# "data" the schema does not check (an extra top-level key or a parameter) may hold null, strings
# or objects: the match then stops at a ']' inside the array, and it is kept (``_emptied``).
_DATA = re.compile(rb'"data"\s*:\s*\[[-+.0-9eE,\[\]\s truefals]*\]')


def _emptied(match: re.Match) -> bytes:
    """A whole ``_DATA`` array as ``"data":[]``; a match that ends inside its array (more '[' than
    ']': it stopped at a value it does not take, such as ``null``) as it is."""
    text = match.group()
    return b'"data":[]' if text.count(b"[") == text.count(b"]") else text


def repeated_key(text: bytes) -> str | None:
    """Where the first key repeated within one object of ``text`` is (an infer request's JSON,
    valid by the schema), as ``inputs[1].data`` (list indices count the objects and lists in that
    list, which for the protocol's lists of objects is the index), or None when no key repeats."""
    for key, _, stack in walk(_DATA.sub(_emptied, text)):
        if key is not None:
            keys = stack[-1][1]
            if key in keys:
                return _path(stack, key)
            keys.add(key)
    return None


def walk(text: bytes) -> Iterator[tuple[bytes | None, int, list[list]]]:
    """Each key of ``text`` (valid JSON) as (key, its offset, the containers open around it, the
    innermost its object) and each '[' or '{' as (None, its offset, the containers open, the
    innermost the one it opens). A container is [its key in the object holding it or its index in
    the list holding it, the keys seen so far (an object; the caller adds them) or the count of
    containers in it so far (a list)]."""
    stack: list[list] = []
    key = b""
    for match in TOKEN.finditer(text):
        if match.lastindex:
            key = key_of(match)
            yield key, match.start(), stack
            continue
        token = match.group()
        if token == b"{" or token == b"[":
            place = key
            if stack and type(stack[-1][1]) is int:
                place, stack[-1][1] = stack[-1][1], stack[-1][1] + 1
            stack.append([place, set() if token == b"{" else 0])
            yield None, match.start(), stack
        elif token == b"}" or token == b"]":  # else a string value
            stack.pop()


def key_of(match: re.Match) -> bytes:
    """The key a ``TOKEN`` match with group 1 names, unescaped (``"d\\u0061ta"`` is ``data``)."""
    key = match.group()[1:match.start(1) - match.start() - 1]
    if b"\\" in key:
        key = json.loads(b'"%s"' % key).encode("utf-8", "surrogatepass")
    return key


def _path(stack: list[list], key: bytes) -> str:
    """``inputs[1].data``: the path to ``key`` in the innermost of ``stack``'s containers."""
    path = ""
    for place, _ in [*stack[1:], [key, None]]:
        if isinstance(place, int):
            path += f"[{place}]"
        else:
            name = place.decode("utf-8", "surrogatepass")
            path += "." + (name if name.isidentifier() else json.dumps(name))
    return path.lstrip(".")
