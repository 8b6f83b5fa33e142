"""Data-parallel training on Ray: step time of 1 vs 2 workers on this machine, bytes exchanged
per step, and a projection of scaling efficiency at 8 and 64 workers.

    .venv/bin/python scripts/bench_distributed.py [--steps 20] [--bandwidth-gbit 10] [--latency-us 50]

For the two-layer net (784-128-10, global batch 128), the LeNet CNN (1x28x28, batch 64) and the
ResNet example (3x32x32, widths 16/32/64, batch 32), SGD with momentum, onnxruntime CPU, one
intra-op thread per process. Columns, median ms per step over ``--steps`` steps after 3 warm-up ones:

* ``1 proc``: single-process ``gc.Trainer.step`` on the global batch (1 thread);
* ``1 worker`` / ``2 workers``: ``gc.Trainer(workers=N).step`` on a local loopback Ray cluster
  (each worker one CPU, one thread) on the same global batch: the driver sends the shards;
* ``2 workers fit``: ``fit`` over a DataLoader of those batches, each worker reading its own
  shard (mean ms per step of the epochs after the first);
* ``compute(B/2)``: single-process step on half the batch: what each of 2 workers computes;
* ``call``: one empty Ray actor round trip (driver -> worker -> driver).

Bytes per step: each worker puts its gradients (G bytes) in its node's object store and reads
the other N-1 workers' (all-gather; shared memory on one node); the driver sends each worker the
batch's position (in ``fit``) or its shard, and gets back its loss.

Projection (weak scaling: each worker keeps B/2 rows): step(N) = compute + overhead + comm(N),
overhead = the measured 1-worker step minus the 1-process step (Ray calls, serialization), over
an assumed link of ``--bandwidth-gbit`` Gbit/s and ``--latency-us`` per message:
* all-gather through the object store (this implementation): (N-1)*G/bandwidth + latency;
* a ring all-reduce over actor calls: 2*(N-1)/N*G/bandwidth + 2*(N-1)*(latency + call), each
  of its 2(N-1) dependent hops an actor call.
Efficiency = compute / step(N).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback-only local cluster
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402

import graphc as gc  # noqa: E402
from graphc.models.cnn import LeNet  # noqa: E402
from graphc.models.resnet import ResNet  # noqa: E402
from graphc.models.two_layer_net import TwoLayerNet  # noqa: E402

CASES = {
    "two-layer 784-128-10, B=128": (lambda: TwoLayerNet(784, 128, 10), (784,), 128),
    "LeNet 1x28x28, B=64": (LeNet, (1, 28, 28), 64),
    "ResNet 3x32x32, B=32": (ResNet, (3, 32, 32), 32),
}


def median_ms(step, batches, steps: int) -> float:
    for batch in batches[:3]:
        step(batch)
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(batches[i % len(batches)])
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bandwidth-gbit", type=float, default=10.0)
    parser.add_argument("--latency-us", type=float, default=50.0)
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    bandwidth = args.bandwidth_gbit * 1e9 / 8  # bytes/s
    latency = args.latency_us * 1e-6
    rng = np.random.default_rng(0)
    rows = []
    for label, (factory, shape, batch) in CASES.items():
        model = gc.capture(factory(), seed=0, x=gc.spec("float32", ("N", *shape)))
        arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"),
                                    gc.optim.SGD(0.01, momentum=0.9))
        batches = [{"x": rng.standard_normal((batch, *shape), dtype=np.float32),
                    "y": rng.integers(0, 10, batch).astype(np.int64)} for _ in range(4)]
        halves = [{k: v[: batch // 2] for k, v in b.items()} for b in batches]
        single = gc.Trainer(arts, backend="ort-cpu", threads=1)
        one_proc = median_ms(single.step, batches, args.steps)
        compute = median_ms(single.step, halves, args.steps)
        timings = {}
        for workers in (1, 2):
            dp = gc.Trainer(arts, backend="ort-cpu", workers=workers, ray_address="auto", num_cpus=1, threads=1)
            timings[workers] = median_ms(dp.step, batches, args.steps)
            if workers == 1:
                call = median_ms(lambda _: dp.worker_pids(), batches, args.steps)
            else:
                loader = gc.data.DataLoader({k: np.concatenate([b[k] for b in batches]) for k in batches[0]},
                                            batch_size=batch, shuffle=False)
                epochs = max(2, -(-args.steps // len(loader)) + 1)
                history = dp.fit(loader, epochs=epochs, progress=False)
                later = history.epochs[1:]
                timings["fit"] = sum(e.seconds for e in later) / sum(e.steps for e in later) * 1e3
            dp.shutdown()
        grad_bytes = sum(p.nbytes for n, p in single.params.items() if n in arts.manifest.trainable)
        shard_bytes = sum(v.nbytes for v in batches[0].values()) / 2
        overhead = max(timings[1] - one_proc, 0.0) / 1e3
        effs = {}
        for n in (8, 64):
            gather = (n - 1) * grad_bytes / bandwidth + latency
            ring = 2 * (n - 1) / n * grad_bytes / bandwidth + 2 * (n - 1) * (latency + call / 1e3)
            effs[n] = tuple(compute / 1e3 / (compute / 1e3 + overhead + c) for c in (gather, ring))
        rows.append((label, grad_bytes, shard_bytes, one_proc, timings, compute, call, overhead * 1e3, effs))
        print(f"done {label}", flush=True)
    ray.shutdown()

    print(f"\nlink assumed: {args.bandwidth_gbit:g} Gbit/s, {args.latency_us:g} us per message; "
          f"{os.cpu_count()} CPUs here, load average {os.getloadavg()[0]:.1f}")
    head = ("model", "grads MB", "per worker/step (N=2)", "1 proc ms", "1 worker ms", "2 workers ms",
            "2 workers fit ms", "compute(B/2) ms", "call ms", "overhead ms", "eff@8 gather/ring",
            "eff@64 gather/ring")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for label, g, shard, one, t, comp, call, over, effs in rows:
        per_worker = (f"{g / 1e6:.2f} MB out + {g / 1e6:.2f} MB in; shard {shard / 1e3:.0f} kB "
                      "(step) or ~100 B position (fit)")
        print(f"| {label} | {g / 1e6:.2f} | {per_worker} | {one:.1f} | {t[1]:.1f} | {t[2]:.1f} | {t['fit']:.1f} | "
              f"{comp:.1f} | {call:.1f} | {over:.1f} | {effs[8][0]:.0%} / {effs[8][1]:.0%} | "
              f"{effs[64][0]:.0%} / {effs[64][1]:.0%} |")


if __name__ == "__main__":
    main()
