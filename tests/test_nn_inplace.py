"""torch's ``inplace=True`` on the gc.nn layers and ``gc.nn.functional`` functions: values against
torch on numpy and onnxruntime with the input read after the call (through a view's base, as torch
writes it), the same Tensor returned, torch's repr; a ResNet BasicBlock's gradients against
torch.autograd and one training step of a model ported from torch source against torch's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import assert_module_matches_torch, assert_step_matches_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_module_matches_torch, assert_step_matches_torch

torch = pytest.importorskip("torch")

X = np.random.default_rng(0).standard_normal((3, 4, 5, 6)).astype(np.float32) * 3

# the constructor text, the same for gc.nn and torch.nn; each made with inplace=True
MODULES = ["ReLU(inplace=True)", "ReLU6(True)", "LeakyReLU(0.1, inplace=True)", "ELU(0.5, inplace=True)",
           "SELU(inplace=True)", "CELU(2.0, inplace=True)", "SiLU(inplace=True)", "Mish(inplace=True)",
           "Hardswish(inplace=True)", "Hardsigmoid(inplace=True)", "Hardtanh(-2.0, 2.5, inplace=True)",
           "RReLU(0.1, 0.3, inplace=True)", "Threshold(0.5, -4.0, inplace=True)", "Dropout(0.3, inplace=True)",
           "Dropout1d(inplace=True)", "Dropout2d(inplace=True)", "Dropout3d(inplace=True)",
           "AlphaDropout(0.2, inplace=True)", "FeatureAlphaDropout(inplace=True)"]

# (function, its arguments after the input, as torch takes them); inplace=True is added
FUNCTIONS = [("relu", ()), ("relu6", ()), ("leaky_relu", (0.2,)), ("elu", (0.5,)), ("selu", ()),
             ("celu", (2.0,)), ("silu", ()), ("mish", ()), ("hardswish", ()), ("hardsigmoid", ()),
             ("hardtanh", (-0.5, 2.0)), ("rrelu", (0.1, 0.3)), ("threshold", (0.5, -4.0)),
             ("dropout", (0.5, False)), ("dropout1d", (0.5, False)), ("dropout2d", (0.5, False)),
             ("dropout3d", (0.5, False)), ("alpha_dropout", (0.5, False)), ("feature_alpha_dropout", (0.5, False))]


def _write_through_view(apply):
    """``apply`` in place on a view of a tensor, whose base is then read: it must see the write."""
    def fn(x):
        y = x * 1
        view = y[1:, :, 0] if "1d" in repr(apply) else y[1:]
        assert apply(view) is view
        return y * 2
    return fn


def _run_both(fn, x):
    model = gc.capture(fn, x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    outs = [gc.Session(model, backend=b).run({"x": x})["output"] for b in ("numpy", "ort-cpu")]
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    return outs[0]


class _Applied:
    """A layer or function applied to one Tensor; named for the view ``_write_through_view`` takes."""

    def __init__(self, name, call):
        self.name, self.call = name, call

    def __call__(self, t):
        return self.call(t)

    def __repr__(self):
        return self.name


@pytest.mark.parametrize("ctor", MODULES)
def test_inplace_modules_write_their_input_like_torch(ctor):
    layer, twin = eval(f"gc.nn.{ctor}"), eval(f"torch.nn.{ctor}").eval()  # noqa: S307 - the texts above
    assert layer.inplace is True and repr(layer) == repr(twin)
    got = _run_both(_write_through_view(_Applied(ctor, layer)), X)
    want = _write_through_view(_Applied(ctor, twin))(torch.tensor(X)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert "Dropout" in ctor or not np.allclose(got, X * 2)  # the layer changed something (dropout: in training)


@pytest.mark.parametrize("name, args", FUNCTIONS, ids=[f[0] for f in FUNCTIONS])
def test_inplace_functions_write_their_input_like_torch(name, args):
    ours, theirs = (_Applied(name, lambda t, lib=lib: getattr(lib, name)(t, *args, inplace=True))
                    for lib in (F, torch.nn.functional))
    got = _run_both(_write_through_view(ours), X)
    np.testing.assert_allclose(got, _write_through_view(theirs)(torch.tensor(X)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [lambda y: F.dropout(y, 0.5, True, True), lambda y: F.rrelu(y, 0.1, 0.3, True, True),
                                lambda y: gc.nn.Dropout2d(0.5, inplace=True).train()(y)],
                         ids=["dropout", "rrelu", "Dropout2d"])
def test_random_inplace_writes_the_drawn_result(fn):
    """In training the draw is random: the input, read after the call, holds the returned values."""
    def capture(x):
        y = x * 1
        out = fn(y)
        assert out is y
        return {"read": y * 1, "out": out}
    outs = gc.Session(gc.capture(capture, x=X), backend="ort-cpu").run({"x": X})
    np.testing.assert_array_equal(outs["read"], outs["out"])
    assert not np.array_equal(outs["read"], X)


def test_inplace_false_leaves_the_input():
    def fn(x):
        y = x * 1
        out = gc.nn.ReLU()(y) + F.leaky_relu(y, 0.2, False) + F.dropout(y, 0.5, False)
        return y + out
    want = X + np.maximum(X, 0) + np.where(X > 0, X, 0.2 * X) + X
    np.testing.assert_allclose(_run_both(fn, X), want, rtol=1e-6)


def test_inplace_needs_a_tensor():
    with pytest.raises(gc.GraphError, match=r"relu\(inplace=True\) writes its result into its argument 'input', "
                                             r"which must be a Tensor \(as torch's\), got ndarray"):
        gc.capture(lambda x: x + F.relu(np.ones(3, np.float32), inplace=True), x=np.ones(3, np.float32))


def _resnet_classes(nn, **dtype):
    """torchvision's ResNet BasicBlock (its source, as ported) and a small net of two, over ``nn``."""
    class BasicBlock(nn.Module):
        def __init__(self, planes):
            super().__init__()
            self.conv1 = nn.Conv2d(planes, planes, 3, padding=1, bias=False, **dtype)
            self.bn1 = nn.BatchNorm2d(planes, **dtype)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False, **dtype)
            self.bn2 = nn.BatchNorm2d(planes, **dtype)

        def forward(self, x):
            identity = x
            out = self.conv1(x)
            out = self.bn1(out)
            out = self.relu(out)
            out = self.conv2(out)
            out = self.bn2(out)
            out += identity
            out = self.relu(out)
            return out

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(2, 4, 3, **dtype)
            self.relu = nn.ReLU(inplace=True)
            self.block = BasicBlock(4)
            self.drop = nn.Dropout(0.0, inplace=True)
            self.fc = nn.Linear(4, 3, **dtype)

        def forward(self, x):
            x = self.relu(self.stem(x))
            x = self.drop(self.block(x))
            return self.fc(x.mean((2, 3)))
    return BasicBlock, Net


def _twins(seed, index, dtype, *args):
    """The gc and the torch module of class ``index`` of ``_resnet_classes``, holding the same weights."""
    layer = _resnet_classes(gc.nn, dtype=dtype)[index](*args)
    twin = _resnet_classes(torch.nn, dtype=getattr(torch, dtype))[index](*args)
    state = layer.init_parameters(seed=seed).state_dict()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    for p in layer.parameters():
        p.data = p.numpy()
    return layer, twin


def test_basic_block_with_inplace_relu_gradients_match_torch():
    """Conv -> BN -> ReLU(inplace=True) -> Conv -> BN, += the input, ReLU(inplace=True), in training
    mode: the output and the gradients of the input and every parameter against torch.autograd."""
    layer, twin = _twins(3, 0, "float32", 3)
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 5)).astype(np.float32)
    assert_module_matches_torch(layer.train(), twin.train(), x, rtol=1e-4, atol=1e-5)


def test_ported_resnet_with_inplace_relu_trains_like_torch():
    """One SGD step of the ported net (torch's source, gc.nn for torch.nn) against torch's."""
    net, twin = _twins(4, 1, "float64")
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((3, 2, 6, 6)), rng.standard_normal((3, 3))
    arts = gc.training.generate(gc.capture(net.train(), x=gc.spec("float64", ("N", 2, 6, 6))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.125))
    opt = torch.optim.SGD(twin.parameters(), lr=0.125)
    loss = lambda: torch.nn.functional.mse_loss(twin(torch.from_numpy(x)), torch.from_numpy(y))  # noqa: E731
    counts = tuple(k for k in twin.state_dict() if k.endswith("num_batches_tracked"))
    assert_step_matches_torch(gc.Trainer(arts, backend="numpy"), {"x": x, "y": y}, opt, loss, twin, 0, skip=counts)
