"""Frozen parameters train as torch 2.13's: the set trained and AdamW steps (float64, numpy and ort-cpu, 1e-12)
for every way a parameter is frozen or made by a module or utility (``Embedding``/``EmbeddingBag.from_pretrained``,
``_freeze``, a frozen weight's parametrization, a fused bias-less layer) and for reads that only stop the gradient
(``no_grad`` blocks, ``.detach()``)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
EMBEDDINGS = np.random.default_rng(1).standard_normal((10, 4))
IDX = np.array([[1, 2, 2, 7, 0], [3, 9, 1, 1, 4]])


def _train_alike(theirs, ours, feeds: dict, steps: int = 2) -> None:
    """``ours`` (a gc.nn module, ``theirs``' state loaded) and ``theirs`` (torch) trained ``steps`` AdamW steps on
    their ``"loss"`` output: the same parameters trained, losses and every parameter within 1e-12."""
    flags = {name: p.requires_grad for name, p in theirs.named_parameters()}
    assert {name: p.requires_grad for name, p in ours.named_parameters()} == flags
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    arts = gc.training.generate(gc.capture(ours, training=True, **feeds), "loss",
                                gc.optim.AdamW(lr=0.05, weight_decay=0.1))
    opt = torch.optim.AdamW([p for p in theirs.parameters() if p.requires_grad], lr=0.05, weight_decay=0.1)
    losses = []
    for step in range(steps):
        if step == 1:  # what torch trains: the parameters that got a gradient
            assert sorted(arts.manifest.trainable) == sorted(n for n, p in theirs.named_parameters()
                                                             if p.grad is not None)
        opt.zero_grad()
        loss = theirs(**{k: torch.tensor(v) for k, v in feeds.items()})["loss"]
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for backend in BACKENDS:
        trainer = gc.Trainer(arts, backend=backend)
        got = [trainer.step(dict(feeds)) for _ in range(steps)]
        np.testing.assert_allclose(got, losses, rtol=1e-12, err_msg=backend)
        state = ours.state_dict()
        for name, value in theirs.state_dict().items():
            np.testing.assert_allclose(trainer.params.get(name, state[name]), value.numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{backend} {name}")


class _TiedHead:
    """``emb`` looked up, projected, and tied to the output layer (``h @ emb.weight.T``)."""

    def __new__(cls, nn, emb):
        class Tied(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb, self.proj = emb, nn.Linear(4, 4).double()

            def forward(self, idx):
                h = self.emb(idx)
                h = self.proj(h).tanh()
                return {"loss": ((h @ self.emb.weight.T) ** 2).mean()}
        return Tied()


def _embedding(nn, make: str):
    w, f64 = (torch.tensor(EMBEDDINGS), torch.float64) if nn is torch.nn else (EMBEDDINGS, "float64")
    if make == "from_pretrained":
        return nn.Embedding.from_pretrained(w)
    if make == "from_pretrained_unfrozen":
        return nn.Embedding.from_pretrained(w, freeze=False)
    if make == "from_pretrained_then_requires_grad":
        emb = nn.Embedding.from_pretrained(w)
        emb.weight.requires_grad_(True)
        return emb
    if make == "_freeze":
        return nn.Embedding(10, 4, _weight=w, _freeze=True, dtype=f64)
    if make == "module_requires_grad":
        return nn.Embedding(10, 4, _weight=w, dtype=f64).requires_grad_(False)
    return nn.EmbeddingBag.from_pretrained(w, mode="sum")  # EmbeddingBag: idx [B, L] -> [B, 4]


@pytest.mark.parametrize("make", ["from_pretrained", "from_pretrained_unfrozen", "from_pretrained_then_requires_grad",
                                  "_freeze", "module_requires_grad", "bag_from_pretrained"])
def test_a_frozen_embedding_tied_to_the_head_is_not_trained_as_torchs(make):
    """The tied read ``h @ emb.weight.T`` (not only the lookup) gets no gradient when the weight is frozen: a
    ``from_pretrained(freeze=True)`` weight was detached in forward only, so AdamW moved it through the head."""
    theirs, ours = _TiedHead(torch.nn, _embedding(torch.nn, make)), _TiedHead(gc.nn, _embedding(gc.nn, make))
    assert theirs.emb.weight.dtype == torch.float64 and ours.emb.weight.dtype == "float64"
    _train_alike(theirs, ours, {"idx": IDX})


def test_from_pretrained_takes_a_parameter_or_tensor_keeping_its_dtype_and_refuses_other_shapes():
    frozen = gc.nn.Parameter(EMBEDDINGS, requires_grad=False, dtype="float64")
    emb = gc.nn.Embedding(10, 4, _weight=frozen)  # torch: a new Parameter of the value, trained
    assert emb.weight.requires_grad and emb.weight.dtype == "float64"
    np.testing.assert_array_equal(emb.weight.numpy(), EMBEDDINGS)
    bag = gc.nn.EmbeddingBag.from_pretrained(gc.tensor(EMBEDDINGS.astype(np.float32)), freeze=False)
    assert bag.weight.requires_grad and bag.weight.dtype == "float32"
    np.testing.assert_array_equal(np.asarray(bag.weight), EMBEDDINGS.astype(np.float32))
    with pytest.raises(gc.CaptureError, match=r"EmbeddingBag.from_pretrained embeddings: expected a 2-D array, "
                                              r"got shape \[10\]"):
        gc.nn.EmbeddingBag.from_pretrained(np.ones(10))
    with pytest.raises(gc.CaptureError, match=r"EmbeddingBag _weight: expected shape \[10, 3\] "
                                              r"\(\[num_embeddings, embedding_dim\]\), got \[10, 4\]"):
        gc.nn.EmbeddingBag(10, 3, _weight=EMBEDDINGS)


class _Head:
    """``layer`` on ``x``, then a trained ``Linear(4, 1)``, under a squared loss."""

    def __new__(cls, nn, layer):
        class Head(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer, self.out = layer, nn.Linear(4, 1).double()

            def forward(self, x):
                return {"loss": (self.out(self.layer(x).tanh()) ** 2).sum()}
        return Head()


def _frozen_weight_norm(nn):
    lin = nn.Linear(3, 4).double()
    lin.weight.requires_grad_(False)
    return nn.utils.parametrizations.weight_norm(lin)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("frozen", [False, True])
def test_fused_linear_and_batchnorm_train_the_parameters_torchs_do(bias, frozen):
    """torch's fused weight keeps the Linear weight's ``requires_grad``; its bias the Linear bias's, and a
    Linear without one gets a bias made like the running mean: not trained."""
    pair = {}
    for nn in (torch.nn, gc.nn):
        lin, bn = nn.Linear(3, 4, bias=bias).double(), nn.BatchNorm1d(4).double()
        if nn is gc.nn:
            lin.load_state_dict({k: v.numpy() for k, v in pair[torch.nn][0].state_dict().items()})
            bn.load_state_dict({k: v.numpy() for k, v in pair[torch.nn][1].state_dict().items()})
        else:
            bn.running_mean.copy_(torch.tensor(RNG.standard_normal(4)))
            bn.running_var.copy_(torch.tensor(RNG.uniform(0.5, 2, 4)))
        lin.weight.requires_grad_(not frozen)
        pair[nn] = lin, bn
    theirs, ours = (_Head(nn, nn.utils.fuse_linear_bn_eval(*(m.eval() for m in pair[nn]))) for nn in pair)
    _train_alike(theirs, ours, {"x": RNG.standard_normal((5, 3))})


class _StoppedReads:
    """A weight read three ways: plainly, in a ``no_grad`` block and through ``.detach()``."""

    def __new__(cls, nn, lib):
        class Stopped(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(3, 3).double(), nn.Linear(3, 3).double()

            def forward(self, x):
                with lib.no_grad():
                    scale = (self.a.weight ** 2).sum() + self.b(x).sum()
                h = self.a(x) * scale + x @ self.b.weight.detach() + self.b(x)
                return {"loss": (h.tanh() ** 2).sum()}
        return Stopped()


def test_a_weight_read_in_no_grad_or_detached_still_trains_through_its_other_reads():
    _train_alike(_StoppedReads(torch.nn, torch), _StoppedReads(gc.nn, gc), {"x": RNG.standard_normal((5, 3))})


def test_a_frozen_weights_parametrization_is_frozen_as_torchs():
    """torch's ``parametrizations.weight_norm`` keeps the weight's ``requires_grad`` on ``original0``/``original1``
    (they were trained)."""
    _train_alike(_Head(torch.nn, _frozen_weight_norm(torch.nn)), _Head(gc.nn, _frozen_weight_norm(gc.nn)),
                 {"x": RNG.standard_normal((5, 3))})
