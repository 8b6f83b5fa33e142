"""Time ``gc.vmap`` of a per-sample MLP (784-256-128-10, float32) both ways it can be written: by the
batching rules (the default) and as one Scan over the examples (what a body without rules becomes),
its forward and its ``gc.grad`` (per-sample losses summed), on onnxruntime CPU (2 threads), with a
plain batched forward for reference; then per-sample gradients of a small CNN (``vmap(grad(loss))``,
conv 1-8-16 on 28x28 images, a batch of ``--cnn-batch`` known at capture, which the grouped
convolutions of mapped weights need) both ways; then ``gc.scan``, ``gc.fori_loop`` and ``gc.cond`` on a
per-example condition over 64 examples by their batching rules vs as the Scan over the examples, and
per-example gradients of a ``gc.while_loop`` of a number of steps per example (its tape a Loop's
per-step outputs) and a Scan along axis 1 (``--control-only``: these alone). The numbers are docs/api.md's, ``graphc/dsl/vmap.py``'s and ``graphc/dsl/vmap_rules_control.py``'s.

    python scripts/bench_vmap.py --batch 256 --repeat 50
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from unittest import mock

import numpy as np

import graphc as gc
from graphc.dsl import ops, vmap_rules
from graphc.dsl.builder import current
from graphc.dsl.control import trace_subgraph


class PerSample(gc.nn.Module):
    """The sum over examples of each one's cross entropy, computed one example at a time by vmap."""

    def __init__(self, batched: bool = False):
        super().__init__()
        self.net = gc.nn.Sequential(gc.nn.Linear(784, 256), gc.nn.ReLU(), gc.nn.Linear(256, 128), gc.nn.ReLU(),
                                    gc.nn.Linear(128, 10))
        self.batched = batched

    def forward(self, x, y):
        if self.batched:
            return {"loss": gc.sum(gc.losses.cross_entropy(self.net(x), y, reduction="none"))}

        def one(a, t):
            return gc.losses.cross_entropy(self.net(a.unsqueeze(0)), t.unsqueeze(0))
        return {"loss": gc.sum(gc.vmap(one, fallback="scan")(x, y))}


class SmallCNN(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = gc.nn.Conv2d(1, 8, 3, padding=1), gc.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = gc.nn.Linear(16 * 7 * 7, 10)

    def forward(self, x):
        h = gc.nn.functional.max_pool2d(gc.relu(self.c1(x)), 2)
        h = gc.nn.functional.max_pool2d(gc.relu(self.c2(h)), 2)
        return self.fc(h.flatten(1))


def per_sample_cnn_grads(net: SmallCNN, names: list[str]):
    """``(x, y, **params) -> {name: per-sample gradient}`` by ``vmap(grad(loss))``."""
    def fn(x, y, **p):
        def loss(ps, a, t):
            return gc.losses.cross_entropy(gc.func.functional_call(net, ps, (a.unsqueeze(0),)), t.unsqueeze(0))
        grads = gc.vmap(gc.func.grad(loss), in_dims=(None, 0, 0), fallback="scan")(
            {k: p[k.replace(".", "_")] for k in names}, x, y)
        return {"d_" + k.replace(".", "_"): v for k, v in grads.items()}
    return fn


def control_flow(rng: np.random.Generator) -> dict:
    """``{op: (function, feeds)}``: a vmapped ``gc.scan`` (a tanh RNN cell 16 -> 32, 20 steps),
    ``gc.fori_loop`` (20 Newton steps for a square root) and ``gc.cond`` on a per-example condition."""
    w = (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)
    u = (rng.standard_normal((16, 32)) * 0.2).astype(np.float32)

    def scan(x, h):
        return gc.vmap(lambda xs, h0: gc.scan(lambda c, xt: (gc.tanh(c @ w + xt @ u), c), h0, xs)[1],
                       fallback="scan")(x, h)

    def loop(x):
        return gc.vmap(lambda a: gc.fori_loop(0, 20, lambda i, c: c - (c * c - a) / (2.0 * c), a + 1.0),
                       fallback="scan")(x)

    def cond(x):
        return gc.vmap(lambda a: gc.cond(a.sum() > 0, lambda: gc.tanh(a) * 2.0, lambda: a * a), fallback="scan")(x)
    def tape(x):
        def loss(a):
            y = gc.while_loop(lambda y: (y * y).sum() < 400.0, lambda y: y * 1.2 + gc.tanh(y @ w) * 0.1, a)
            return (y * y).sum()
        return gc.vmap(gc.func.grad(loss), fallback="scan")(x)

    def scan_axis1(x, h):
        def one(xs, h0):  # xs (16, 20): 20 steps along axis 1, as ONNX's scan_input_axes [1]
            body, _, _ = trace_subgraph(current(), lambda c, xt: [gc.tanh(c @ w + xt @ u)] * 2, [],
                                        [("c", "float32", [32]), ("xt", "float32", [16])], "scan_body")
            return ops.emit("Scan", [h0, xs], {"body": body, "num_scan_inputs": 1, "scan_input_axes": [1],
                                               "scan_output_axes": [1]}, 2)[1]
        return gc.vmap(one, fallback="scan")(x, h)
    x_loop = rng.standard_normal((64, 32)).astype(np.float32)
    x_loop *= rng.uniform(0.5, 20.0, (64, 1)).astype(np.float32) / np.linalg.norm(x_loop, axis=1, keepdims=True)
    return {"Scan": (scan, {"x": rng.standard_normal((64, 20, 16)).astype(np.float32),
                            "h": rng.standard_normal((64, 32)).astype(np.float32)}, "Scan"),
            "Loop": (loop, {"x": rng.uniform(1, 2, (64, 32)).astype(np.float32)}, "Loop"),
            "If": (cond, {"x": rng.standard_normal((64, 128)).astype(np.float32)}, "If"),
            "grad of while_loop": (tape, {"x": x_loop}, "Loop"),
            "Scan along axis 1": (scan_axis1, {"x": rng.standard_normal((64, 16, 20)).astype(np.float32),
                                               "h": rng.standard_normal((64, 32)).astype(np.float32)}, "Scan")}


def _time(model: gc.Model, feeds: dict, repeat: int) -> float:
    session = gc.Session(model, backend="ort-cpu", threads=2)
    session.run(feeds)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3  # the median: the machine is shared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--cnn-batch", type=int, default=64)
    parser.add_argument("--control-only", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.control_only:
        return _control(rng, args.repeat)
    feeds = {"x": rng.standard_normal((args.batch, 784)).astype(np.float32),
             "y": rng.integers(0, 10, args.batch).astype(np.int64)}
    specs = {"x": gc.spec("float32", ("N", 784)), "y": gc.spec("int64", ("N",))}
    rows = []
    for name, batched, ctx in (("batched forward (no vmap)", True, nullcontext()),
                               ("vmap, batching rules", False, nullcontext()),
                               ("vmap, Scan", False, mock.patch.object(vmap_rules, "RULES", {}))):
        with ctx:
            model = gc.capture(PerSample(batched), **specs)
        grads = gc.grad(model, "loss")
        rows.append((name, _time(model, feeds, args.repeat), _time(grads, feeds, args.repeat)))
    print(f"per-sample MLP 784-256-128-10, batch {args.batch}, onnxruntime CPU, 2 threads (median ms per run)")
    for name, fwd, grad in rows:
        print(f"  {name:28s} forward {fwd:8.3f}   gradient {grad:8.3f}")

    net = SmallCNN().init_parameters(0)
    names = [k for k, _ in net.named_parameters()]
    params = {k.replace(".", "_"): (rng.standard_normal(v.shape) * 0.1).astype(np.float32)
              for k, v in net.named_parameters()}
    feeds = {"x": rng.standard_normal((args.cnn_batch, 1, 28, 28)).astype(np.float32),
             "y": rng.integers(0, 10, args.cnn_batch).astype(np.int64), **params}
    print(f"per-sample gradients of a CNN (conv 1-8-16, 28x28), batch {args.cnn_batch} (median ms per run)")
    for name, ctx in (("vmap(grad), batching rules", nullcontext()),
                      ("vmap(grad), Scan", mock.patch.object(vmap_rules, "RULES", {}))):
        with ctx:
            model = gc.capture(per_sample_cnn_grads(net, names), **feeds)
        print(f"  {name:28s} {_time(model, feeds, args.repeat):8.3f}")

    _control(rng, args.repeat)


def _control(rng: np.random.Generator, repeat: int) -> None:
    print("control flow over 64 examples (median ms per run)")
    for name, (fn, feeds, op) in control_flow(rng).items():
        specs = {k: gc.spec(v.dtype.name, v.shape) for k, v in feeds.items()}  # static shapes, not evaluated
        rule = _time(gc.capture(fn, **specs), feeds, repeat)
        with mock.patch.dict(vmap_rules.RULES):
            del vmap_rules.RULES[op]
            scan = _time(gc.capture(fn, **specs), feeds, repeat)
        print(f"  {name:18s} batching rule {rule:8.3f}   Scan {scan:8.3f}")


if __name__ == "__main__":
    main()
