"""``gc.autograd.Function``: the user's backward in gc.grad and the training graphs, the forward's plain
nodes in inference graphs and exports; checked against torch 2.13's ``torch.autograd.Function``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import assert_classifier_steps_match_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_classifier_steps_match_torch

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


# -- the Functions, in graphc and in torch (the same code on each library's names) --------------------------


def _functions(lib, function_base):
    class GradReverse(function_base):
        @staticmethod
        def forward(ctx, x, lambd):
            ctx.lambd = lambd
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return -ctx.lambd * g, None

    class RoundSTE(function_base):
        @staticmethod
        def forward(ctx, x):
            return lib.round(x)

        @staticmethod
        def backward(ctx, g):
            return g

    class SavedExp(function_base):
        @staticmethod
        def forward(ctx, x):
            y = lib.exp(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * y

    class MulAdd(function_base):  # two inputs, two outputs, no gradient for b (a factor only)
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * b, a + b

        @staticmethod
        def backward(ctx, g_prod, g_sum):
            a, b = ctx.saved_tensors
            return g_prod * b + g_sum, None

    return GradReverse, RoundSTE, SavedExp, MulAdd


GC_FNS = _functions(gc, gc.autograd.Function)
TORCH_FNS = _functions(torch, torch.autograd.Function)


def _loss(fns, lib, h, b):
    grad_reverse, round_ste, saved_exp, mul_add = fns
    r = grad_reverse.apply(h, 0.5)
    p, s = mul_add.apply(saved_exp.apply(r * 0.3), b)
    return (p * p).sum() + (round_ste.apply(s * 4.0) * s).sum() + lib.tanh(h).sum()


class Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4)

    def forward(self, x, b):
        return {"loss": _loss(GC_FNS, gc, self.fc(x), b)}


def _torch_grads(params, x, b):
    w = torch.tensor(params["fc.weight"], requires_grad=True)
    bias = torch.tensor(params["fc.bias"], requires_grad=True)
    loss = _loss(TORCH_FNS, torch, torch.tensor(x) @ w.T + bias, torch.tensor(b))
    loss.backward()
    return loss.item(), {"fc.weight": w.grad.numpy(), "fc.bias": bias.grad.numpy()}


def _model():
    return gc.capture(Net().double(), x=gc.spec("float64", ("N", 3)), b=gc.spec("float64", ("N", 4)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_are_the_backwards_torchs(backend):
    model = _model()
    x, b = RNG.normal(size=(5, 3)), RNG.normal(size=(5, 4))
    out = gc.Session(gc.grad(model, "loss"), backend=backend).run({"x": x, "b": b})
    loss, grads = _torch_grads(model.params, x, b)
    np.testing.assert_allclose(out["loss"], loss, rtol=1e-12)
    for name, want in grads.items():
        np.testing.assert_allclose(out[f"{name}_grad"], want, rtol=1e-10, atol=1e-12)


def test_the_gradient_is_not_the_forwards():
    """Differentiating the forward's nodes would give GradReverse's +1 and Round's 0: the backward's own."""
    def f(x):
        return {"loss": (GC_FNS[0].apply(x, 2.0) + GC_FNS[1].apply(x * 4.0)).sum()}

    model = gc.capture(f, x=gc.spec("float64", (2, 3)))
    g = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend="numpy").run({"x": RNG.normal(size=(2, 3))})
    np.testing.assert_allclose(g["x_grad"], np.full((2, 3), -2.0 + 4.0))


def test_inference_and_exports_are_plain_onnx(tmp_path):
    model = _model()
    assert [f.domain for f in model.proto.functions] == ["graphc.autograd"] * 4  # the backwards, called by no node
    assert all(n.domain == "" for n in model.proto.graph.node)
    x, b = RNG.normal(size=(5, 3)), RNG.normal(size=(5, 4))
    loss, _ = _torch_grads(model.params, x, b)
    for backend in BACKENDS:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x, "b": b})["loss"], loss, rtol=1e-12)
    artifacts = gc.training.generate(model, "loss", gc.optim.SGD(0.1))
    artifacts.save(tmp_path / "art")
    for name in ("train_step", "gradients", "eval", "inference"):
        proto = onnx.load(tmp_path / "art" / f"{name}.onnx")
        onnx.checker.check_model(proto, full_check=True)
        assert not proto.functions and {o.domain for o in proto.opset_import} <= {"", "ai.onnx"}, name
    exported = gc.optimize(model, level=3).proto
    assert not exported.functions and "graphc.autograd_function" not in str(exported)


def test_trainer_steps_equal_torchs():
    model = _model()
    trainer = gc.Trainer(gc.training.generate(model, "loss", gc.optim.SGD(0.05)), backend="numpy")
    w = torch.tensor(model.params["fc.weight"], requires_grad=True)
    bias = torch.tensor(model.params["fc.bias"], requires_grad=True)
    opt = torch.optim.SGD([w, bias], lr=0.05)
    for _ in range(4):
        x, b = RNG.normal(size=(6, 3)), RNG.normal(size=(6, 4))
        got = trainer.step({"x": x, "b": b})
        opt.zero_grad()
        loss = _loss(TORCH_FNS, torch, torch.tensor(x) @ w.T + bias, torch.tensor(b))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-10)
    np.testing.assert_allclose(trainer.params["fc.weight"], w.detach().numpy(), rtol=1e-10)


def test_needs_input_grad_and_non_differentiable_outputs():
    seen = {}

    class Split(gc.autograd.Function):
        @staticmethod
        def forward(ctx, x, k):
            seen["needs"] = ctx.needs_input_grad
            idx = gc.argmax(x, 1)
            mask = (x > 0).astype("float64")
            ctx.mark_non_differentiable(mask)
            return x * 2.0, mask, idx

        @staticmethod
        def backward(ctx, g, g_mask, g_idx):
            seen["grads"] = (g_mask is not None, g_idx)
            return g * 3.0, None

    def f(x):
        y, mask, _ = Split.apply(x, 2)
        return {"loss": (y * mask).sum() + mask.sum()}

    model = gc.capture(f, x=gc.spec("float64", (2, 3)))
    assert seen == {"needs": (True, False), "grads": (True, None)}  # zeros for the marked output, None for ints
    x = RNG.normal(size=(2, 3))
    g = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend="numpy").run({"x": x})
    np.testing.assert_allclose(g["x_grad"], 3.0 * (x > 0))


class _Bad(gc.autograd.Function):
    @staticmethod
    def forward(ctx, x, mode):
        ctx.mode = mode
        return 3 if mode == "int" else x * 2.0

    @staticmethod
    def backward(ctx, g):
        if ctx.mode == "count":
            return g
        if ctx.mode == "shape":
            return g.sum(0), None
        return g, g


@pytest.mark.parametrize("mode, message", [
    ("count", r"_Bad\.backward \(line \d+\) returned 1 gradient\(s\); forward took 2 argument\(s\)"),
    ("shape", r"returned a gradient of float64\[3\] for argument 0, which is float64\[2,3\]"),
    ("str", r"returned a gradient for argument 1, which is str; return None there"),
    ("int", r"forward returned int as output 0; it returns a gc.Tensor"),
])
def test_errors_name_the_function_and_the_line(mode, message):
    def f(x):
        return _Bad.apply(x, mode)

    with pytest.raises(gc.CaptureError, match=rf"Function _Bad \(applied at [^)]*test_autograd_function.py:\d+\).*"
                                              rf"{message}"):
        gc.capture(f, x=gc.spec("float64", (2, 3)))


def test_gc_func_transforms_take_its_backward():
    def f(x):
        return {"g": gc.func.grad(lambda v: GC_FNS[2].apply(v).sum())(x), "j": gc.func.jacrev(GC_FNS[0].apply)(x, 2.0)}

    model = gc.capture(f, x=gc.spec("float64", (3,)))
    x = RNG.normal(size=3)
    xt = torch.tensor(x, requires_grad=True)
    TORCH_FNS[2].apply(xt).sum().backward()
    for backend in BACKENDS:
        out = gc.Session(model, backend=backend).run({"x": x})
        np.testing.assert_allclose(out["g"], xt.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(out["j"], -2.0 * np.eye(3))


def test_a_model_without_its_backward_is_refused_by_name():
    model = _model()
    proto = model.proto
    del proto.functions[:]
    with pytest.raises(gc.GraphError, match=r"Function \w+ \(applied at .*\) lies on the path to the loss, "
                                            r"but its backward '\w+' is not in this graph's model"):
        gc.grad(gc.load(proto), "loss")


def _behind(lib, function_base, checkpoint):
    """A Linear whose output reaches the loss only through a Function (in a checkpoint region before it)."""
    saved_exp = _functions(lib, function_base)[2]

    class Behind(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = lib.nn.Linear(3, 4), lib.nn.Linear(4, 2)

        def forward(self, x):
            h = checkpoint(lambda t: lib.tanh(self.fc1(t)), x, use_reentrant=False)
            return self.fc2(saved_exp.apply(h * 0.5))

    return Behind


@pytest.mark.parametrize("backend", BACKENDS)
def test_params_only_a_function_reads_train(backend):
    """Before: fc1 was frozen (manifest.frozen, no step), as if the Function's outputs were gc.detach'ed."""
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    from graphc.utils.checkpoint import checkpoint
    net = _behind(gc, gc.autograd.Function, checkpoint)().double()
    model = gc.capture(net, x=gc.spec("float64", ("N", 3)))
    artifacts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.1, momentum=0.9))
    assert artifacts.manifest.frozen == []
    twin = _behind(torch, torch.autograd.Function, torch_checkpoint)().double()
    twin.load_state_dict({k: torch.tensor(v) for k, v in model.params.items()})
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    trainer = gc.Trainer(artifacts, backend=backend)
    assert_classifier_steps_match_torch(trainer, twin, opt, RNG)
    for name, want in twin.state_dict().items():
        np.testing.assert_allclose(trainer.params[name], want.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)
