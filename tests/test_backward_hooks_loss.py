"""A module's backward hooks where its outputs reach different graph outputs: each graph output taken as the loss
(``gc.grad``, ``gc.training.generate``) gives the hooks torch's None for the module output it does not reach (the
hooks run at capture once per such pattern of Nones, ``graphc.dsl.autograd.settle``); checked against torch 2.13 in
float64, hooks whose gradients depend on which ``grad_output`` is None; also after ``gc.optimize``."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

X = np.random.default_rng(0).normal(size=(5, 3))


def _net(lib, seen: list):
    """Two outputs of a hooked call, one read by ``main``, the other by ``aux``."""
    def pre(module, grad_output):
        seen.append(("pre", [g is None for g in grad_output]))
        k = 3.0 if any(g is None for g in grad_output) else 1.5  # zeros for None give other numbers
        return tuple(None if g is None else g * k for g in grad_output)

    def full(module, grad_input, grad_output):
        seen.append(("full", [g is None for g in grad_output]))
        return (grad_input[0] * (0.5 if grad_output[1] is None else 2.0),)

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
            a, b = self.two(x)
            main = (self.out(lib.tanh(a)) ** 2).sum()  # "mixed": main and a term reaching no output of the call
            return {"main": main, "aux": (b * b).sum(), "mixed": main + (x * x).sum()}

    return Net().double()


def _captured():
    seen: list = []
    net = _net(gc, seen)
    model = gc.capture(net, x=gc.spec("float64", ("N", 3)))
    return net, model, seen


def _torch(net, loss: str):
    """torch's hooks' calls and the gradients of x and each parameter (zeros where the loss reaches none)."""
    want: list = []
    twin = _net(torch, want)
    twin.load_state_dict({k: torch.tensor(v) for k, v in net.state_dict().items()})
    tx = torch.tensor(X, requires_grad=True)
    twin(tx)[loss].backward()
    grads = {f"{k}_grad": np.zeros(p.shape) if p.grad is None else p.grad.numpy() for k, p in twin.named_parameters()}
    return want, {"x_grad": tx.grad.numpy(), **grads}


def test_the_hooks_run_once_for_each_pattern_of_nones():
    _, _, seen = _captured()
    patterns = ([False, False], [False, True], [True, False])  # every output reached; as "main" would; as "aux"
    assert seen == [(kind, p) for kind in ("pre", "full") for p in patterns]


@pytest.mark.parametrize("backend, how", [("numpy", "captured"), ("ort-cpu", "captured"), ("numpy", "saved"),
                                          ("numpy", "optimized")])
@pytest.mark.parametrize("loss", ["main", "aux", "mixed"])
def test_grad_takes_the_hooks_as_torch_calls_them_for_that_loss(loss, backend, how, tmp_path):
    """The "mixed" loss sums an output of the call and a term reaching none (the "main" run). Captured; saved and
    loaded (the variants' backwards and records kept); or gc.optimize'd at level 2, whose
    CSE merged the hooks' output marker with the detach of the same value beside it (every gradient zero)."""
    net, model, seen = _captured()
    if how == "saved":
        model.save(tmp_path / "m.onnx")
        model = gc.load(tmp_path / "m.onnx")
    elif how == "optimized":
        model = gc.optimize(model, level=2)
    want, grads = _torch(net, loss)
    nones = [loss == "aux", loss != "aux"]
    assert want == [("pre", nones), ("full", nones)]
    assert all(call in seen for call in want)
    out = gc.Session(gc.grad(model, loss, wrt=["x", *model.params]), backend=backend).run({"x": X})
    for name, value in grads.items():
        np.testing.assert_allclose(out[name], value, rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("spec", ["main", "l1_aux"])
def test_training_gradients_take_the_hooks_as_torch_calls_them(spec):
    net, model, _ = _captured()
    loss = "main" if spec == "main" else gc.losses.l1("aux", label="zero")  # |aux| = aux: torch's aux.backward()
    arts = gc.training.generate(model, loss, gc.optim.SGD(0.1))
    feeds = {"x": X} if spec == "main" else {"x": X, "zero": np.zeros(())}
    out = gc.Session(arts.gradients, backend="numpy").run(feeds)
    _, grads = _torch(net, "main" if spec == "main" else "aux")
    assert {"two.fc.weight_grad", "two.fc.bias_grad"} <= set(out)  # (a parameter the loss does not reach: none)
    for name in set(grads) & set(out):
        np.testing.assert_allclose(out[name], grads[name], rtol=1e-12, atol=1e-14, err_msg=name)
