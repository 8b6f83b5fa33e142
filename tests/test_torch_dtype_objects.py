"""torch dtype objects (``torch.float64``, ``torch.double``, ``torch.long``) are accepted wherever graphc takes
a dtype, as their names are (recognised by their type's module: graphc never imports torch); an unknown
one is a TypeError naming it and what is accepted."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.model.dtypes import as_dtype

torch = pytest.importorskip("torch")

NAMES = [(torch.float64, "float64"), (torch.double, "float64"), (torch.float, "float32"), (torch.half, "float16"),
         (torch.bfloat16, "bfloat16"), (torch.long, "int64"), (torch.int32, "int32"), (torch.int8, "int8"),
         (torch.uint8, "uint8"), (torch.bool, "bool"), (torch.complex64, "complex64"),
         (torch.float8_e4m3fn, "float8e4m3fn"), (torch.uint16, "uint16")]


@pytest.mark.parametrize("dtype,name", NAMES, ids=[str(d) for d, _ in NAMES])
def test_as_dtype_takes_torch_dtypes(dtype, name):
    assert as_dtype(dtype) == name


@pytest.mark.parametrize("dtype", [torch.qint8, torch.complex32, object(), "float65"])
def test_an_unknown_dtype_is_a_type_error_naming_it_and_the_accepted_ones(dtype):
    with pytest.raises(TypeError, match=r"unknown dtype .*expected a dtype name .* or a torch dtype"):
        as_dtype(dtype)
    with pytest.raises(TypeError, match=r"unknown dtype"):
        nn.Linear(3, 4, dtype=dtype)


MODULES = [
    lambda d: nn.Linear(3, 4, dtype=d), lambda d: nn.Conv2d(2, 3, 3, dtype=d), lambda d: nn.BatchNorm1d(3, dtype=d),
    lambda d: nn.LayerNorm(3, dtype=d), lambda d: nn.Embedding(5, 3, dtype=d), lambda d: nn.LSTM(3, 4, dtype=d),
    lambda d: nn.MultiheadAttention(4, 2, dtype=d), lambda d: nn.PReLU(dtype=d), lambda d: nn.GroupNorm(1, 2, dtype=d),
    lambda d: nn.LinearCrossEntropyLoss(3, 4, dtype=d), lambda d: nn.Bilinear(2, 3, 4, dtype=d),
]


@pytest.mark.parametrize("make", MODULES, ids=range(len(MODULES)))
def test_modules_take_torch_dtypes(make):
    """The parameters are float64, as given by name."""
    assert {p.dtype for p in make(torch.float64).parameters()} == {"float64"}


def test_factories_casts_and_specs_take_torch_dtypes():
    def fn(x):
        return {"zeros": gc.zeros(2, dtype=torch.float64), "ones": gc.ones(2, dtype=torch.int64),
                "full": gc.full((2,), 3, dtype=torch.int32), "tensor": gc.tensor([1.0, 2.0], dtype=torch.double),
                "arange": gc.arange(3, dtype=torch.float64), "zeros_like": gc.zeros_like(x, dtype=torch.half),
                "to": x.to(torch.float64), "to_kw": x.to(dtype=torch.int64), "type": x.type(torch.int32),
                "astype": x.astype(torch.float16)}

    model = gc.capture(fn, x=gc.spec(torch.float32, (2,)))
    got = {o.name: o.dtype for o in model.outputs}
    assert got == {"zeros": "float64", "ones": "int64", "full": "int32", "tensor": "float64", "arange": "float64",
                   "zeros_like": "float16", "to": "float64", "to_kw": "int64", "type": "int32", "astype": "float16"}
    assert model.inputs[0].dtype == "float32"


def test_parameters_and_masks_take_torch_dtypes():
    assert nn.Parameter(shape=(2,), dtype=torch.float64).dtype == "float64"
    mask = nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64)
    assert mask.dtype == np.float64


def test_graphc_does_not_import_torch():
    code = "import sys, graphc; graphc.nn.Linear(2, 2, dtype='float64'); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
