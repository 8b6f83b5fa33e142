"""``gc.autograd.Function`` through the passes that rewrite a model: level-3 optimize (refused for gradients,
as for a dropped ``gc.detach``), levels 0-2 (the backward's values kept), the training Dropout rewrite inside a
forward, a forward returning one Tensor twice; checked against torch 2.13 (float64, numpy and ort-cpu)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


def _half_tanh(base, lib):
    class HalfTanh(base):  # a backward that is not the forward's: half the true gradient
        @staticmethod
        def forward(ctx, x):
            y = lib.tanh(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return 0.5 * g * (1.0 - y * y)

    return HalfTanh


HalfTanh = _half_tanh(gc.autograd.Function, gc)
TorchHalfTanh = _half_tanh(torch.autograd.Function, torch)


class TwoLayer(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = gc.nn.Linear(3, 4)
        self.fc2 = gc.nn.Linear(4, 2)

    def forward(self, x):
        return {"loss": (self.fc2(HalfTanh.apply(self.fc1(x))) ** 2).sum()}


def _torch_two_layer(params, x):
    p = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    h = TorchHalfTanh.apply(torch.tensor(x) @ p["fc1.weight"].T + p["fc1.bias"])
    ((h @ p["fc2.weight"].T + p["fc2.bias"]) ** 2).sum().backward()
    return {k: v.grad.numpy() for k, v in p.items()}


def test_level_3_refuses_gradients_naming_the_function():
    """Level 3 drops the marks and backwards: differentiating would take tanh's own gradient (fc1 twice
    torch's), so gc.grad and generate refuse, naming the Function and level 2, whose gradients are torch's."""
    model = gc.capture(TwoLayer().double(), x=gc.spec("float64", ("N", 3)))
    dropped = gc.optimize(model, level=3)
    message = (r"gc.optimize at level 3 \(inference only\) dropped the backward of gc.autograd.Function HalfTanh "
               r"\(applied at .*test_autograd_function_passes.py:\d+\).*gc.optimize\(model, level=2\)")
    with pytest.raises(gc.GraphError, match=message):
        gc.grad(dropped, "loss")
    with pytest.raises(gc.GraphError, match=message):
        gc.training.generate(gc.load(dropped.proto), "loss", gc.optim.SGD(0.1))  # the record survives save/load
    x = RNG.normal(size=(5, 3))
    want = _torch_two_layer(model.params, x)
    grads = gc.grad(gc.optimize(model, level=2), "loss")
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x})
        for name, w in want.items():
            np.testing.assert_allclose(got[f"{name}_grad"], w, rtol=1e-10, atol=1e-12, err_msg=f"{backend} {name}")


class DropSquare(gc.autograd.Function):  # Dropout in the forward; the backward reads its output
    @staticmethod
    def forward(ctx, x, p):
        d = gc.nn.functional.dropout(x, p, training=True)
        ctx.save_for_backward(d)
        return d * d

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return 3.0 * g * d, None  # not the true 2 * g * d * mask: the backward's own


class TorchMaskSquare(torch.autograd.Function):  # the same with the mask given (torch's Dropout scales by 1/(1-p))
    @staticmethod
    def forward(ctx, x, mask):
        d = x * mask
        ctx.save_for_backward(d)
        return d * d

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return 3.0 * g * d, None


class DropNet(gc.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.fc1 = gc.nn.Linear(3, 4)

    def forward(self, x):
        return {"loss": (DropSquare.apply(self.fc1(x), self.p) * 0.7).sum()}


@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_in_a_forward_trains_with_the_forwards_mask(backend, p):
    """The training Dropout rewrite (noise input; p=0: an Identity) replaces the value the backward reads:
    the binding follows it, so the backward reads the forward's own mask, as torch's."""
    model = gc.capture(DropNet(p).double(), x=gc.spec("float64", ("N", 3)))
    arts = gc.training.generate(model, "loss", gc.optim.SGD(0.1))
    x = RNG.normal(size=(6, 3))
    feeds = {"x": x}
    mask = np.ones((6, 4))
    if p:
        noise = RNG.random((6, 4), dtype=np.float32)
        feeds["dropout_noise.0"] = noise
        mask = (noise >= p) / (1.0 - p)
    got = gc.Session(arts.gradients, backend=backend).run(feeds)
    w = torch.tensor(model.params["fc1.weight"], requires_grad=True)
    b = torch.tensor(model.params["fc1.bias"], requires_grad=True)
    loss = (TorchMaskSquare.apply(torch.tensor(x) @ w.T + b, torch.tensor(mask)) * 0.7).sum()
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-12)
    np.testing.assert_allclose(got["fc1.weight_grad"], w.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["fc1.bias_grad"], b.grad.numpy(), rtol=1e-10, atol=1e-12)


def _twice(base, lib):
    class Twice(base):  # outputs 0 and 2 are one Tensor
        @staticmethod
        def forward(ctx, x):
            y = lib.sin(x)
            return y, x * 3.0, y

        @staticmethod
        def backward(ctx, g0, g1, g2):
            return 2.0 * g0 + 3.0 * g1 + 5.0 * g2

    return Twice


GC_TWICE, TORCH_TWICE = _twice(gc.autograd.Function, gc), _twice(torch.autograd.Function, torch)


def _twice_loss(fn, x):
    a, b, c = fn.apply(x)
    return (a * 2.0).sum() + (b * 7.0).sum() + (c * c * 11.0).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tensor_returned_twice_is_its_last_output(backend):
    """torch gives the one Tensor's gradient (both uses summed) to its last output and zeros to the first:
    2 * 0 + 3 * 7 + 5 * (2 + 22 sin x), not graphc's former 2 * 2 + 3 * 7 + 5 * 22 sin x."""
    model = gc.capture(lambda x: {"loss": _twice_loss(GC_TWICE, x)}, x=gc.spec("float64", (2, 3)))
    x = RNG.normal(size=(2, 3))
    got = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    xt = torch.tensor(x, requires_grad=True)
    _twice_loss(TORCH_TWICE, xt).backward()
    np.testing.assert_allclose(got["x_grad"], xt.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), 21.0 + 5.0 * (2.0 + 22.0 * np.sin(x)), rtol=1e-12)


class SelfScaled(gc.nn.Module):  # h * h.detach(): the gradient is h, not the 2h of h * h
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4)

    def forward(self, x):
        h = self.fc(x)
        return {"loss": (h * h.detach()).sum()}


def test_level_3_refuses_gradients_naming_the_dropped_detach():
    """Level 3 drops gc.detach's mark too: its gradients would be 2h where torch's are h (fc's 100% off), so
    gc.grad and generate refuse, counting the mark and naming level 2, whose gradients are torch's."""
    model = gc.capture(SelfScaled().double(), x=gc.spec("float64", ("N", 3)))
    dropped = gc.optimize(model, level=3)
    message = (r"gc.optimize at level 3 \(inference only\) dropped 1 stop-gradient mark \(gc.detach, .*\); "
               r"differentiate or train the captured model, or one from gc.optimize\(model, level=2\)")
    with pytest.raises(gc.GraphError, match=message):
        gc.grad(dropped, "loss")
    with pytest.raises(gc.GraphError, match=message):
        gc.training.generate(gc.load(dropped.proto), "loss", gc.optim.SGD(0.1))  # the record survives save/load
    x = RNG.normal(size=(5, 3))
    p = {k: torch.tensor(v, requires_grad=True) for k, v in model.params.items()}
    h = torch.tensor(x) @ p["fc.weight"].T + p["fc.bias"]
    (h * h.detach()).sum().backward()
    grads = gc.grad(gc.optimize(model, level=2), "loss")
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x})
        for name, w in p.items():
            np.testing.assert_allclose(got[f"{name}_grad"], w.grad.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{backend} {name}")


def _saves_folded(base, lib):
    class SavesFolded(base):  # saves what levels 1-2 fold: x*1 (into its input), a constant, a value read only here
        @staticmethod
        def forward(ctx, h):
            y, c, z = h * 1.0, lib.ones_like(h) * 2.0, lib.exp(h)
            ctx.save_for_backward(y, c, z)
            return z

        @staticmethod
        def backward(ctx, g):
            y, c, z = ctx.saved_tensors
            return g * y * c * 1.5 + z * 0.25

    return SavesFolded


GC_SAVES, TORCH_SAVES = _saves_folded(gc.autograd.Function, gc), _saves_folded(torch.autograd.Function, torch)


class Affine(gc.nn.Module):  # x @ w + b: level 2 fuses the MatMul and Add the Function's input comes from
    def __init__(self):
        super().__init__()
        self.w = gc.nn.Parameter(RNG.normal(size=(3, 4)))
        self.b = gc.nn.Parameter(RNG.normal(size=(4,)))

    def forward(self, x):
        h = x @ self.w + self.b
        return {"loss": (GC_SAVES.apply(h) + gc.exp(h)).sum()}


@pytest.mark.parametrize("level", [0, 1, 2])
def test_the_backward_keeps_its_values_through_optimize(level):
    """Levels 1-2 fold x*1 into x and drop a value only the backward reads: the values a Function's records
    bind stay graph-visible while the pipeline runs, so its backward is torch's after gc.optimize."""
    captured = gc.capture(Affine().double(), x=gc.spec("float64", ("N", 3)))
    model = gc.optimize(captured, level=level)
    assert [v.name for v in model.outputs] == ["loss"]
    onnx.checker.check_model(model.proto, full_check=True)
    x = RNG.normal(size=(5, 3))
    p = {k: torch.tensor(v, requires_grad=True) for k, v in captured.params.items()}
    h = torch.tensor(x) @ p["w"] + p["b"]
    (TORCH_SAVES.apply(h) + torch.exp(h)).sum().backward()
    grads = gc.grad(model, "loss", wrt=list(p))
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x})
        for name, w in p.items():
            np.testing.assert_allclose(got[f"{name}_grad"], w.grad.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{backend} {name}")
