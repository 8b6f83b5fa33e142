"""Gradient hooks: ``Tensor.register_hook``, ``Parameter.register_hook`` and a Module's full backward hooks and
pre-hooks, each a ``gc.autograd.Function`` whose backward is the hook; checked against torch 2.13 in float64."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.utils.checkpoint import checkpoint as gc_checkpoint

try:
    from torch_grad_util import assert_classifier_steps_match_torch
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_classifier_steps_match_torch

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
MASK = (np.random.default_rng(1).random((4, 3)) > 0.5).astype(np.float64)  # a pruned weight's kept entries


def _tensor_hooks(lib, x, w):
    """A value read before its hooks and after; two hooks whose order matters (scale, then clamp)."""
    h = x @ w
    before = lib.tanh(h)
    h.register_hook(lambda g: g * 2.0)
    h.register_hook(lambda g: lib.clamp(g, -0.3, 0.3))
    h.register_hook(lambda g: None)  # torch: observes only; here: computes nothing
    return (before * 3.0).sum() + (h * h).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensor_hooks_chain_in_order_on_the_whole_gradient(backend):
    model = gc.capture(lambda x, w: {"loss": _tensor_hooks(gc, x, w)}, x=gc.spec("float64", (4, 3)),
                       w=gc.spec("float64", (3, 5)))
    x, w = RNG.normal(size=(4, 3)), RNG.normal(size=(3, 5))
    out = gc.Session(gc.grad(model, "loss", wrt=["x", "w"]), backend=backend).run({"x": x, "w": w})
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    _tensor_hooks(torch, tx, tw).backward()
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out["w_grad"], tw.grad.numpy(), rtol=1e-10, atol=1e-12)


def _squares(lib):
    """x * x with its gradient of its own (a saved input), for torch's Function or graphc's."""
    base = torch.autograd.Function if lib is torch else gc.autograd.Function

    class Square(base):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2.0 * x

    return Square


def _function_then_hooks(lib, x):
    """A Function reads t before t's hooks are registered (and one hook removed again): the hooks see its gradient."""
    t = x * 2.0
    squared = _squares(lib).apply(t)
    t.register_hook(lambda g: g * 5.0).remove()
    t.register_hook(lambda g: lib.clamp(g, -0.5, 0.5))
    t.register_hook(lambda g: g * 3.0)
    return squared.sum() + lib.sin(t).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hook_sees_the_gradient_through_a_function_applied_before_it(backend):
    model = gc.capture(lambda x: {"loss": _function_then_hooks(gc, x)}, x=gc.spec("float64", (3, 4)))
    x = RNG.normal(size=(3, 4))
    tx = torch.tensor(x, requires_grad=True)
    _function_then_hooks(torch, tx).backward()
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_a_removed_hook_leaves_the_gradient_and_the_model_alone():
    def f(x):
        y = x * 3.0
        y.register_hook(lambda g: g * 2.0)
        y.register_hook(lambda g: g * 5.0).remove()
        with y.register_hook(lambda g: g * 7.0):
            pass
        return {"loss": (y * y).sum()}

    model = gc.capture(f, x=gc.spec("float64", (2, 3)))
    assert [f.domain for f in model.proto.functions] == ["graphc.autograd"]  # the kept hook's backward only
    x = RNG.normal(size=(2, 3))
    g = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend="numpy").run({"x": x})
    np.testing.assert_allclose(g["x_grad"], 3.0 * 2.0 * 2.0 * (3.0 * x), rtol=1e-12)


def _pruned(lib):
    """fc1's weight masked by a parameter hook, fc2's gradient clamped by one registered in forward."""
    def mask(g):
        return g * (torch.tensor(MASK) if lib is torch else MASK)

    class Pruned(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = lib.nn.Linear(3, 4), lib.nn.Linear(4, 2)
            self.fc1.weight.register_hook(mask)
            self.fc1.bias.register_hook(lambda g: g * 0.5).remove()

        def forward(self, x):
            if not getattr(self, "hooked", False):  # torch keeps a forward's hook on the parameter: once
                self.fc2.weight.register_hook(lambda g: lib.clamp(g, -0.1, 0.1))
                self.hooked = lib is torch
            return self.fc2(lib.tanh(self.fc1(x)))

    return Pruned


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameter_hooks_steer_adamw_steps_as_torchs(backend):
    model = gc.capture(_pruned(gc)().double(), x=gc.spec("float64", ("N", 3)))
    artifacts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"),
                                     gc.optim.AdamW(0.01, weight_decay=0.1))
    twin = _pruned(torch)().double()
    twin.load_state_dict({k: torch.tensor(v) for k, v in model.params.items()})
    opt = torch.optim.AdamW(twin.parameters(), lr=0.01, weight_decay=0.1)
    trainer = gc.Trainer(artifacts, backend=backend)
    assert_classifier_steps_match_torch(trainer, twin, opt, RNG)
    for name, want in twin.state_dict().items():
        np.testing.assert_allclose(trainer.params[name], want.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    pruned = MASK == 0  # no gradient: AdamW's decoupled decay alone moves them, as torch's
    np.testing.assert_allclose(trainer.params["fc1.weight"][pruned],
                               model.params["fc1.weight"][pruned] * (1 - 0.01 * 0.1) ** 3, rtol=1e-12)


def _hooked(lib, log):
    """fc2 with a pre-hook scaling grad_output and two full hooks (clamping grad_input, mixing in grad_output)."""
    class Hooked(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = lib.nn.Linear(3, 4), lib.nn.Linear(4, 4), lib.nn.Linear(4, 2)
            self.fc2.register_full_backward_pre_hook(lambda m, go: (go[0] * 3.0,))
            self.fc2.register_full_backward_hook(
                lambda m, gi, go: (lib.clamp(gi[0], -0.05, 0.05) + go[0].sum() * 0.01,))
            self.fc2.register_full_backward_hook(lambda m, gi, go: log.append((type(m).__name__, len(gi), len(go))))
            self.fc2.register_full_backward_hook(lambda m, gi, go: (gi[0] * 0.5,), prepend=False)

        def forward(self, x):
            h = lib.tanh(self.fc1(x))
            return self.fc3(lib.tanh(self.fc2(h)) + h)  # h read outside fc2 too: that gradient is not hooked

    return Hooked


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_backward_hooks_are_torchs(backend):
    log = []
    net = _hooked(gc, log)().double()

    class Loss(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x):
            return {"loss": (self.net(x) ** 2).sum()}

    model = gc.capture(Loss(), x=gc.spec("float64", ("N", 3)))
    assert log == [("Linear", 1, 1)]  # run once, at capture
    twin = _hooked(torch, [])().double()
    twin.load_state_dict({k: torch.tensor(v) for k, v in net.state_dict().items()})
    x = RNG.normal(size=(5, 3))
    tx = torch.tensor(x, requires_grad=True)
    (twin(tx) ** 2).sum().backward()
    out = gc.Session(gc.grad(model, "loss", wrt=["x", *model.params]), backend=backend).run({"x": x})
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name, p in twin.named_parameters():
        np.testing.assert_allclose(out[f"net.{name}_grad"], p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)


def test_full_hooks_see_none_for_arguments_without_a_gradient():
    seen = []

    class Scale(gc.nn.Module):
        def forward(self, x, k, n):
            return x * k + n.astype("float64").sum(), n

    module = Scale()
    module.register_full_backward_hook(lambda m, gi, go: seen.append([g is None for g in gi] + [g is None for g in go]))

    def f(x):
        y, _ = module(x, 2.0, gc.argmax(x, 1))
        return {"loss": y.sum()}

    gc.capture(f, x=gc.spec("float64", (2, 3)))
    assert seen == [[False, True, True, False, True]]


def _two_outputs(lib, seen):
    """A module of two outputs whose second the loss does not read; hooks that say which ``grad_output`` is None,
    a pre-hook scaling the first (and returning None for the second), a full hook mixing it into ``grad_input``."""
    def pre(module, grad_output):
        seen.append(("pre", [g is None for g in grad_output]))
        return grad_output[0] * 3.0, None

    def full(module, grad_input, grad_output):
        seen.append(("full", [g is None for g in grad_output]))
        return (grad_input[0] * 0.5 + grad_output[0].sum() * 0.01,)

    class Two(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = lib.nn.Linear(3, 2)

        def forward(self, x):
            h = self.fc(x)
            return h * 2.0, lib.sin(h)

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.two, self.out = Two(), lib.nn.Linear(2, 1)
            self.two.register_full_backward_pre_hook(pre)
            self.two.register_full_backward_hook(full)

        def forward(self, x):
            used, unused = self.two(x)
            unread, _ = self.two(x)  # a call none of whose outputs reaches the loss: torch calls no hook
            return self.out(lib.tanh(used))

    return Net


@pytest.mark.parametrize("backend", BACKENDS)
def test_hooks_get_none_for_an_output_that_reaches_no_graph_output(backend):
    """torch's: None in ``grad_output`` where an output has no gradient, no call where none has; graphc takes
    "reaches a graph output" for torch's "reaches the loss"."""
    seen, want = [], []
    net = _two_outputs(gc, seen)().double()
    model = gc.capture(lambda x: {"loss": (net(x) ** 2).sum()}, x=gc.spec("float64", ("N", 3)))
    twin = _two_outputs(torch, want)().double()
    twin.load_state_dict({k: torch.tensor(v) for k, v in net.state_dict().items()})
    x = RNG.normal(size=(5, 3))
    tx = torch.tensor(x, requires_grad=True)
    (twin(tx) ** 2).sum().backward()
    assert seen == want == [("pre", [False, True]), ("full", [False, True])]
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("returned, message", [
    ("count", r"Linear's full backward hook \S*<lambda> \(test_backward_hooks.py line \d+\) returned an invalid "
              r"number of gradients, got 2, but expected 1"),
    ("shape", r"returned a gradient of float64\[3\] for one of float64\[2,3\]"),
])
def test_a_hooks_wrong_result_is_named(returned, message):
    module = gc.nn.Linear(3, 4).double()
    module.register_full_backward_hook(
        lambda m, gi, go: (gi[0], gi[0]) if returned == "count" else (gi[0].sum(0),))

    def f(x):
        return {"loss": module(x * 1.0).sum()}

    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(f, x=gc.spec("float64", (2, 3)))


def test_refusals_name_the_problem():
    with pytest.raises(gc.CaptureError, match=r"Tensor.register_hook at .*: cannot register a hook on a tensor that "
                                              r"doesn't require gradient \(.* is int64"):
        gc.capture(lambda x: gc.argmax(x, 1).register_hook(lambda g: g), x=gc.spec("float64", (2, 3)))
    frozen = gc.nn.Linear(3, 4)
    frozen.weight.requires_grad_(False)
    with pytest.raises(gc.CaptureError, match=r"cannot register a hook .* is frozen \(requires_grad=False\)"):
        frozen.weight.register_hook(lambda g: g)
    with pytest.raises(gc.CaptureError, match=r"is outside gc.capture, where no gradient is taken"):
        gc.ones(3).register_hook(lambda g: g)
    with pytest.raises(TypeError, match="a hook must be callable, got int"):
        gc.nn.Linear(3, 4).register_full_backward_pre_hook(3)


def _clamped(lib):
    """Hooks nonlinear in their gradient (clamps), which show what gradient they are given."""
    class Clamped(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = lib.nn.Linear(3, 4), lib.nn.Linear(4, 1)
            self.fc1.weight.register_hook(lambda g: lib.clamp(g, -0.05, 0.05))

        def forward(self, x):
            h = self.fc1(x)
            h.register_hook(lambda g: lib.clamp(g, -0.02, 0.02))
            return self.fc2(lib.tanh(h))

    return Clamped


@pytest.mark.parametrize("backend", BACKENDS)
def test_hooks_see_the_scaled_gradient_and_the_weighted_one(backend):
    """Under loss scaling a hook gets the scaled gradient, as torch's under GradScaler; with accumulate=2 it gets
    each micro-batch's weighted gradient, as torch's in its ``(loss * rows / step_rows).backward()`` loop."""
    model = gc.capture(_clamped(gc)().double(), x=gc.spec("float64", ("N", 3)))
    x, y = RNG.normal(size=(8, 3)) * 2, RNG.normal(size=(8, 1)) * 3

    def torch_sgd(parts, seed_scale):
        twin = _clamped(torch)().double()
        twin.load_state_dict({k: torch.tensor(v) for k, v in model.params.items()})
        for xs, ys in zip(np.array_split(x, parts), np.array_split(y, parts)):
            loss = torch.nn.functional.mse_loss(twin(torch.tensor(xs)), torch.tensor(ys))
            (loss * seed_scale * len(xs) / len(x)).backward()
        grads = {k: p.grad.numpy() / seed_scale for k, p in twin.named_parameters()}
        return {k: model.params[k] - 0.5 * grads[k] for k in model.params}

    for options, want in (({"loss_scale": 1024.0}, torch_sgd(1, 1024.0)), ({"accumulate": 2}, torch_sgd(2, 1.0))):
        scale = {"loss_scale": options.pop("loss_scale")} if "loss_scale" in options else {}
        artifacts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.5), **scale)
        trainer = gc.Trainer(artifacts, backend=backend, **options)
        trainer.step({"x": x, "y": y})
        for name, value in want.items():
            np.testing.assert_allclose(trainer.params[name], value, rtol=1e-12, atol=1e-15, err_msg=f"{options} {name}")
    unscaled = torch_sgd(1, 1.0)  # the clamps bite: what the hooks see decides the step
    assert np.abs(torch_sgd(1, 1024.0)["fc1.weight"] - unscaled["fc1.weight"]).max() > 1e-3
    assert np.abs(torch_sgd(2, 1.0)["fc1.weight"] - unscaled["fc1.weight"]).max() > 1e-3


def _hooked_input(lib, kind):
    """A Linear whose forward hooks its own input (clamped, scaled), called between two other reads of x; with
    backward hooks (``kind``) torch's forward gets the input through an identity of its own."""
    class Hooked(lib.nn.Linear):
        def forward(self, x):
            x.register_hook(lambda g: lib.clamp(g, -0.2, 0.2) * 3.0)
            return lib.tanh(super().forward(x)) * x

    m = Hooked(4, 4).double()
    if kind == "full":
        m.register_full_backward_hook(lambda mod, gi, go: None)
    elif kind == "pre":
        m.register_full_backward_pre_hook(lambda mod, go: None)
    return m


@pytest.mark.parametrize("kind", ["none", "full", "pre"])
def test_a_hook_in_forward_on_its_input_reaches_the_callers_reads_as_torchs(kind):
    """Without backward hooks the hook is on the caller's x (all its reads); with them, on forward's only."""
    m, twin = _hooked_input(gc, kind), _hooked_input(torch, kind)
    twin.load_state_dict({k: torch.tensor(v) for k, v in m.state_dict().items()})

    def loss(lib, mod, x):
        before = lib.sin(x)
        return (mod(x) ** 2).sum() + before.sum() + (x * x).sum() + mod(x * 2.0).sum()

    model = gc.capture(lambda x: {"loss": loss(gc, m, x)}, x=gc.spec("float64", (3, 4)))
    x = RNG.normal(size=(3, 4))
    tx = torch.tensor(x, requires_grad=True)
    loss(torch, twin, tx).backward()
    for backend in BACKENDS:
        out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": x})
        np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-12, atol=1e-13, err_msg=backend)


_ALIASES = {"clone": lambda x: x.clone(), "squeeze": lambda x: x.squeeze(), "squeeze(0)": lambda x: x.squeeze(0),
            "double": lambda x: x.double(), "type_as": lambda x: x.type_as(x)}


@pytest.mark.parametrize("op", sorted(_ALIASES))
def test_a_hook_on_a_copy_or_a_no_op_view_is_torchs(op):
    """torch's clone and squeeze (nothing to squeeze) are new tensors, its double/type_as (same dtype) x itself:
    a hook on the result sees the result's reads, or all of x's."""
    def loss(lib, x):
        a = lib.sin(x)
        y = _ALIASES[op](x)
        y.register_hook(lambda g: lib.clamp(g, -0.1, 0.1) * 3.0)
        return (lib.tanh(y) * 2.0).sum() + a.sum() + (x * x).sum()

    model = gc.capture(lambda x: {"loss": loss(gc, x)}, x=gc.spec("float64", (3, 4)))
    x = RNG.normal(size=(3, 4))
    tx = torch.tensor(x, requires_grad=True)
    loss(torch, tx).backward()
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend="numpy").run({"x": x})
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-12, atol=1e-13)


def _checkpointed(lib, x, w, target):
    """A checkpointed function hooking its argument, the weight it reads, or a value it computes."""
    def fn(v):
        h = v @ w
        {"arg": v, "weight": w, "inner": h}[target].register_hook(lambda g: lib.clamp(g, -0.3, 0.3) * 3.0)
        return lib.tanh(h) * h
    y = gc_checkpoint(fn, x) if lib is gc else torch.utils.checkpoint.checkpoint(
        fn, x, use_reentrant=False)
    return (y ** 2).sum() + lib.sin(x).sum()


def test_a_hook_in_a_checkpoint_on_a_value_from_outside_it_is_refused_and_one_inside_is_torchs():
    """torch registers a hook on the region's argument or weight again when it recomputes the region (it runs
    twice): refused, naming the line; one on a value the region computes runs once, as here."""
    spec = {"x": gc.spec("float64", (3, 4)), "w": gc.spec("float64", (4, 4))}
    for target, name in (("arg", "x"), ("weight", "w")):
        with pytest.raises(gc.CaptureError, match=rf"Tensor.register_hook at .*test_backward_hooks.py:\d+: {name} "
                                                  r"is a value from outside the gc.utils.checkpoint region"):
            gc.capture(lambda x, w: {"loss": _checkpointed(gc, x, w, target)}, **spec)
    model = gc.capture(lambda x, w: {"loss": _checkpointed(gc, x, w, "inner")}, **spec)
    x, w = RNG.normal(size=(3, 4)), RNG.normal(size=(4, 4))
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    _checkpointed(torch, tx, tw, "inner").backward()
    out = gc.Session(gc.grad(model, "loss", wrt=["x", "w"]), backend="numpy").run({"x": x, "w": w})
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(out["w_grad"], tw.grad.numpy(), rtol=1e-12, atol=1e-13)
