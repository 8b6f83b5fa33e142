"""``nn.init.dirac_`` and ``nn.init.sparse_`` (drawn at capture, as the other in-place forms), ``Module.type(dtype)``
and ``Module.to(tensor)`` against torch 2.13."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
from graphc import nn

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("shape,groups", [((4, 4, 3), 1), ((6, 2, 3, 4), 3), ((3, 5, 2, 3, 3), 1), ((4, 1, 5), 2)])
def test_dirac_is_torchs_and_a_conv_with_it_passes_its_input_through(shape, groups):
    want = torch.nn.init.dirac_(torch.empty(shape, dtype=torch.float64), groups).numpy()
    p = nn.Parameter(shape=shape, dtype="float64")
    assert nn.init.dirac_(p, groups) is p
    p.draw(RNG)
    np.testing.assert_array_equal(p.numpy(), want)
    conv = nn.Conv2d(4, 4, 3, padding=1, bias=False, dtype="float64")
    nn.init.dirac_(conv.weight)
    x = RNG.standard_normal((2, 4, 5, 5))
    model = gc.capture(conv, x=x)
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_array_equal(gc.Session(model, backend=backend).run({"x": x})["output"], x)


def test_sparse_zeros_ceil_sparsity_rows_of_each_column_and_draws_normal_elsewhere():
    rows, cols, sparsity, std = 400, 30, 0.3, 0.05
    t = torch.nn.init.sparse_(torch.empty(rows, cols, dtype=torch.float64), sparsity, std).numpy()
    p = nn.init.sparse_(nn.Parameter(shape=(rows, cols), dtype="float64"), sparsity, std)
    p.draw(RNG)
    g = p.numpy()
    zeros = math.ceil(sparsity * rows)
    assert ((g == 0).sum(0) == zeros).all() and ((t == 0).sum(0) == zeros).all()
    assert (g[:, 0] == 0).tolist() != (g[:, 1] == 0).tolist()  # each column its own rows
    np.testing.assert_allclose(g[g != 0].std(), t[t != 0].std(), rtol=0.05)
    np.testing.assert_allclose(g[g != 0].std(), std, rtol=0.05)


def test_init_refusals_name_the_problem():
    with pytest.raises(ValueError, match=r"dirac_ takes a 3-, 4- or 5-D tensor.*\(3, 4\)"):
        nn.init.dirac_(nn.Parameter(shape=(3, 4)))
    with pytest.raises(ValueError, match=r"dim 0 \(5\) must be divisible by groups, got groups=2"):
        nn.init.dirac_(nn.Parameter(shape=(5, 2, 3)), 2)
    with pytest.raises(ValueError, match=r"sparse_ takes a 2-D tensor, got shape \(2, 3, 4\)"):
        nn.init.sparse_(nn.Parameter(shape=(2, 3, 4)), 0.5)
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\], got -0.1"):
        nn.init.sparse_(nn.Parameter(shape=(2, 3)), -0.1)


def _pair():
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    net.init_parameters(0)
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return net, twin


def _dtypes(state):
    return {k: str(v.dtype).removeprefix("torch.") for k, v in state.items()}


@pytest.mark.parametrize("dst", ["float64", "float16"])
def test_type_casts_every_parameter_and_buffer_as_torch(dst):
    net, twin = _pair()
    assert net.type(dst) is net
    twin.type(getattr(torch, dst))
    assert _dtypes(net.state_dict()) == _dtypes(twin.state_dict())  # num_batches_tracked too


def test_a_module_typed_float64_by_a_torch_dtype_runs_as_torchs():
    net, twin = _pair()
    net.type(torch.float64)
    twin.type(torch.float64)
    x = RNG.standard_normal((5, 3))
    model = gc.capture(net.eval(), x=x)
    want = twin.eval()(torch.from_numpy(x)).detach().numpy()
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want, rtol=1e-12)


def test_type_refuses_an_integer_dtype_for_parameters():
    net, twin = _pair()
    with pytest.raises(RuntimeError):
        twin.type(torch.int64)
    with pytest.raises(TypeError, match=r"parameter '0.weight' must stay floating point"):
        net.type("int64")


@pytest.mark.parametrize("like", [lambda: np.zeros(2), lambda: torch.zeros(2, dtype=torch.float64)],
                         ids=["numpy", "torch"])
def test_to_a_tensor_takes_its_dtype(like):
    net, twin = _pair()
    assert net.to(like()) is net
    twin.to(torch.zeros(1, dtype=torch.float64))
    assert _dtypes(net.state_dict()) == _dtypes(twin.state_dict())  # num_batches_tracked stays int64


def test_to_a_captured_tensor_takes_its_dtype_and_integers_are_refused():
    net, _ = _pair()
    seen = []

    def fn(x):
        seen.append(net.to(x))
        return x

    gc.capture(fn, x=np.zeros(2, np.float16))
    assert _dtypes(net.state_dict())["0.weight"] == "float16"
    with pytest.raises(TypeError, match="floating point dtype.*int64"):
        net.to(np.zeros(2, np.int64))
