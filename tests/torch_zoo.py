"""Test-scale PyTorch architectures (small widths and inputs) for the import sweep: each is a
classifier ``logits = module(x)`` trained with cross-entropy, exported by both ``torch.onnx``
exporters (``export``). Used by tests/test_torch_zoo.py and scripts/torch_sweep.py; needs torch.

``scripts/export_torch_models.py`` writes each export (float32 and float64) and the module's
state, input and labels under ``tests/data/zoo/``, so the tests need not run the (slow) exporters;
``load`` rebuilds the module from that state."""

from __future__ import annotations

import io
import math
import warnings

import onnx
import torch
from torch import nn
from torch.nn import functional as F
from torch_blocks import WindowAttention

CLASSES = 5
VOCAB = 13


class ResNetBlocks(nn.Module):
    """Stem, a basic residual block and a downsampling block with a 1x1 projection, pool, fc."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                               nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8))
        self.b = nn.Sequential(nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(12), nn.ReLU(),
                               nn.Conv2d(12, 12, 3, padding=1, bias=False), nn.BatchNorm2d(12))
        self.down = nn.Sequential(nn.Conv2d(8, 12, 1, stride=2, bias=False), nn.BatchNorm2d(12))
        self.fc = nn.Linear(12, CLASSES)

    def forward(self, x):
        x = self.stem(x)
        x = F.relu(x + self.a(x))
        x = F.relu(self.down(x) + self.b(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MobileNetBlocks(nn.Module):
    """Inverted residual: 1x1 expand, depthwise 3x3, squeeze-excite (hardsigmoid), hardswish."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(16), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.Hardswish())
        self.se1, self.se2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.project = nn.Sequential(nn.Conv2d(16, 8, 1), nn.BatchNorm2d(8))
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, x):
        x = self.stem(x)
        y = self.dw(self.expand(x))
        y = y * F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
        x = x + self.project(y)
        return self.fc(x.mean((2, 3)))


class ShuffleBlocks(nn.Module):
    """ShuffleNetV2 units: ``torch.chunk`` into two halves, a branch on one, concat, channel shuffle."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.branch = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4), nn.ReLU(),
                                    nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.BatchNorm2d(4),
                                    nn.Conv2d(4, 4, 1), nn.ReLU())
        self.fc = nn.Linear(8, CLASSES)

    @staticmethod
    def shuffle(x, groups=2):
        n, c, h, w = x.shape
        return x.reshape(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)

    def forward(self, x):
        x = self.stem(x)
        for _ in range(2):
            a, b = x.chunk(2, dim=1)
            x = self.shuffle(torch.cat([a, self.branch(b)], 1))
        return self.fc(x.mean((2, 3)))


class Encoder(nn.Module):
    """BERT-style: token + position embeddings, LayerNorm, self-attention with a padding mask
    filled with float32's minimum (-3.4e38; the dynamo exporter writes float64's as -inf, and
    0 * -inf is NaN), GELU feed-forward, first-token pooler with tanh."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(VOCAB, dim), nn.Embedding(8, dim)
        self.ln0, self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ff1, self.ff2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.pool, self.fc = nn.Linear(dim, dim), nn.Linear(dim, CLASSES)
        self.register_buffer("position_ids", torch.arange(8).unsqueeze(0), persistent=False)

    def forward(self, x):
        b, t = x.shape
        h = self.ln0(self.tok(x) + self.pos(self.position_ids[:, :t]))
        mask = (x != 0).to(h.dtype)[:, None, None, :]
        mask = (1.0 - mask) * torch.finfo(torch.float32).min
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(h).chunk(3, -1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + mask
        ctx = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        h = self.ln1(h + self.out(ctx))
        h = self.ln2(h + self.ff2(F.gelu(self.ff1(h))))
        return self.fc(torch.tanh(self.pool(h[:, 0])))


class NewGELU(nn.Module):
    """GPT-2's tanh GELU, written out as in minGPT (its constants are the exporter's, not params)."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Decoder(nn.Module):
    """GPT-style: causal self-attention with a ``tril`` mask buffer, NewGELU MLP, pre-norm,
    logits of the last position."""

    def __init__(self, dim=16, heads=2, block=8):
        super().__init__()
        self.heads = heads
        self.tok, self.pos = nn.Embedding(VOCAB, dim), nn.Parameter(torch.randn(1, block, dim) * 0.1)
        self.ln1, self.ln2, self.lnf = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.act, self.mproj = nn.Linear(dim, 4 * dim), NewGELU(), nn.Linear(4 * dim, dim)
        self.head = nn.Linear(dim, CLASSES)
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        b, t = x.shape
        h = self.tok(x) + self.pos[:, :t]
        q, k, v = self.attn(self.ln1(h)).split(h.shape[-1], dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        h = h + self.proj((att @ v).transpose(1, 2).contiguous().view(b, t, -1))
        h = h + self.mproj(self.act(self.fc(self.ln2(h))))
        return self.head(self.lnf(h)[:, -1])


class RecurrentLM(nn.Module):
    """Embedding, LSTM, GRU (zero initial states made by the exporter), mean over time, head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, x):
        y, _ = self.lstm(self.emb(x))
        y, _ = self.gru(y)
        return self.head(y.mean(1))


class WindowNet(nn.Module):
    """Swin-style: a 1x1 patch embedding, a shifted window-attention block whose padding of H
    and W up to a multiple of the window is computed from the input's shape (7x6 -> 8x8),
    window partition, attention with a relative position bias, reverse; mean, head."""

    def __init__(self, dim=8):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 1)
        self.block = WindowAttention(dim, heads=2, window=4, shift=2)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, x):
        return self.head(self.block(self.patch(x).permute(0, 2, 3, 1)).mean((1, 2)))


def _tokens(gen):
    x = torch.randint(1, VOCAB, (4, 6), generator=gen)
    x[0, 4:] = 0  # padding, for the encoder's mask
    return x


# name -> (module class, example input maker(generator))
ZOO = {
    "resnet": (ResNetBlocks, lambda gen: torch.randn(4, 3, 8, 8, generator=gen)),
    "mobilenet": (MobileNetBlocks, lambda gen: torch.randn(4, 3, 8, 8, generator=gen)),
    "shufflenet": (ShuffleBlocks, lambda gen: torch.randn(4, 3, 6, 6, generator=gen)),
    "window_attention": (WindowNet, lambda gen: torch.randn(4, 3, 7, 6, generator=gen)),
    "bert": (Encoder, _tokens),
    "gpt": (Decoder, _tokens),
    "lstm_gru_lm": (RecurrentLM, _tokens),
}
EXPORTERS = ("torchscript", "dynamo")


def build(name: str, dtype=torch.float32, seed: int = 0):
    """(module in train mode, input x, labels y), the same for a given seed."""
    cls, make_x = ZOO[name]
    torch.manual_seed(seed)
    module = cls().to(dtype).train()
    with torch.no_grad():  # norm layers as after training: distinct values, which the dynamo
        for sub in module.modules():  # exporter would otherwise merge into one initializer
            if isinstance(sub, (nn.LayerNorm, nn.BatchNorm2d)):
                sub.weight.uniform_(0.5, 1.5)
                sub.bias.uniform_(-0.5, 0.5)
            if isinstance(sub, nn.BatchNorm2d):
                sub.running_mean.uniform_(-0.2, 0.2)
                sub.running_var.uniform_(0.5, 1.5)
    gen = torch.Generator().manual_seed(seed)
    x = make_x(gen)
    x = x.to(dtype) if x.is_floating_point() else x
    y = torch.randint(0, CLASSES, (x.shape[0],), generator=gen)
    return module, x, y


def exporter_folds_params(module: nn.Module) -> bool:
    """Whether the exporters' constant folding would merge a parameter with constants into a
    tensor PyTorch does not train: BatchNorm fused into the Conv before it, Swin's relative
    position bias table gathered by its constant index."""
    return any(isinstance(m, (nn.modules.batchnorm._BatchNorm, WindowAttention)) for m in module.modules())


def export(module: nn.Module, x: torch.Tensor, exporter: str, optimize: bool | None = None) -> onnx.ModelProto:
    """``module`` in eval mode exported with input ``x`` and output ``logits``, with each
    exporter's defaults except where those fold a parameter into a tensor PyTorch does not
    train (``exporter_folds_params``): there TorchScript runs without ``do_constant_folding``
    and dynamo with ``optimize=False`` (``optimize`` overrides)."""
    fold = not exporter_folds_params(module) if optimize is None else optimize
    training = module.training
    module.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                program = torch.onnx.export(module, (x,), dynamo=True, optimize=fold, verbose=False,
                                            input_names=["x"], output_names=["logits"])
                return program.model_proto
            buffer = io.BytesIO()
            torch.onnx.export(module, (x,), buffer, dynamo=False, opset_version=18, input_names=["x"],
                              output_names=["logits"], do_constant_folding=fold)
            return onnx.load_from_string(buffer.getvalue())
    finally:
        module.train(training)


DATA = __import__("pathlib").Path(__file__).resolve().parent / "data" / "zoo"


def files(name: str, exporter: str, dtype: str = "float32"):
    """(the export's path, the state file's path) under ``DATA``."""
    suffix = "" if dtype == "float32" else f"_{dtype}"
    return DATA / f"{name}_{exporter}{suffix}.onnx", DATA / f"{name}.npz"


def save(name: str) -> list:
    """Write the exports and state of ``name`` under ``DATA``; returns the paths written."""
    import numpy as np

    DATA.mkdir(parents=True, exist_ok=True)
    module, x, y = build(name)
    written = []
    for exporter in EXPORTERS:
        for dtype, torch_dtype in (("float32", torch.float32), ("float64", torch.float64)):
            path, _ = files(name, exporter, dtype)
            wide = module if dtype == "float32" else __import__("copy").deepcopy(module).to(torch_dtype)
            xs = x.to(torch_dtype) if x.is_floating_point() else x
            proto = export(wide, xs, exporter)
            for node in proto.graph.node:  # the dynamo exporter's stack traces: most of the bytes
                del node.metadata_props[:]
            onnx.save(proto, path)
            written.append(path)
    state = {f"state.{k}": v.detach().numpy() for k, v in module.state_dict().items()}
    state_path = files(name, EXPORTERS[0])[1]
    np.savez(state_path, x=x.numpy(), y=y.numpy(), **state)
    return [*written, state_path]


def load(name: str, dtype=torch.float32):
    """(module in train mode, x, y) as ``save`` stored them, in ``dtype``."""
    import numpy as np

    with np.load(files(name, EXPORTERS[0])[1], allow_pickle=False) as data:
        module = ZOO[name][0]()
        module.load_state_dict({k[len("state."):]: torch.from_numpy(data[k]) for k in data.files
                                if k.startswith("state.")})
        x, y = torch.from_numpy(data["x"]), torch.from_numpy(data["y"])
    module = module.to(dtype).train()
    return module, (x.to(dtype) if x.is_floating_point() else x), y
