"""The KServe v2 / Open Inference Protocol messages as strict pydantic models.

They validate infer request headers (nothing is coerced: ``"2"`` is not a dim, ``"false"`` is
not a boolean, ``null`` is not a number, ``1e400`` is not a finite FP32) and describe every
route for ``/openapi.json``. Each input's ``data`` is typed by its ``datatype`` (a discriminated
union): integers within the datatype's range, finite numbers within the float type's range,
booleans for ``BOOL``; flat (row-major) or nested lists. Every list stops at its first bad item,
so a malformed multi-megabyte request costs one error, not one per element.
"""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal, TypeVar, Union

import ml_dtypes
import numpy as np
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, TypeAdapter,
                      ValidationError, create_model, model_validator)
from pydantic_core import InitErrorDetails, PydanticCustomError
from typing_extensions import TypeAliasType

from graphc.model.dtypes import to_numpy
from graphc.serving.kserve import extensions

# KServe datatype <-> graphc dtype name: every numeric type the protocol has. BYTES (strings)
# is not served (a model with a string input or output is refused when the server loads it).
DATATYPES: dict[str, str] = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
    "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
    "FP16": "float16", "BF16": "bfloat16", "FP32": "float32", "FP64": "float64",
}
Datatype = Literal[tuple(DATATYPES)]  # type: ignore[valid-type]

T = TypeVar("T")


def _list(item: Any) -> Any:
    """A list that stops at its first bad item."""
    return Annotated[list[item], Field(fail_fast=True)]


# Data is a flat (row-major) list or nested lists; the flat form is tried first.
Nested = TypeAliasType("Nested", Annotated[Union[_list(T), _list("Nested[T]")], Field(union_mode="left_to_right")],
                       type_params=(T,))
Dim = Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Parameters(BaseModel):
    """Protocol parameters: the known ones are typed, those of Triton extensions this server does
    not implement are refused (any value, null too), and so are the names Triton reserves
    (``triton_...``); others are allowed and ignored."""

    model_config = ConfigDict(strict=True, extra="allow")

    @model_validator(mode="after")
    def _unreserved(self) -> _Parameters:
        for name, value in (self.__pydantic_extra__ or {}).items():
            if name.startswith(extensions.RESERVED_PREFIX):
                why = _refusal("reserved_parameter", extensions.reserved_message(name))
                raise ValidationError.from_exception_data(
                    type(self).__name__, [InitErrorDetails(type=why, loc=(name,), input=value)])
        return self


def _refusal(kind: str, why: str) -> PydanticCustomError:
    """The error refusing a parameter: ``why``, and to leave it out."""
    return PydanticCustomError(kind, "{why}; leave the parameter out", {"why": why})


def _refuse(extension: str, _value: Any) -> Any:
    raise _refusal("unsupported_parameter", extensions.unsupported_message(extension))


def _with_refused(model: type[_Parameters], refused: dict[str, str]) -> type[_Parameters]:
    """``model`` plus a field per parameter of ``refused`` (name -> its extension) that fails validation."""
    fields: dict[str, Any] = {
        name: (Annotated[Any, AfterValidator(functools.partial(_refuse, extension))],
               Field(None, description=f"Triton's {extension} extension: not implemented, refused."))
        for name, extension in refused.items()}
    return create_model(model.__name__.lstrip("_"), __base__=model, __doc__=model.__doc__, **fields)


class _InputParameters(_Parameters):
    binary_data_size: Annotated[StrictInt, Field(ge=0)] | None = Field(
        None, description="Bytes of this tensor in the binary section after the JSON header.")


class _OutputParameters(_Parameters):
    binary_data: StrictBool | None = Field(None, description="Return this output as raw bytes.")


class _RequestParameters(_Parameters):
    binary_data_output: StrictBool | None = Field(None, description="Default for every output's binary_data.")


InputParameters = _with_refused(_InputParameters, extensions.INPUT_PARAMETERS)
OutputParameters = _with_refused(_OutputParameters, extensions.OUTPUT_PARAMETERS)
RequestParameters = _with_refused(_RequestParameters, extensions.REQUEST_PARAMETERS)


def _element(datatype: str) -> Any:
    """The JSON element type of ``datatype``'s data, with the datatype's range (named
    ``FP32Value`` etc., which also names the data's schema ``Nested_FP32Value_``)."""
    dtype = to_numpy(DATATYPES[datatype])
    if dtype.kind == "b":
        element: Any = StrictBool
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        element = Annotated[StrictInt, Field(ge=int(info.min), le=int(info.max))]
    elif dtype.itemsize == 8:  # every finite JSON number is a finite FP64
        element = Annotated[float, Field(strict=True, allow_inf_nan=False)]
    else:
        top = FLOAT_BOUNDS[datatype]
        element = Annotated[float, Field(strict=True, allow_inf_nan=False, gt=-top, lt=top)]
    return TypeAliasType(f"{datatype}Value", element)


def _overflow(dtype: np.dtype) -> float:
    """The least float64 that becomes infinite as ``dtype``: every smaller number rounds to a
    finite value (the largest, past ``finfo.max`` by up to half a step, included; bfloat16 rounds
    through float32, as torch's does). Found by bisecting float64 bit patterns."""
    bits = np.array([ml_dtypes.finfo(dtype).max, np.inf], np.float64).view(np.int64)
    low, high = int(bits[0]), int(bits[1])
    while high - low > 1:
        mid = (low + high) // 2
        with np.errstate(over="ignore"):
            if np.isinf(np.array([mid]).view(np.float64).astype(dtype)[0]):
                high = mid
            else:
                low = mid
    return float(np.array([high]).view(np.float64)[0])


# Per float datatype, the least float64 that becomes infinite as it: its data must lie strictly
# within +-bound (FP64: every finite number).
FLOAT_BOUNDS: dict[str, float] = {dt: math.inf if dt == "FP64" else _overflow(to_numpy(DATATYPES[dt]))
                                  for dt in ("FP16", "BF16", "FP32", "FP64")}

_INPUT_FIELDS: dict[str, Any] = {
    "name": (StrictStr, ...),
    "shape": (_list(Dim), ...),
    "parameters": (InputParameters | None, None),
}
# One model per datatype, so ``data`` carries that datatype's element type and range.
_INPUTS = {dt: create_model(f"{dt}Input", __base__=_Message, datatype=(Literal[dt], ...),
                            data=(Nested[_element(dt)] | None, None), **_INPUT_FIELDS)
           for dt in DATATYPES}
# Each datatype's flat data alone: which element of a slice of an array the schema refuses first.
ELEMENT_LISTS = {dt: TypeAdapter(_list(_element(dt))) for dt in DATATYPES}
RequestInput = Annotated[Union[tuple(_INPUTS.values())], Field(discriminator="datatype")]


class RequestOutput(_Message):
    name: StrictStr
    parameters: OutputParameters | None = None


class InferRequest(_Message):
    """The JSON header of ``POST /v2/models/{name}[/versions/{version}]/infer``."""

    id: StrictStr | None = None
    parameters: RequestParameters | None = None
    inputs: _list(RequestInput)
    outputs: _list(RequestOutput) | None = None


# -- responses (documentation: the server writes them without pydantic) ------------------------

class ResponseOutput(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]
    parameters: dict[str, Any] | None = Field(None, description="binary_data_size when sent as raw bytes.")
    data: list[Any] | None = Field(None, description="Row-major values, absent when sent as raw bytes.")


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[ResponseOutput]


class ErrorResponse(BaseModel):
    error: str


class TensorMetadata(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int] = Field(description="-1 for a dim of any size.")
    parameters: Union[dict[str, str], None] = Field(None, description=(
        'Only on a complex input or output, sent as its [..., 2] real pair (real, imaginary): {"complex": '
        '"complex64"} for an FP32 pair, "complex128" for FP64.'))


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelReady(BaseModel):
    name: str
    ready: bool


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class RepositoryEntry(BaseModel):
    name: str
    version: str
    state: str
