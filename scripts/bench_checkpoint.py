"""Activation checkpointing on a memory-bound model: peak RSS and step time of a deep MLP's
train step on ort-cpu without checkpointing, with ``gc.utils.checkpoint`` regions
(``checkpoint_sequential``), and with ``generate(..., recompute=True)``; and of its ``gc.grad``
gradient model run in a ``gc.Session`` without and with the regions; then the gradient model with
regions in an ort-cpu session under each set of onnxruntime options the backend chooses between
(``graph_order``, ``mem_pattern``: ``backends/onnxruntime.py``), 3 processes each, medians.

Each variant runs in its own process (peak RSS is per process): ``python scripts/bench_checkpoint.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_zoo import peak_rss_mb  # noqa: E402 - this process's peak RSS

VARIANTS = ("none", "regions", "recompute", "grad-none", "grad-regions")
DEPTH, WIDTH, BATCH, SEGMENTS, STEPS = 16, 512, 4096, 4, 4
# the gc.grad model with regions, ort-cpu, prepared with these options (the last: the session's own)
GRAD_OPTIONS = {"ort order, mem pattern": {"graph_order": False, "mem_pattern": True},
                "ort order, no mem pattern": {"graph_order": False, "mem_pattern": False},
                "graph order, mem pattern": {"graph_order": True, "mem_pattern": True},
                "graph order, no mem pattern": {}}
RUNS = 3


def _measure(variant: str, options: dict) -> dict:
    import graphc as gc
    from graphc.backends.registry import get_backend
    from graphc.utils.checkpoint import checkpoint_sequential

    class Deep(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = gc.nn.Sequential(*(gc.nn.Sequential(gc.nn.Linear(WIDTH, WIDTH), gc.nn.Tanh())
                                             for _ in range(DEPTH)))
            self.head = gc.nn.Linear(WIDTH, 10)

        def forward(self, x):
            h = checkpoint_sequential(self.blocks, SEGMENTS, x, use_reentrant=False) if variant.endswith("regions") \
                else self.blocks(x)
            return self.head(h)

    model = gc.capture(Deep(), x=gc.spec("float32", ("N", WIDTH)))
    loss = gc.losses.cross_entropy("output", label="y")
    if variant.startswith("grad"):
        step = get_backend("ort-cpu").prepare(gc.grad(model, loss).proto, **options).run
    else:
        step = gc.Trainer(gc.training.generate(model, loss, gc.optim.SGD(1e-3), recompute=variant == "recompute"),
                          backend="ort-cpu").step
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(BATCH, WIDTH)).astype(np.float32), "y": rng.integers(0, 10, BATCH)}
    before = peak_rss_mb()
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        step(batch)
        times.append(time.perf_counter() - start)
    return {"variant": variant, "peak_rss_mb": round(peak_rss_mb()), "before_steps_mb": round(before),
            "step_s": round(float(np.median(times[1:])), 3)}


def main() -> None:
    if len(sys.argv) > 1:
        print(json.dumps(_measure(sys.argv[1], json.loads(sys.argv[2]))))
        return
    print(f"MLP {DEPTH} x Linear({WIDTH}) + Tanh, batch {BATCH}, float32, SGD, ort-cpu; "
          f"regions: checkpoint_sequential(segments={SEGMENTS})")
    for variant in VARIANTS:
        print(json.dumps(_child(variant, {})))
    print(f"gc.grad with regions, ort-cpu, median of {RUNS} processes (peak RSS above the process's before the first run):")
    for label, options in GRAD_OPTIONS.items():
        runs = [_child("grad-regions", options) for _ in range(RUNS)]
        peak = np.median([r["peak_rss_mb"] - r["before_steps_mb"] for r in runs])
        print(f"  {label:28s} +{peak:.0f} MB  {np.median([r['step_s'] for r in runs]):.2f} s/step")


def _child(variant: str, options: dict) -> dict:
    """One measurement in a fresh process."""
    out = subprocess.run([sys.executable, __file__, variant, json.dumps(options)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
