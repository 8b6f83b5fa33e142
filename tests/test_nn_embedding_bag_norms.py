"""EmbeddingBag / F.embedding_bag with ``max_norm`` (and ``norm_type``) and ``scale_grad_by_freq`` against torch
2.13 in float64 on numpy and ort-cpu: the bag of renormalised rows and the weight's gradient; trained, the weight
stepped from its renormalised value as torch's SGD steps it; each row's gradient divided by its count in the batch.

Torch's CPU kernel for ``embedding_bag(scale_grad_by_freq=True)`` divides a row's gradient by the count of another
row (``[[1, 2, 1]]``, sum: row 2's gradient 0.5, not 1; ``F.embedding``'s is 1), except where every index occurs
equally often; so the uneven cases are checked against torch's ``F.embedding(scale_grad_by_freq=True)`` reduced
into bags by torch, the even ones against ``F.embedding_bag`` itself."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(4)
WEIGHT = RNG.normal(size=(8, 3)) * 1.5  # row norms about 0.5 to 4: some over max_norm, some not
BAGS = np.array([[1, 2, 1, 5], [0, 3, 3, 1], [6, 6, 6, 2]])
FLAT = np.array([4, 1, 0, 1, 1, 2, 7, 4])
OFFSETS = np.array([0, 3, 3, 6])  # bags [0:3], [3:3] (empty), [3:6], [6:8]
EVEN = np.array([[1, 2, 5, 3], [3, 5, 1, 2]])  # each index twice: torch's kernel divides right

# (id, input, offsets, keyword arguments)
NORM_CASES = [
    ("2d-mean", BAGS, None, {"max_norm": 1.5}),
    ("2d-sum-l1-padding", BAGS, None, {"max_norm": 2.0, "norm_type": 1.0, "mode": "sum", "padding_idx": 3}),
    ("2d-max-l3", BAGS, None, {"max_norm": 1.0, "norm_type": 3.0, "mode": "max"}),
    ("1d-mean-padding", FLAT, OFFSETS, {"max_norm": 1.2, "padding_idx": 1}),
    ("1d-sum", FLAT, OFFSETS, {"max_norm": 1.2, "mode": "sum"}),
    ("2d-even-sum-freq", EVEN, None, {"max_norm": 1.2, "mode": "sum", "scale_grad_by_freq": True}),
]


def _torch_bag(idx, offsets, kwargs, c):
    """torch's F.embedding_bag on a fresh float64 copy of WEIGHT: the output, the weight's gradient of
    ``sum(out * c)`` and the weight after the call (renormalised in place)."""
    w = torch.tensor(WEIGHT, requires_grad=True)
    out = torch.nn.functional.embedding_bag(torch.from_numpy(idx), w, None if offsets is None else
                                            torch.from_numpy(offsets), **kwargs)
    (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), w.grad.numpy(), w.detach().numpy()


def _gc_bag(idx, offsets, kwargs, c, backend):
    return gc_grads(lambda F, w, i: F.embedding_bag(i, w, offsets, **kwargs), {"w": WEIGHT}, {"i": idx}, c,
                    backend=backend)


@pytest.mark.parametrize("name,idx,offsets,kwargs", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_max_norm_bags_and_gradients_match_torch(name, idx, offsets, kwargs):
    c = RNG.standard_normal((len(idx) if idx.ndim == 2 else len(offsets), 3))
    want, dw, renormed = _torch_bag(idx, offsets, kwargs, c)
    assert not np.allclose(renormed, WEIGHT)  # torch renormalised rows in place: the case bites
    for backend in ("numpy", "ort-cpu"):
        got = _gc_bag(idx, offsets, kwargs, c, backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-12, atol=1e-15, err_msg=backend)
        np.testing.assert_allclose(got["w"], dw, rtol=1e-12, atol=1e-15, err_msg=f"{backend} weight")


def _torch_freq_oracle(idx, offsets, mode, c):
    """The weight's gradient of ``sum(bags * c)`` with bags made from torch's F.embedding(scale_grad_by_freq)."""
    w = torch.tensor(WEIGHT, requires_grad=True)
    rows = torch.nn.functional.embedding(torch.from_numpy(idx), w, scale_grad_by_freq=True)
    if idx.ndim == 2:
        bags = list(rows)
    else:
        ends = [*offsets[1:], len(idx)]
        bags = [rows[s:e] for s, e in zip(offsets, ends)]
    out = torch.stack([b.sum(0) if mode == "sum" else b.sum(0) / max(len(b), 1) for b in bags])
    (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), w.grad.numpy()


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("idx,offsets", [(BAGS, None), (FLAT, OFFSETS)], ids=["2d", "1d"])
def test_scale_grad_by_freq_divides_each_rows_gradient_by_its_count(mode, idx, offsets):
    c = RNG.standard_normal((3 if idx.ndim == 2 else len(offsets), 3))
    want, dw = _torch_freq_oracle(idx, offsets, mode, c)
    plain = _gc_bag(idx, offsets, {"mode": mode}, c, "numpy")["w"]
    assert not np.allclose(plain, dw)  # the scaling changes the gradient here
    for backend in ("numpy", "ort-cpu"):
        got = _gc_bag(idx, offsets, {"mode": mode, "scale_grad_by_freq": True}, c, backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-12, atol=1e-15, err_msg=backend)
        np.testing.assert_allclose(got["w"], dw, rtol=1e-12, atol=1e-15, err_msg=f"{backend} weight")


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_scale_grad_by_freq_matches_torchs_embedding_bag_where_its_kernel_is_right(mode):
    psw = RNG.standard_normal(EVEN.shape) if mode == "sum" else None
    c = RNG.standard_normal((2, 3))
    kwargs = {"mode": mode, "scale_grad_by_freq": True, "per_sample_weights": psw}
    want, dw, _ = _torch_bag(EVEN, None, {**kwargs, "per_sample_weights": None if psw is None else
                                          torch.from_numpy(psw)}, c)
    for backend in ("numpy", "ort-cpu"):
        got = _gc_bag(EVEN, None, kwargs, c, backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["w"], dw, rtol=1e-12, err_msg=f"{backend} weight")


def _bag(ns, dtype, freq=False):
    return ns.EmbeddingBag(8, 3, max_norm=1.0, norm_type=3.0, scale_grad_by_freq=freq, mode="sum", dtype=dtype)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_training_steps_the_renormalised_weight_as_torch(backend):
    """A module's in-place renorm persists, as Embedding's: SGD steps from the renormalised rows."""
    net = nn.Sequential(_bag(nn, "float64"), nn.Linear(3, 2, dtype="float64"))
    net.load_state_dict({"0.weight": WEIGHT, "1.weight": RNG.normal(size=(2, 3)), "1.bias": np.zeros(2)})
    twin = torch.nn.Sequential(_bag(torch.nn, torch.float64), torch.nn.Linear(3, 2, dtype=torch.float64))
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()}, strict=True)
    model = gc.capture(net, training=True, i=gc.spec("int64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))
    assert arts.manifest.renormed == ["0.weight"]
    trainer, opt = gc.Trainer(arts, backend=backend), torch.optim.SGD(twin.parameters(), lr=0.1)
    rng = np.random.default_rng(1)
    for step in range(4):
        batch = {"i": rng.integers(0, 8, (3, 4)), "y": rng.normal(size=(3, 2))}
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["i"])), torch.from_numpy(batch["y"]))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step(batch), loss.item(), rtol=1e-12, err_msg=f"step {step}")
    for name, value in twin.state_dict().items():
        np.testing.assert_allclose(trainer.state_dict()[name], value.numpy(), rtol=1e-12, atol=1e-15, err_msg=name)


def test_module_repr_and_max_mode_refusal_are_torchs():
    assert repr(_bag(nn, "float32", True)) == repr(_bag(torch.nn, torch.float32, True))
    with pytest.raises(gc.GraphError, match=r"embedding_bag.*mode='max' does not support scale_grad_by_freq"):
        gc.capture(lambda w: gc.nn.functional.embedding_bag(BAGS, w, mode="max", scale_grad_by_freq=True), w=WEIGHT)
    with pytest.raises(ValueError, match="max mode does not support scaling the gradient"):
        torch.nn.functional.embedding_bag(torch.from_numpy(BAGS), torch.tensor(WEIGHT), mode="max",
                                          scale_grad_by_freq=True)
