"""``gc.nn.Embedding(max_norm=...)`` and ``F.embedding(..., max_norm=...)`` against torch: the rows
looked up whose norm exceeds ``max_norm`` come out scaled to it, the scaling not differentiated (torch
renormalises them in place under ``no_grad``); on numpy and ort-cpu. Training such a weight is refused
at generate time: torch's optimizer steps the renormalised weight, which the training graphs cannot."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

R = np.random.default_rng(0)
WEIGHT = R.normal(size=(6, 3)) * 1.5  # row norms from about 0.9 to 4: some over max_norm, some not
INDICES = np.array([[0, 2, 2, 4], [5, 1, 0, 3]])


def _layers(dtype: str, padding_idx: int | None, **norm):
    layer = gc.nn.Embedding(6, 3, padding_idx=padding_idx, dtype=dtype, **norm)
    layer.weight = gc.nn.Parameter(WEIGHT.astype(dtype), dtype=dtype)
    twin = torch.nn.Embedding(6, 3, padding_idx=padding_idx, dtype=getattr(torch, dtype), **norm)
    with torch.no_grad():
        twin.weight.copy_(torch.from_numpy(WEIGHT))
    return layer, twin


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_the_lookup_and_its_gradient_match_torch(dtype, norm_type, padding_idx):
    layer, twin = _layers(dtype, padding_idx, max_norm=1.5, norm_type=norm_type)
    want = twin(torch.from_numpy(INDICES))
    c = R.standard_normal(tuple(want.shape)).astype(dtype)
    (want * torch.from_numpy(c)).sum().backward()
    assert not np.allclose(twin.weight.detach().numpy(), WEIGHT)  # torch renormed rows in place
    tol = {"rtol": 1e-12, "atol": 0} if dtype == "float64" else {"rtol": 1e-6, "atol": 1e-7}
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, i: m(i), {}, {"i": INDICES}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), **tol, err_msg=backend)
        np.testing.assert_allclose(got["m.weight"], twin.weight.grad.numpy(), **tol, err_msg=backend)
    norms = np.linalg.norm(got["out"], ord=norm_type, axis=-1)
    assert norms.max() <= 1.5 * (1 + 1e-6) and (np.linalg.norm(WEIGHT, ord=norm_type, axis=-1) > 1.5).any()


def test_the_functional_form_matches_torch():
    c = R.standard_normal((2, 4, 3))
    w = torch.tensor(WEIGHT, requires_grad=True)
    want = torch.nn.functional.embedding(torch.from_numpy(INDICES), w, max_norm=2.0)
    (want * torch.from_numpy(c)).sum().backward()
    got = gc_grads(lambda F, w, i: F.embedding(i, w, max_norm=2.0), {"w": WEIGHT}, {"i": INDICES}, c,
                   backend="ort-cpu")
    np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(got["w"], w.grad.numpy(), rtol=1e-12)


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = gc.nn.Embedding(6, 3, max_norm=1.0, dtype="float64")
        self.fc = gc.nn.Linear(3, 1, dtype="float64")

    def forward(self, i):
        return self.fc(self.emb(i)).sum(1)


def test_training_a_max_norm_weight_is_refused_naming_it_and_the_line():
    model = gc.capture(_Net(), training=True, i=INDICES)
    with pytest.raises(gc.PassError, match=r"embedding of 'emb.weight' with max_norm \(at .*test_embedding_max_norm"
                                           r"\.py:\d+\) is trained: torch renormalises"):
        gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))
    frozen = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1),
                                  frozen=["emb.weight"])
    assert "emb.weight" in frozen.manifest.frozen and "fc.weight" in frozen.manifest.trainable
