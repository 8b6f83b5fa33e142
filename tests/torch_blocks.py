"""Small PyTorch models of the architectures whose exports the optimizer is measured on (needs
torch; shared by the optimizer tests and scripts/bench_optimize.py --torch). Widths and inputs
are test-scale; every input shape is static."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from torch import nn


class WindowAttention(nn.Module):
    """A Swin-style block: (shifted) window attention with a relative position bias, its
    padding to a multiple of the window computed from the input's shape, then an MLP."""

    def __init__(self, dim: int = 8, heads: int = 2, window: int = 4, shift: int = 2):
        super().__init__()
        self.window, self.shift, self.heads = window, shift, heads
        self.norm = nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("rel_index", (rel[..., 0] * (2 * window - 1) + rel[..., 1]).flatten(), persistent=False)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):  # x: [B, H, W, C]
        b, h, w, c = x.shape
        ws, s = self.window, self.shift
        y = F.pad(self.norm(x), (0, 0, 0, (ws - w % ws) % ws, 0, (ws - h % ws) % ws))
        _, ph, pw, _ = y.shape
        if s:
            y = torch.roll(y, shifts=(-s, -s), dims=(1, 2))
        nh, nw = ph // ws, pw // ws
        win = y.view(b, nh, ws, nw, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b * nh * nw, ws * ws, c)
        qkv = self.qkv(win).reshape(win.size(0), ws * ws, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attn = (qkv[0] * (c // self.heads) ** -0.5) @ qkv[1].transpose(-2, -1)
        attn = attn + self.bias_table[self.rel_index].view(ws * ws, ws * ws, -1).permute(2, 0, 1).unsqueeze(0)
        if s:  # tokens that the roll brought together from far apart do not attend to each other
            mask = y.new_zeros((ph, pw))
            spans = ((0, -ws), (-ws, -s), (-s, None))
            for i, (a, b_) in enumerate((a, b_) for a in spans for b_ in spans):
                mask[a[0]:a[1], b_[0]:b_[1]] = i
            mask = mask.view(nh, ws, nw, ws).permute(0, 2, 1, 3).reshape(nh * nw, ws * ws)
            mask = mask.unsqueeze(1) - mask.unsqueeze(2)
            mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
            attn = attn.view(-1, nh * nw, self.heads, ws * ws, ws * ws) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, ws * ws, ws * ws)
        out = (attn.softmax(-1) @ qkv[2]).transpose(1, 2).reshape(win.size(0), ws * ws, c)
        out = self.proj(out).view(b, nh, nw, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, ph, pw, c)
        if s:
            out = torch.roll(out, shifts=(s, s), dims=(1, 2))
        x = x + out[:, :h, :w, :].contiguous()
        return x + self.mlp(x)


class PatchMerging(nn.Module):
    """Swin's downsampling: pad H and W to even (computed from the shape), 2x2 -> channels."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.norm, self.reduce = nn.LayerNorm(4 * dim), nn.Linear(4 * dim, 2 * dim, bias=False)

    def forward(self, x):
        h, w = x.shape[-3:-1]
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[..., 0::2, 0::2, :], x[..., 1::2, 0::2, :], x[..., 0::2, 1::2, :], x[..., 1::2, 1::2, :]], -1)
        return self.reduce(self.norm(x))


class SwinNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 8, 2, stride=2)
        self.b1, self.b2 = WindowAttention(shift=0), WindowAttention(shift=2)
        self.merge, self.b3 = PatchMerging(8), WindowAttention(16, 2, 4, 2)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.patch(x).permute(0, 2, 3, 1)
        return self.head(self.b3(self.merge(self.b2(self.b1(x)))).mean((1, 2)))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.dw, self.ln = nn.Conv2d(dim, dim, 7, padding=3, groups=dim), nn.LayerNorm(dim)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))  # layer scale

    def forward(self, x):
        y = self.pw2(F.gelu(self.pw1(self.ln(self.dw(x).permute(0, 2, 3, 1))))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtNet(nn.Module):
    def __init__(self, dim: int = 8):
        super().__init__()
        self.stem, self.stem_ln = nn.Conv2d(3, dim, 4, stride=4), nn.LayerNorm(dim)
        self.blocks = nn.Sequential(ConvNeXtBlock(dim), ConvNeXtBlock(dim))
        self.down_ln, self.down = nn.LayerNorm(dim), nn.Conv2d(dim, 2 * dim, 2, stride=2)
        self.block2 = ConvNeXtBlock(2 * dim)
        self.head_ln, self.head = nn.LayerNorm(2 * dim), nn.Linear(2 * dim, 5)

    def forward(self, x):
        x = self.stem_ln(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.down(self.down_ln(self.blocks(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2))
        return self.head(self.head_ln(self.block2(x).mean((2, 3))))


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)).mean(1))


class LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm, self.fc = nn.LSTM(6, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.lstm(x)[0][:, -1])


# name -> (module factory, input shape)
MODELS = {
    "window_block": (WindowAttention, (2, 7, 6, 8)),
    "swin_net": (SwinNet, (2, 3, 28, 24)),
    "convnext_net": (ConvNeXtNet, (2, 3, 32, 32)),
    "transformer_encoder": (Encoder, (2, 5, 8)),
    "lstm": (LSTMNet, (2, 5, 6)),
}


def export(name: str, dynamo: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray], np.ndarray]:
    """(the eval-mode model exported to ONNX with input ``x`` and output ``y``, its feeds,
    torch's output). TorchScript exports at opset 18, dynamo at its default."""
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    module = factory().eval()
    with torch.no_grad():  # distinct LayerNorm params: an exporter merges initializers of equal values
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            proto = torch.onnx.export(module, (x,), dynamo=True, verbose=False, input_names=["x"],
                                      output_names=["y"]).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(module, (x,), buffer, dynamo=False, opset_version=18, input_names=["x"],
                              output_names=["y"])
            proto = onnx.load_from_string(buffer.getvalue())
        with torch.no_grad():
            expected = module(x).numpy()
    return proto, {"x": x.numpy()}, expected
