"""gc.nn.Transformer against torch.nn.Transformer with the same weights: state_dict keys, xavier
init, the output and the gradients of src, tgt and every parameter with masks (causal, padding,
float), post- and pre-norm, batch_first or not, on the numpy and ort-cpu backends; the captured
model through the full ONNX checker; torch's refusals."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
try:
    from torch_grad_util import gc_grads, run_both, torch_twin
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads, run_both, torch_twin

R = np.random.default_rng(5)
ARGS = "d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16, dropout=0.0"


@pytest.mark.parametrize("extra", ["", ", batch_first=True", ", norm_first=True, activation='gelu'"],
                         ids=["post-norm", "batch-first", "pre-norm-gelu"])
def test_transformer_and_gradients_match_torch(extra):
    torch = pytest.importorskip("torch")
    model, tmodel = torch_twin(f"Transformer({ARGS}{extra})", seed=3)
    first = "batch_first" in extra
    src, tgt = R.standard_normal((2, 5, 8)).astype(np.float32), R.standard_normal((2, 4, 8)).astype(np.float32)
    if not first:
        src, tgt = src.transpose(1, 0, 2).copy(), tgt.transpose(1, 0, 2).copy()
    masks = {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(4),
             "src_key_padding_mask": np.array([[False] * 4 + [True], [False] * 5]),
             "memory_mask": np.where(R.random((4, 5)) < 0.3, -1.5, 0.0).astype(np.float32)}
    tin = {"src": torch.tensor(src, requires_grad=True), "tgt": torch.tensor(tgt, requires_grad=True)}
    want = tmodel(*tin.values(), **{k: torch.from_numpy(v) for k, v in masks.items()}, tgt_is_causal=True)
    c = R.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, src, tgt, **kw: m(src, tgt, **kw, tgt_is_causal=True), {"src": src, "tgt": tgt},
                       masks, c, module=model, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=backend)
        for k, t in tin.items():
            np.testing.assert_allclose(got[k], t.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=f"{backend} {k}")
        for k, p in tmodel.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=f"{backend} {k}")
    batch = ("N", 5, 8) if first else (5, "N", 8)
    captured = gc.capture(lambda src, tgt: model(src, tgt, tgt_is_causal=True, tgt_mask=masks["tgt_mask"]),
                          src=gc.spec("float32", batch), tgt=gc.spec("float32", (batch[0], 4, 8) if first else
                                                                     (4, "N", 8)))
    onnx.checker.check_model(captured.proto, full_check=True)
    with torch.no_grad():
        causal_only = tmodel(tin["src"], tin["tgt"], tgt_mask=torch.from_numpy(masks["tgt_mask"]))
    got = run_both(captured, {"src": src, "tgt": tgt})["output"]
    np.testing.assert_allclose(got, causal_only.numpy(), rtol=1e-4, atol=1e-5)


def test_parameters_start_xavier_uniform_as_torchs():
    model = nn.Transformer(16, 2, 1, 1, dim_feedforward=4).init_parameters(seed=0)
    state = model.state_dict()
    w = state["encoder.layers.0.linear1.weight"]  # [4, 16]: Linear's default U(+-1/4), xavier U(+-sqrt(6/20))
    assert 0.4 < np.abs(w).max() <= math.sqrt(6 / 20)
    assert np.all(state["encoder.norm.weight"] == 1) and np.all(state["decoder.layers.0.linear1.bias"] != 0)


def test_square_subsequent_mask_is_torchs():
    torch = pytest.importorskip("torch")
    mask = nn.Transformer.generate_square_subsequent_mask(4, dtype="float64")
    assert mask.dtype == np.float64
    np.testing.assert_array_equal(mask, torch.nn.Transformer.generate_square_subsequent_mask(4).numpy())


def test_refusals_name_the_inputs():
    model = nn.Transformer(8, 2, 1, 1, 16)
    with pytest.raises(gc.GraphError, match=r"Transformer.*src and tgt batch sizes differ \(2 vs 3\)"):
        gc.capture(model, src=np.zeros((5, 2, 8), np.float32), tgt=np.zeros((4, 3, 8), np.float32))
    with pytest.raises(gc.GraphError, match=r"Transformer.*feature number of tgt \(6\) must equal d_model \(8\)"):
        gc.capture(model, src=np.zeros((5, 2, 8), np.float32), tgt=np.zeros((4, 2, 6), np.float32))


@pytest.mark.parametrize("custom", ["encoder", "decoder"])
def test_an_empty_custom_module_is_kept_as_torchs(custom):
    """An empty ``nn.Sequential`` (falsy: no layers) given as ``custom_encoder``/``custom_decoder``
    is used, not replaced by the default stack: the same state_dict keys as torch's."""
    torch = pytest.importorskip("torch")
    model = nn.Transformer(8, 2, 1, 1, 16, **{f"custom_{custom}": nn.Sequential()})
    tmodel = torch.nn.Transformer(8, 2, 1, 1, 16, **{f"custom_{custom}": torch.nn.Sequential()})
    assert isinstance(getattr(model, custom), nn.Sequential)
    assert sorted(model.init_parameters(seed=0).state_dict()) == sorted(tmodel.state_dict())
