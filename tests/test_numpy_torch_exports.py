"""Real exported models: PyTorch modules exported to ONNX (several opsets, both exporters) run
on the numpy backend and agree with onnxruntime."""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import onnx
import pytest

from graphc.backends.conformance import runtime_model
from graphc.backends.numpy import NumpyBackend
from numpy_backend_util import run_ort

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional


class Vision(nn.Module):
    """Depthwise conv, GroupNorm, InstanceNorm, ConvTranspose, PixelShuffle, resizes, pools."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gn = nn.GroupNorm(2, 8)
        self.inorm = nn.InstanceNorm2d(8, affine=True)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.ps = nn.PixelShuffle(2)

    def forward(self, x):
        y = self.inorm(self.gn(F.silu(self.dw(F.hardswish(self.c1(x))))))
        a = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        b = F.interpolate(y, scale_factor=2, mode="nearest")
        d = F.adaptive_avg_pool2d(a + b, (4, 4))
        e = F.avg_pool2d(self.up(y), 3, stride=2, padding=1, count_include_pad=False)
        return d.flatten(1), e.mean(dim=(2, 3)), F.leaky_relu(self.ps(y)).amax(dim=1)


class Recurrent(nn.Module):
    """Embedding, 2-layer bidirectional LSTM, GRU, LogSoftmax, CumSum, TopK."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.lstm = nn.LSTM(6, 5, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(10, 4, batch_first=True)

    def forward(self, tokens):
        y, _ = self.lstm(self.emb(tokens))
        z, h = self.gru(y)
        return torch.log_softmax(z, -1), h, torch.cumsum(z, 1), torch.topk(z.flatten(1), 3).values


class Elementwise(nn.Module):
    """ArgMax/GatherElements, Where/Clip, Gelu (tanh), Erf, Elu, Selu, Softplus, Einsum, norms, slices."""

    def forward(self, x):
        g = torch.gather(x, -1, torch.argmax(x, dim=-1, keepdim=True))
        w = torch.where(x > 0, x, torch.zeros_like(x)).clamp(-0.5, 0.5)
        return (g, w, F.gelu(x, approximate="tanh"), torch.erf(x), F.elu(x), F.selu(x), F.softplus(x),
                torch.einsum("bij,bkj->bik", x, x), x.norm(dim=-1), torch.flip(x, [1]), x[:, 1:, ::2].pow(2))


class CausalAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _inputs(name):
    gen = torch.Generator().manual_seed(0)
    return {"vision": (torch.randn(2, 3, 8, 8, generator=gen),),
            "recurrent": (torch.randint(0, 20, (3, 7), generator=gen),),
            "elementwise": (torch.randn(2, 4, 6, generator=gen),),
            "attention": tuple(torch.randn(2, 4, 5, 8, generator=gen) for _ in range(3))}[name]


MODULES = {"vision": Vision, "recurrent": Recurrent, "elementwise": Elementwise, "attention": CausalAttention}


def _export(name, opset, dynamo):
    torch.manual_seed(0)
    module, inputs = MODULES[name]().eval(), _inputs(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            if dynamo:
                return torch.onnx.export(module, inputs, dynamo=True, opset_version=opset).model_proto, inputs
            buffer = io.BytesIO()
            torch.onnx.export(module, inputs, buffer, opset_version=opset, dynamo=False)
            return onnx.load_from_string(buffer.getvalue()), inputs
        finally:
            logging.disable(logging.NOTSET)


@pytest.mark.parametrize(("name", "opset", "dynamo"), [
    ("vision", 11, False), ("vision", 17, False),
    ("recurrent", 11, False), ("recurrent", 17, False),
    ("elementwise", 13, False), ("elementwise", 17, False),
    ("attention", 23, True),  # one Attention node
])
def test_torch_export_matches_onnxruntime(name, opset, dynamo):
    model, inputs = _export(name, opset, dynamo)
    if name == "attention":
        assert [n.op_type for n in model.graph.node] == ["Attention"]
    feeds = {v.name: t.numpy() for v, t in zip(model.graph.input, inputs)}
    ours = NumpyBackend().prepare(model).run(feeds)
    theirs = run_ort(runtime_model(model), feeds)
    for out, want in zip(model.graph.output, theirs):
        np.testing.assert_allclose(ours[out.name], want, rtol=1e-4, atol=1e-5, err_msg=out.name)
