"""Test-scale real architectures (tests/torch_zoo.py: ResNet, MobileNet, ShuffleNet, Swin-style
window attention with computed padding, BERT, GPT, LSTM/GRU LM) through both torch.onnx
exporters, checked against PyTorch: forward parity on numpy and onnxruntime, the trainable set
equal to ``named_parameters()``, gradients against float64 ``torch.autograd``, 20 AdamW steps
tracking torch's losses, deploy at opset 17.

The exports are committed under tests/data/zoo (``scripts/export_torch_models.py --zoo``), so
the exporters (seconds each) do not run here; torch is the oracle."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
import torch_zoo  # noqa: E402 - needs torch
from backend_params import EXACT_CUDA, on_cuda  # noqa: E402

F = torch.nn.functional
torch.set_num_threads(1)  # tiny tensors: torch's default pool (one thread per core) thrashes a shared machine
CASES = [pytest.param(name, exporter, id=f"{name}-{exporter}") for name in torch_zoo.ZOO
         for exporter in torch_zoo.EXPORTERS]
LOSS = gc.losses.cross_entropy("logits", label="y")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # a block reused twice shares its BN (shufflenet)


def _generate(name, exporter, dtype="float32", optimizer=None, device="cpu"):
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    model = gc.load(torch_zoo.files(name, exporter, dtype)[0])
    return model, gc.training.generate(model, LOSS, optimizer or gc.optim.SGD(0.1), device=device)


def _split_by_name(module, trainable):
    """(params trained under their torch names, other trainables, torch params not by name)."""
    names = [n for n, _ in module.named_parameters()]
    return ([n for n in trainable if n in names], [n for n in trainable if n not in names],
            [n for n in names if n not in trainable])


def _nonzero_sorted(arrays):
    flat = np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays]) if arrays else np.zeros(0)
    return np.sort(flat[flat != 0])


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_trainable_set_and_gradients_equal_torch_float64(name, exporter):
    """The trainable set is named_parameters(): each param trained under its own name, or as the
    one tensor the exporter folded it into (a transposed weight, LSTM gates reordered, a sliced
    position table); no exporter constant is trained. Gradients equal float64 autograd: by name,
    and for folded params as the same multiset of (nonzero) values."""
    module, x, y = torch_zoo.load(name, torch.float64)
    _, arts = _generate(name, exporter, "float64")
    named, folded, missing = _split_by_name(module, arts.manifest.trainable)
    assert not (folded or missing) or (folded and missing), (folded, missing)
    state = {n: p.detach().numpy() for n, p in module.named_parameters()}
    values = _nonzero_sorted([arts.state[n] for n in folded])
    assert np.isin(values, _nonzero_sorted([state[n] for n in missing])).all()  # copies of torch values

    got = gc.Session(arts.gradients, backend="numpy").run({"x": x.numpy(), "y": y.numpy()})
    params, tol = _assert_named_grads_equal_torch(module, x, y, got, named)
    want = _nonzero_sorted([params[n].grad.numpy() for n in missing])
    have = _nonzero_sorted([got[f"{n}_grad"] for n in folded])
    assert have.shape == want.shape
    np.testing.assert_allclose(have, want, **tol)


def _assert_named_grads_equal_torch(module, x, y, got, named, loss_rtol=1e-9):
    """``got`` (a gradients graph's outputs) against float64 autograd of ``module`` on (x, y):
    the loss to ``loss_rtol``, the gradient of each param in ``named``. Returns torch's params
    (their ``.grad`` set) and the gradient tolerance."""
    loss = F.cross_entropy(module(x), y)
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=loss_rtol)
    params = dict(module.named_parameters())
    scale = max(np.abs(p.grad.numpy()).max() for p in params.values())
    tol = {"rtol": 1e-6, "atol": 1e-7 * scale}  # float64 (exporters write a few constants in float32)
    for n in named:
        np.testing.assert_allclose(got[f"{n}_grad"], params[n].grad.numpy(), **tol, err_msg=n)
    return params, tol


@pytest.mark.parametrize(("name", "exporter"), [c for c in CASES if c.values[0] in ("mobilenet", "shufflenet")])
def test_cuda_lowered_gradients_equal_torch_float64(name, exporter):
    """Artifacts generated for CUDA (every depthwise conv's weight gradient a sum over its taps,
    where the CPU's lowering keeps a Conv on these small maps) give float64 autograd's gradients
    too (here on numpy)."""
    module, x, y = torch_zoo.load(name, torch.float64)
    _, arts = _generate(name, exporter, "float64", device="cuda")
    got = gc.Session(arts.gradients, backend="numpy").run({"x": x.numpy(), "y": y.numpy()})
    _assert_named_grads_equal_torch(module, x, y, got, _split_by_name(module, arts.manifest.trainable)[0])


def _torch_run(module, x, y, steps=20):
    """torch's eval-mode logits, then its losses over ``steps`` AdamW steps (train mode). Run
    before any onnxruntime session exists: their spinning thread pools slow torch tenfold."""
    module.eval()
    with torch.no_grad():
        expected = module(x).numpy()
    module.train()
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return expected, losses


@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_forward_training_and_deploy_track_torch(name, exporter, tmp_path):
    """float32: the inference graph on numpy and onnxruntime equals torch's eval forward; 20
    AdamW steps on onnxruntime track torch's losses to 1e-5 relative; the export deployed at
    opset 17 gives torch's outputs."""
    module, x, y = torch_zoo.load(name)
    expected, theirs = _torch_run(module, x, y)
    model, arts = _generate(name, exporter, optimizer=gc.optim.AdamW(1e-2, weight_decay=0.01))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(arts.inference, backend=backend).run({"x": x.numpy()})["logits"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=backend)

    served = gc.load(gc.deploy.triton(model, tmp_path, "m") / "1" / "model.onnx")
    assert served.opset == 17
    np.testing.assert_allclose(gc.Session(served, backend="ort-cpu").run({"x": x.numpy()})["logits"], expected,
                               rtol=1e-4, atol=1e-5)

    trainer = gc.Trainer(arts, backend="ort-cpu")
    ours = [trainer.step({"x": x.numpy(), "y": y.numpy()}) for _ in range(20)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


@on_cuda
@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_gradients_on_cuda_equal_torch_float64(name, exporter):
    """The gradients graph on onnxruntime's CUDA provider, float64 (no TF32 or reduced-precision
    kernel can hide a wrong lowering), equals float64 autograd for the params trained by name."""
    module, x, y = torch_zoo.load(name, torch.float64)
    _, arts = _generate(name, exporter, "float64")
    session = gc.Session(arts.gradients, backend="ort-cuda")
    got = session.run({"x": x.numpy(), "y": y.numpy()})
    _assert_named_grads_equal_torch(module, x, y, got, _split_by_name(module, arts.manifest.trainable)[0],
                                    loss_rtol=1e-7)  # CUDA's float64 reductions: 2e-8 seen


@on_cuda
@pytest.mark.parametrize("lowered_for", ["cpu", "cuda"])
@pytest.mark.parametrize(("name", "exporter"), CASES)
def test_training_on_cuda_tracks_torch(name, exporter, lowered_for):
    """20 AdamW steps on onnxruntime's CUDA provider (float32, TF32 off) track torch's losses as
    the CPU's do, with params and optimizer state kept on the GPU; artifacts generated for either
    device."""
    module, x, y = torch_zoo.load(name)
    _, theirs = _torch_run(module, x, y)
    _, arts = _generate(name, exporter, optimizer=gc.optim.AdamW(1e-2, weight_decay=0.01), device=lowered_for)
    trainer = gc.Trainer(arts, backend="ort-cuda", **EXACT_CUDA)
    ours = [trainer.step({"x": x.numpy(), "y": y.numpy()}) for _ in range(20)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert {v.device_name().lower() for v in trainer._state.values()} == {"cuda"}
