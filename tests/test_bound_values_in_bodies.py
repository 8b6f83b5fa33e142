"""gc.grad of a model gc.optimize rewrote (levels 0-2) that calls a module with backward hooks or applies a
gc.autograd.Function in gc.cond / gc.scan / gc.fori_loop / gc.while_loop bodies (a cond in a scan's body too) or
in the main graph: the values their backwards bind by name are kept through the pipeline (before, CSE and x*1
elimination in the bodies renamed them: AutodiffError "bound to the value 'mul', which this graph no longer
has"), and so are the markers of outputs nothing reads (dead-node removal dropped them: KeyError). Checked against
the unoptimized model and torch 2.13 running the same hooks and Functions in Python control flow (float64, numpy
and ort-cpu)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_backward_hooks_bodies import KINDS, _body, _hooked_linear, _two_outputs

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
FLOWS = ("main", *KINDS, "scan_cond")


def _flow(lib, step, x, flow):
    """``step`` under ``flow``'s control flow on x [3, 4, 3]; "scan_cond": a cond in each scan step; "main": on x."""
    if flow == "main":
        return step(x)
    if flow != "scan_cond":
        return _body(lib, step, x, flow)
    if lib is gc:
        inner = lambda h: gc.cond(h.sum() > 0, step, lambda v: v * 1.0, h)  # noqa: E731
        return gc.scan(lambda c, xt: (lambda n: (n, n))(inner(c + xt)), x[0] * 0, x)[1]
    c, ys = x[0] * 0, []
    for t in range(x.shape[0]):
        c = c + x[t]
        c = step(c) if c.sum() > 0 else c * 1.0
        ys.append(c)
    return torch.stack(ys)


def _names(graph):
    """The node outputs and outputs of ``graph`` and its subgraphs."""
    return {*(o.name for o in graph.output),
            *(v for n in graph.node for v in n.output),
            *(v for n in graph.node for a in n.attribute if a.type == a.GRAPH for v in _names(a.g))}


def _check(model, twin_loss, x, twin=None):
    """Levels 0-2 then gc.grad: the unoptimized model's gradients (1e-12) and torch's ``twin_loss(x)`` ones
    (``twin``'s parameters' too: model parameter ``m.<name>``)."""
    tx = torch.tensor(x, requires_grad=True)
    twin_loss(tx).backward()
    want = gc.Session(gc.grad(model, "loss", wrt=["x", *model.params]), backend="numpy").run({"x": x})
    np.testing.assert_allclose(want["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    for name, p in twin.named_parameters() if twin is not None else ():
        np.testing.assert_allclose(want[f"m.{name}_grad"], p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=name)
    for level in (0, 1, 2):
        optimized = gc.optimize(model, level=level)
        assert not any(n.endswith("_kept") or "_placeholder" in n for n in _names(optimized.proto.graph))
        grads = gc.grad(optimized, "loss", wrt=["x", *model.params])
        for backend in BACKENDS:
            out = gc.Session(grads, backend=backend).run({"x": x})
            for name, value in want.items():
                np.testing.assert_allclose(out[name], value, rtol=1e-12, atol=1e-12,
                                           err_msg=f"{name} at level {level} on {backend}")


@pytest.mark.parametrize("module", ["hooked", "one_output_read"])
@pytest.mark.parametrize("flow", FLOWS)
def test_module_hooks_in_a_body_give_torchs_gradients_after_optimize(flow, module):
    """A Linear whose full hooks change its gradients; a module whose second output the body does not read
    (the hooks get None for it, as torch's)."""
    if module == "hooked":
        m, twin = _hooked_linear(gc), _hooked_linear(torch)
        call = lambda lib, mod, h: lib.tanh(mod(h))  # noqa: E731
    else:
        m, twin = _two_outputs(gc, []), _two_outputs(torch, [])
        call = lambda lib, mod, h: mod(h)[0]  # noqa: E731
    twin.load_state_dict({k: torch.tensor(v) for k, v in m.state_dict().items()})

    def loss(lib, mod, x):
        o = _flow(lib, lambda h: call(lib, mod, h), x, flow)
        return (o * o).sum()

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, x):
            return {"loss": loss(gc, self.m, x)}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # test_backward_hooks_bodies checks the warnings
        model = gc.capture(Net(), x=gc.spec("float64", (3, 4, 3)))
    _check(model, lambda tx: loss(torch, twin, tx), np.abs(RNG.normal(size=(3, 4, 3))), twin)


def _saving(lib, base):
    class Saves(base):  # saves x * 1.0 (x*1 elimination folds it) and tanh(x), which the step makes too (CSE)
        @staticmethod
        def forward(ctx, x):
            s, t = x * 1.0, lib.tanh(x)
            ctx.save_for_backward(s, t)
            return t * s

        @staticmethod
        def backward(ctx, g):
            s, t = ctx.saved_tensors
            return g * (t + s * (1 - t * t)) * 0.5

    return Saves


@pytest.mark.parametrize("flow", FLOWS)
def test_a_functions_saved_values_in_a_body_survive_optimize(flow):
    w = RNG.normal(size=(3, 3)) * 0.6
    fns = {gc: _saving(gc, gc.autograd.Function), torch: _saving(torch, torch.autograd.Function)}

    def loss(lib, x):
        def step(h):
            y = h @ lib.tensor(w)
            return fns[lib].apply(y) + lib.tanh(y)
        return (_flow(lib, step, x, flow) ** 2).sum()

    model = gc.capture(lambda x: {"loss": loss(gc, x)}, x=gc.spec("float64", (3, 4, 3)))
    _check(model, lambda tx: loss(torch, tx), np.abs(RNG.normal(size=(3, 4, 3))))
