"""Sweep PyTorch modules through both torch.onnx exporters and check graphc on each export.

For every module in ``MODULES`` and each exporter (TorchScript at opset 18, dynamo), the loss
``sum(module(*inputs) * w)`` (w fixed) is exported and checked, one mode per run:

    grad    gc's gradients of every input (float64) against torch.autograd
    train   float32 export: training artifacts, gradients equal on numpy and onnxruntime,
            three finite onnxruntime Trainer steps
    deploy  float32 export deployed as a Triton model at opset 17: onnxruntime outputs equal
    parity  float32 export: numpy backend and onnxruntime outputs equal

    .venv/bin/python scripts/torch_sweep.py grad [--only NAME ...]

Prints one line per module and exporter (OK, MISMATCH, ERROR with the reason) and the counts.
An ERROR raised by torch's exporter is torch's, not graphc's; the line says which. Needs torch.

``zoo`` sweeps the test-scale architectures of tests/torch_zoo.py (ResNet, MobileNet,
ShuffleNet, Swin-style window attention, BERT, GPT, LSTM/GRU LM), freshly exported, as a classifier trained with
cross-entropy, and prints a table per model x exporter: forward parity (max relative error of
the inference graph on numpy and onnxruntime against torch), the trainable set against
``named_parameters()``, the float64 gradient error against torch.autograd (the largest
difference over the largest gradient), the loss gap to
torch after 20 AdamW steps (onnxruntime, float32), node counts of gc -O3 / onnxsim / onnxslim
(those installed) and deploy at opset 17 (max relative error)::

    .venv/bin/python scripts/torch_sweep.py zoo
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import pathlib
import sys
import tempfile
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import rivals
import torch

import graphc as gc
from graphc.passes.autodiff import gradient_model

nn, F = torch.nn, torch.nn.functional


def R(*shape):  # noqa: N802 - a short name for the table below
    return torch.randn(*shape, dtype=torch.float64)


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q):
        return self.m(q, q, q, need_weights=False)[0]


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x, memory):
        return self.d(x, memory)


class Cells(nn.Module):
    def __init__(self):
        super().__init__()
        self.g, self.l = nn.GRUCell(3, 4), nn.LSTMCell(3, 4)

    def forward(self, x):
        return self.g(x) + self.l(x)[1]


class MBBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Sequential(nn.Conv2d(4, 12, 1), nn.BatchNorm2d(12), nn.ReLU6(),
                               nn.Conv2d(12, 12, 3, padding=1, groups=12), nn.BatchNorm2d(12), nn.ReLU6(),
                               nn.Conv2d(12, 4, 1), nn.BatchNorm2d(4))

    def forward(self, x):
        return x + self.b(x)


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch, self.cls = nn.Conv2d(3, 8, 4, stride=4), nn.Parameter(torch.randn(1, 1, 8) * 0.1)
        self.pos = nn.Parameter(torch.randn(1, 5, 8) * 0.1)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, activation="gelu")
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        return self.head(self.enc(torch.cat([self.cls.expand(x.shape[0], -1, -1), t], 1) + self.pos)[:, 0])


class ConvNeXt(nn.Module):
    def __init__(self):
        super().__init__()
        self.dw, self.ln = nn.Conv2d(4, 4, 7, padding=3, groups=4), nn.LayerNorm(4)
        self.pw1, self.pw2, self.gamma = nn.Linear(4, 16), nn.Linear(16, 4), nn.Parameter(torch.full((4,), 0.5))

    def forward(self, x):
        y = self.pw2(F.gelu(self.pw1(self.ln(self.dw(x).permute(0, 2, 3, 1))))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class Conformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.pw1, self.pw2 = nn.LayerNorm(4), nn.Conv1d(4, 8, 1), nn.Conv1d(4, 4, 1)
        self.dw, self.bn = nn.Conv1d(4, 4, 3, padding=1, groups=4), nn.BatchNorm1d(4)

    def forward(self, x):
        y = F.glu(self.pw1(self.ln(x).transpose(1, 2)), dim=1)
        return x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)


# name -> (module factory, inputs)
torch.manual_seed(0)  # the inputs below: the same in every run (a random draw can land on a kink)
MODULES = {
    "transformer_encoder_norm_first": (lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                                                         norm_first=True), [R(2, 5, 8)]),
    "transformer_decoder": (Decoder, [R(2, 4, 8), R(2, 3, 8)]),
    "multihead_attention": (MHA, [R(2, 4, 8)]),
    "gru_lstm_cells": (Cells, [R(2, 3)]),
    "lstm_bidirectional": (lambda: nn.LSTM(3, 4, num_layers=2, batch_first=True, bidirectional=True), [R(2, 5, 3)]),
    "gru": (lambda: nn.GRU(3, 4, batch_first=True), [R(2, 5, 3)]),
    "conv1d_adaptive_pool": (lambda: nn.Sequential(nn.Conv1d(3, 4, 3, stride=2), nn.AdaptiveAvgPool1d(1)), [R(2, 3, 9)]),
    "conv3d_avgpool3d_ceil": (lambda: nn.Sequential(nn.Conv3d(2, 3, 2), nn.AvgPool3d(2, ceil_mode=True)),
                              [R(1, 2, 4, 5, 4)]),
    "conv_padding_modes": (lambda: nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect"),
                                                 nn.Conv2d(3, 2, 3, padding=2, padding_mode="circular")), [R(1, 2, 5, 5)]),
    "conv_transpose_groups": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                              [R(1, 4, 3, 3)]),
    "maxpool_ceil_dilation": (lambda: nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True), [R(1, 2, 7, 8)]),
    "avgpool_ceil_exclude_pad": (lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
                                 [R(1, 2, 7, 8)]),
    "adaptive_avg_pool_non_divisible": (lambda: nn.AdaptiveAvgPool2d((3, 5)), [R(1, 2, 7, 8)]),
    "adaptive_max_pool": (lambda: nn.AdaptiveMaxPool2d((2, 2)), [R(1, 2, 4, 6)]),
    "lp_pool": (lambda: nn.LPPool2d(2, 2), [R(1, 2, 4, 4)]),
    "max_unpool": (lambda: Fn(lambda x: F.max_unpool2d(*F.max_pool2d(x, 2, return_indices=True), 2)), [R(1, 2, 4, 4)]),
    "upsample_nearest": (lambda: nn.Upsample(scale_factor=2, mode="nearest"), [R(1, 2, 3, 4)]),
    "interpolate_bicubic_align": (lambda: Fn(lambda x: F.interpolate(x, size=(5, 7), mode="bicubic", align_corners=True)),
                                  [R(1, 2, 3, 4)]),
    "interpolate_bilinear_1p5": (lambda: Fn(lambda x: F.interpolate(x, scale_factor=1.5, mode="bilinear")), [R(1, 2, 4, 4)]),
    "interpolate_nearest_exact": (lambda: Fn(lambda x: F.interpolate(x, size=(7, 5), mode="nearest-exact")),
                                  [R(1, 2, 4, 3)]),
    "pixel_shuffle": (lambda: nn.PixelShuffle(2), [R(1, 8, 3, 3)]),
    "pixel_unshuffle": (lambda: nn.PixelUnshuffle(2), [R(1, 2, 4, 6)]),
    "fold": (lambda: nn.Fold((4, 5), 2), [R(1, 8, 12)]),
    "unfold": (lambda: Fn(lambda x: F.unfold(x, 2)), [R(1, 2, 3, 4)]),
    "affine_grid_sample": (lambda: Fn(lambda x, t: F.grid_sample(x, F.affine_grid(t.reshape(1, 2, 3), (1, 2, 4, 5),
                                                                                   align_corners=False),
                                                                 align_corners=False)), [R(1, 2, 4, 5), R(6) * 0.3]),
    "group_norm": (lambda: nn.GroupNorm(2, 4), [R(2, 4, 3, 3)]),
    "instance_norm_affine": (lambda: nn.InstanceNorm2d(3, affine=True), [R(2, 3, 4, 4)]),
    "rms_norm": (lambda: nn.RMSNorm(6), [R(2, 3, 6)]),
    "local_response_norm_glu": (lambda: nn.Sequential(nn.LocalResponseNorm(3), nn.Softmax2d(),
                                                      Fn(lambda x: F.glu(x, dim=1))), [R(1, 4, 3, 3)]),
    "activations": (lambda: nn.Sequential(nn.PReLU(3), nn.Hardswish(), nn.Mish(), nn.SiLU(), nn.GELU("tanh")),
                    [R(2, 3, 4)]),
    "activations_2": (lambda: nn.Sequential(nn.CELU(0.7), nn.SELU(), nn.Hardtanh(-0.5, 0.8), nn.ReLU6(),
                                            nn.Softplus(beta=2, threshold=5), nn.ELU(0.4)), [R(3, 6) * 2]),
    "shrinks_softmin": (lambda: nn.Sequential(nn.Softmin(1), nn.LogSigmoid(), nn.Softshrink(0.1), nn.Hardshrink(0.05),
                                              nn.Tanhshrink()), [R(3, 4)]),
    "hardsigmoid_log_softmax": (lambda: Fn(lambda x: F.hardsigmoid(x) + F.log_softmax(x, dim=0)), [R(3, 4) * 3]),
    "cumsum_flip_roll": (lambda: Fn(lambda x: torch.roll(torch.flip(torch.cumsum(x, 1), [2]), 1, 1)), [R(2, 4, 3)]),
    "topk_sort": (lambda: Fn(lambda x: torch.topk(x, 2, dim=1).values.sum(1) + torch.sort(x, dim=1).values[:, 0]),
                  [R(3, 5)]),
    "masked_fill_where": (lambda: Fn(lambda x: torch.where(x > 0.2, x * 2, x.masked_fill(x < -0.5, 0.3))), [R(3, 4)]),
    "einsum_baddbmm": (lambda: Fn(lambda a, b: torch.baddbmm(torch.einsum("bij,bjk->bik", a, b), a, b, beta=0.5,
                                                             alpha=2.0)), [R(2, 3, 3), R(2, 3, 3)]),
    "normalize_cosine": (lambda: Fn(lambda a, b: F.cosine_similarity(a, b) + F.normalize(a, dim=1).sum(1)),
                         [R(3, 4), R(3, 4)]),
    "reductions": (lambda: Fn(lambda x: torch.logsumexp(x, 1) + x.var(1) + x.std(1, unbiased=False) + torch.norm(x, dim=1)
                              + torch.amax(x, 1) + torch.prod(x, 1)), [R(3, 5)]),
    "atan2_fmod_remainder": (lambda: Fn(lambda a, b: torch.atan2(a, b) + torch.fmod(a, 0.7) + torch.remainder(a, 0.6)),
                             [R(3, 4), R(3, 4)]),
    "losses_inside": (lambda: Fn(lambda x, t: F.cross_entropy(x, torch.tensor([1, 0, 3]))
                                 + F.kl_div(F.log_softmax(x, 1), F.softmax(t, 1), reduction="batchmean")
                                 + F.smooth_l1_loss(x, t, beta=0.5)), [R(3, 4), R(3, 4)]),
    "clamp_minimum_maximum": (lambda: Fn(lambda x, y: torch.clamp(x, min=-0.3) + torch.maximum(x, y) + torch.minimum(x, y)),
                              [R(3, 4), R(3, 4)]),
    "triu_tril": (lambda: Fn(lambda x: torch.triu(x, 1) + torch.tril(x, -1) * 2), [R(4, 4)]),
    "repeat_interleave_tile": (lambda: Fn(lambda x: torch.repeat_interleave(x, 2, dim=1) + torch.tile(x, (1, 2))),
                               [R(2, 3)]),
    "embedding_bag": (lambda: Fn(lambda w: F.embedding_bag(torch.tensor([[1, 2, 4], [4, 3, 2]]), w, mode="mean")),
                      [R(6, 3)]),
    "bilinear": (lambda: nn.Bilinear(3, 4, 2), [R(2, 3), R(2, 4)]),
    "sdpa_float_mask": (lambda: Fn(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)),
                        [R(1, 2, 3, 4), R(1, 2, 5, 4), R(1, 2, 5, 4), R(3, 5)]),
    "mobilenet_block": (lambda: MBBlock().eval(), [R(2, 4, 6, 6)]),
    "vit": (lambda: ViT().eval(), [R(2, 3, 8, 8)]),
    "convnext_block": (ConvNeXt, [R(2, 4, 8, 8)]),
    "conformer_conv": (lambda: Conformer().eval(), [R(2, 6, 4)]),
}


class Loss(nn.Module):
    """sum(body(*inputs) * w), w a fixed buffer of the output's shape."""

    def __init__(self, body, inputs, dtype):
        super().__init__()
        self.body = body.to(dtype)
        with torch.no_grad():
            y = self.body(*inputs)
        y = y[0] if isinstance(y, tuple) else y
        self.register_buffer("w", torch.sin(torch.arange(y.numel(), dtype=dtype).reshape(y.shape) * 0.37 + 0.1))
        self.train(body.training)

    def forward(self, *xs):
        y = self.body(*xs)
        return ((y[0] if isinstance(y, tuple) else y) * self.w).sum()


@contextlib.contextmanager
def _quiet_fds():
    """Stdout and stderr of this process, C++ writers included, go to /dev/null meanwhile."""
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as null:
        sys.stdout.flush()
        os.dup2(null.fileno(), 1)
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def export(name: str, dynamo: bool, dtype=torch.float64):
    """(torch module, ONNX proto, input feeds) of a module's loss."""
    factory, inputs = MODULES[name]
    torch.manual_seed(1)
    inputs = [t.to(dtype) for t in inputs]
    module = Loss(factory(), inputs, dtype)
    names = [f"in{i}" for i in range(len(inputs))]
    with warnings.catch_warnings(), _quiet_fds():  # torch prints its IR on failure, from C++ too
        warnings.simplefilter("ignore")
        try:
            if dynamo:
                proto = torch.onnx.export(module, tuple(inputs), dynamo=True, verbose=False, input_names=names,
                                          output_names=["loss"]).model_proto
            else:
                buffer = io.BytesIO()
                torch.onnx.export(module, tuple(inputs), buffer, dynamo=False, opset_version=18, input_names=names,
                                  output_names=["loss"])
                proto = onnx.load_from_string(buffer.getvalue())
        except Exception as exc:  # noqa: BLE001 - reported as torch's own failure
            raise RuntimeError(f"torch's exporter: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}") from None
    return module, proto, dict(zip(names, inputs))


def check_grad(name: str, dynamo: bool) -> str:
    module, proto, inputs = export(name, dynamo)
    grads = gc.Model(gradient_model(ir.serde.deserialize_model(proto), "loss", list(inputs)))
    got = gc.Session(grads, backend="numpy").run({n: t.numpy() for n, t in inputs.items()})
    leaves = {n: t.clone().requires_grad_() for n, t in inputs.items()}
    module(*leaves.values()).backward()
    bad = [f"{n}: max err {np.abs(got[f'{n}_grad'] - t.grad.numpy()).max():.3g}" for n, t in leaves.items()
           if not np.allclose(got[f"{n}_grad"], t.grad.numpy(), rtol=1e-6, atol=1e-8)]
    return "; ".join(bad)


def check_train(name: str, dynamo: bool) -> str:
    _, proto, inputs = export(name, dynamo, torch.float32)
    feeds = {n: t.numpy() for n, t in inputs.items()}
    if not any(t.data_type == onnx.TensorProto.FLOAT and len(t.dims) for t in proto.graph.initializer):
        return ""  # nothing to train
    arts = gc.training.generate(gc.load(proto), "loss", gc.optim.SGD(0.01))
    on_numpy = gc.Session(arts.gradients, backend="numpy").run(feeds)
    on_ort = gc.Session(arts.gradients, backend="ort-cpu").run(feeds)
    bad = [k for k in on_numpy if not np.allclose(on_numpy[k], on_ort[k], rtol=1e-3, atol=1e-4)]
    trainer = gc.Trainer(arts, backend="ort-cpu")
    losses = [float(trainer.step(feeds)) for _ in range(3)]
    return "; ".join([*(f"{k} differs on numpy and onnxruntime" for k in bad),
                      *([f"losses {losses}"] if not np.all(np.isfinite(losses)) else [])])


def check_deploy(name: str, dynamo: bool) -> str:
    _, proto, inputs = export(name, dynamo, torch.float32)
    feeds = {n: t.numpy() for n, t in inputs.items()}
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        onnx.save(proto, folder / "m.onnx")
        expected = gc.Session(gc.load(folder / "m.onnx"), backend="numpy").run(feeds)["loss"]
        served = gc.load(gc.deploy.triton(folder / "m.onnx", folder / "repo", "m") / "1" / "model.onnx")
        got = gc.Session(served, backend="ort-cpu").run(feeds)["loss"]
    return "" if np.allclose(got, expected, rtol=1e-4, atol=1e-5) else f"{float(got)} vs {float(expected)}"


def check_parity(name: str, dynamo: bool) -> str:
    _, proto, inputs = export(name, dynamo, torch.float32)
    feeds = {n: t.numpy() for n, t in inputs.items()}
    model = gc.load(proto)
    a, b = (gc.Session(model, backend=backend).run(feeds)["loss"] for backend in ("numpy", "ort-cpu"))
    return "" if np.allclose(a, b, rtol=1e-4, atol=1e-5) else f"numpy {float(a)} vs onnxruntime {float(b)}"


CHECKS = {"grad": check_grad, "train": check_train, "deploy": check_deploy, "parity": check_parity}


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))


def zoo_row(name: str, exporter: str) -> dict[str, str]:
    """One row of the ``zoo`` table (see the module docstring)."""
    import copy

    import torch_zoo

    loss_spec = gc.losses.cross_entropy("logits", label="y")
    module, x, y = torch_zoo.build(name)
    wide = copy.deepcopy(module).double()
    x64 = x.double() if x.is_floating_point() else x
    with _quiet_fds():
        proto, proto64 = torch_zoo.export(module, x, exporter), torch_zoo.export(wide, x64, exporter)
    module.eval()
    with torch.no_grad():
        expected = module(x).numpy()
    module.train()
    theirs, opt = [], torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.01)
    for _ in range(20):
        opt.zero_grad()
        loss = F.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    F.cross_entropy(wide(x64), y).backward()

    row = {}
    arts = gc.training.generate(gc.load(proto), loss_spec, gc.optim.AdamW(1e-2, weight_decay=0.01))
    parity = [_rel(gc.Session(arts.inference, backend=b).run({"x": x.numpy()})["logits"], expected)
              for b in ("numpy", "ort-cpu")]
    row["parity"] = f"{max(parity):.1e}"
    names = [n for n, _ in module.named_parameters()]
    trainable = arts.manifest.trainable
    by_name = sum(n in names for n in trainable)
    row["trainable"] = (f"{by_name}/{len(names)} by name + {len(trainable) - by_name} folded, "
                        f"{len(arts.manifest.constants)} constants")
    arts64 = gc.training.generate(gc.load(proto64), loss_spec, gc.optim.SGD(0.1))
    got = gc.Session(arts64.gradients, backend="numpy").run({"x": x64.numpy(), "y": y.numpy()})
    params = dict(wide.named_parameters())
    named = [n for n in arts64.manifest.trainable if n in params]
    folded = [n for n in arts64.manifest.trainable if n not in params]
    missing = [n for n in params if n not in arts64.manifest.trainable]
    # each difference over the largest gradient of any param (the test's tolerance): a conv bias
    # before a BatchNorm has a zero gradient that both compute as 1e-17 noise
    scale = max(float(np.abs(p.grad.numpy()).max()) for p in params.values())
    errors = [float(np.abs(got[f"{n}_grad"] - params[n].grad.numpy()).max()) / scale for n in named]
    have = np.sort(np.concatenate([got[f"{n}_grad"].ravel() for n in folded] or [np.zeros(0)]))
    want = np.sort(np.concatenate([params[n].grad.numpy().ravel() for n in missing] or [np.zeros(0)]))
    have, want = have[have != 0], want[want != 0]
    errors.append(float(np.abs(have - want).max()) / scale if have.shape == want.shape and have.size
                  else 0.0 if not have.size and not want.size else float("inf"))
    row["grad err (f64)"] = f"{max(errors):.1e}"
    trainer = gc.Trainer(arts, backend="ort-cpu")
    ours = [trainer.step({"x": x.numpy(), "y": y.numpy()}) for _ in range(20)]
    row["20-step loss gap"] = f"{max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)):.1e}"
    row["nodes (-O3 / rivals)"] = rivals.describe(rivals.node_counts(proto))
    with tempfile.TemporaryDirectory() as folder:
        served = gc.load(gc.deploy.triton(gc.load(proto), folder, "m") / "1" / "model.onnx")
        outputs = gc.Session(served, backend="ort-cpu").run({"x": x.numpy()})["logits"]
        row["deploy@17"] = f"{_rel(outputs, expected):.1e}"
    return row


def zoo_main() -> None:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
    import torch_zoo

    torch.set_num_threads(1)
    header = ["model", "exporter", "parity", "trainable", "grad err (f64)", "20-step loss gap",
              "nodes (-O3 / rivals)", "deploy@17"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in torch_zoo.ZOO:
        for exporter in torch_zoo.EXPORTERS:
            try:
                row = zoo_row(name, exporter)
            except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
                row = {"parity": f"ERROR {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"}
            print("| " + " | ".join([name, exporter, *(row.get(h, "") for h in header[2:])]) + " |", flush=True)


def main() -> None:
    if sys.argv[1:2] == ["zoo"]:
        zoo_main()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=sorted([*CHECKS, "zoo"]))
    parser.add_argument("--only", nargs="+", default=sorted(MODULES), choices=sorted(MODULES), metavar="NAME")
    args = parser.parse_args()
    counts = {"OK": 0, "MISMATCH": 0, "ERROR (graphc)": 0, "ERROR (torch export)": 0}
    for name in args.only:
        for dynamo in (False, True):
            try:
                problem = CHECKS[args.mode](name, dynamo)
                verdict = "OK" if not problem else "MISMATCH"
            except RuntimeError as exc:
                problem = str(exc)
                verdict = "ERROR (torch export)" if problem.startswith("torch's exporter") else "ERROR (graphc)"
            except Exception as exc:  # noqa: BLE001 - every failure is a line of the report
                problem, verdict = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", "ERROR (graphc)"
            counts[verdict] += 1
            print(f"{name:34s} {'dynamo' if dynamo else 'torchscript':11s} {verdict}{': ' + problem if problem else ''}",
                  flush=True)
    print(", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    main()
