"""A module's full backward hooks together with parameter and tensor hooks, on a computed input (the hooks'
nodes of a parameter first read inside the call go before the call's), checked against torch 2.13 in float64."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

BACKENDS = ("numpy", "ort-cpu")
X = np.abs(np.random.default_rng(1).normal(size=(2, 3)))


def _linear(lib, hooks):
    """A Linear whose pre-hook doubles grad_output and whose full hook clamps grad_input and adds 0.1 grad_output;
    ``hooks`` names the parameter hooks (``weight``, ``bias``) it also gets."""
    m = lib.nn.Linear(3, 3).double()
    m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2.0,))
    m.register_full_backward_hook(lambda mod, gi, go: (lib.clamp(gi[0], -0.2, 0.2) + go[0] * 0.1,))
    if "weight" in hooks:
        m.weight.register_hook(lambda g: lib.clamp(g, -0.05, 0.05))
    if "bias" in hooks:
        m.bias.register_hook(lambda g: g * 3.0)
    return m


def _forwards(lib):
    """Each case: its modules' parameter hooks, and a forward of (modules, x)."""
    def on_input(ms, x):
        h = x * 1.0
        h.register_hook(lambda g: g * 0.5)
        return ms[0](h)

    def on_output(ms, x):
        o = ms[0](x * 1.0)
        o.register_hook(lambda g: lib.clamp(g, -1.0, 1.0))
        return lib.tanh(o)

    return {
        "weight": (("weight",), lambda ms, x: ms[0](x * 1.0)),
        "bias": (("bias",), lambda ms, x: ms[0](lib.sin(x))),
        "input hook": (("weight",), on_input),
        "output hook": (("weight", "bias"), on_output),
        "in sequence": (("weight",), lambda ms, x: ms[1](lib.tanh(ms[0](x * 1.0)))),
        "used twice": (("weight",), lambda ms, x: ms[0](lib.tanh(ms[0](x * 1.0)) * 2.0)),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(_forwards(torch)))
def test_full_hooks_with_parameter_hooks_match_torch_on_a_computed_input(case, backend):
    hooks, forward = _forwards(gc)[case]
    mods = [_linear(gc, hooks) for _ in range(2)]
    twins = [_linear(torch, hooks) for _ in range(2)]
    for m, twin in zip(mods, twins):
        twin.load_state_dict({k: torch.tensor(v) for k, v in m.state_dict().items()})

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = mods

        def forward(self, x):
            o = forward((self.a, self.b), x)
            return {"loss": (o * o).sum()}

    model = gc.capture(Net(), x=gc.spec("float64", (2, 3)))
    params = [f"{n}.{p}" for n in "ab" for p in ("weight", "bias") if f"{n}.{p}" in model.params]
    out = gc.Session(gc.grad(model, "loss", wrt=["x", *params]), backend=backend).run({"x": X})
    tx = torch.tensor(X, requires_grad=True)
    o = _forwards(torch)[case][1](twins, tx)
    (o * o).sum().backward()
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name in params:
        module, attr = name.split(".")
        want = getattr(twins["ab".index(module)], attr).grad.numpy()
        np.testing.assert_allclose(out[f"{name}_grad"], want, rtol=1e-10, atol=1e-12, err_msg=name)


def _hooks_its_input(lib):
    """A module whose forward hooks its own input (x5), with a full hook clamping grad_input: torch's hook is on
    the forward's argument, so it sees the gradient before the full hook does."""
    class Inner(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = lib.nn.Linear(3, 3).double()

        def forward(self, x):
            x.register_hook(lambda g: g * 5.0)
            return self.l(x)

    m = Inner()
    m.register_full_backward_hook(lambda mod, gi, go: (lib.clamp(gi[0], -0.2, 0.2),))
    return m


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("computed", [False, True])
def test_a_hook_in_forward_on_the_input_comes_before_the_full_hook_as_torchs(computed, backend):
    m, twin = _hooks_its_input(gc), _hooks_its_input(torch)
    twin.load_state_dict({k: torch.tensor(v) for k, v in m.state_dict().items()})

    def f(x):
        return x * 1.0 if computed else x

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            o = self.m(f(x))
            return {"loss": (o * o).sum()}

    model = gc.capture(Net(), x=gc.spec("float64", (2, 3)))
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": X})
    tx = torch.tensor(X, requires_grad=True)
    o = twin(f(tx))
    (o * o).sum().backward()
    np.testing.assert_allclose(out["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
