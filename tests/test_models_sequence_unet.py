"""The LSTM language model, U-Net and GPT examples: ``graphc capture`` on each, a few training
steps on both backends (the loss falls), and with torch installed, the same model written in
torch.nn with our weights gives the same outputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.models.gpt import GPT
from graphc.models.lstm_lm import LSTMLanguageModel
from graphc.models.unet import UNet
try:
    from cli_util import run_cli
except ImportError:  # tests/ collected as a package
    from tests.cli_util import run_cli

R = np.random.default_rng(8)
TOKENS = R.integers(0, 100, (3, 9))
IMAGES = R.standard_normal((2, 1, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("target,spec,shape", [
    ("models/lstm_lm.py:LSTMLanguageModel", "tokens:int64[N,8]", (3, 8, 100)),
    ("models/gpt.py:GPT", "idx:int64[N,8]", (3, 8, 100)),
    ("models/unet.py:UNet", "x:float32[N,1,16,16]", (2, 2, 16, 16)),
], ids=["lstm_lm", "gpt", "unet"])
def test_graphc_capture_each_example(capsys, tmp_path, target, spec, shape):
    out = tmp_path / "m.onnx"
    assert run_cli(capsys, "capture", target, "--input", spec, "-o", out).code == 0
    onnx.checker.check_model(str(out), full_check=True)
    model = gc.load(out)
    name = model.inputs[0].name
    feed = IMAGES if name == "x" else TOKENS[:, :8]
    assert gc.Session(model, backend="ort-cpu").run({name: feed})["output"].shape == shape


class _TokenLoss(nn.Module):
    """Next-token cross-entropy, as a PyTorch training loop computes it."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, targets):
        return {"loss": gc.losses.cross_entropy(self.lm(tokens).transpose(0, 2, 1), targets)}


class _PixelLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, y):
        return {"loss": gc.losses.cross_entropy(self.net(x), y)}


@pytest.mark.parametrize("name", ["lstm_lm", "gpt", "unet"])
def test_each_example_trains(name):
    if name == "unet":
        model = gc.capture(_PixelLoss(UNet()), x=gc.spec("float32", ("N", 1, 16, 16)),
                           y=gc.spec("int64", ("N", 16, 16)), training=True)
        batch = {"x": IMAGES, "y": (IMAGES[:, 0] > 0).astype(np.int64)}
    else:
        lm = LSTMLanguageModel() if name == "lstm_lm" else GPT(dropout=0.1)
        model = gc.capture(_TokenLoss(lm), tokens=gc.spec("int64", ("N", 8)), targets=gc.spec("int64", ("N", 8)),
                           training=True)
        batch = {"tokens": TOKENS[:, :-1], "targets": TOKENS[:, 1:]}
    artifacts = gc.training.generate(model, "loss", gc.optim.AdamW(1e-2))
    losses = {}
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(artifacts, backend=backend, seed=3)
        losses[backend] = [trainer.step(batch) for _ in range(4)]
    assert losses["numpy"][-1] < losses["numpy"][0]
    if name != "gpt":  # GPT's dropout masks differ between the backends' generators
        np.testing.assert_allclose(losses["ort-cpu"], losses["numpy"], rtol=1e-3)


def test_gpt_ties_the_head_to_the_embedding():
    model = gc.capture(GPT(), idx=gc.spec("int64", ("N", 8)))
    assert "lm_head.weight" not in model.params and "wte.weight" in model.params
    users = {n.op_type for n in model.ir.graph for v in n.inputs if v is not None and v.name == "wte.weight"}
    assert users == {"Gather", "Transpose"}


def _torch_gpt(torch):
    tnn, F = torch.nn, torch.nn.functional

    class Attn(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn, self.c_proj, self.resid_dropout = tnn.Linear(32, 96), tnn.Linear(32, 32), tnn.Dropout(0.0)

        def forward(self, x):
            B, T, C = x.shape  # noqa: N806
            q, k, v = (t.reshape(B, T, 4, 8).transpose(1, 2) for t in self.c_attn(x).split(32, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(tnn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc, self.gelu = tnn.Linear(32, 128), tnn.GELU(approximate="tanh")
            self.c_proj, self.dropout = tnn.Linear(128, 32), tnn.Dropout(0.0)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(tnn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2, self.mlp = tnn.LayerNorm(32), Attn(), tnn.LayerNorm(32), MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class TorchGPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe, self.drop = tnn.Embedding(100, 32), tnn.Embedding(32, 32), tnn.Dropout(0.0)
            self.h = tnn.ModuleList([Block(), Block()])
            self.ln_f, self.lm_head = tnn.LayerNorm(32), tnn.Linear(32, 100, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx):
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1])))
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return TorchGPT()


def _torch_lstm_lm(torch):
    tnn = torch.nn

    class TorchLM(tnn.Module):
        def __init__(self):
            super().__init__()
            self.drop, self.encoder = tnn.Dropout(0.2), tnn.Embedding(100, 32)
            self.rnn = tnn.LSTM(32, 32, 2, dropout=0.2, batch_first=True)
            self.decoder = tnn.Linear(32, 100)
            self.decoder.weight = self.encoder.weight

        def forward(self, tokens):
            out, _ = self.rnn(self.drop(self.encoder(tokens)))
            return self.decoder(self.drop(out))

    return TorchLM()


@pytest.mark.parametrize("name", ["gpt", "lstm_lm"])
def test_example_matches_the_same_model_in_torch(name):
    torch = pytest.importorskip("torch")
    ours, theirs = (GPT(), _torch_gpt(torch)) if name == "gpt" else (LSTMLanguageModel(), _torch_lstm_lm(torch))
    ours.init_parameters(seed=6)
    state = {k: torch.from_numpy(v) for k, v in ours.state_dict().items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight", "decoder.weight"}  # the tied copies
    model = gc.capture(ours, seed=6, **{ours.forward.__code__.co_varnames[1]: TOKENS[:, :8]})
    with torch.no_grad():
        want = theirs.eval()(torch.from_numpy(TOKENS[:, :8])).numpy()
    got = gc.Session(model, backend="ort-cpu").run({model.inputs[0].name: TOKENS[:, :8]})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
