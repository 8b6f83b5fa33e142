"""float64 normalisation layers keep ``eps`` a double, as torch: ONNX's float32 ``epsilon`` attribute
(1e-5 -> 9.99999974e-6) moved outputs of std 0.02 inputs ~7e-10 relative off torch float64 and std 1e-3
ones ~1e-8. Forward and gradients (input, weight, bias) within 1e-13 of torch on numpy and ort-cpu;
float32 captures keep the fused ONNX ops."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


class _Weighted(nn.Module):
    """``layer(x)`` and the loss ``sum(layer(x) * g)`` for a fixed random ``g``."""

    def __init__(self, layer: nn.Module, g: np.ndarray):
        super().__init__()
        self.layer, self.g = layer, g

    def forward(self, x):
        y = self.layer(x)
        return {"y": y, "loss": (y * gc.tensor(self.g)).sum()}


def _torch_pair(layer: nn.Module, torch_layer):
    """Random float64 parameters and statistics (running variances near eps) loaded into both."""
    torch = pytest.importorskip("torch")
    state = {}
    for name, value in layer.state_dict().items():
        value = np.asarray(value)
        if value.dtype == np.float64:
            value = RNG.uniform(1e-4, 1e-3, value.shape) if "running_var" in name else \
                RNG.normal(1.0 if name == "weight" else 0.0, 0.1, value.shape)
        state[name] = value
    layer.load_state_dict(state)
    torch_layer.double().load_state_dict({k: torch.tensor(v) for k, v in state.items()})


def _against_torch(layer: nn.Module, torch_layer, shape, std: float, opset: int = 21) -> None:
    torch = pytest.importorskip("torch")
    _torch_pair(layer, torch_layer)
    x, g = RNG.normal(0.0, std, shape), RNG.normal(size=shape)
    model = gc.capture(_Weighted(layer, g), x=gc.TensorSpec(shape=list(shape), dtype="float64"), opset=opset)
    params = [name for name, _ in torch_layer.named_parameters()]
    grads = gc.grad(model, "loss", wrt=["x", *(f"layer.{p}" for p in params)])
    xt = torch.tensor(x, requires_grad=True)
    yt = torch_layer(xt)
    (yt * torch.tensor(g)).sum().backward()
    want = {"y": yt.detach().numpy(), "x_grad": xt.grad.numpy(),
            **{f"layer.{p}_grad": t.grad.numpy() for p, t in torch_layer.named_parameters()}}
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x})
        for name, value in want.items():
            error = float(np.max(np.abs(got[name] - value)) / np.max(np.abs(value)))
            assert error < 1e-13, f"{backend} {name}: relative error {error:.2g} vs torch float64"


LAYERS = {
    "LayerNorm": (lambda: nn.LayerNorm(16, dtype="float64"), "LayerNorm", (16,), (4, 16), 21),
    "LayerNorm-2d-no-bias": (lambda: nn.LayerNorm((3, 8), bias=False, dtype="float64"), "LayerNorm",
                             ((3, 8),), (4, 3, 8), 21),
    "InstanceNorm1d": (lambda: nn.InstanceNorm1d(6, affine=True, dtype="float64"), "InstanceNorm1d", (6,),
                       (4, 6, 10), 21),
    "InstanceNorm2d-plain": (lambda: nn.InstanceNorm2d(3, dtype="float64"), "InstanceNorm2d", (3,), (2, 3, 5, 4), 21),
    "RMSNorm-opset23": (lambda: nn.RMSNorm(16, eps=1e-5, dtype="float64"), "RMSNorm", (16,), (4, 16), 23),
    "RMSNorm-opset21": (lambda: nn.RMSNorm(16, eps=1e-5, dtype="float64"), "RMSNorm", (16,), (4, 16), 21),
    "GroupNorm": (lambda: nn.GroupNorm(2, 6, dtype="float64"), "GroupNorm", (2, 6), (4, 6, 10), 21),
}


@pytest.mark.parametrize("std", [0.02, 1e-3])
@pytest.mark.parametrize("name", list(LAYERS))
def test_float64_norm_matches_torch_at_small_variance(name, std):
    torch = pytest.importorskip("torch")
    make, torch_name, args, shape, opset = LAYERS[name]
    kwargs = {"affine": True} if torch_name == "InstanceNorm1d" else {}
    kwargs.update({"eps": 1e-5} if torch_name == "RMSNorm" else {})
    kwargs.update({"bias": False} if "no-bias" in name else {})
    _against_torch(make(), getattr(torch.nn, torch_name)(*args, **kwargs), shape, std, opset)


FUSED = [  # (layer, input shape, opset, dtype, the ONNX op, whether it stays fused)
    (lambda dt: nn.LayerNorm(8, dtype=dt), [2, 8], 21, "float32", "LayerNormalization", True),
    (lambda dt: nn.InstanceNorm1d(8, dtype=dt), [2, 8, 3], 21, "float32", "InstanceNormalization", True),
    (lambda dt: nn.RMSNorm(8, eps=1e-5, dtype=dt), [2, 8], 23, "float32", "RMSNormalization", True),
    (lambda dt: nn.LayerNorm(8, eps=2.0 ** -10, dtype=dt), [2, 8], 21, "float64", "LayerNormalization", True),
    (lambda dt: nn.RMSNorm(8, dtype=dt), [2, 8], 23, "float64", "RMSNormalization", True),  # eps 2**-52
    (lambda dt: nn.LayerNorm(8, dtype=dt), [2, 8], 21, "float64", "LayerNormalization", False),
    (lambda dt: nn.InstanceNorm1d(8, dtype=dt), [2, 8, 3], 21, "float64", "InstanceNormalization", False),
    (lambda dt: nn.RMSNorm(8, eps=1e-5, dtype=dt), [2, 8], 23, "float64", "RMSNormalization", False)]


@pytest.mark.parametrize("make, shape, opset, dtype, op, fused", FUSED)
def test_fused_op_kept_where_the_attribute_holds_eps(make, shape, opset, dtype, op, fused):
    """float32 captures, and float64 ones whose eps float32 holds exactly, emit the one ONNX op."""
    model = gc.capture(make(dtype), x=gc.TensorSpec(shape=shape, dtype=dtype), opset=opset)
    assert (op in [n.op_type for n in model.proto.graph.node]) == fused
