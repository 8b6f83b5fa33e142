"""graphc's training step against PyTorch eager on real architectures, at 2 threads.

    .venv/bin/python scripts/bench_zoo.py [--models resnet18,resnet50] [--batches 2,32]
        [--image-size 64] [--rounds 5] [--steps 2] [--recompute] [--device cpu|cuda]
        [--cuda-graph] [--cuda-option KEY=VALUE ...] [--keep-freed] [--repeat 1] [--json results.json]

Models (plain torch.nn, random init, no dropout or stochastic depth so both frameworks run the
same computation): resnet18, resnet50, efficientnet_b0, mobilenetv3_small, regnety_400mf (the
CNNs, 1000-class ImageNet heads on --image-size px images), vit (ViT-Ti/8: dim 192, depth 12,
3 heads, 1000 classes) and gpt (GPT-2 style decoder: vocab 2048, 128 tokens, dim 256, 6 layers,
4 heads, tied LM head; logits flattened to [N*128, 2048] for next-token cross-entropy).

Each model is exported with torch.onnx (TorchScript, opset 17), imported with ``gc.load`` and
given AdamW(1e-3) training artifacts; graphc trains them on onnxruntime CPU, PyTorch trains the
same module with torch.optim.AdamW(lr=1e-3). ``--device cuda`` runs both on GPU 0 instead
(graphc's artifacts generated with ``device="cuda"`` and trained on ``ort-cuda``, PyTorch on
``cuda``, each with its defaults); ``--cuda-graph`` trains graphc's with ``cuda_graph=True``
(its steps replayed as CUDA graphs) and times the Trainer without graphs beside it, in the same
rounds, after warm-up steps past the graphs' capture; the two Trainers' losses over their first
4 steps (same batches) are compared, a check that the replayed graphs train as the plain steps do.
``--cuda-option KEY=VALUE`` (repeatable) passes an onnxruntime CUDA provider option to graphc's
Trainers (``arena_extend_strategy=kSameAsRequested``, ``use_tf32=0``, ...). Per model and batch
size it reports:

- ms per step of each (feed the batch, forward, backward, update, read the loss): median over
  ``--rounds`` rounds in which the two take turns, ``--steps`` timed steps each after untimed
  ones (``bench_train.timed_turn``: the steady state of a training loop, not the switch from the
  other framework), so a busy machine slows both alike; and graphc / torch, with the lowest and
  highest of the rounds' own ratios ("rounds": how far this machine's noise moves it);
- the optimizer update's share of graphc's kernel time (nodes named ``optim/...``), from an
  onnxruntime profile of the train_step (on the CPU only: on the GPU the profile times kernel
  launches, not kernels), and the train_step's node count; beside it, for scale, PyTorch's own:
  the median ``opt.step()`` time over its median step time; and two floors, the shares the
  update would have (the step's other kernel time kept) as graphc's 11-node AdamW chain alone,
  over in-cache flat buffers of as many floats as the params and without the step's gathering
  and splitting (fewer elementwise ONNX nodes cannot compute AdamW: ``chain_floor_ms``), and as
  one fused kernel pass, PyTorch's fused AdamW on the same params. Where the chain floor passes
  the target, no update in standard ONNX ops can meet it on this machine;
- peak RSS of a fresh process that trains 5 steps, libraries included: graphc from the saved
  artifacts (without torch imported), PyTorch from the module; and graphc / torch. On the GPU
  instead the GPU memory such a process holds after 5 steps (nvidia-smi, CUDA context included;
  onnxruntime's arena and PyTorch's caching allocator keep their peak);
- how long ``gc.training.generate`` took.

Each (model, batch) row runs in a fresh process (``row_in_child``); ``--repeat N`` runs it in N
fresh processes one after the other and reports the run of median ratio, the lowest and highest
ratio and update share of the N beside it ("runs": how far this machine moves between processes,
where "rounds" is within one); ``--keep-freed`` has its
malloc keep what is freed (``KEEP_FREED``: PyTorch's CPU step, with glibc's defaults, returns
its large tensors' memory and faults it in again every step). It ends with a table
marking the rows that meet the targets (``TARGETS``). A row whose export,
``gc.load``, generate, Trainer or steps fail is reported as failed, with the error, and the others
still run. Needs torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

THREADS = 2
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(THREADS))
os.environ.setdefault("MKL_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402

import graphc as gc  # noqa: E402
from bench_train import interleaved_turns  # noqa: E402 - the turns of an interleaved benchmark

LR = 1e-3
MEMORY_STEPS = 5
# graphc/torch step time, update share of kernel time, graphc/torch peak RSS
TARGETS = {"ratio": {"cnn": 1.0, "transformer": 0.8}, "update_pct": 15.0, "memory_ratio": 1.1}


def peak_rss_mb() -> float:
    """This process's peak RSS (Linux's VmHWM; ru_maxrss would be at least the parent's RSS at
    the fork, which Linux carries over exec)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"^VmHWM:\s*(\d+) kB", status, re.M).group(1)) / 1024


def gpu_used_mb() -> float:
    """GPU 0's memory in use, all processes together (nvidia-smi)."""
    done = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[0])


def memory_meter(device: str) -> Callable[[], float]:
    """A function giving this process's peak memory in MB so far: peak RSS on the CPU; on the
    GPU the growth of GPU 0's memory in use since the meter was made."""
    if device == "cpu":
        return peak_rss_mb
    start = gpu_used_mb()
    return lambda: gpu_used_mb() - start


def graphc_memory_child(directory: str, device: str, cuda_graph: str, cuda_options: str) -> None:
    """Print the peak memory of training the artifacts in ``directory`` on its ``batch.npz``
    (``cuda_graph``: "graph" or ""; ``cuda_options``: JSON)."""
    meter = memory_meter(device)
    batch = dict(np.load(Path(directory) / "batch.npz"))
    trainer = gc.Trainer(directory, **backend_options(device, bool(cuda_graph), json.loads(cuda_options)))
    for _ in range(MEMORY_STEPS * (2 if cuda_graph else 1)):  # graphs: past their capture
        trainer.step(batch)
    print(meter())


def backend_options(device: str, cuda_graph: bool = False, cuda_options: dict | None = None) -> dict:
    """graphc's Trainer backend and options on ``device`` (``cuda_options``: CUDA provider options)."""
    if device == "cpu":
        return {"backend": "ort-cpu", "threads": THREADS}
    return {"backend": "ort-cuda", **({"cuda_graph": True} if cuda_graph else {}),
            **({"providers_options": cuda_options} if cuda_options else {})}


# The graphc memory child runs here, before torch is imported, so its memory holds none of torch.
if __name__ == "__main__" and sys.argv[1:3] == ["--child", "graphc"]:
    graphc_memory_child(*sys.argv[3:7])
    sys.exit(0)

try:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn
except ImportError:
    sys.exit("bench_zoo.py needs PyTorch: pip install torch")

NUM_CLASSES = 1000
VOCAB, SEQ = 2048, 128


# -- architectures --------------------------------------------------------------------------------

def conv_bn(cin: int, cout: int, k: int = 1, stride: int = 1, groups: int = 1, act=nn.ReLU) -> nn.Sequential:
    """Conv (no bias, "same" padding) + BatchNorm + ``act`` (none when None)."""
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


def classifier(cin: int) -> nn.Sequential:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, NUM_CLASSES))


class Residual(nn.Module):
    """ResNet/RegNet block: relu(body(x) + shortcut(x)), the shortcut a strided 1x1 conv + BN
    where the shape changes."""

    def __init__(self, body: nn.Module, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = body
        self.shortcut = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeeze: int, act=nn.ReLU, gate=nn.Sigmoid):
        super().__init__()
        self.scale = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, squeeze, 1), act(),
                                   nn.Conv2d(squeeze, channels, 1), gate())

    def forward(self, x):
        return x * self.scale(x)


class InvertedResidual(nn.Module):
    """MobileNetV3 / EfficientNet block: 1x1 expand (when ``expanded != cin``), kxk depthwise,
    squeeze-excite, 1x1 linear projection; identity residual when the shape is kept."""

    def __init__(self, cin: int, expanded: int, cout: int, k: int, stride: int, act, se: nn.Module | None):
        super().__init__()
        layers = [conv_bn(cin, expanded, act=act)] if expanded != cin else []
        layers.append(conv_bn(expanded, expanded, k, stride, groups=expanded, act=act))
        layers += [se] if se else []
        self.body = nn.Sequential(*layers, conv_bn(expanded, cout, act=None))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def resnet(bottleneck: bool, depths: tuple[int, ...]) -> nn.Sequential:
    """ResNet v1.5 (torchvision's): the stride sits on the 3x3 conv of a bottleneck."""
    expansion = 4 if bottleneck else 1
    layers, cin = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
    for stage, (width, depth) in enumerate(zip((64, 128, 256, 512), depths)):
        for i in range(depth):
            stride, cout = 2 if stage and not i else 1, width * expansion
            if bottleneck:
                body = nn.Sequential(conv_bn(cin, width), conv_bn(width, width, 3, stride),
                                     conv_bn(width, cout, act=None))
            else:
                body = nn.Sequential(conv_bn(cin, width, 3, stride), conv_bn(width, width, 3, act=None))
            layers.append(Residual(body, cin, cout, stride))
            cin = cout
    return nn.Sequential(*layers, classifier(cin))


def efficientnet_b0() -> nn.Sequential:
    layers, cin = [conv_bn(3, 32, 3, 2, act=nn.SiLU)], 32
    # (expansion, kernel, stride, channels, repeats) per stage: the paper's Table 1
    for e, k, s, cout, n in [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                             (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]:
        for i in range(n):
            se = SqueezeExcite(cin * e, max(1, cin // 4), nn.SiLU)
            layers.append(InvertedResidual(cin, cin * e, cout, k, s if i == 0 else 1, nn.SiLU, se))
            cin = cout
    return nn.Sequential(*layers, conv_bn(cin, 1280, act=nn.SiLU), classifier(1280))


def mobilenetv3_small() -> nn.Sequential:
    layers, cin = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)], 16
    # (kernel, expanded, channels, SE, hardswish, stride) per block: the paper's Table 2
    for k, exp, cout, se, hs, s in [(3, 16, 16, 1, 0, 2), (3, 72, 24, 0, 0, 2), (3, 88, 24, 0, 0, 1),
                                    (5, 96, 40, 1, 1, 2), (5, 240, 40, 1, 1, 1), (5, 240, 40, 1, 1, 1),
                                    (5, 120, 48, 1, 1, 1), (5, 144, 48, 1, 1, 1), (5, 288, 96, 1, 1, 2),
                                    (5, 576, 96, 1, 1, 1), (5, 576, 96, 1, 1, 1)]:
        squeeze = max(8, (exp // 4 + 4) // 8 * 8)  # a multiple of 8, as torchvision's
        block_se = SqueezeExcite(exp, squeeze, nn.ReLU, nn.Hardsigmoid) if se else None
        layers.append(InvertedResidual(cin, exp, cout, k, s, nn.Hardswish if hs else nn.ReLU, block_se))
        cin = cout
    return nn.Sequential(*layers, conv_bn(cin, 576, act=nn.Hardswish), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, NUM_CLASSES))


def regnety_400mf() -> nn.Sequential:
    """RegNetY-400MF: bottleneck ratio 1, group width 8, SE on a quarter of the block's input width."""
    layers, cin = [conv_bn(3, 32, 3, 2)], 32
    for width, depth in zip((48, 104, 208, 440), (1, 3, 6, 6)):
        for i in range(depth):
            stride = 2 if i == 0 else 1
            body = nn.Sequential(conv_bn(cin, width), conv_bn(width, width, 3, stride, groups=width // 8),
                                 SqueezeExcite(width, round(0.25 * cin)), conv_bn(width, width, act=None))
            layers.append(Residual(body, cin, width, stride))
            cin = width
    return nn.Sequential(*layers, classifier(cin))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) with a 4x GELU MLP."""

    def __init__(self, dim: int, heads: int, causal: bool = False):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """ViT-Ti/8: class token, learned positions, classifier on the class token."""

    def __init__(self, image_size: int, patch: int = 8, dim: int = 192, depth: int = 12, heads: int = 3):
        super().__init__()
        self.patches = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, (image_size // patch) ** 2 + 1, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, NUM_CLASSES)

    def forward(self, x):
        x = self.patches(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class GPT(nn.Module):
    """GPT-2 style decoder with the LM head tied to the token embedding; logits [N*T, vocab]."""

    def __init__(self, dim: int = 256, depth: int = 6, heads: int = 4):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, dim)
        self.pos = nn.Parameter(0.02 * torch.randn(1, SEQ, dim))
        self.blocks = nn.Sequential(*[Block(dim, heads, causal=True) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        h = self.norm(self.blocks(self.tokens(x) + self.pos))
        return F.linear(h, self.tokens.weight).flatten(0, 1)


@dataclass(frozen=True)
class Arch:
    build: Callable[[int], nn.Module]  # image size -> module
    kind: str  # "cnn" or "transformer": which step-time target applies
    tokens: bool = False  # input is token ids (next-token labels), else images (class labels)


ZOO = {
    "resnet18": Arch(lambda _: resnet(False, (2, 2, 2, 2)), "cnn"),
    "resnet50": Arch(lambda _: resnet(True, (3, 4, 6, 3)), "cnn"),
    "efficientnet_b0": Arch(lambda _: efficientnet_b0(), "cnn"),
    "mobilenetv3_small": Arch(lambda _: mobilenetv3_small(), "cnn"),
    "regnety_400mf": Arch(lambda _: regnety_400mf(), "cnn"),
    "vit": Arch(ViT, "transformer"),
    "gpt": Arch(lambda _: GPT(), "transformer", tokens=True),
}


def make_batch(arch: Arch, batch: int, image_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if arch.tokens:
        text = rng.integers(0, VOCAB, (batch, SEQ + 1))
        return {"x": text[:, :-1], "y": text[:, 1:].reshape(-1)}
    return {"x": rng.standard_normal((batch, 3, image_size, image_size), np.float32),
            "y": rng.integers(0, NUM_CLASSES, batch)}


# -- the two frameworks ---------------------------------------------------------------------------

def torch_stepper(model: nn.Module, batches: list[dict[str, np.ndarray]],
                  update_seconds: list[float] | None = None, device: str = "cpu") -> Callable[[int], float]:
    """A PyTorch training step on ``device`` (the batch copied there each step, as graphc's is);
    the time of each ``opt.step()`` goes to ``update_seconds``."""
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    tensors = [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]
    updates = update_seconds if update_seconds is not None else []
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None

    def step(i: int) -> float:
        b = {k: v.to(device) for k, v in tensors[i % len(tensors)].items()}
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(b["x"]), b["y"])
        loss.backward()
        sync()
        t0 = time.perf_counter()
        opt.step()
        sync()
        updates.append(time.perf_counter() - t0)
        return loss.item()

    return step


def export_onnx(model: nn.Module, batch: dict[str, np.ndarray], path: Path) -> None:
    """TorchScript export in TRAINING mode: BatchNormalization keeps its running statistics as
    initializers, and every parameter its own initializer (an eval-mode export merges equal
    tensors, such as every fresh BatchNorm's ones and zeros, into one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(batch["x"]),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["logits"], do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)


def profile_kernels(arts, batch: dict[str, np.ndarray], directory: Path, runs: int, warmup: int = 2
                    ) -> tuple[list[dict], list[float]]:
    """The kernel events of an onnxruntime profile of the train_step after its first ``warmup``
    (allocating) runs of ``runs``, and each run's wall seconds; the session runs as the Trainer
    runs it (the ort-cpu backend's, its rewrites included; carried state fed, not initializers;
    no memory pattern; denormals flushed)."""
    proto = arts.train_step.proto
    fed = {i.name for i in proto.graph.input}
    kept = [t for t in proto.graph.initializer if t.name not in fed]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(kept)
    state = arts.manifest.pack(arts.state)  # per-param names -> the train_step's (flat) inputs
    return profiled_runs(proto, lambda name: batch[name] if name in batch else state[name], ["loss"],
                         directory, runs, warmup)


def profiled_runs(proto, feed: Callable[[str], np.ndarray], fetch: list[str], directory: Path, runs: int,
                  warmup: int) -> tuple[list[dict], list[float]]:
    """Run ``proto`` ``runs`` times on the ort-cpu backend (its rewrites included: NCHWc Convs,
    race-free scatters) under onnxruntime's profiler, each input fed ``feed(name)``: the kernel
    events after the first ``warmup`` runs, and each later run's wall seconds."""
    from graphc.backends.registry import get_backend

    executable = get_backend("ort-cpu").prepare(proto, threads=THREADS, mem_pattern=False, flush_denormals=True,
                                                profile=str(directory / "ort_profile"))
    feeds = {name: feed(name) for name in executable.input_names}
    walls = []
    for _ in range(runs):
        t0 = time.perf_counter()
        executable.run(feeds, fetch)
        walls.append(time.perf_counter() - t0)
    events = json.loads(executable.end_profiling().read_text())
    start = sorted(e["ts"] for e in events if e["name"] == "model_run")[warmup]
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start]
    return kernels, walls[warmup:]


def update_share(arts, batch: dict[str, np.ndarray], directory: Path, runs: int = 5, warmup: int = 2
                 ) -> tuple[float, float]:
    """ms per step of the train_step's kernels in ``optim/...`` nodes and of all its kernels, from
    an onnxruntime profile of ``runs`` steps, the first ``warmup`` (allocation) left out."""
    kernels, _ = profile_kernels(arts, batch, directory, runs, warmup)
    return (kernel_ms([e for e in kernels if "optim/" in e["name"]], runs - warmup),
            kernel_ms(kernels, runs - warmup))


def kernel_ms(kernels: list[dict], runs: int) -> float:
    """ms per run of the profiled ``kernels`` (events of ``runs`` runs)."""
    return sum(e["dur"] for e in kernels) / 1e3 / runs


def chain_floor_ms(arts, directory: Path, runs: int = 7, warmup: int = 2) -> float:
    """Kernel ms per run of graphc's update chain alone over as many float32s as the trainable
    params: flat buffers of ``flat.CHUNK_ELEMENTS`` (in cache), none of the step's gathering of
    gradients, splitting or per-param nodes; an onnxruntime profile, as ``update_share``'s.
    AdamW in elementwise ONNX ops takes at least these 11 full-size nodes per buffer: a moment
    is a sum of two tensors with two coefficients (no elementwise op scales both: each kept as
    its sum, the first 2 nodes, the second 3 with the squared gradient), and ``p*(1-lr*wd) -
    c*m/(sqrt(v)+eps)`` 6 more (a Gemm doing the ``a*x + b*y`` measured no faster:
    ``passes.training.optimizers``). What ``update_share`` counts beyond it is the step's own
    gathering and splitting (``optim/flat/...``: the gradients' Concat and Reshapes, the step's
    Split, the small params' tails) and the dispatch of more, smaller groups. GPT at batch 2, 1
    thread, per-node medians of 12 profiled runs: update 13.4 ms, of it Concat and Split 2.0
    (onnxruntime's CPU Concat and Split run on one thread, so at 2 threads their share grows);
    the chain here 10.9. With each param of 2**16 elements or more a group of its own
    (``flat.ALONE_ELEMENTS``) 12.1 ms, Concat and Split 0.26, the rest 52 Reshapes (views, no
    copy; 0.2-0.3 ms) and 26 groups' nodes against this chain's 11 groups.

    What the rest is (``profile_step.py --update``, 1 thread, 64 px, per-node medians of 10-20
    runs; CPU times of 15 runs): at 1 thread it is the buffers' size, not the graph. ResNet-18 at
    batch 32: update 32.4 of 233 ms (13.9 %), of it the 175 chain nodes 31.7 ms (98 %), the
    Reshapes, Concats, Splits and scalars 0.63; the chain nodes take 1.03x their time in the
    same update run alone (same groups), so a gradient just written is no cheaper to read than
    one written long before. Each group's chain already runs right after its gradient (onnxruntime
    orders them so: nodes 425-436 of 1,530 for a 512x512x3x3 weight), but for ``param * shrink``,
    which reads only inputs and runs a group earlier (its Sub 1.17x slower than alone, 0.5 ms;
    moved next to the Sub in the node list, onnxruntime runs it where it did). The chain costs
    0.19-0.20 ns per element and pass in groups of up to 2**19 elements and 0.22-0.35 ns in the
    four 2.36 M-element weights (9.4 MB per buffer, past the 2 MB L2): CPU time of the floor here
    25.1 ms, of the same chain in 2**21-element chunks 30.9, of the update alone 30.5. Such a
    weight's chain in cache-sized pieces without copies (a Scan over its gradient, state and
    param reshaped to [k, n/k], the chain its body) measured 1.06x / 1.03x / 1.00x the plain
    chain for k = 4 / 9 / 18 (from flushed caches 0.98x and 1.03x in two runs for 9, 0.97x for 18); with copies (Split
    and Concat) 1.04x the step (``flat.CHUNK_ELEMENTS``). GPT at batch 2: update 13.2 of 101 ms
    (13.1 %), chain 12.5 ms, Reshapes 0.35, Concats and Splits 0.27, scalars 0.10; CPU time of
    the floor 12.6 ms, of the update alone 12.9: at 1 thread within 2 % of the floor.

    At 2 threads (the step, the update alone and this floor profiled in turns in one process, 6-10
    rounds, each node at its fastest run, as ``profile_step.py --update`` counts: on a 2-core
    machine at load 9-18 the medians were up to 20x the minima; 64 px, ms of kernel time) it is
    again the chain over groups of more than ``flat.CHUNK_ELEMENTS`` (params of more than 2**19
    elements, each alone), 0.36-0.78 ns per element and pass where the floor's groups take
    0.27-0.54 in the same run, and in nets of many small params the gathering and splitting too.
    ResNet-18 at batch 32: update 50.2, alone 49.0, floor 38.6; Concats, Splits, Reshapes and
    scalars 0.9; the rest the chain over its 7 params of more than 2**19 elements, 10.0 M of its
    11.7 M floats (three runs: 1.3-2.0x the floor's cost per element and pass; step against alone
    0.9x-1.4x from run to run, no steady difference). ResNet-50: batch 32 update 149.4, alone
    152.3, floor 100.4, gathering 2.1, the chain over groups past 2**19 117 of the chain's 147 ms
    at 0.48-0.65 ns (the floor's 0.36); batch 2 180.8 / 178.0 / 138.5, gathering 2.2.
    EfficientNet-B0 at batch 32: 37.2 / 33.8 / 31.4, the 5.8 ms over the floor the Concats and
    Splits 2.9, the Reshapes 1.1, the head's 1.28 M-element weight 2.3 (its small groups' chain at
    the floor's cost); batch 2 36.6 / 32.5 / 30.5, Concats and Splits 2.8, Reshapes 1.1.
    MobileNetV3-small at batch 32: 19.0 / 21.4 / 13.1, of the 6.0 ms Concats and Splits 2.1,
    Reshapes 0.9, scalars 0.3, the head's two weights 0.6, the chain of its small groups (82 nodes
    over 0.93 M floats) 2.3; batch 2 24.4 / 26.9 / 17.5, Concats and Splits 2.6, Reshapes 1.2. Of
    EfficientNet-B0's 2.9 (batch 32, 3 mixed groups) the gradients' Concats and the delta's Splits,
    which any flat chain needs, take 1.9; the small params' tail (``flat.apply``: their step
    re-gathered from the delta's pieces, the params concatenated, the result split back) 1.1, its
    step's Concat 0.04-0.32 ms per group: since spared (``flat.SMALL_ELEMENTS``: the small params
    laid out last)."""
    return kernel_ms(chain_floor_kernels(arts, directory, runs, warmup), runs - warmup)


def chain_floor_kernels(arts, directory: Path, runs: int, warmup: int = 2) -> list[dict]:
    """The kernel events of ``chain_floor_ms``'s graph over ``runs`` runs, the first ``warmup`` left out."""
    import onnx_ir as ir

    from graphc.passes.training import flat, update_graphs

    numel = sum(int(np.prod(shape)) for buf in arts.manifest.layout for shape in buf.shapes)
    sizes = [flat.CHUNK_ELEMENTS] * (numel // flat.CHUNK_ELEMENTS) + [numel % flat.CHUNK_ELEMENTS] * bool(
        numel % flat.CHUNK_ELEMENTS)
    params = [ir.Value(name=f"w{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([n]))
              for i, n in enumerate(sizes)]  # each one param of a group of its own
    groups = [flat.Group(f"w{i}.flat", ir.DataType.FLOAT, [f"w{i}"], [(n,)], True) for i, n in enumerate(sizes)]
    proto = ir.to_proto(update_graphs.update_graph(arts.manifest.opset, arts.manifest.optimizer, params, groups))
    rng = np.random.default_rng(0)
    values = {i.name: rng.random(int(i.type.tensor_type.shape.dim[0].dim_value), dtype=np.float32) * 1e-3
              for i in proto.graph.input if i.name.startswith("w")}  # params, gradients, state
    return profiled_runs(proto, lambda name: values[name], [o.name for o in proto.graph.output],
                         directory, runs, warmup)[0]


def update_kernels(arts, directory: Path, runs: int, warmup: int = 2) -> list[dict]:
    """The kernel events of an onnxruntime profile of the train_step's update as a graph of its
    own (``gc.training.update_model``: the same groups, views, Concats and Splits) over ``runs``
    runs, the first ``warmup`` left out: the params and state as the artifacts hold them,
    gradients of 1e-3 random normals."""
    from graphc.compile.training import update_model

    proto = update_model(arts.manifest).proto
    state, rng = arts.manifest.pack(arts.state), np.random.default_rng(0)

    def feed(name: str) -> np.ndarray:
        if name.endswith("_grad"):
            return (rng.standard_normal(arts.state[name[:-5]].shape) * 1e-3).astype(arts.state[name[:-5]].dtype)
        return arts.state[name] if name in arts.state else state[name]

    return profiled_runs(proto, feed, [o.name for o in proto.graph.output], directory, runs, warmup)[0]


def fused_update_ms(model: nn.Module, steps: int = 10) -> float:
    """Median ms of PyTorch's fused AdamW step (``fused=True``: one kernel pass over each param,
    its gradient and its state) on copies of ``model``'s params with random gradients: the
    update done as a single fused kernel, which standard ONNX ops cannot express."""
    params = [p.detach().clone() for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=LR, fused=True)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:]) * 1e3


def child_peak_mb(*args: str) -> float:
    """Run this script as a memory child (``--child ...``) and read the MB it prints."""
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"memory child {' '.join(args)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.split()[-1])


def torch_memory_child(name: str, batch: int, image_size: int, device: str) -> None:
    """Print the peak memory of training ``name`` with PyTorch."""
    meter = memory_meter(device)
    torch.manual_seed(0)
    arch = ZOO[name]
    step = torch_stepper(arch.build(image_size), [make_batch(arch, batch, image_size)], device=device)
    for i in range(MEMORY_STEPS):
        step(i)
    print(meter())


# -- benchmark ------------------------------------------------------------------------------------

def interleaved_ms(steppers: dict[str, Callable[[int], float]], rounds: int, steps: int,
                   warmup: int = 2, per_round: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Median ms per step of each stepper; they take turns, ``steps`` timed steps each after
    untimed ones (``bench_train.interleaved_turns``: the steady state of a training loop, not
    the switch). ``per_round``, if given, gets each stepper's median ms in each round."""
    turns = interleaved_turns({name: (step, steps) for name, step in steppers.items()}, rounds, warmup)
    if per_round is not None:
        for name, each in turns.items():
            per_round.setdefault(name, []).extend(statistics.median(turn) * 1e3 for turn in each)
    return {name: statistics.median([t for turn in each for t in turn]) * 1e3 for name, each in turns.items()}


def bench(name: str, batch: int, args: argparse.Namespace) -> dict:
    arch = ZOO[name]
    row: dict = {"model": name, "kind": arch.kind, "batch": batch}
    torch.manual_seed(0)
    model = arch.build(args.image_size)
    batches = [make_batch(arch, batch, args.image_size, seed) for seed in range(4)]
    stage = "export"
    try:
        with tempfile.TemporaryDirectory(prefix="bench-zoo-") as tmp:
            tmp = Path(tmp)
            export_onnx(model, batches[0], tmp / "model.onnx")
            stage = "gc.load"
            imported = gc.load(tmp / "model.onnx")
            stage = "generate"
            t0 = time.perf_counter()
            arts = gc.training.generate(imported, gc.losses.cross_entropy("logits", label="y"), gc.optim.AdamW(LR),
                                        recompute=args.recompute, device=args.device)
            row["generate_s"] = time.perf_counter() - t0
            untrained = [p for p, _ in model.named_parameters() if p not in arts.manifest.trainable]
            if untrained:
                raise RuntimeError(f"torch params not in manifest.trainable: {untrained}")
            stage = "Trainer"
            trainer = gc.Trainer(arts, **backend_options(args.device, args.cuda_graph, args.cuda_option))
            stage = "timing"
            torch_updates: list[float] = []
            steppers = {"graphc": lambda i: trainer.step(batches[i % len(batches)]),
                        "torch": torch_stepper(model, batches, torch_updates, args.device)}
            if args.cuda_graph:  # the Trainer without graphs, for comparison
                plain = gc.Trainer(arts, **backend_options(args.device, False, args.cuda_option))
                steppers["plain"] = lambda i: plain.step(batches[i % len(batches)])
                # their first steps (the graphs captured, then replayed) on the same batches agree
                # as far as rounding goes (TF32, each session's cuDNN algorithms), before training
                # amplifies it: on the CPU, ResNet-50's params perturbed by 1e-4 relative gave
                # losses 1e-4 apart at the first step, 15 % at the 21st (0.011 vs 0.0097)
                first = [(trainer.step(batches[i]), plain.step(batches[i])) for i in range(4)]
                row["graph_loss_rel_diff"] = max(abs(g - p) / max(abs(p), 1e-12) for g, p in first)
            # with graphs, warm up past their capture (one or two graphs, each captured at first use)
            rounds: dict[str, list[float]] = {}
            ms = interleaved_ms(steppers, args.rounds, args.steps, warmup=10 if args.cuda_graph else 2,
                                per_round=rounds)
            each = [g / t for g, t in zip(rounds["graphc"], rounds["torch"])]
            row.update(graphc_ms=ms["graphc"], torch_ms=ms["torch"], ratio=ms["graphc"] / ms["torch"],
                       ratio_range=[min(each), max(each)],
                       torch_update_pct=100 * statistics.median(torch_updates) * 1e3 / ms["torch"])
            if args.cuda_graph:
                row["plain_ms"] = ms["plain"]
                del plain
            stage = "profile"
            row["nodes"] = len(arts.train_step.ir.graph)
            if args.device == "cpu":
                update_ms, kernel_ms = update_share(arts, batches[0], tmp)
                chain_ms, fused_ms = chain_floor_ms(arts, tmp), fused_update_ms(model)
                row.update(update_pct=100 * update_ms / kernel_ms, update_ms=update_ms, chain_floor_ms=chain_ms,
                           fused_update_ms=fused_ms,  # the shares the step would have with either update
                           chain_floor_pct=100 * chain_ms / (kernel_ms - update_ms + chain_ms),
                           fused_update_pct=100 * fused_ms / (kernel_ms - update_ms + fused_ms))
            stage = "memory"
            del trainer  # its device buffers, before the children measure the GPU's
            arts.save(tmp / "artifacts")
            np.savez(tmp / "artifacts" / "batch.npz", **batches[0])
            row["graphc_mb"] = child_peak_mb("graphc", str(tmp / "artifacts"), args.device,
                                             "graph" if args.cuda_graph else "", json.dumps(args.cuda_option))
            row["torch_mb"] = child_peak_mb("torch", name, str(batch), "--image-size", str(args.image_size),
                                            "--device", args.device)
            row["memory_ratio"] = row["graphc_mb"] / row["torch_mb"]
    except Exception as exc:  # noqa: BLE001 - report the row as failed and go on with the others
        row["error"] = f"{stage}: {type(exc).__name__}: {exc}"
    return row


# glibc's malloc keeping what a process frees (``--keep-freed``): no trimming of the heap, no
# mmap for large blocks. With its defaults PyTorch's CPU step gives the memory of its large
# tensors back to the kernel and faults it in again every step (batch 32, 128 px, minor faults a
# step: EfficientNet-B0 78,000, ResNet-18 68,000; with these 1,800 and 1,000; graphc's Trainer 2,
# its buffers bound once), and runs 9-13 % faster without (EfficientNet-B0 453 -> 414 ms,
# ResNet-18 417 -> 365).
KEEP_FREED = {"MALLOC_TRIM_THRESHOLD_": str(1 << 36), "MALLOC_MMAP_THRESHOLD_": str(1 << 32),
              "MALLOC_TOP_PAD_": str(1 << 30)}


def row_in_child(name: str, batch: int, keep_freed: bool) -> dict:
    """``bench(name, batch, ...)`` in a fresh process, given this one's arguments: one model per
    process, as a training job runs. In one process what the rows before left behind (freed
    heap, onnxruntime's shared arena) moved both sides: RegNetY-400MF at batch 32, 128 px, alone
    and after ResNet-50, graphc 234 -> 272 ms, PyTorch 257 -> 237 (ratio 0.91 -> 1.15).
    ``keep_freed``: the process's malloc keeps what is freed (``KEEP_FREED``)."""
    with tempfile.TemporaryDirectory(prefix="bench-zoo-row-") as tmp:
        out = Path(tmp) / "row.json"
        env = {**os.environ, **(KEEP_FREED if keep_freed else {})}
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--row", name, str(batch), str(out)],
                              stderr=subprocess.PIPE, text=True, env=env)
        if out.exists():
            return json.loads(out.read_text())
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "kind": ZOO[name].kind, "batch": batch,
                "error": f"process: exit {done.returncode}: {last}"}


def median_run(runs: list[dict]) -> dict:
    """Of a row's runs (``--repeat``), the finished one of median ratio (the lower of the middle
    two), with every finished run's ratio and update share beside it (``run_ratios``,
    ``run_update_pcts``) and the failed runs' errors (``run_errors``); a failed run where none
    finished."""
    done = sorted((r for r in runs if "error" not in r), key=lambda r: r["ratio"])
    if not done:
        return runs[-1]
    row = dict(done[(len(done) - 1) // 2])
    row["run_ratios"] = [r["ratio"] for r in done]
    if all("update_pct" in r for r in done):
        row["run_update_pcts"] = [r["update_pct"] for r in done]
    if len(done) < len(runs):
        row["run_errors"] = [r["error"] for r in runs if "error" in r]
    return row


def meets(row: dict) -> dict[str, bool]:
    """Which targets a finished row meets, by column (an unmeasured update share counts as met)."""
    return {"ratio": row["ratio"] <= TARGETS["ratio"][row["kind"]],
            "update_pct": row.get("update_pct", 0.0) <= TARGETS["update_pct"],
            "memory_ratio": row["memory_ratio"] <= TARGETS["memory_ratio"]}


def marked(text: str, ok: bool) -> str:
    return f"[green]{text} ✓[/green]" if ok else f"[red]{text} ✗[/red]"


def print_table(rows: list[dict], image_size: int, device: str, keep_freed: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    where = f"ort-cpu) vs PyTorch eager, AdamW, {THREADS} threads" if device == "cpu" else \
        f"ort-cuda) vs PyTorch eager (cuda), AdamW, {torch.cuda.get_device_name(0)}, MB of GPU memory"
    malloc = "malloc keeping freed memory" if keep_freed else "glibc malloc's defaults"
    table = Table(title=f"graphc ({where}, {image_size} px images, {malloc}")
    graphs = any("plain_ms" in row for row in rows)
    repeated = any(len(row.get("run_ratios", ())) > 1 for row in rows)
    for column in ("model", "batch", "graphc ms", *(["no-graph ms"] if graphs else []), "torch ms", "ratio",
                   "rounds", *(["runs", "runs' update %"] if repeated else []), "update %", "chain floor %",
                   "fused floor %", "torch upd %", "graphc MB", "torch MB", "mem ratio", "nodes", "generate s"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in rows:
        if "error" in row:
            table.add_row(row["model"], str(row["batch"]), f"[red]failed ({row['error'].split(':')[0]})[/red]")
            continue
        ok = meets(row)
        table.add_row(row["model"], str(row["batch"]), f"{row['graphc_ms']:.1f}",
                      *([f"{row['plain_ms']:.1f}" if "plain_ms" in row else ""] if graphs else []),
                      f"{row['torch_ms']:.1f}",
                      marked(f"{row['ratio']:.2f}", ok["ratio"]),
                      _spread(row["ratio_range"], "{:.2f}"),
                      *([_spread(row.get("run_ratios"), "{:.2f}"), _spread(row.get("run_update_pcts"), "{:.1f}")]
                        if repeated else []),
                      marked(f"{row['update_pct']:.1f}", ok["update_pct"]) if "update_pct" in row else "n/a",
                      *((f"{row['chain_floor_pct']:.1f}", f"{row['fused_update_pct']:.1f}") if "update_pct" in row
                        else ("n/a", "n/a")),
                      f"{row['torch_update_pct']:.1f}",
                      f"{row['graphc_mb']:.0f}", f"{row['torch_mb']:.0f}",
                      marked(f"{row['memory_ratio']:.2f}", ok["memory_ratio"]), str(row["nodes"]),
                      f"{row['generate_s']:.1f}")
    console = Console(width=240)  # wide enough for the table when piped
    console.print(table)
    t = TARGETS
    console.print(f"targets: ratio <= {t['ratio']['cnn']} (CNNs), <= {t['ratio']['transformer']} (transformers); "
                  f"update <= {t['update_pct']:.0f}% of kernel time; mem ratio <= {t['memory_ratio']}")
    if any("update_pct" in r for r in rows):
        console.print(f"update floors: the update's share of the step were it the 11-node AdamW chain alone, in "
                      "cache-sized flat buffers (chain floor: no standard-op update is cheaper), or one fused "
                      f"kernel (PyTorch's fused AdamW); above {t['update_pct']:.0f}%, that kind of update cannot "
                      "meet the target on this machine")
    finished = [r for r in rows if "error" not in r]
    console.print(f"rows meeting every target: {sum(all(meets(r).values()) for r in finished)} of {len(rows)}")
    for row in rows:
        if "error" in row:
            console.print(f"{row['model']} batch {row['batch']} failed at {row['error']}", style="red",
                          markup=False, highlight=False)


def _spread(values: list[float] | None, form: str) -> str:
    """"lowest-highest" of a row's rounds or runs, "" where there is one value."""
    if not values or len(values) < 2:
        return ""
    return f"{form.format(min(values))}-{form.format(max(values))}"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ZOO), help=f"comma-separated, of: {', '.join(ZOO)}")
    p.add_argument("--batches", default="2,32", help="comma-separated batch sizes")
    p.add_argument("--image-size", type=int, default=64, help="image side in px (ViT needs a multiple of 8)")
    p.add_argument("--rounds", type=int, default=5, help="timing rounds (the two frameworks take turns)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per framework per round")
    p.add_argument("--recompute", action="store_true", help="generate graphc's artifacts with recompute=True")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where both frameworks train")
    p.add_argument("--cuda-graph", action="store_true",
                   help="with --device cuda: graphc's Trainer replays CUDA graphs (and is timed without too)")
    p.add_argument("--cuda-option", action="append", default=[], metavar="KEY=VALUE",
                   help="with --device cuda: an onnxruntime CUDA provider option for graphc (repeatable)")
    p.add_argument("--keep-freed", action="store_true",
                   help="glibc's malloc keeps freed memory (no trim, no mmap): PyTorch without its page faults")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each row in this many fresh processes; report the run of median ratio")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # torch MODEL BATCH: one memory measurement
    p.add_argument("--row", nargs=3, help=argparse.SUPPRESS)  # MODEL BATCH OUT: one row, written to OUT as JSON
    args = p.parse_args()
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in ZOO]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    if (args.cuda_graph or args.cuda_option) and args.device != "cuda":
        p.error("--cuda-graph and --cuda-option need --device cuda")
    malformed = [o for o in args.cuda_option if "=" not in o]
    if malformed:
        p.error(f"--cuda-option takes KEY=VALUE, got {', '.join(malformed)}")
    args.cuda_option = dict(o.split("=", 1) for o in args.cuda_option)
    return args


def main() -> int:
    args = parse_args()
    torch.set_num_threads(THREADS)
    if args.child:
        _, name, batch = args.child
        torch_memory_child(name, int(batch), args.image_size, args.device)
        return 0
    if args.row:
        name, batch, out = args.row
        Path(out).write_text(json.dumps(bench(name, int(batch), args)))
        return 0
    rows = []
    for name in args.models:
        for batch in args.batches:
            row = median_run([row_in_child(name, batch, args.keep_freed) for _ in range(args.repeat)])
            rows.append(row)
            if "error" in row:
                print(f"{name} batch {batch}: failed at {row['error']}", flush=True)
            else:
                graphs = (f" (without graphs {row['plain_ms']:.1f} ms; their first 4 losses differ by up to "
                          f"{row['graph_loss_rel_diff']:.1e})") if "plain_ms" in row else ""
                runs = f", ratios of {len(row['run_ratios'])} runs {_spread(row['run_ratios'], '{:.2f}')}" \
                    if len(row["run_ratios"]) > 1 else ""
                runs += "".join(f"; a run failed at {error}" for error in row.get("run_errors", ()))
                print(f"{name} batch {batch}: graphc {row['graphc_ms']:.1f} ms{graphs}, torch {row['torch_ms']:.1f} ms, "
                      f"generate {row['generate_s']:.1f} s{runs}", flush=True)
            if args.json:  # after each row, so a run cut short keeps the rows it finished
                args.json.write_text(json.dumps({"device": args.device, "threads": THREADS,
                                                 "image_size": args.image_size, "num_classes": NUM_CLASSES,
                                                 "keep_freed": args.keep_freed,
                                                 "rows": rows}, indent=2))
    print_table(rows, args.image_size, args.device, args.keep_freed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
