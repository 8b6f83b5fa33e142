"""The torch idioms the five ported families (tests/test_port_model_families.py) needed: graphc ops in a module's
``__init__`` (``nn.Parameter(1e-6 * torch.ones(dim))``, a rotary ``inv_freq``, a sinusoidal table written by
slices), ``device=`` on factories and ``x.device``, ``register_buffer(..., persistent=False)``,
``nn.Parameter(..., requires_grad=False)`` and ``torch.stack(..., dim=)``; each against torch 2.13."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(0)


def _tables(M):
    """What torch code computes in ``__init__``: a layer scale, rotary frequencies, a sinusoidal table."""
    scale = 1e-6 * M.ones((6))
    inv_freq = 1.0 / (10000 ** (M.arange(0, 8, 2).float() / 8))
    position = M.arange(0, 5, dtype=M.float32).unsqueeze(1)
    div_term = M.exp(M.arange(0, 6, 2).float() * (-math.log(10000.0) / 6))
    pe = M.zeros(5, 6)
    pe[:, 0::2] = M.sin(position * div_term)
    pe[:, 1::2] = M.cos(position * div_term)
    return scale, inv_freq, pe


def test_graphc_ops_outside_a_capture_compute_values_as_torch():
    torch = pytest.importorskip("torch")
    for got, want in zip(_tables(gc), _tables(torch)):
        assert np.asarray(got).dtype == np.float32
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-6, atol=1e-7)
    a, b = gc.randn(3), gc.randn(3)  # two draws differ, as torch's
    assert not np.array_equal(np.asarray(a), np.asarray(b))


class _Tables(nn.Module):
    def __init__(self):
        super().__init__()
        scale, inv_freq, pe = _tables(gc)
        self.gamma = nn.Parameter(scale)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("pe", pe)
        self.frozen = nn.Parameter(gc.ones(6) * 2, requires_grad=False)
        self.offset = gc.arange(6, dtype=gc.float64) * 0.5  # a plain tensor attribute: a constant in the graph

    def forward(self, x):
        return (x * self.gamma * self.frozen + self.pe + self.offset).sum() + self.inv_freq.sum()


def test_parameters_and_buffers_computed_in_init_are_captured():
    net = _Tables()
    assert list(net.state_dict()) == ["gamma", "frozen", "pe"]  # inv_freq is not persistent, as torch's
    net.load_state_dict(net.state_dict())  # strict: inv_freq is not asked for
    assert net.double().state_dict()["pe"].dtype == np.float64  # .double() converts the non-persistent buffer too
    x = RNG.standard_normal((5, 6))
    model = gc.grad(gc.capture(net, x=x), "output")
    _, inv_freq, pe = (np.asarray(t, np.float64) for t in _tables(gc))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})
        want = (x * 1e-6 * 2 + pe + np.arange(6) * 0.5).sum() + inv_freq.sum()
        np.testing.assert_allclose(got["output"], want, rtol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["gamma_grad"], 2 * x.sum(0), rtol=1e-6, err_msg=backend)
        assert not got["frozen_grad"].any(), backend  # requires_grad=False: no gradient, as torch's None


def test_factories_take_torch_device_keywords_and_tensors_have_a_device():
    torch = pytest.importorskip("torch")

    def fn(M, x):
        ar = M.arange(x.shape[1], device=x.device, dtype=x.dtype)
        z = M.zeros(2, 3, dtype=x.dtype, device="cpu" if M is torch else "cuda:0", requires_grad=False,
                    layout=M.strided if M is torch else "strided")
        r = M.rand(2, 3, device=x.device, dtype=x.dtype).mul(0)
        return M.stack([x * ar, x * 2], dim=-1).flatten(-2).sum(0) + (z + r).sum() + M.cat((x, x), dim=1).sum()

    x = RNG.standard_normal((2, 4))
    want = fn(torch, torch.tensor(x)).numpy()
    model = gc.capture(lambda x: fn(gc, x), x=x)
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want, rtol=1e-13)
    seen = {}
    gc.capture(lambda x: seen.update(device=x.device) or x, x=x)
    assert seen["device"] == "cpu" and seen["device"].type == "cpu" and seen["device"].index is None
    assert gc.device("cuda", 1).index == 1 and gc.device("cuda:1").type == "cuda"


def test_factory_keywords_graphc_cannot_honour_say_so():
    with pytest.raises(gc.CaptureError, match=r"zeros\(device='gpu'\): expected a device"):
        gc.capture(lambda x: x + gc.zeros(3, device="gpu"), x=gc.spec("float32", [3]))
    with pytest.raises(gc.CaptureError, match=r"ones\(requires_grad=True\).*nn.Parameter\(gc.ones"):
        gc.capture(lambda x: x + gc.ones(3, requires_grad=True), x=gc.spec("float32", [3]))
    with pytest.raises(ValueError, match="gc.device: expected cpu, cuda"):
        gc.device("tpu")


NUMPY_OPERANDS = {"float64": RNG.standard_normal(4), "float16": RNG.standard_normal(4).astype(np.float16),
                  "int64": np.arange(-2, 2)}


class _OnNumpy(nn.Module):
    """``call()``'s value beside the input: an op whose operands are numpy arrays alone, in a capture."""

    def __init__(self, call):
        super().__init__()
        self.call = call

    def forward(self, x):
        return x, self.call()


@pytest.mark.parametrize("dtype", sorted(NUMPY_OPERANDS))
def test_an_op_on_numpy_arrays_alone_has_one_dtype_rule_inside_and_outside_a_capture(dtype):
    """Outside a capture (9dd3df3) as inside: with no Tensor beside it a float64 array is float32 (a Python float's
    rule, torch's default dtype), other dtypes kept; ``gc.as_tensor`` keeps float64, as ``torch.from_numpy``."""
    torch = pytest.importorskip("torch")
    a = NUMPY_OPERANDS[dtype]
    lone = torch.from_numpy(a).float() if dtype == "float64" else torch.from_numpy(a)
    calls = {"abs": (lambda: gc.abs(a), torch.abs(lone)), "add": (lambda: gc.add(a, a), lone + lone),
             "as_tensor": (lambda: gc.abs(gc.as_tensor(a)), torch.abs(torch.from_numpy(a))),
             "relu": (lambda: gc.relu(a), torch.relu(lone))}  # int64: Max(x, 0) on ort-cpu (backends/integers.py)
    x = np.zeros(1, np.float32)
    for name, (call, want) in calls.items():
        outside = np.asarray(call())
        assert outside.dtype == want.numpy().dtype, name
        np.testing.assert_array_equal(outside, want.numpy(), err_msg=name)
        model = gc.capture(_OnNumpy(call), x=x)
        for backend in ("numpy", "ort-cpu"):
            inside = list(gc.Session(model, backend=backend).run({"x": x}).values())[1]
            assert inside.dtype == outside.dtype, (name, backend)
            np.testing.assert_array_equal(inside, outside, err_msg=f"{name} {backend}")


def test_torch_dtype_names_are_graphc_attributes():
    """``dtype=torch.bool`` / ``torch.long`` / ``torch.float`` ... port as ``gc.bool`` etc.; ``from graphc import *``
    leaves the builtins ``bool``, ``float`` and ``int`` alone."""
    torch = pytest.importorskip("torch")
    for name in ("bool", "float", "double", "half", "long", "int", "short", "int16"):
        want = torch.ones(2, dtype=getattr(torch, name)).numpy().dtype
        assert np.asarray(gc.ones(2, dtype=getattr(gc, name))).dtype == want, name
        assert name in dir(gc), name
    x = RNG.standard_normal((3, 3))
    model = gc.capture(lambda x: x.masked_fill(~gc.tril(gc.ones(3, 3, dtype=gc.bool)), 0.0), x=x)
    np.testing.assert_array_equal(gc.Session(model).run({"x": x})["output"], np.tril(x))
    namespace: dict = {}
    exec("from graphc import *", namespace)  # noqa: S102 - a star import's names
    assert not {"bool", "float", "int", "long"} & set(namespace)


def _written_in_init(M, nn_):
    """What torch code writes into parameters in ``__init__`` (Mamba's ``dt_proj.bias``), under ``no_grad``."""
    lin = nn_.Linear(2, 4)
    dt = M.exp(M.arange(4, dtype=M.float32) * 0.5 - 3.0)
    with M.no_grad():
        out = lin.bias.copy_(dt + M.log(-M.expm1(-dt)))
        lin.weight.fill_(0.25)
        lin.weight.copy_(M.arange(2, dtype=M.float32))  # broadcast over the rows, as torch's
    return lin, out


def test_parameter_writes_in_init_match_torch():
    torch = pytest.importorskip("torch")
    (theirs, returned), (ours, out) = _written_in_init(torch, torch.nn), _written_in_init(gc, nn)
    assert returned is theirs.bias and out is ours.bias  # copy_ returns self
    want, got = theirs.state_dict(), ours.state_dict()
    assert list(got) == list(want)
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value.numpy(), rtol=1e-6, err_msg=key)
    lin = nn.Linear(2, 4)
    lin.bias.zero_()
    assert not lin.state_dict()["bias"].any()
    with pytest.raises(gc.CaptureError, match=r"bias(\.data)?\.copy_: expected a value that broadcasts to \[4\], got shape \[3\]"):
        lin.bias.copy_(np.ones(3))
