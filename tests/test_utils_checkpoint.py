"""gc.utils.checkpoint / checkpoint_sequential: regions whose activations the training graphs'
backward recomputes.

Oracles: torch 2.13's torch.utils.checkpoint on the same float64 MLP (gradients, and SGD steps
with momentum on numpy and ort-cpu), the same graphc model without regions (Dropout's masks:
the same noise must give the same numbers), and the train_step graph itself (which nodes are
copies, which values they read)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.model import CHECKPOINT_KEY
from graphc.passes.training.recompute import CHEAP
from graphc.utils.checkpoint import checkpoint, checkpoint_sequential

torch = pytest.importorskip("torch")

F64 = {"dtype": "float64"}
RNG = np.random.default_rng(0)
MODES = ("none", "sequential", "nested", "reentrant")


def _run(mode: str, layers: list, x, ck, ck_seq):
    """The body in ``layers`` applied to ``x`` as ``mode`` marks it (the same code for graphc and torch)."""
    def seq(part):
        def f(h):
            for layer in part:
                h = layer(h)
            return h
        return f

    if mode == "none":
        return seq(layers)(x)
    if mode == "sequential":  # 3 regions of 2 layers, the last 2 plain
        return ck_seq(layers, 4, x, use_reentrant=False)
    if mode == "nested":  # a region holding a region, then a plain tail
        outer = lambda h: seq(layers[2:4])(ck(seq(layers[:2]), h, use_reentrant=False))  # noqa: E731
        return seq(layers[4:])(ck(outer, x, use_reentrant=False))
    # torch's reentrant variant gives no gradient to a region's params when no input of it needs one
    # (it warns); graphc's are the non-reentrant ones, so the region starts after a Linear here
    return ck(seq(layers[2:]), seq(layers[:2])(x), use_reentrant=True)


class _Net(gc.nn.Module):
    def __init__(self, mode: str, p: float = 0.0):
        super().__init__()
        self.mode = mode
        self.body = gc.nn.Sequential(gc.nn.Linear(6, 16, **F64), gc.nn.Tanh(), gc.nn.Linear(16, 16, **F64),
                                     gc.nn.Dropout(p) if p else gc.nn.Tanh(), gc.nn.Linear(16, 16, **F64),
                                     gc.nn.ReLU(), gc.nn.Linear(16, 16, **F64), gc.nn.Tanh())
        self.head = gc.nn.Linear(16, 3, **F64)

    def forward(self, x):
        return self.head(_run(self.mode, list(self.body.children()), x, checkpoint, checkpoint_sequential))


class _Twin(torch.nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        f64 = {"dtype": torch.float64}
        self.mode = mode
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16, **f64), torch.nn.Tanh(), torch.nn.Linear(16, 16, **f64),
                                        torch.nn.Tanh(), torch.nn.Linear(16, 16, **f64), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 16, **f64), torch.nn.Tanh())
        self.head = torch.nn.Linear(16, 3, **f64)

    def forward(self, x):
        c = torch.utils.checkpoint
        return self.head(_run(self.mode, list(self.body.children()), x, c.checkpoint, c.checkpoint_sequential))


def _artifacts(net, optimizer=None):
    net.train()
    model = gc.capture(net, x=gc.spec("float64", ("N", 6)))
    return model, gc.training.generate(model, gc.losses.mse("output", label="y"),
                                       optimizer or gc.optim.SGD(0.1, momentum=0.9))


def _batches(n: int = 3):
    return [{"x": RNG.normal(size=(5, 6)), "y": RNG.normal(size=(5, 3))} for _ in range(n)]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("mode", MODES[1:])
def test_gradients_and_steps_equal_torch_and_the_plain_model(mode, backend):
    gc.manual_seed(0)
    net = _Net(mode)
    _, arts = _artifacts(net)
    plain = _artifacts(_Net("none"))[1]
    assert arts.manifest.recompute and not plain.manifest.recompute
    assert [n for n in arts.train_step.proto.graph.node if n.name.startswith("recompute/")]
    twin = _Twin(mode)
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    batches = _batches()
    grads = gc.Session(arts.gradients, backend=backend).run(batches[0])
    x, y = (torch.from_numpy(batches[0][k]) for k in ("x", "y"))
    torch.nn.functional.mse_loss(twin(x), y).backward()
    for name, p in twin.named_parameters():
        np.testing.assert_allclose(grads[f"{name}_grad"], p.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
    twin.zero_grad()

    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    torch_losses = []
    for b in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(twin(torch.from_numpy(b["x"])), torch.from_numpy(b["y"]))
        loss.backward()
        opt.step()
        torch_losses.append(loss.item())
    runs = {}
    for key, a in (("regions", arts), ("plain", plain)):
        trainer = gc.Trainer(a, backend=backend)
        runs[key] = ([trainer.step(b) for b in batches], trainer.state_dict())
    np.testing.assert_allclose(runs["regions"][0], torch_losses, rtol=1e-10)
    np.testing.assert_allclose(runs["regions"][0], runs["plain"][0], rtol=1e-12)
    for name, p in twin.state_dict().items():
        np.testing.assert_allclose(runs["regions"][1][name], p.numpy(), rtol=1e-10, atol=1e-13, err_msg=name)
        np.testing.assert_allclose(runs["regions"][1][name], runs["plain"][1][name], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_dropout_in_a_region_recomputes_the_forward_mask(backend):
    runs, batches = [], _batches(4)
    for mode in ("sequential", "none"):
        gc.manual_seed(0)
        _, arts = _artifacts(_Net(mode, p=0.4), gc.optim.Adam(1e-2))
        trainer = gc.Trainer(arts, backend=backend, seed=7)
        runs.append(([trainer.step(b) for b in batches], trainer.state_dict()))
        if mode == "sequential":  # the mask's copy reads the step's noise input, as the forward's compare does
            nodes = arts.train_step.proto.graph.node
            masks = [n for n in nodes if n.op_type == "GreaterOrEqual"]
            assert {n.name.startswith("recompute/") for n in masks} == {True, False}
            assert len({n.input[0] for n in masks}) == 1 and masks[0].input[0].startswith("dropout_noise.")
    rtol = 0 if backend == "numpy" else 1e-12
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=rtol)
    for name, value in runs[1][1].items():
        np.testing.assert_allclose(runs[0][1][name], value, rtol=rtol, atol=1e-15, err_msg=name)


def test_regions_nested_in_one_sequential_apart_and_copies_stay_in_their_region():
    regions = {}
    for mode in ("nested", "sequential"):
        model, arts = _artifacts(_Net(mode))
        marks = [n.metadata_props.get(CHECKPOINT_KEY) for n in model.ir.graph]
        regions[mode] = {m for m in marks if m is not None}
        assert marks[-1] is None  # the head's Gemm is outside
        nodes = arts.train_step.proto.graph.node
        made_by = {o: n for n in nodes for o in n.output}
        region = {n.name: {p.key: p.value for p in n.metadata_props}.get(CHECKPOINT_KEY) for n in nodes}
        for n in nodes:
            if n.name.startswith("recompute/"):  # a copy reads copies of its own region only
                read = [made_by[i] for i in n.input if i in made_by and made_by[i].name.startswith("recompute/")]
                assert all(region[r.name] == region[n.name] for r in read), n.name
        copied = {n.op_type for n in nodes if n.name.startswith("recompute/")}
        assert "Gemm" in copied  # expensive ops are recomputed too (recompute=True keeps them)
    assert len(regions["nested"]) == 1 and len(regions["sequential"]) == 3


def test_recompute_true_keeps_its_meaning_beside_regions():
    def copied(mode, recompute):
        arts = gc.training.generate(gc.capture(_Net(mode).train(), x=gc.spec("float64", ("N", 6))),
                                    gc.losses.mse("output", label="y"), gc.optim.SGD(0.1), recompute=recompute)
        return {n.op_type for n in arts.train_step.proto.graph.node if n.name.startswith("recompute/")}

    everywhere = copied("none", True)
    assert everywhere and everywhere <= CHEAP  # the whole graph's cheap values, the expensive ones kept
    assert "Gemm" in copied("nested", False) and copied("nested", True) == everywhere | copied("nested", False)


def test_outside_a_capture_the_function_just_runs():
    x = gc.ones(2, 3)
    np.testing.assert_array_equal(np.asarray(checkpoint(lambda t: t * 2, x, use_reentrant=False)), 2 * np.ones((2, 3)))
    layers = [lambda t: t + 1, lambda t: t * 3, lambda t: t - 1]
    np.testing.assert_array_equal(np.asarray(checkpoint_sequential(layers, 2, x, use_reentrant=False)),
                                  5 * np.ones((2, 3)))


@pytest.mark.parametrize(("call", "match"), [
    (lambda: checkpoint(lambda t, s: t * s, 1.0, s=2.0, use_reentrant=True), "s for the function need use_reentrant"),
    (lambda: checkpoint(lambda t: t, 1.0, context_fn=lambda: None), "context_fn"),
    (lambda: checkpoint(lambda t: t, 1.0, debug=True), "debug=True"),
    (lambda: checkpoint(lambda t: t, 1.0, determinism_check="strict"), "determinism_check must be one of"),
    (lambda: checkpoint_sequential([abs], 2, 1.0), r"segments must be an int from 1 to the 1 functions, got 2"),
    (lambda: checkpoint_sequential([abs], 1, 1.0, mode="x"), "unexpected keyword arguments mode"),
])
def test_bad_arguments_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_gc_utils_is_torch_utils_checkpoint_by_name():
    assert gc.utils.checkpoint.checkpoint is checkpoint
    assert gc.utils.checkpoint.checkpoint_sequential is checkpoint_sequential
    assert gc.checkpoint.__name__ == "graphc.runtime.checkpoint"  # gc.checkpoint (training checkpoints) stays
