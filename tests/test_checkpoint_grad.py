"""Checkpoint regions under gc.grad, gc.autograd.grad and in unrolled gc.scan / gc.fori_loop bodies:
the gradient graphs read recomputed copies of the regions' values.

Oracles: torch 2.13's torch.utils.checkpoint on the same float64 model (gradients to 1e-10; Dropout's
mask read off the forward's output), the same graphc model without regions (1e-12), and the graphs
themselves (which nodes are copies, onnxruntime keeping them)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.backends.registry import get_backend
from graphc.model import RECOMPUTED_KEY
from graphc.utils.checkpoint import checkpoint, checkpoint_sequential

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
T = 5


def _layers(lib, p: float) -> list:
    f64 = {"dtype": torch.float64} if lib is torch.nn else F64
    return [lib.Linear(6, 16, **f64), lib.Tanh(), lib.Linear(16, 16, **f64), lib.Dropout(p) if p else lib.Tanh(),
            lib.Linear(16, 16, **f64), lib.ReLU(), lib.Linear(16, 3, **f64)]


class _Net(gc.nn.Module):
    def __init__(self, regions: bool):
        super().__init__()
        self.regions = regions
        self.body = gc.nn.Sequential(*_layers(gc.nn, 0.0))

    def forward(self, x):
        return checkpoint_sequential(self.body, 3, x, use_reentrant=False) if self.regions else self.body(x)


def _capture(net: gc.nn.Module, **specs) -> gc.Model:
    return gc.capture(net.train(), **{k: gc.spec("float64", v) for k, v in specs.items()})


def _grad(model: gc.Model, loss) -> gc.Model:
    return gc.grad(model, loss)


def _copies(model: gc.Model) -> list:
    return [n for n in model.proto.graph.node if any(p.key == RECOMPUTED_KEY for p in n.metadata_props)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gc_grad_recomputes_regions_equal_torch_and_the_plain_model(backend):
    batch = {"x": RNG.normal(size=(5, 6)), "y": RNG.normal(size=(5, 3))}
    loss = gc.losses.mse("output", label="y")
    gc.manual_seed(0)
    regions = _grad(_capture(_Net(True), x=("N", 6)), loss)
    gc.manual_seed(0)
    plain = _grad(_capture(_Net(False), x=("N", 6)), loss)
    copies = _copies(regions)
    assert {n.op_type for n in copies} == {"Gemm", "Tanh"} and not _copies(plain)
    assert all(n.name.startswith("recompute/") for n in copies)
    got = gc.Session(regions, backend=backend).run(batch)
    want = gc.Session(plain, backend=backend).run(batch)
    twin = torch.nn.Sequential(*_layers(torch.nn, 0.0))
    twin.load_state_dict({k[len("body."):]: torch.from_numpy(np.array(v)) for k, v in regions.params.items()
                          if k.startswith("body.")})
    x, y = (torch.from_numpy(batch[k]) for k in ("x", "y"))
    out = torch.utils.checkpoint.checkpoint_sequential(twin, 3, x, use_reentrant=False)
    torch.nn.functional.mse_loss(out, y).backward()
    for name, p in twin.named_parameters():
        key = f"body.{name}_grad"
        np.testing.assert_allclose(got[key], p.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
        np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-15, err_msg=name)
    if backend == "ort-cpu":  # the session keeps the copies untold (no common-subexpression elimination)
        kept = [n for n in get_backend("ort-cpu").prepare(regions.proto).placement if n.startswith("recompute/")]
        assert len(kept) == len(copies)


class _Drop(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = gc.nn.Linear(6, 16, **F64), gc.nn.Dropout(0.5), gc.nn.Linear(16, 3, **F64)

    def forward(self, x):
        kept = checkpoint(lambda h: self.drop(gc.tanh(self.fc1(h))), x, use_reentrant=False)
        return self.fc2(kept), kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_gc_grad_dropout_in_a_region_keeps_the_forward_mask(backend):
    """[Linear, Tanh, Dropout] is a region: the Tanh is recomputed, the Dropout kept, so fc1's gradient
    is torch's on the mask read off the forward's output (a fresh draw would not match it)."""
    gc.manual_seed(0)
    model = _capture(_Drop(), x=("N", 6))
    graded = _grad(model, gc.losses.mse("output_0", label="y"))
    assert {n.op_type for n in _copies(graded)} == {"Gemm", "Tanh"}
    assert [n.op_type for n in graded.proto.graph.node].count("Dropout") == 1
    batch = {"x": RNG.normal(size=(64, 6)), "y": RNG.normal(size=(64, 3))}
    got = gc.Session(graded, backend=backend).run(batch)
    mask = torch.from_numpy((got["output_1"] != 0) * 2.0)
    assert 0.3 < float(mask.mean()) / 2 < 0.7
    fc1, fc2 = (torch.nn.Linear(6, 16, dtype=torch.float64), torch.nn.Linear(16, 3, dtype=torch.float64))
    for name, layer in (("fc1", fc1), ("fc2", fc2)):
        layer.weight.data, layer.bias.data = (torch.from_numpy(np.array(model.params[f"{name}.{k}"]))
                                              for k in ("weight", "bias"))
    x, y = (torch.from_numpy(batch[k]) for k in ("x", "y"))
    out = fc2(torch.utils.checkpoint.checkpoint(lambda h: torch.tanh(fc1(h)) * mask, x, use_reentrant=False))
    torch.nn.functional.mse_loss(out, y).backward()
    for name, layer in (("fc1", fc1), ("fc2", fc2)):
        for k in ("weight", "bias"):
            np.testing.assert_allclose(got[f"{name}.{k}_grad"], getattr(layer, k).grad.numpy(), rtol=1e-10,
                                       atol=1e-13, err_msg=f"{name}.{k}")


class _Penalty(gc.nn.Module):
    """``sum(f(x)) + |d sum(f(x)) / dx|^2`` (a gradient penalty) with ``f`` a region or not."""

    def __init__(self, regions: bool):
        super().__init__()
        self.regions = regions
        self.fc1, self.fc2 = gc.nn.Linear(4, 8, **F64), gc.nn.Linear(8, 3, **F64)

    def forward(self, x):
        x = x * 1.0
        f = lambda h: self.fc2(gc.tanh(self.fc1(h)))  # noqa: E731
        y = checkpoint(f, x, use_reentrant=False) if self.regions else f(x)
        (g,) = gc.autograd.grad(y.sum(), x, create_graph=True)
        return y.sum() + (g * g).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_autograd_grad_in_model_code_reads_copies_and_training_differentiates_them(backend):
    models = {}
    for regions in (True, False):
        gc.manual_seed(0)
        models[regions] = _capture(_Penalty(regions), x=(5, 4))
    assert {n.op_type for n in _copies(models[True])} == {"Gemm", "Tanh"} and not _copies(models[False])
    x = RNG.normal(size=(5, 4))
    got, want = (gc.Session(gc.grad(models[r], "output"), backend=backend).run({"x": x}) for r in (True, False))
    fc1, fc2 = torch.nn.Linear(4, 8, dtype=torch.float64), torch.nn.Linear(8, 3, dtype=torch.float64)
    for name, layer in (("fc1", fc1), ("fc2", fc2)):
        layer.weight.data, layer.bias.data = (torch.from_numpy(np.array(models[True].params[f"{name}.{k}"]))
                                              for k in ("weight", "bias"))
    xt = torch.from_numpy(x).requires_grad_(True)
    y = torch.utils.checkpoint.checkpoint(lambda h: fc2(torch.tanh(fc1(h))), xt, use_reentrant=False)
    (g,) = torch.autograd.grad(y.sum(), xt, create_graph=True)
    (y.sum() + (g * g).sum()).backward()
    for name, layer in (("fc1", fc1), ("fc2", fc2)):
        for k in ("weight", "bias"):
            key = f"{name}.{k}_grad"
            np.testing.assert_allclose(got[key], getattr(layer, k).grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=key)
            np.testing.assert_allclose(got[key], want[key], rtol=1e-12, atol=1e-15, err_msg=key)


class _Steps(gc.nn.Module):
    """A tanh cell over ``T`` steps as ``kind`` (gc.scan, gc.fori_loop, a Python loop), each step's
    cell a region or not."""

    def __init__(self, kind: str, regions: bool):
        super().__init__()
        self.kind, self.regions = kind, regions
        self.fc1, self.fc2 = gc.nn.Linear(4, 8, **F64), gc.nn.Linear(8, 4, **F64)

    def cell(self, h, x):
        return gc.tanh(self.fc2(gc.tanh(self.fc1(h + x))))

    def step(self, h, x):
        return checkpoint(self.cell, h, x, use_reentrant=False) if self.regions else self.cell(h, x)

    def forward(self, xs):
        h = xs[0] * 0.0
        if self.kind == "scan":
            h = gc.scan(lambda c, x: (self.step(c, x), c), h, xs)[0]
        elif self.kind == "fori_loop":
            h = gc.fori_loop(0, T, lambda i, c: self.step(c, xs[i]), h)
        else:
            for i in range(T):
                h = self.step(h, xs[i])
        return (h * h).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["scan", "fori_loop"])
def test_a_region_in_an_unrolled_body_is_recomputed_per_step(kind, backend):
    graded = {}
    for regions in (True, False):
        gc.manual_seed(0)
        graded[regions] = _grad(_capture(_Steps(kind, regions), xs=(T, 3, 4)), "output")
    copies = _copies(graded[True])  # each step's Add, 2 Gemms, 2 Tanhs, from that step's inputs only
    assert len(copies) == 5 * T and not _copies(graded[False])
    xs = RNG.normal(size=(T, 3, 4))
    got, want = (gc.Session(graded[r], backend=backend).run({"xs": xs}) for r in (True, False))
    gc.manual_seed(0)
    unrolled = gc.Session(_grad(_capture(_Steps("python", True), xs=(T, 3, 4)), "output"), backend=backend)
    torch_like = unrolled.run({"xs": xs})
    for key, value in want.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-12, atol=1e-15, err_msg=key)
        np.testing.assert_allclose(torch_like[key], value, rtol=1e-12, atol=1e-15, err_msg=key)
    matches_torch_checkpoint(got, graded[True].params, xs)


def matches_torch_checkpoint(got: dict, params: dict, xs: np.ndarray) -> None:
    """``got``'s fc1 and fc2 gradients against torch's: ``torch.utils.checkpoint`` of ``_Steps``' tanh cell (of
    ``params``) over a Python loop of ``xs``' steps, the loss ``(h * h).sum()`` of the last h (1e-10)."""
    fc1, fc2 = torch.nn.Linear(4, 8, dtype=torch.float64), torch.nn.Linear(8, 4, dtype=torch.float64)
    for name, layer in (("fc1", fc1), ("fc2", fc2)):
        layer.weight.data, layer.bias.data = (torch.from_numpy(np.array(params[f"{name}.{k}"]))
                                              for k in ("weight", "bias"))
    h = torch.zeros(3, 4, dtype=torch.float64)
    for x in torch.from_numpy(xs):
        h = torch.utils.checkpoint.checkpoint(lambda c, v: torch.tanh(fc2(torch.tanh(fc1(c + v)))), h, x,
                                              use_reentrant=False)
    (h * h).sum().backward()
    for name, layer in (("fc1", fc1), ("fc2", fc2)):
        for k in ("weight", "bias"):
            key = f"{name}.{k}_grad"
            np.testing.assert_allclose(got[key], getattr(layer, k).grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=key)
