"""Gradient hooks inside ``gc.cond`` branches and ``gc.scan`` / ``gc.fori_loop`` / ``gc.while_loop`` bodies: a
Tensor's hooks on a value the body computes, a module's full hooks on a call in the body, a parameter's hook on a
weight first read there; checked against torch 2.13 running the same hooks in Python control flow (float64, numpy
and ort-cpu). A hook registered in a body on a value from outside it is refused."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


def _hooked_step(lib, h, w):
    """A step whose value is read before its hooks and after; a hook on the step's input too."""
    h.register_hook(lambda g: g * 1.5)
    y = h @ w
    before = lib.tanh(y)
    y.register_hook(lambda g: g * 3.0)
    y.register_hook(lambda g: lib.clamp(g, -0.4, 0.4))
    return before * 2.0 + y


def _body(lib, step, x, kind):
    """``step(h)`` under ``kind``'s control flow on x [3, 4, 3]: graphc's ops, or torch's Python loop."""
    if lib is gc:
        if kind == "cond":
            return gc.cond(x.sum() > 0, lambda v: step(v * 1.0), lambda v: v * 1.0, x[0])
        if kind == "scan":
            return gc.scan(lambda c, xt: (lambda n: (n, n))(step(c + xt)), x[0] * 0, x)[1]
        if kind == "fori_loop":
            return gc.fori_loop(0, 3, lambda i, h: step(h * 1.0), x[1])
        steps = (x[0, 0, 0] * 0 + 3).to(gc.int64)  # a run-time trip count: reverse mode
        return gc.while_loop(lambda i, h: i < steps, lambda i, h: (i + 1, step(h * 1.0)), (gc.tensor(0), x[1]))[1]
    if kind == "cond":
        return step(x[0] * 1.0) if x.sum() > 0 else x[0] * 1.0
    if kind == "scan":
        c, ys = x[0] * 0, []
        for t in range(x.shape[0]):
            c = step(c + x[t])
            ys.append(c)
        return torch.stack(ys)
    h = x[1]
    for _ in range(3):
        h = step(h * 1.0)
    return h


KINDS = ("cond", "scan", "fori_loop", "while_loop")


def _compare(model, twin_loss, x, names):
    """gc.grad of ``model``'s loss against torch's ``twin_loss(x)`` gradients, on both backends."""
    tx = torch.tensor(x, requires_grad=True)
    twin_loss(tx).backward()
    grads = gc.grad(model, "loss", wrt=["x", *names])
    for backend in BACKENDS:
        out = gc.Session(grads, backend=backend).run({"x": x})
        np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        yield out


@pytest.mark.parametrize("kind", KINDS)
def test_tensor_hooks_in_a_body_are_torchs(kind):
    w = RNG.normal(size=(3, 3)) * 0.6
    model = gc.capture(lambda x: {"loss": (lambda o: (o * o).sum())(
        _body(gc, lambda h: _hooked_step(gc, h, gc.tensor(w)), x, kind))}, x=gc.spec("float64", (3, 4, 3)))
    for sign in (1.0, -1.0):  # the cond case: both branches
        x = np.abs(RNG.normal(size=(3, 4, 3))) * sign
        list(_compare(model, lambda tx: (lambda o: (o * o).sum())(
            _body(torch, lambda h: _hooked_step(torch, h, torch.tensor(w)), tx, kind)), x, []))


def _hooked_linear(lib):
    """A Linear whose full hooks scale grad_output, clamp grad_input and mix grad_output in; its weight's hook clamps."""
    m = lib.nn.Linear(3, 3).double()
    m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2.0,))
    m.register_full_backward_hook(lambda mod, gi, go: (lib.clamp(gi[0], -0.2, 0.2) + go[0] * 0.1,))
    m.weight.register_hook(lambda g: lib.clamp(g, -0.05, 0.05))
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_module_and_parameter_hooks_in_a_body_are_torchs(kind):
    """The weight is first read in the body and again after it: its hook goes in the main graph, on its whole
    gradient, as torch's."""
    linear, twin = _hooked_linear(gc), _hooked_linear(torch)
    twin.load_state_dict({k: torch.tensor(v) for k, v in linear.state_dict().items()})

    def loss(lib, m, x):
        o = _body(lib, lambda h: lib.tanh(m(h)), x, kind)
        return (o * o).sum() + m.weight.sum()

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = linear

        def forward(self, x):
            return {"loss": loss(gc, self.m, x)}

    model = gc.capture(Net(), x=gc.spec("float64", (3, 4, 3)))
    for sign in (1.0, -1.0):
        twin.zero_grad()
        for out in _compare(model, lambda tx: loss(torch, twin, tx), np.abs(RNG.normal(size=(3, 4, 3))) * sign,
                            list(model.params)):
            for name, p in twin.named_parameters():
                want = np.zeros(p.shape) if p.grad is None else p.grad.numpy()  # the other branch: no gradient
                np.testing.assert_allclose(out[f"m.{name}_grad"], want, rtol=1e-10, atol=1e-12, err_msg=name)


_OUTSIDE = r"Tensor.register_hook at .*: {} is a value from outside the gc.cond/gc.scan/gc.fori_loop/gc.while_loop/" \
           r"gc.vmap body being traced; a body is traced once, where torch would register the hook at every step " \
           r"\(or only when the branch runs\): register it outside the body"


def test_a_hook_in_a_body_on_a_value_from_outside_it_is_refused():
    def outer(x):
        w = x * 2.0
        return gc.fori_loop(0, 2, lambda i, h: (w.register_hook(lambda g: g), h * w)[1], x)

    with pytest.raises(gc.CaptureError, match=_OUTSIDE.format("mul")):
        gc.capture(outer, x=gc.spec("float64", (2, 3)))
    operand = lambda x: gc.cond(x.sum() > 0, lambda v: (v.register_hook(lambda g: g), v * 1.0)[1],  # noqa: E731
                                lambda v: v * 1.0, x)
    with pytest.raises(gc.CaptureError, match=_OUTSIDE.format("x")):
        gc.capture(operand, x=gc.spec("float64", (2, 3)))
    linear = gc.nn.Linear(3, 3).double()
    weight = dict(linear.named_parameters())["weight"]  # the Parameter itself, as in torch
    for hooked, message in ((lambda: linear.weight, _OUTSIDE.format("linear.weight")),
                            (lambda: weight, r"Parameter.register_hook at .*: this parameter is a value from "
                                             r"outside the gc.cond")):
        with pytest.raises(gc.CaptureError, match=message):
            gc.capture(lambda x: gc.scan(lambda c, xt: (hooked().register_hook(lambda g: g), (c, linear(xt)))[1],
                                         x[0], x), x=gc.spec("float64", (2, 3)))


def _two_outputs(lib, seen: list):
    """A Linear's tanh and a scaled copy; hooks whose numbers and record depend on which grad_output is None."""
    class Two(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = lib.nn.Linear(3, 3)

        def forward(self, h):
            y = self.fc(h)
            return lib.tanh(y), y * 3.0

    def pre(module, grad_output):
        seen.append(("pre", [g is None for g in grad_output]))
        return grad_output[0] * (3.0 if grad_output[1] is None else 1.5), grad_output[1]

    def full(module, grad_input, grad_output):
        seen.append(("full", [g is None for g in grad_output]))
        return (grad_input[0] * (0.5 if grad_output[1] is None else 2.0),)

    m = Two().double()
    m.register_full_backward_pre_hook(pre)
    m.register_full_backward_hook(full)
    return m


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_the_body_does_not_return_is_none_to_the_hooks(kind):
    """The body reads only the call's first output: torch's hooks get None for the second at every step; graphc's
    hooks run once as the body is traced, with that None (zeros before: weight off by 1.8-9.4)."""
    seen, want = [], []
    two, twin = _two_outputs(gc, seen), _two_outputs(torch, want)
    twin.load_state_dict({k: torch.tensor(v) for k, v in two.state_dict().items()})

    def loss(lib, m, x):
        o = _body(lib, lambda h: m(h)[0], x, kind)
        return (o * o).sum()

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = two

        def forward(self, x):
            return {"loss": loss(gc, self.m, x)}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's None pattern at every step: no warning
        model = gc.capture(Net(), x=gc.spec("float64", (3, 4, 3)))
    for out in _compare(model, lambda tx: loss(torch, twin, tx), np.abs(RNG.normal(size=(3, 4, 3))),
                        list(model.params)):
        for name, p in twin.named_parameters():
            np.testing.assert_allclose(out[f"m.{name}_grad"], p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    assert seen == [("pre", [False, True]), ("full", [False, True])]  # at capture: once
    assert want == seen * (1 if kind == "cond" else 3)  # torch: at every step


def _unread(lib, m, x, which):
    """The call's second output a scan's per-step output the loss does not read, or a carry the next step reads."""
    if which == "scanned" and lib is gc:
        return gc.scan(lambda c, xt: m(c + xt), x[0] * 0, x)[0]
    if which == "carried" and lib is gc:
        return gc.fori_loop(0, 3, lambda i, hb: m(hb[0] + hb[1] * 0.1), (x[0], x[1]))[0]
    h, b = (x[0] * 0, None) if which == "scanned" else (x[0], x[1])
    for t in range(3):
        h, b = m(h + x[t]) if which == "scanned" else m(h + b * 0.1)
    return h


@pytest.mark.parametrize("which, when", [("scanned", "at every step"), ("carried", "at some steps")])
def test_an_output_the_loss_reaches_at_no_or_some_steps_is_warned_of(which, when):
    """Where torch's None depends on the loss or the step, the body's hooks (run once, traced) get zeros: a warning
    names the module and the line."""
    seen, want = [], []
    two, twin = _two_outputs(gc, seen), _two_outputs(torch, want)
    twin.load_state_dict({k: torch.tensor(v) for k, v in two.state_dict().items()})
    with pytest.warns(UserWarning, match=rf"Two's backward hooks \(called at .*test_backward_hooks_bodies.py:\d+\), "
                                         rf"in a gc.cond/.* gives the hooks None {when} for an output"):
        gc.capture(lambda x: {"loss": (_unread(gc, two, x, which) ** 2).sum()}, x=gc.spec("float64", (3, 4, 3)))
    (_unread(torch, twin, torch.ones(3, 4, 3, dtype=torch.float64, requires_grad=True), which) ** 2).sum().backward()
    assert seen == [("pre", [False, False]), ("full", [False, False])]
    others = [False, True] if which == "scanned" else [False, False]  # torch: the last step's first
    assert [p for kind, p in want if kind == "pre"] == [[False, True], others, others]
