"""Byte scans over a large JSON body that never hold the GIL for long: counts a slice at a time,
the string-aware bounds of a flat array (where it ends, where it may be cut between elements), and
the lists of a nested array of elements found bracket by bracket.

``bytes.count`` and a regular expression run over a whole 27 MB body in one C call, 6-10 ms each
holding the GIL (so the event loop); ``bytes.find`` (memchr) takes 0.3 ms for it and needs no slicing.
"""

from __future__ import annotations

import re
from bisect import bisect_right

SLICE_BYTES = 1 << 18
_TOKENS = re.compile(rb'[\[\]"{]')
_BLANK = b" \t\n\r"
# Deepest nesting taken: numpy 1 made at most 32 dims (2 makes 64 and words a deeper list its own way).
MAX_DEPTH = 32


def count(text: bytes, chars: bytes, start: int = 0, end: int | None = None) -> int:
    """How many of ``text[start:end]``'s bytes are one of ``chars``, counted a slice at a time."""
    end = len(text) if end is None else end
    return sum(text.count(char, at, min(at + SLICE_BYTES, end))
               for at in range(start, end, SLICE_BYTES) for char in (chars[i:i + 1] for i in range(len(chars))))


def string_end(text: bytes, quote: int) -> int:
    """The index after the string opened by the '"' at ``quote``, or -1 if the body ends in it."""
    at = quote + 1
    while (close := text.find(b'"', at)) >= 0:
        escapes = close
        while text[escapes - 1] == 0x5C:  # '\\': an odd run of them escapes the quote
            escapes -= 1
        if (close - escapes) % 2 == 0:
            return close + 1
        at = close + 1
    return -1


class FlatArray:
    """The array opened by the '[' at ``start`` of ``text`` if nothing in it outside strings opens
    another list: ``end`` (its ']', -1 if the body ends first) and ``strings`` ((start, end) of each
    string in it, in order); ``flat`` False where a '[' comes first; ``objects``: whether a '{' is in it
    (outside strings: where strings are too, a ',' between elements cannot be told from one in an object)."""

    def __init__(self, text: bytes, start: int):
        self.text, self.start, self.strings, self.flat, self.end, self.objects = text, start, [], True, -1, False
        self._bound(start)
        self._starts = [s for s, _ in self.strings]
        self.stop = len(text) if self.end < 0 else self.end  # where its elements end

    def _bound(self, start: int) -> None:
        """Find ``end`` and ``strings`` (or that the array is not ``flat``)."""
        text = self.text
        at, close = start + 1, text.find(b"]", start + 1)
        limit = len(text) if close < 0 else close
        while (quote := text.find(b'"', at, limit)) >= 0:
            if not self._opens_no_list(at, quote):
                return
            after = string_end(text, quote)
            self.strings.append((quote, len(text) if after < 0 else after))
            if after < 0:
                return
            at = after
            if at > close >= 0:
                close = text.find(b"]", at)
                limit = len(text) if close < 0 else close
        if self._opens_no_list(at, limit):
            self.end = close

    def _opens_no_list(self, start: int, end: int) -> bool:
        """Whether ``text[start:end]`` (outside strings) opens no list; if not, ``flat`` is False."""
        self.objects = self.objects or self.text.find(b"{", start, end) >= 0
        self.flat = self.text.find(b"[", start, end) < 0
        return self.flat

    def _string_around(self, at: int) -> tuple[int, int] | None:
        """The string ``at`` lies in, if any."""
        index = bisect_right(self._starts, at) - 1
        return self.strings[index] if index >= 0 and at < self.strings[index][1] else None

    def last_comma(self, start: int, end: int) -> int:
        """The last ',' between elements in ``text[start:end]``, or -1."""
        comma = self.text.rfind(b",", start, end)
        while comma >= 0 and (string := self._string_around(comma)) is not None:
            comma = self.text.rfind(b",", start, string[0])
        return comma

    def next_comma(self, start: int, end: int) -> int:
        """The first ',' between elements in ``text[start:end]``, or ``end``."""
        comma = self.text.find(b",", start, end)
        while comma >= 0 and (string := self._string_around(comma)) is not None:
            comma = self.text.find(b",", string[1], end)
        return end if comma < 0 else comma


class NestedArray:
    """The array of lists opened by the '[' at ``start`` of ``text``, when each of its lists holds only
    lists or only elements (numbers, booleans, strings; no object; JSON whitespace and commas between
    the lists) and nests at most ``MAX_DEPTH`` deep: ``end`` its ']' (-1 where it is not such an array
    or the body ends first), ``rows`` ((start, end) of the elements of each list that holds no list, in
    order) and ``tree`` (the top list: a list holding lists is the list of them, one holding elements
    its row's index). Where the lists break off (the body ends in them, or a token or a gap breaks the
    pattern), ``tail`` is ``(prefix, at, cut)``: ``text[at:cut]`` (from after the last bracket to the
    token that broke it, or the body's end) comes after the lists ``prefix`` opens, so that parsing
    ``prefix + text[at:cut]`` meets a JSON error there where the whole parse does; ``ending``, that
    error's message, is for ``flat_data`` to set."""

    def __init__(self, text: bytes, start: int):
        self.text, self.start, self.end, self.rows, self.tree = text, start, -1, [], None
        self.tail: tuple[bytes, int, int] | None = None
        self.ending: str | None = None
        self._bound()
        self.stop = len(text) if self.end < 0 else self.end

    def _bound(self) -> None:
        """Walk the brackets from ``start`` until the top list closes (or one breaks the pattern)."""
        text, stack, last, last_at, at = self.text, [], b"", self.start, self.start
        while (at := _next_token(text, at)) >= 0:
            char = text[at:at + 1]
            if char == b'"' and last == b"[":  # a string among a row's elements
                at = string_end(text, at)
                if at < 0:
                    break
                continue
            if char == b"[":
                if stack and not _is_gap(text, last_at, at, b"," if last == b"]" else b""):
                    break
                stack.append([])
                if len(stack) > MAX_DEPTH:
                    return
            elif char == b"]":
                if last == b"]" and not _is_gap(text, last_at, at, b""):
                    break
                children = stack.pop()
                if last == b"[":  # a list of elements
                    children = len(self.rows)
                    self.rows.append((last_at + 1, at))
                if not stack:
                    self.end, self.tree = at, children
                    return
                stack[-1].append(children)
            else:  # a string beside a list, or an object
                break
            last, last_at, at = char, at, at + 1
        # the lists open here, and what follows the last bracket up to the token that broke them
        prefix = b"[" * len(stack) + (b"[]" if last == b"]" else b"")
        self.tail = (prefix, last_at + 1, len(text) if at < 0 else at + 1)


def _next_token(text: bytes, start: int) -> int:
    """The offset of the first '[', ']', '"' or '{' from ``start`` (-1: none), searched a slice at a time."""
    at = start
    while at < len(text):
        limit = min(at + SLICE_BYTES, len(text))
        match = _TOKENS.search(text, at, limit)
        if match is not None:
            return match.start()
        at = limit
    return -1


def _is_gap(text: bytes, after: int, before: int, sep: bytes) -> bool:
    """Whether ``text`` between the brackets at ``after`` and ``before`` is ``sep`` in JSON whitespace."""
    return before - after <= SLICE_BYTES and text[after + 1:before].strip(_BLANK) == sep
