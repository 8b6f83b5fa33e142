"""``gc.autograd.Function`` with ``gc.utils.checkpoint`` regions, accumulation, clipping, resume and Triton
deploys; checked against torch 2.13 (float64, numpy and ort-cpu)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from graphc.utils.checkpoint import checkpoint

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
MODES = ("plain", "function_in_region", "region_in_function")


def _functions(base, lib):
    class HalfExp(base):  # a backward that is not the forward's: half the true gradient
        @staticmethod
        def forward(ctx, x):
            y = lib.exp(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return 0.5 * g * y

    class TanhInRegion(base):  # a region inside the forward
        @staticmethod
        def forward(ctx, x, ck):
            y = ck(lambda t: lib.tanh(t) * 2.0, x, use_reentrant=False)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return g * (1.0 - y), None

    return HalfExp, TanhInRegion


GC_FNS = _functions(gc.autograd.Function, gc)
TORCH_FNS = _functions(torch.autograd.Function, torch)


def _forward(lib, fns, ck, m, x, mode):
    """fc1 and fc2 reach the loss only through a Function's output: their gradients are its backward's."""
    h = lib.tanh(m.fc1(x))
    if mode == "region_in_function":
        h = fns[1].apply(m.fc2(h), ck)
    else:
        f = lambda t: lib.tanh(fns[0].apply(m.fc2(t) * 0.3))  # noqa: E731
        h = f(h) if mode == "plain" else ck(f, h, use_reentrant=False)
    return m.head(h)


class _Net(gc.nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.fc1, self.fc2 = gc.nn.Linear(6, 16, dtype="float64"), gc.nn.Linear(16, 16, dtype="float64")
        self.head = gc.nn.Linear(16, 3, dtype="float64")

    def forward(self, x):
        return _forward(gc, GC_FNS, checkpoint, self, x, self.mode)


class _Twin(torch.nn.Module):
    def __init__(self, mode, net):
        super().__init__()
        self.mode = mode
        self.fc1, self.fc2 = torch.nn.Linear(6, 16, dtype=torch.float64), torch.nn.Linear(16, 16, dtype=torch.float64)
        self.head = torch.nn.Linear(16, 3, dtype=torch.float64)
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})

    def forward(self, x):
        return _forward(torch, TORCH_FNS, torch.utils.checkpoint.checkpoint, self, x, self.mode)


def _setup(mode, optimizer):
    gc.manual_seed(0)
    net = _Net(mode).train()
    model = gc.capture(net, x=gc.spec("float64", ("N", 6)))
    return _Twin(mode, net), gc.training.generate(model, gc.losses.mse("output", label="y"), optimizer)


def _batches(n):
    return [{"x": RNG.normal(size=(4, 6)), "y": RNG.normal(size=(4, 3))} for _ in range(n)]


def _torch_steps(twin, batches, accumulate=1, max_norm=None):
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for i in range(0, len(batches), accumulate):
        opt.zero_grad()
        for b in batches[i:i + accumulate]:
            loss = torch.nn.functional.mse_loss(twin(torch.from_numpy(b["x"])), torch.from_numpy(b["y"]))
            (loss / accumulate).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(twin.parameters(), max_norm)
        opt.step()


def _assert_params(params, twin):
    for name, p in twin.state_dict().items():
        np.testing.assert_allclose(params[name], p.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("mode", MODES)
def test_params_reached_only_through_a_function_train_as_torch(mode, backend):
    """They were left out of training (manifest.frozen, no step): the param selection did not see through
    a Function's outputs to the arguments its backward gives gradients."""
    twin, arts = _setup(mode, gc.optim.SGD(0.1, momentum=0.9))
    assert set(arts.manifest.trainable) == {n for n, _ in twin.named_parameters()}
    assert arts.manifest.recompute == (mode != "plain")
    batches = _batches(3)
    trainer = gc.Trainer(arts, backend=backend)
    for b in batches:
        trainer.step(b)
    _torch_steps(twin, batches)
    _assert_params(trainer.params, twin)


def test_accumulate_and_clipping_resume_exactly(tmp_path):
    twin, arts = _setup("function_in_region", gc.optim.SGD(0.1, momentum=0.9, max_grad_norm=0.5))
    arts.save(tmp_path / "art")
    batches = _batches(6)
    steps = [{k: np.concatenate([a[k], b[k]]) for k in a} for a, b in zip(batches[::2], batches[1::2])]
    whole = gc.Trainer(tmp_path / "art", backend="ort-cpu", accumulate=2)
    first = gc.Trainer(tmp_path / "art", backend="ort-cpu", accumulate=2)
    whole.step(steps[0])
    first.step(steps[0])
    first.save_checkpoint(tmp_path / "ck.safetensors")
    resumed = gc.Trainer(tmp_path / "art", backend="ort-cpu", accumulate=2)
    resumed.load_checkpoint(tmp_path / "ck.safetensors")
    for b in steps[1:]:
        whole.step(b)
        resumed.step(b)
    _torch_steps(twin, batches, accumulate=2, max_norm=0.5)
    _assert_params(whole.params, twin)
    for name, value in whole.params.items():
        np.testing.assert_array_equal(resumed.params[name], value, err_msg=name)


@pytest.mark.parametrize("opset", [None, 21])
def test_triton_deploy_drops_the_backwards(tmp_path, opset):
    """At the model's opset (no conversion) the file shipped the graphc.autograd functions; at any opset
    it kept the domain's import."""
    gc.manual_seed(0)
    model = gc.capture(_Net("function_in_region"), x=gc.spec("float64", ("N", 6)))
    assert model.opset == 21 and {f.domain for f in model.proto.functions} == {"graphc.autograd"}
    path = gc.deploy.triton(model, tmp_path / "repo", "net", opset=opset) / "1" / "model.onnx"
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert not proto.functions and {o.domain for o in proto.opset_import} == {""}
    assert {f.domain for f in model.proto.functions} == {"graphc.autograd"}  # the caller's model is unchanged
    x = RNG.normal(size=(5, 6))
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, gc.Session(model, backend="numpy").run({"x": x})["output"], rtol=1e-12)


@pytest.mark.parametrize("body", ["cond", "scan", "while_loop", "vmap"])
def test_a_region_inside_a_body_does_not_warn(body):
    """A region in a body is recomputed (unrolled steps, reverse mode's backward loop, vmap's batched
    ops): nothing to warn of; test_checkpoint_reverse_mode checks its gradients."""
    region = lambda v: checkpoint(lambda t: gc.tanh(t) * 2.0, v, use_reentrant=False)  # noqa: E731

    def f(x):
        if body == "cond":
            return gc.cond(x.sum() > 0, region, lambda v: v * 1.0, x).sum()
        if body == "vmap":
            return gc.vmap(region)(x).sum()
        if body == "while_loop":
            return gc.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, region(h)), (gc.tensor(0), x))[1].sum()
        return gc.scan(lambda c, row: (c + region(row), c), x[0] * 0.0, x)[0].sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.grad(gc.capture(f, x=gc.spec("float64", (2, 3))), "output", wrt=["x"])


_SPREAD = np.linspace(0.5, 1.5, 8)


def _squares(base, lib, ck):
    """x * x, whose backward's region widens each value 8 times (values the backward's own gradient reads)."""
    class Square(base):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            f = lambda t, u: lib.tanh(lib.tanh((t * u).unsqueeze(-1) * lib.tensor(_SPREAD)) * 3.0).sum(-1) * u  # noqa: E731
            return f(g, x) if ck is None else ck(f, g, x, use_reentrant=False)

    return Square


class _Penalty(gc.nn.Module):
    """A gradient penalty (create_graph=True): the loss's gradient differentiates the Functions' backwards."""

    def __init__(self, regions):
        super().__init__()
        self.square = _squares(gc.autograd.Function, gc, checkpoint if regions else None)
        self.fcs = gc.nn.ModuleList([gc.nn.Linear(64, 64, dtype="float64") for _ in range(4)])

    def forward(self, x):
        h = x
        for fc in self.fcs:
            h = self.square.apply(fc(h))
        (g,) = gc.autograd.grad(h.sum(), [x], create_graph=True)
        return (g * g).sum()


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_region_inside_a_functions_backward_is_recomputed_where_that_backward_is_differentiated(backend):
    """As torch's: the gradient penalty's gradient recomputes the region's values from its inputs (graph-order
    peak of live tensors 1.66 -> 0.92 MB) and equals the region-free model's and torch.utils.checkpoint's.
    Captured, it warned that the region was kept."""
    from graphc.backends.value_sized import ShapePrepass

    x = RNG.normal(size=(32, 64))
    got, peak = {}, {}
    for regions in (False, True):
        gc.manual_seed(0)
        net = _Penalty(regions)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = gc.grad(gc.capture(net, x=gc.spec("float64", (32, 64))), "output")
        copies = sum(n.name.startswith("recompute/") for n in model.proto.graph.node)
        assert (copies > 0) == regions
        got[regions] = gc.Session(model, backend=backend).run({"x": x})
        peak[regions] = ShapePrepass(model.proto)._infer({"x": x}).peak[0]
    assert peak[True] < 0.6 * peak[False], peak
    for name, want in got[False].items():
        np.testing.assert_allclose(got[True][name], want, rtol=1e-12, atol=1e-14, err_msg=name)
    fcs = [torch.nn.Linear(64, 64, dtype=torch.float64) for _ in range(4)]
    for i, fc in enumerate(fcs):
        fc.load_state_dict({k: torch.from_numpy(np.array(net.state_dict()[f"fcs.{i}.{k}"])) for k in ("weight", "bias")})
    square = _squares(torch.autograd.Function, torch, torch.utils.checkpoint.checkpoint)
    h = inputs = torch.tensor(x, requires_grad=True)
    for fc in fcs:
        h = square.apply(fc(h))
    (g,) = torch.autograd.grad(h.sum(), [inputs], create_graph=True)
    loss = (g * g).sum()
    loss.backward()
    np.testing.assert_allclose(got[True]["output"], loss.item(), rtol=1e-10)
    for i, fc in enumerate(fcs):
        for k in ("weight", "bias"):
            np.testing.assert_allclose(got[True][f"fcs.{i}.{k}_grad"], getattr(fc, k).grad.numpy(), rtol=1e-10,
                                       atol=1e-12, err_msg=f"fcs.{i}.{k}")
