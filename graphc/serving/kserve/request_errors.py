"""An infer request's JSON header validated by the schema, and the one-line message naming what is
wrong when it is not (the field at fault, what it needs and what came, or the key given twice)."""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import ValidationError

from graphc.serving.kserve.repeated_keys import repeated_key
from graphc.serving.kserve.schemas import DATATYPES, InferRequest

class _JsonWords(reprlib.Repr):
    """``reprlib.Repr`` with JSON's words for the values a client sent: ``null``, ``true``, ``false``."""

    def repr_NoneType(self, value: None, level: int) -> str:
        return "null"

    def repr_bool(self, value: bool, level: int) -> str:
        return "true" if value else "false"


_SHORT = _JsonWords()  # a bad value is quoted briefly, whatever its size
_SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 4, 4, 40, 40, 2


Path = tuple[int, ...]


def validate_header(text: bytes, data_at: dict[int, tuple[Path, Path]] | None = None) -> InferRequest | str:
    """The request in ``text``, or the message saying why it is refused. ``data_at`` (input index ->
    (the path to an element in ``text``, in the whole array: an index in each list)) is for a body whose
    ``inputs[i].data`` was cut down around its first bad element: an error there is reported at its
    place in the whole array."""
    try:
        request = InferRequest.model_validate_json(text)
    except ValidationError as exc:
        return describe_errors(_moved(exc.errors(include_url=False), data_at or {}))
    where = repeated_key(text)  # the parser kept the last value of a repeated key
    if where is None:
        return request
    return f"invalid infer request: {where} is given twice (a JSON object repeats its key); give each key once"


def _moved(errors: list[dict[str, Any]], data_at: dict[int, tuple[Path, Path]]) -> list[dict[str, Any]]:
    """``errors`` with each one in ``inputs[i].data`` on the way to a cut-down element moved to the
    whole array's indices (``data[j][k]``: the indices after "data", where each equals the cut path's)."""
    for error in errors:
        loc = list(error["loc"])
        if len(loc) > 5 and loc[0] == "inputs" and loc[3] == "data" and loc[1] in data_at:
            cut, whole = data_at[loc[1]]
            places = [at for at in range(4, len(loc)) if type(loc[at]) is int]
            for place, index, moved in zip(places, cut, whole):
                if loc[place] != index:
                    break
                loc[place] = moved
            error["loc"] = tuple(loc)
    return errors


def describe_errors(errors: list[dict[str, Any]]) -> str:
    """One line naming the field at fault (``inputs[0].data[5]``), what it needs and what came, from a
    ``ValidationError``'s ``errors()`` (a handful: every list fails fast)."""
    if errors[0]["type"] in ("json_invalid", "json_type"):
        return f"malformed JSON in the request body (its JSON part, KServe's inference header): {errors[0]['msg']}"
    # Of a union's alternatives, the one that got furthest into the data says what is wrong.
    error = max(errors, key=lambda e: tuple(p for p in e["loc"] if isinstance(p, int)))
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]
                    if isinstance(p, int) or (p.isidentifier() and p.islower())).lstrip(".") or "request"
    if error["type"] == "union_tag_invalid":
        tag = error["ctx"]["tag"]
        if tag == "BYTES":
            return f"invalid infer request: {where}.datatype: BYTES (strings) is not supported; use one of " \
                   f"{', '.join(DATATYPES)}"
        return f"invalid infer request: {where}.datatype: unknown datatype {tag!r}; expected one of " \
               f"{', '.join(DATATYPES)}"
    if error["type"] == "union_tag_not_found":
        return f"invalid infer request: {where}.datatype: field required"
    return f"invalid infer request: {where}: {error['msg']}, got {_SHORT.repr(error['input'])}"
