"""torch.nn.functional's remaining names against torch 2.13 (values and gradients, float32 and
float64, numpy and ort-cpu): ``F.embedding``'s ``padding_idx``, ``scale_grad_by_freq`` and
``sparse``, ``nn.Embedding``'s and ``Embedding.from_pretrained``; ``F.linear_cross_entropy``."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

R = np.random.default_rng(0)
WEIGHT = R.normal(size=(6, 3)) * 1.5
INDICES = np.array([[0, 2, 2, 4], [5, 2, 0, 4]])  # 2 three times, 0 and 4 twice
TOL = {"float64": {"rtol": 1e-12, "atol": 1e-15}, "float32": {"rtol": 1e-6, "atol": 1e-7}}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kw", [{"padding_idx": 2}, {"padding_idx": -2, "scale_grad_by_freq": True},
                                {"scale_grad_by_freq": True, "max_norm": 1.0, "padding_idx": 0},
                                {"sparse": True, "padding_idx": 4}, {"scale_grad_by_freq": True}])
def test_embedding_arguments_match_torch(dtype, kw):
    w0, c = WEIGHT.astype(dtype), R.standard_normal((2, 4, 3)).astype(dtype)
    w = torch.tensor(w0, requires_grad=True)
    want = torch.nn.functional.embedding(torch.from_numpy(INDICES), w, **kw)
    (want * torch.from_numpy(c)).sum().backward()
    grad = w.grad.to_dense().numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda F, w, i: F.embedding(i, w, **kw), {"w": w0}, {"i": INDICES}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), **TOL[dtype], err_msg=backend)
        np.testing.assert_allclose(got["w"], grad, **TOL[dtype], err_msg=backend)
    assert (w0[kw.get("padding_idx", 0)] != 0).all()  # the padding row's value is looked up, not zeros


def test_embedding_positional_arguments_are_torchs():
    """``F.embedding(i, w, 2)``: the third argument is ``padding_idx``, as torch's (it was ``max_norm``)."""
    c = R.standard_normal((2, 4, 3))
    got = gc_grads(lambda F, w, i: F.embedding(i, w, 2), {"w": WEIGHT}, {"i": INDICES}, c)
    np.testing.assert_array_equal(got["out"], WEIGHT[INDICES])
    assert not got["w"][2].any() and got["w"][0].any()


def test_embedding_refuses_a_padding_idx_outside_the_rows():
    with pytest.raises(gc.CaptureError, match=r"padding_idx=6 must be an int within num_embeddings \(weight rows: 6\)"):
        gc.capture(lambda i: gc.nn.functional.embedding(i, WEIGHT, padding_idx=6), i=INDICES)


class _Net(gc.nn.Module):
    def __init__(self, embedding):
        super().__init__()
        self.emb, self.fc = embedding, gc.nn.Linear(3, 1, dtype="float64")

    def forward(self, i):
        return self.fc(self.emb(i)).sum()


def _train(net: _Net, twin: torch.nn.Module, steps: int = 3):
    """SGD with weight decay on ``sum(fc(emb(i)))``, graphc against torch: losses and parameters."""
    arts = gc.training.generate(gc.capture(net, training=True, i=INDICES), "output",
                                gc.optim.SGD(0.125, weight_decay=0.5))
    trainer = gc.Trainer(arts, backend="numpy")  # ort-cpu's fused step reports another loss here: a separate bug
    opt = torch.optim.SGD([p for p in twin.parameters() if p.requires_grad], lr=0.125, weight_decay=0.5)
    for step in range(steps):
        indices = INDICES[:, ::-1] if step % 2 else INDICES
        loss = trainer.step({"i": indices.copy()})
        opt.zero_grad()
        want = twin(torch.from_numpy(indices.copy())).sum()
        want.backward()
        opt.step()
        np.testing.assert_allclose(loss, want.item(), rtol=1e-10, err_msg=f"step {step}")
    state = net.state_dict()
    for name, value in twin.state_dict().items():
        np.testing.assert_allclose(trainer.params.get(name, state[name]), value.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=name)
    return arts


def _twins(**kw):
    net = _Net(gc.nn.Embedding(6, 3, dtype="float64", **kw))
    net.emb.weight = gc.nn.Parameter(WEIGHT, dtype="float64")
    twin = torch.nn.Sequential()
    twin.emb = torch.nn.Embedding(6, 3, dtype=torch.float64, **kw)
    twin.fc = torch.nn.Linear(3, 1, dtype=torch.float64)
    state = net.state_dict()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return net, twin


@pytest.mark.parametrize("kw", [{"padding_idx": 2}, {"padding_idx": 0, "scale_grad_by_freq": True}])
def test_embedding_layer_trains_as_torchs(kw):
    """The padding row is read from the weight as it is now: weight decay shrinks it in torch, and
    the lookup sees that (it was read as the captured value, a constant)."""
    _train(*_twins(**kw))


def test_from_pretrained_frozen_is_not_trained():
    pre = WEIGHT * 0.5
    net = _Net(gc.nn.Embedding.from_pretrained(pre, padding_idx=1))
    twin = torch.nn.Sequential()
    twin.emb = torch.nn.Embedding.from_pretrained(torch.from_numpy(pre), padding_idx=1)
    twin.fc = torch.nn.Linear(3, 1, dtype=torch.float64)
    twin.fc.load_state_dict({k.removeprefix("fc."): torch.from_numpy(v) for k, v in net.state_dict().items()
                             if k.startswith("fc.")})
    arts = _train(net, twin)
    assert arts.manifest.frozen == ["emb.weight"] and net.emb.weight.dtype == "float64"
    trainable = gc.nn.Embedding.from_pretrained(pre.astype(np.float32), freeze=False)
    assert trainable.weight.requires_grad and trainable.weight.dtype == "float32"
    with pytest.raises(gc.CaptureError, match=r"from_pretrained embeddings: expected a 2-D array, got shape \[6\]"):
        gc.nn.Embedding.from_pretrained(np.ones(6))


LCE_CASES = {  # name: (input shape, weight shape, target maker, keyword arguments)
    "classes": ((5, 4), (7, 4), lambda r: r.integers(0, 7, 5), {}),
    "bias_weight_smoothing_sum": ((5, 4), (7, 4), lambda r: r.integers(0, 7, 5),
                                  {"linear_bias": True, "weight": True, "label_smoothing": 0.2, "reduction": "sum"}),
    "ignore_index_none": ((5, 4), (7, 4), lambda r: np.array([1, 3, 3, 0, 6]), {"ignore_index": 3,
                                                                                 "reduction": "none"}),
    "probabilities": ((5, 4), (7, 4), lambda r: r.dirichlet(np.ones(7), 5), {"linear_bias": True}),
    "unbatched": ((4,), (7, 4), lambda r: np.array(2), {"label_smoothing": 0.1}),
    "k_dimensional": ((5, 4), (7, 3, 4), lambda r: r.integers(0, 7, (5, 3)),
                      {"linear_bias": True, "weight": True, "ignore_index": 1}),
}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", list(LCE_CASES))
def test_linear_cross_entropy_matches_torch(case, dtype):
    x_shape, w_shape, make_target, kw = LCE_CASES[case]
    r = np.random.default_rng(len(case))
    x, w, target = r.normal(size=x_shape).astype(dtype), r.normal(size=w_shape).astype(dtype), make_target(r)
    target = target.astype(dtype) if target.dtype.kind == "f" else target
    params = {"x": x, "w": w, **({"b": r.normal(size=w_shape[:-1]).astype(dtype)} if kw.get("linear_bias") else {})}
    fixed = {k: v for k, v in kw.items() if k != "linear_bias" and k != "weight"}
    class_weight = r.uniform(0.5, 2, w_shape[0]).astype(dtype) if kw.get("weight") else None
    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    want = torch.nn.functional.linear_cross_entropy(
        leaves["x"], leaves["w"], torch.from_numpy(np.asarray(target)), linear_bias=leaves.get("b"),
        weight=None if class_weight is None else torch.from_numpy(class_weight), **fixed)
    c = r.standard_normal(tuple(want.shape)).astype(dtype)
    (want * torch.from_numpy(c)).sum().backward()

    def fn(F, x, w, *b, t):
        return F.linear_cross_entropy(x, w, t, linear_bias=b[0] if b else None, weight=class_weight, **fixed)

    tol = {"float64": {"rtol": 1e-11, "atol": 1e-13}, "float32": {"rtol": 2e-5, "atol": 1e-6}}[dtype]
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(fn, params, {"t": np.asarray(target)}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), **tol, err_msg=backend)
        for k, leaf in leaves.items():
            np.testing.assert_allclose(got[k], leaf.grad.numpy(), **tol, err_msg=f"{backend} {k}")


@pytest.mark.parametrize("args, message", [
    (((2, 3, 4), (7, 4), {}), r"expected input with dimensionality 1 or 2, got 3"),
    (((5, 4), (7,), {}), r"expected linear_weight with dimensionality at least 2, got 1"),
    (((5, 4), (7, 3), {}), r"expected equal input and linear_weight last dimensions \(in_features\), got 4 and 3"),
    (((5, 4), (7, 4), {"linear_bias": np.zeros(6)}), r"expected linear_bias shape \(7,\), got \(6,\)"),
    (((4,), (7, 2, 4), {}), r"K-dimensional loss .* requires batched input"),
])
def test_linear_cross_entropy_refuses_like_torch(args, message):
    x_shape, w_shape, kw = args
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(lambda x: gc.nn.functional.linear_cross_entropy(x, np.ones(w_shape), np.zeros(x_shape[:-1], np.int64),
                                                                   **kw), x=np.ones(x_shape))
