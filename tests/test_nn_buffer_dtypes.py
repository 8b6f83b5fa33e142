"""The dtype rule of ``gc.nn.Parameter``, ``Module.register_buffer`` and ``Embedding(_weight=)``: an array keeps its
dtype, but numpy's float64 default is float32 (a float32 model stays float32, where torch's float32 default gives
float32 tensors), and an explicit ``dtype`` is taken, so a float64 buffer or weight equals torch's float64 one
(values and outputs to 1e-12 on numpy and ort-cpu); ``register_buffer(name, None)`` registers none, as torch's."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(11)
SCALE = np.array([0.1, 1 / 3, 2 / 3])  # not float32 numbers: a rounding shows at ~1e-8


class Scaled(nn.Module):
    """``emb(i) * scale``: an Embedding from ``_weight`` times a registered buffer."""

    def __init__(self, weight, dtype=None):
        super().__init__()
        self.register_buffer("scale", SCALE, dtype=dtype)
        self.emb = nn.Embedding(*weight.shape, _weight=weight, dtype=dtype)

    def forward(self, i):
        return self.emb(i) * self.scale


def test_float64_arrays_are_float32_unless_dtype_says():
    weight = RNG.normal(size=(5, 3))
    default, exact = Scaled(weight).state_dict(), Scaled(weight, dtype="float64").state_dict()
    assert {k: v.dtype.name for k, v in default.items()} == {"scale": "float32", "emb.weight": "float32"}
    assert {k: v.dtype.name for k, v in exact.items()} == {"scale": "float64", "emb.weight": "float64"}
    np.testing.assert_array_equal(exact["scale"], SCALE)
    np.testing.assert_array_equal(exact["emb.weight"], weight)


def test_other_dtypes_are_kept_and_an_explicit_dtype_casts():
    m = nn.Module()
    m.register_buffer("steps", np.arange(3))
    m.register_buffer("halves", np.ones(2, np.float16))  # "half" is Module.half: a KeyError, as torch
    m.register_buffer("cast", np.arange(3), dtype="float32")
    assert {k: v.dtype.name for k, v in m.state_dict().items()} == {"steps": "int64", "halves": "float16",
                                                                    "cast": "float32"}
    assert nn.Parameter(np.arange(3), dtype="float32").dtype == "float32"  # was int64: the dtype was ignored
    assert nn.Embedding(4, 2, _weight=np.ones((4, 2), np.float16)).weight.dtype == "float16"


def test_a_none_buffer_registers_nothing_as_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = nn.Module(), torch.nn.Module()
    ours.register_buffer("b", None)
    theirs.register_buffer("b", None)
    assert ours.b is None and theirs.b is None
    assert ours.state_dict() == {} and dict(theirs.state_dict()) == {}


def test_float64_buffer_and_weight_equal_torchs_float64():
    torch = pytest.importorskip("torch")
    weight, idx = RNG.normal(size=(5, 3)), RNG.integers(0, 5, 7)
    theirs = torch.nn.Embedding(5, 3, _weight=torch.from_numpy(weight))
    theirs.register_buffer("scale", torch.from_numpy(SCALE))
    assert theirs.weight.dtype == theirs.scale.dtype == torch.float64
    want = (theirs(torch.from_numpy(idx)) * theirs.scale).detach().numpy()
    model = gc.capture(Scaled(weight, dtype="float64"), i=idx)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"i": idx})["output"]
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=backend)
