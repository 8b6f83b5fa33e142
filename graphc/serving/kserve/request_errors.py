"""An infer request's JSON header validated by the schema, and the one-line message naming what is
wrong when it is not (the field at fault, what it needs and what came, or the key given twice)."""

from __future__ import annotations

import reprlib
from typing import Any

from pydantic import ValidationError

from graphc.serving.kserve.repeated_keys import repeated_key
from graphc.serving.kserve.schemas import DATATYPES, InferRequest

_SHORT = reprlib.Repr()  # a bad value is quoted briefly, whatever its size
_SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 4, 4, 40, 40, 2


def validate_header(text: bytes, data_at: dict[int, tuple[int, int]] | None = None) -> InferRequest | str:
    """The request in ``text``, or the message saying why it is refused. ``data_at`` (input index ->
    (index in ``text``, index in the whole array)) is for a body whose ``inputs[i].data`` was cut
    down around its first bad element: an error there is reported at its index in the whole array."""
    try:
        request = InferRequest.model_validate_json(text)
    except ValidationError as exc:
        return describe_errors(_moved(exc.errors(include_url=False), data_at or {}))
    where = repeated_key(text)  # the parser kept the last value of a repeated key
    if where is None:
        return request
    return f"invalid infer request: {where} is given twice (a JSON object repeats its key); give each key once"


def _moved(errors: list[dict[str, Any]], data_at: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """``errors`` with each one at a flat ``inputs[i].data[k]`` moved to the whole array's index."""
    for error in errors:
        loc = error["loc"]
        if len(loc) == 6 and loc[0] == "inputs" and loc[3] == "data" and data_at.get(loc[1], (None,))[0] == loc[5]:
            error["loc"] = (*loc[:5], data_at[loc[1]][1])
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
