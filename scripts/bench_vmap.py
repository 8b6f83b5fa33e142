"""Time ``gc.vmap`` of a per-sample MLP (784-256-128-10, float32) both ways it can be written: by the
batching rules (the default) and as one Scan over the examples (what a body without rules becomes),
its forward and its ``gc.grad`` (per-sample losses summed), on onnxruntime CPU (2 threads), with a
plain batched forward for reference. The numbers are docs/api.md's and ``graphc/dsl/vmap.py``'s.

    python scripts/bench_vmap.py --batch 256 --repeat 50
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from unittest import mock

import numpy as np

import graphc as gc
from graphc.dsl import vmap_rules


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
        return {"loss": gc.sum(gc.vmap(one)(x, y))}


def _time(model: gc.Model, feeds: dict, repeat: int) -> float:
    session = gc.Session(model, backend="ort-cpu", threads=2)
    session.run(feeds)
    start = time.perf_counter()
    for _ in range(repeat):
        session.run(feeds)
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
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
    print(f"per-sample MLP 784-256-128-10, batch {args.batch}, onnxruntime CPU, 2 threads (ms per run)")
    for name, fwd, grad in rows:
        print(f"  {name:28s} forward {fwd:8.3f}   gradient {grad:8.3f}")


if __name__ == "__main__":
    main()
