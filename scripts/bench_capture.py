"""Capture time of the transformer example and of a 1,000-layer MLP (symbolic batch).

    .venv/bin/python scripts/bench_capture.py [--repeat 5] [--layers 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import onnx

import graphc as gc
from graphc.models import EXAMPLES


class DeepMLP(gc.nn.Module):
    def __init__(self, layers: int, width: int = 64):
        super().__init__()
        self.layers = gc.nn.Sequential(*(gc.nn.Linear(width, width) for _ in range(layers)))

    def forward(self, x):
        for layer in self.layers.children():
            x = gc.relu(layer(x))
        return x


def bench(label: str, make, inputs: dict, repeat: int) -> None:
    times, model = [], None
    for _ in range(repeat):
        module = make()
        start = time.perf_counter()
        model = gc.capture(module, **inputs)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    onnx.checker.check_model(model.proto, full_check=True)
    check_s = time.perf_counter() - start
    print(f"{label:<28} nodes {len(model.ir.graph):>5}  params {sum(v.size for v in model.params.values()):>10,}  "
          f"capture median {statistics.median(times) * 1000:8.1f} ms  (min {min(times) * 1000:.1f})  "
          f"full check {check_s * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", type=int, default=1000)
    args = parser.parse_args()
    factory, inputs = EXAMPLES["transformer"]
    bench("transformer (example)", factory, inputs(), args.repeat)
    bench(f"MLP {args.layers} layers x 64", lambda: DeepMLP(args.layers),
          {"x": gc.spec("float32", ("N", 64))}, args.repeat)
    print("checker status of the example models (opset 21, full_check=True):")
    for name, (factory, inputs) in EXAMPLES.items():
        try:
            onnx.checker.check_model(gc.capture(factory(), **inputs()).proto, full_check=True)
            status = "ok"
        except Exception as exc:  # noqa: BLE001 - report, do not stop
            status = f"FAILED: {exc}"
        print(f"  {name:<14} {status}")


if __name__ == "__main__":
    main()
