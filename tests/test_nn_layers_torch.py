"""The gc.nn layers of issue 12 against torch.nn: parameter names, shapes and init bounds, forward
outputs on the numpy and ort-cpu backends, and ``gc.grad`` gradients of every parameter and of
the input vs ``torch.autograd``, with the same weights (torch's ``load_state_dict`` of ours); a
numpy formula checks the ones where it is short, without torch."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
try:
    from torch_grad_util import assert_step_matches_torch, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch, gc_grads, run_both

R = np.random.default_rng(11)
X1 = R.standard_normal((2, 3, 9)).astype(np.float32)
X4 = R.standard_normal((2, 4, 9)).astype(np.float32)
IMG = R.standard_normal((2, 3, 6, 6)).astype(np.float32)
IMG4 = R.standard_normal((2, 4, 3, 3)).astype(np.float32)
VOL = R.standard_normal((1, 2, 4, 5, 5)).astype(np.float32)
SEQ = R.standard_normal((4, 2, 5)).astype(np.float32)  # (L, N, H_in)
BSEQ = R.standard_normal((2, 4, 5)).astype(np.float32)  # (N, L, H_in)
EMB = R.standard_normal((2, 5, 8)).astype(np.float32)
TOK = np.array([[1, 0, 4], [9, 2, 0]], np.int64)
X7 = np.random.default_rng(7).standard_normal((2, 3, 7)).astype(np.float32)  # ceil_mode pools: 3 windows, not 4


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


# (id, gc layer factory, torch constructor (evaluated with torch.nn in scope), input, numpy ref f(x, params))
CASES = [
    ("Conv1d", lambda: nn.Conv1d(3, 4, 3, stride=2, padding=1), "Conv1d(3, 4, 3, stride=2, padding=1)", X1, None),
    ("Conv1dSame", lambda: nn.Conv1d(3, 4, 4, padding="same", dilation=2), "Conv1d(3, 4, 4, padding='same', dilation=2)",
     X1, None),
    ("Conv1dGroups", lambda: nn.Conv1d(4, 6, 3, groups=2, bias=False), "Conv1d(4, 6, 3, groups=2, bias=False)", X4,
     None),
    ("Conv2dSame", lambda: nn.Conv2d(3, 4, 4, padding="same"), "Conv2d(3, 4, 4, padding='same')", IMG, None),
    ("Conv2dSameDilated", lambda: nn.Conv2d(3, 4, (3, 4), padding="same", dilation=(2, 1)),
     "Conv2d(3, 4, (3, 4), padding='same', dilation=(2, 1))", IMG, None),
    ("Conv3d", lambda: nn.Conv3d(2, 3, 2, stride=(1, 2, 2), padding=1), "Conv3d(2, 3, 2, stride=(1, 2, 2), padding=1)",
     VOL, None),
    ("ConvTranspose1d", lambda: nn.ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1),
     "ConvTranspose1d(3, 4, 3, stride=2, padding=1, output_padding=1)", X1, None),
    ("ConvTranspose2d", lambda: nn.ConvTranspose2d(3, 2, 2, stride=2), "ConvTranspose2d(3, 2, 2, stride=2)", IMG, None),
    ("ConvTranspose2dGroups", lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
     "ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)", IMG4, None),
    ("MaxPool1d", lambda: nn.MaxPool1d(3, stride=2, padding=1), "MaxPool1d(3, stride=2, padding=1)", X1, None),
    ("AvgPool1d", lambda: nn.AvgPool1d(3), "AvgPool1d(3)", X1, lambda x, p: x.reshape(2, 3, 3, 3).mean(-1)),
    ("MaxPool1dCeil", lambda: nn.MaxPool1d(4, 3, 2, ceil_mode=True), "MaxPool1d(4, 3, 2, ceil_mode=True)", X7, None),
    ("AvgPool1dCeil", lambda: nn.AvgPool1d(4, 3, 2, ceil_mode=True), "AvgPool1d(4, 3, 2, ceil_mode=True)", X7, None),
    ("AvgPool1dCeilPadsUncounted", lambda: nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False),
     "AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False)", X1, None),
    ("AdaptiveAvgPool1d", lambda: nn.AdaptiveAvgPool1d(3), "AdaptiveAvgPool1d(3)", X1,
     lambda x, p: x.reshape(2, 3, 3, 3).mean(-1)),
    ("AdaptiveAvgPool1dTo1", lambda: nn.AdaptiveAvgPool1d(1), "AdaptiveAvgPool1d(1)", X1,
     lambda x, p: x.mean(-1, keepdims=True)),
    ("GroupNorm", lambda: nn.GroupNorm(2, 4), "GroupNorm(2, 4)", IMG4, None),
    ("InstanceNorm2d", lambda: nn.InstanceNorm2d(3), "InstanceNorm2d(3)", IMG,
     lambda x, p: (x - x.mean((2, 3), keepdims=True)) / np.sqrt(x.var((2, 3), keepdims=True) + 1e-5)),
    ("InstanceNorm2dAffine", lambda: nn.InstanceNorm2d(4, affine=True), "InstanceNorm2d(4, affine=True)", IMG4, None),
    ("RMSNorm", lambda: nn.RMSNorm(8, eps=1e-6), "RMSNorm(8, eps=1e-6)", EMB,
     lambda x, p: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * p["weight"]),
    ("RMSNormDefaultEps", lambda: nn.RMSNorm([5, 8]), "RMSNorm([5, 8])", EMB, None),
    ("BatchNorm1dNCL", lambda: nn.BatchNorm1d(4), "BatchNorm1d(4)", X4, None),
    ("BatchNorm3d", lambda: nn.BatchNorm3d(2), "BatchNorm3d(2)", VOL, None),
    ("BatchNorm3dNoBias", lambda: nn.BatchNorm3d(2, eps=1e-3, bias=False), "BatchNorm3d(2, eps=1e-3, bias=False)", VOL,
     None),
    ("BatchNorm2dUntracked", lambda: nn.BatchNorm2d(3, track_running_stats=False),
     "BatchNorm2d(3, track_running_stats=False)", IMG,
     lambda x, p: (x - x.mean((0, 2, 3), keepdims=True)) / np.sqrt(x.var((0, 2, 3), keepdims=True) + 1e-5)),
    ("BatchNorm1dUntrackedNoAffine", lambda: nn.BatchNorm1d(4, affine=False, track_running_stats=False),
     "BatchNorm1d(4, affine=False, track_running_stats=False)", X4, None),
    ("InstanceNorm1d", lambda: nn.InstanceNorm1d(3), "InstanceNorm1d(3)", X1,
     lambda x, p: (x - x.mean(2, keepdims=True)) / np.sqrt(x.var(2, keepdims=True) + 1e-5)),
    ("InstanceNorm1dAffineNoBias", lambda: nn.InstanceNorm1d(4, affine=True, bias=False),
     "InstanceNorm1d(4, affine=True, bias=False)", X4, None),
    ("InstanceNorm3d", lambda: nn.InstanceNorm3d(2), "InstanceNorm3d(2)", VOL,
     lambda x, p: (x - x.mean((2, 3, 4), keepdims=True)) / np.sqrt(x.var((2, 3, 4), keepdims=True) + 1e-5)),
    ("InstanceNorm3dAffine", lambda: nn.InstanceNorm3d(2, eps=1e-3, affine=True),
     "InstanceNorm3d(2, eps=1e-3, affine=True)", VOL, None),
    ("Embedding", lambda: nn.Embedding(10, 4, padding_idx=0), "Embedding(10, 4, padding_idx=0)", TOK,
     lambda x, p: p["weight"][x]),
    ("RNN", lambda: nn.RNN(5, 6), "RNN(5, 6)", SEQ, None),
    ("RNNReluDeepBidir", lambda: nn.RNN(5, 6, num_layers=2, nonlinearity="relu", bidirectional=True),
     "RNN(5, 6, num_layers=2, nonlinearity='relu', bidirectional=True)", SEQ, None),
    ("LSTM", lambda: nn.LSTM(5, 6), "LSTM(5, 6)", SEQ, None),
    ("LSTMDeepBidirBatchFirst", lambda: nn.LSTM(5, 3, num_layers=2, bidirectional=True, batch_first=True),
     "LSTM(5, 3, num_layers=2, bidirectional=True, batch_first=True)", BSEQ, None),
    ("GRU", lambda: nn.GRU(5, 6, num_layers=2, batch_first=True), "GRU(5, 6, num_layers=2, batch_first=True)", BSEQ,
     None),
    ("GRUBidirNoBias", lambda: nn.GRU(5, 4, bidirectional=True, bias=False), "GRU(5, 4, bidirectional=True, bias=False)",
     SEQ, None),
    ("TransformerEncoderLayer", lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
     "TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)", EMB, None),
    ("TransformerEncoderLayerPreNormGelu",
     lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", norm_first=True),
     "TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation='gelu', norm_first=True)", EMB, None),
    ("Upsample", lambda: nn.Upsample(scale_factor=2), "Upsample(scale_factor=2)", IMG,
     lambda x, p: x.repeat(2, 2).repeat(2, 3)),
    ("UpsampleBilinear", lambda: nn.Upsample(size=(9, 7), mode="bilinear"), "Upsample(size=(9, 7), mode='bilinear')",
     IMG, None),
    ("PixelShuffle", lambda: nn.PixelShuffle(2), "PixelShuffle(2)", IMG4,
     lambda x, p: x.reshape(2, 1, 2, 2, 3, 3).transpose(0, 1, 4, 2, 5, 3).reshape(2, 1, 6, 6)),
    ("LeakyReLU", lambda: nn.LeakyReLU(0.2), "LeakyReLU(0.2)", X1, lambda x, p: np.where(x > 0, x, 0.2 * x)),
    ("ELU", lambda: nn.ELU(0.7), "ELU(0.7)", X1, lambda x, p: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
    ("SiLU", nn.SiLU, "SiLU()", X1, lambda x, p: x * _sigmoid(x)),
    ("Mish", nn.Mish, "Mish()", X1, lambda x, p: x * np.tanh(np.log1p(np.exp(x)))),
    ("Hardswish", nn.Hardswish, "Hardswish()", X1 * 4, lambda x, p: x * np.clip(x + 3, 0, 6) / 6),
    ("Hardsigmoid", nn.Hardsigmoid, "Hardsigmoid()", X1 * 4, lambda x, p: np.clip(x + 3, 0, 6) / 6),
    ("Softplus", lambda: nn.Softplus(beta=2.0, threshold=1.0), "Softplus(beta=2.0, threshold=1.0)", X1,
     lambda x, p: np.where(2 * x > 1, x, np.log1p(np.exp(2 * x)) / 2)),
    ("PReLU", nn.PReLU, "PReLU()", X1, lambda x, p: np.where(x > 0, x, 0.25 * x)),
    ("PReLUChannels", lambda: nn.PReLU(3, init=0.1), "PReLU(3, init=0.1)", IMG,
     lambda x, p: np.where(x > 0, x, 0.1 * x)),
]
IDS = [c[0] for c in CASES]


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _capture(layer, x, opset=21):
    model = gc.capture(lambda x: _first(layer(x)), x=gc.spec(x.dtype, ("N", *x.shape[1:])), seed=4, opset=opset)
    onnx.checker.check_model(model.proto, full_check=True)
    return model


@pytest.mark.parametrize("name,factory,ctor,x,ref", [c for c in CASES if c[4]], ids=[c[0] for c in CASES if c[4]])
def test_layer_matches_numpy(name, factory, ctor, x, ref):
    layer = factory()
    out = run_both(_capture(layer, x), {"x": x})["output"]
    np.testing.assert_allclose(out, ref(x, layer.state_dict()), rtol=1e-4, atol=1e-5)


def _torch_layer(torch, ctor, state):
    layer = eval(f"torch.nn.{ctor}", {"torch": torch})  # noqa: S307 - the constructors listed above
    layer.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=False)
    missing = set(layer.state_dict()) - set(state) - {k for k in layer.state_dict() if "num_batches" in k}
    assert not missing, f"torch's names missing here: {missing}"
    return layer.eval()


@pytest.mark.parametrize("name,factory,ctor,x,ref", CASES, ids=IDS)
def test_layer_and_gradients_match_torch(name, factory, ctor, x, ref):
    torch = pytest.importorskip("torch")
    layer = factory()
    layer.init_parameters(seed=2)
    state = layer.state_dict()
    tl = _torch_layer(torch, ctor, state)
    assert list(state) == list(tl.state_dict())  # names and order
    assert all(tuple(tl.state_dict()[k].shape) == v.shape for k, v in state.items())
    for p in layer.parameters():  # keep these values through capture
        p.data = p.numpy()
    floats = x.dtype == np.float32
    xt = torch.tensor(x, requires_grad=floats)
    out = _first(tl(xt))
    c = R.standard_normal(tuple(out.shape)).astype(np.float32)
    (out * torch.from_numpy(c)).sum().backward()
    got = gc_grads(lambda m, *a, **kw: m(*a, *kw.values()), {"x": x} if floats else {}, {} if floats else {"x": x}, c,
                   module=layer)
    np.testing.assert_allclose(got["out"], out.detach().numpy(), rtol=1e-4, atol=1e-5)
    if floats:
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-3, atol=1e-4)
    for k, p in tl.named_parameters():
        np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol=1e-3, atol=1e-4, err_msg=k)
    fwd = run_both(_capture(layer, x), {"x": x})["output"]
    np.testing.assert_allclose(fwd, out.detach().numpy(), rtol=1e-4, atol=1e-5)


def _flat(result):
    out, (h, c) = result
    return out, h, c


def test_recurrent_states_in_and_out_match_torch():
    torch = pytest.importorskip("torch")
    lstm = nn.LSTM(5, 3, num_layers=2, bidirectional=True)
    lstm.init_parameters(seed=1)
    h0, c0 = (R.standard_normal((4, 2, 3)).astype(np.float32) for _ in range(2))
    model = gc.capture(lambda x, h0, c0: _flat(lstm(x, (h0, c0))), x=SEQ, h0=h0, c0=c0)
    onnx.checker.check_model(model.proto, full_check=True)
    assert [n.op_type for n in model.ir.graph].count("LSTM") == 2
    out = run_both(model, {"x": SEQ, "h0": h0, "c0": c0})
    tl = _torch_layer(torch, "LSTM(5, 3, num_layers=2, bidirectional=True)", lstm.state_dict())
    with torch.no_grad():
        y, (h, c) = tl(torch.from_numpy(SEQ), (torch.from_numpy(h0), torch.from_numpy(c0)))
    for got, want in zip(out.values(), (y, h, c)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_decoder_layer_and_causal_masks_match_torch():
    torch = pytest.importorskip("torch")
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    layer.init_parameters(seed=3)
    mem = EMB[:, :3] * 0.5
    pad = np.array([[False, False, True], [False, False, False]])
    model = gc.capture(lambda x, mem, pad: {
        "dec": layer(x, mem, tgt_is_causal=True, memory_key_padding_mask=pad)}, x=EMB, mem=mem, pad=pad)
    onnx.checker.check_model(model.proto, full_check=True)
    out = run_both(model, {"x": EMB, "mem": mem, "pad": pad})
    tl = _torch_layer(torch, "TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)", layer.state_dict())
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        want = tl(torch.from_numpy(EMB), torch.from_numpy(mem), tgt_mask=causal, tgt_is_causal=True,
                  memory_key_padding_mask=torch.from_numpy(pad))
    np.testing.assert_allclose(out["dec"], want.numpy(), rtol=1e-4, atol=1e-5)


def test_encoder_layer_causal_matches_masked_numpy_free_forms():
    """``is_causal=True`` equals passing the causal mask (bool and float forms) explicitly."""
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    hidden = np.triu(np.ones((5, 5), bool), 1)
    model = gc.capture(lambda x, m: {"causal": layer(x, is_causal=True), "bool": layer(x, src_mask=m),
                                     "float": layer(x, src_mask=gc.where(m, -1e9, 0.0))}, x=EMB, m=hidden)
    out = run_both(model, {"x": EMB, "m": hidden})
    np.testing.assert_allclose(out["causal"], out["bool"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["causal"], out["float"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out["causal"], run_both(gc.capture(layer, x=EMB), {"x": EMB})["output"])


@pytest.mark.parametrize("opset", [17, 23])
def test_norms_written_out_before_their_op(opset):
    """GroupNorm (written out at every opset) and RMSNorm (written out before 23) agree across opsets."""
    for layer, x in ((nn.GroupNorm(2, 4), IMG4), (nn.RMSNorm(8), EMB)):
        layer.init_parameters(seed=0)
        layer.weight.data = R.standard_normal(layer.weight.shape)
        ref = run_both(_capture(layer, x), {"x": x})["output"]
        np.testing.assert_allclose(run_both(_capture(layer, x, opset), {"x": x})["output"], ref, rtol=1e-4, atol=1e-5)


def test_recurrent_dropout_between_layers_in_training_mode():
    gru = nn.GRU(5, 4, num_layers=3, dropout=0.3)
    ops = [n.op_type for n in gc.capture(gru, x=SEQ, training=True).ir.graph]
    assert ops.count("GRU") == 3 and ops.count("Dropout") == 2
    assert "Dropout" not in [n.op_type for n in gc.capture(gru, x=SEQ).ir.graph]


def test_default_initialisation_bounds():
    lstm, conv = nn.LSTM(4, 16, bidirectional=True), nn.ConvTranspose2d(8, 4, 3)
    for m in (lstm, conv):
        m.init_parameters(seed=0)
    sd = lstm.state_dict()
    assert list(sd) == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_ih_l0_reverse",
                        "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse"]
    assert sd["weight_ih_l0"].shape == (64, 4) and sd["weight_hh_l0_reverse"].shape == (64, 16)
    assert all(0.2 < np.abs(v).max() <= 0.25 for v in sd.values())  # U(-1/sqrt(16), 1/sqrt(16))
    w = conv.state_dict()["weight"]
    assert w.shape == (8, 4, 3, 3) and 0.9 / math.sqrt(36) < np.abs(w).max() <= 1 / math.sqrt(36)


def test_unbatched_recurrent_input_matches_torch():
    torch = pytest.importorskip("torch")
    gru = nn.GRU(5, 4, num_layers=2, bidirectional=True, batch_first=True)
    gru.init_parameters(seed=5)
    h0 = R.standard_normal((4, 4)).astype(np.float32)
    model = gc.capture(lambda x, h0: gru(x, h0), x=SEQ[:, 0], h0=h0)
    out = run_both(model, {"x": SEQ[:, 0], "h0": h0})
    tl = _torch_layer(torch, "GRU(5, 4, num_layers=2, bidirectional=True, batch_first=True)", gru.state_dict())
    with torch.no_grad():
        y, h = tl(torch.from_numpy(SEQ[:, 0]), torch.from_numpy(h0))
    np.testing.assert_allclose(out["output_0"], y.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["output_1"], h.numpy(), rtol=1e-4, atol=1e-5)


def test_transformer_encoder_stack_matches_torch():
    torch = pytest.importorskip("torch")
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    # torch's keywords, as a port spells them
    stack = nn.TransformerEncoder(encoder_layer=layer, num_layers=2, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    stack.init_parameters(seed=8)
    state = stack.state_dict()
    assert not np.allclose(state["layers.0.linear1.weight"], state["layers.1.linear1.weight"])
    model = gc.capture(lambda x: stack(x, is_causal=True), x=EMB)
    tl = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), 2,
                                     norm=torch.nn.LayerNorm(8), enable_nested_tensor=False)
    tl.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
    with torch.no_grad():
        want = tl.eval()(torch.from_numpy(EMB), mask=mask, is_causal=True)
    np.testing.assert_allclose(run_both(model, {"x": EMB})["output"], want.numpy(), rtol=1e-4, atol=1e-5)


def test_transformer_decoder_stack_takes_torchs_keywords_and_matches_torch():
    torch = pytest.importorskip("torch")
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    stack = nn.TransformerDecoder(decoder_layer=layer, num_layers=2, norm=nn.LayerNorm(8))
    stack.init_parameters(seed=9)
    memory = EMB[:, :3] * 0.5
    model = gc.capture(lambda x, m: stack(x, m), x=EMB, m=memory)
    tl = torch.nn.TransformerDecoder(decoder_layer=torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0,
                                                                                     batch_first=True),
                                     num_layers=2, norm=torch.nn.LayerNorm(8))
    tl.load_state_dict({k: torch.from_numpy(v) for k, v in stack.state_dict().items()})
    with torch.no_grad():
        want = tl.eval()(torch.from_numpy(EMB), torch.from_numpy(memory))
    np.testing.assert_allclose(run_both(model, {"x": EMB, "m": memory})["output"], want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [17, 21])
def test_group_norm_of_a_large_mean_is_accurate_on_both_backends(opset):
    """A group mean 1000x its std: onnxruntime's GroupNormalization kernel lost it (error 0.24)."""
    x = (np.random.default_rng(0).standard_normal((2, 4, 8, 8)) * 0.1 + 100).astype(np.float32)
    g = x.astype(np.float64).reshape(2, 2, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    model = gc.capture(nn.GroupNorm(2, 4), x=x, opset=opset)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        np.testing.assert_allclose(got, want, atol=1e-3, err_msg=backend)


@pytest.mark.parametrize("dims,layout,x", [(1, "L", X4[0]), (2, "H, W", IMG[0]), (3, "D, H, W", VOL[0])],
                         ids=["1d", "2d", "3d"])
def test_instance_norm_unbatched_matches_torch_and_checks_its_input(dims, layout, x):
    torch = pytest.importorskip("torch")
    name = f"InstanceNorm{dims}d"
    x = x * 2 + 1  # (C, *spatial): torch normalises each channel over the spatial dims
    channels = x.shape[0]
    layer = getattr(nn, name)(channels, affine=True)
    layer.init_parameters(seed=3)
    want = _torch_layer(torch, f"{name}({channels}, affine=True)", layer.state_dict())(torch.from_numpy(x))
    got = run_both(gc.capture(layer, x=x), {"x": x})["output"]
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-4, atol=1e-5)
    wider = np.concatenate([x, x[:1]])
    with pytest.raises(gc.GraphError, match=rf"{name}.*input channels and num_features differ \({channels + 1} vs "
                                            rf"{channels}\)"):
        gc.capture(layer, x=wider)
    with pytest.raises(gc.GraphError, match=rf"{name}.*\(C, {layout}\) or \(N, C, {layout}\) input, got rank "
                                            rf"{dims}"):
        gc.capture(layer, x=x[0])


def test_group_norm_below_opset_21_takes_symbolic_spatial_dims():
    layer = nn.GroupNorm(2, 4)
    model = gc.capture(layer, x=gc.spec("float32", ("N", 4, "H", "W")), opset=17)
    g = IMG4.astype(np.float64).reshape(2, 2, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(IMG4.shape)
    np.testing.assert_allclose(run_both(model, {"x": IMG4})["output"], want, rtol=1e-4, atol=1e-5)
    assert [d for d in model.outputs[0].shape] == ["N", 4, "H", "W"]


def test_mish_written_out_before_opset_18():
    want = X1 * np.tanh(np.log1p(np.exp(X1)))
    for fn in (nn.Mish(), gc.nn.functional.mish):
        model = gc.capture(fn, x=X1, opset=17)
        assert "Mish" not in [n.op_type for n in model.ir.graph]
        np.testing.assert_allclose(run_both(model, {"x": X1})["output"], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("name,call", [("softplus", lambda f, x: f.softplus(x)),
                                       ("softplus_beta", lambda f, x: f.softplus(x, 2.0, 5.0)),
                                       ("mish", lambda f, x: f.mish(x))])
def test_float64_softplus_and_mish_run_on_onnxruntime(name, call, opset):
    """onnxruntime has no float64 Softplus (nor Mish, whose body is one): float64 writes it out,
    with torch's values and gradients on both backends, large |x| included."""
    torch = pytest.importorskip("torch")
    x = np.array([-40.0, -5.0, -0.5, 0.0, 0.3, 2.0, 2.6, 19.0, 40.0])
    c = np.random.default_rng(3).standard_normal(x.shape)
    xt = torch.tensor(x, requires_grad=True)
    want = call(torch.nn.functional, xt)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(call, {"x": x}, {}, c, backend=backend, opset=opset)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12, atol=1e-300, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-12, atol=1e-300, err_msg=backend)


class _Volume(nn.Module):
    """Conv3d, BatchNorm3d, a mean over the volume and a Linear head (float64)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(2, 3, 2, dtype="float64")
        self.bn = nn.BatchNorm3d(3, momentum=0.25, dtype="float64")
        self.fc = nn.Linear(3, 1, dtype="float64")

    def forward(self, x):
        return self.fc(self.bn(self.conv(x)).mean((2, 3, 4)))


def test_batchnorm3d_trains_and_tracks_running_statistics_like_torch():
    """Three SGD steps of gc.training.generate in training mode against torch.optim on the same
    module in train(): parameters, running mean and (unbiased) running variance step for step;
    then the eval graph uses the running statistics as torch's eval()."""
    torch = pytest.importorskip("torch")
    net = _Volume()
    net.init_parameters(seed=6)
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 2, 3, 4, 4))),  # rates exact in float32
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=0.5))
    assert arts.manifest.trainable == [k for k, _ in net.named_parameters()]
    trainer = gc.Trainer(arts, backend="numpy")
    f64 = {"dtype": torch.float64}
    tnet = torch.nn.ModuleDict({"conv": torch.nn.Conv3d(2, 3, 2, **f64), "fc": torch.nn.Linear(3, 1, **f64),
                                "bn": torch.nn.BatchNorm3d(3, momentum=0.25, **f64)})
    tnet.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
    opt = torch.optim.SGD(tnet.parameters(), lr=0.125, momentum=0.5)
    rng = np.random.default_rng(4)
    for step in range(3):
        x, y = rng.standard_normal((3, 2, 3, 4, 4)) * 2 + 1, rng.standard_normal((3, 1))
        state = assert_step_matches_torch(  # ModuleDict starts in train()
            trainer, {"x": x, "y": y}, opt,
            lambda: torch.nn.functional.mse_loss(tnet.fc(tnet.bn(tnet.conv(torch.from_numpy(x))).mean((2, 3, 4))),
                                                 torch.from_numpy(y)),
            tnet, step, skip=("bn.num_batches_tracked",))
    x = rng.standard_normal((2, 2, 3, 4, 4))
    got = gc.Session(arts.eval, backend="numpy").run({"x": x, "y": np.zeros((2, 1)), **trainer.params,
                                                      **{k: state[k] for k in ("bn.running_mean", "bn.running_var")}})
    with torch.no_grad():
        want = tnet.eval().fc(tnet.bn(tnet.conv(torch.from_numpy(x))).mean((2, 3, 4)))
    np.testing.assert_allclose(got["output"], want.numpy(), rtol=1e-10)
