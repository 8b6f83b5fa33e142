"""``gc.Trainer(workers=2, shard_optimizer=True)`` against unsharded workers: step time and each
worker's resident memory, on a local loopback Ray cluster, onnxruntime CPU, AdamW.

    .venv/bin/python scripts/bench_shard_optimizer.py [--rounds 5] [--steps 10]

Cases: a 4-layer MLP of 1024-wide layers at batch 8 (16 MiB of float32 params: its update is most
of a step) and the LeNet CNN (1x28x28) at batch 32. Both trainers are made at once; their steps
run in interleaved blocks of ``--steps`` (``--rounds`` of them, after 3 warm-up steps each), the
median ms per step reported; then each worker's resident memory, private and shared (``rss_mib``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402

import graphc as gc  # noqa: E402
from graphc.models.cnn import LeNet  # noqa: E402

RNG = np.random.default_rng(0)


def _mlp():
    return gc.nn.Sequential(*(m for _ in range(4) for m in (gc.nn.Linear(1024, 1024), gc.nn.ReLU())))


CASES = {  # name: (module, input shape, batch, loss, labels)
    "MLP 4x1024, B=8": (_mlp, (1024,), 8, lambda: gc.losses.mse("output", label="y"),
                        lambda n: RNG.standard_normal((n, 1024), dtype=np.float32)),
    "LeNet 1x28x28, B=32": (LeNet, (1, 28, 28), 32, lambda: gc.losses.cross_entropy("output", label="y"),
                            lambda n: RNG.integers(0, 10, n)),
}


def rss_mib(pid: int) -> tuple[float, float]:
    """(private, shared) resident MiB of process ``pid``: ``RssAnon`` and ``RssShmem`` (Ray's object
    store, mapped into each worker, is shared memory)."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return tuple(int(fields[key].split()[0]) / 1024 for key in ("RssAnon", "RssShmem"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    for name, (make, shape, batch, loss, labels) in CASES.items():
        model = gc.capture(make(), x=gc.spec("float32", ("N", *shape)))
        arts = gc.training.generate(model, loss(), gc.optim.AdamW(1e-3, weight_decay=0.01))
        batches = [{"x": RNG.standard_normal((batch, *shape), dtype=np.float32), "y": labels(batch)} for _ in range(8)]
        trainers = {kind: gc.Trainer(arts, workers=2, num_cpus=0.5, backend="ort-cpu", shard_optimizer=kind == "sharded")
                    for kind in ("unsharded", "sharded")}
        times: dict[str, list[float]] = {kind: [] for kind in trainers}
        for trainer in trainers.values():
            for b in batches[:3]:
                trainer.step(b)
        for _ in range(args.rounds):
            for kind, trainer in trainers.items():
                for i in range(args.steps):
                    start = time.perf_counter()
                    trainer.step(batches[i % len(batches)])
                    times[kind].append((time.perf_counter() - start) * 1e3)
        for kind, trainer in trainers.items():
            rss = [rss_mib(pid) for pid in trainer.worker_pids()]
            print(f"{name:22s} {kind:9s} {statistics.median(times[kind]):7.2f} ms/step   worker RSS private "
                  + " / ".join(f"{a:.0f}" for a, _ in rss) + " MiB, shared " + " / ".join(f"{s:.0f}" for _, s in rss)
                  + " MiB"
                  + (f"   shard bytes {[round(b / 2**20, 2) for b in trainer._plan.bytes]} MiB"
                     if trainer._plan else ""))
            trainer.shutdown()


if __name__ == "__main__":
    main()
