"""What train metrics cost per step: ``Trainer.fit`` on the LeNet CNN (1x28x28, 10 classes,
batch 32, SGD, onnxruntime CPU at 2 threads) with the default train metrics (accuracy, top-5
accuracy from each step's own prediction) against the same run with none (``metrics=[]``).

    .venv/bin/python scripts/bench_train_metrics.py [--rounds 8] [--steps 32] [--backend ort-cpu]

The two trainers take turns an epoch at a time (so a busy machine slows both alike); the time per
step is the epoch's train time (``EpochRecord.seconds``, evaluation excluded) over its steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import timeit

import numpy as np

THREADS = 2
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import graphc as gc  # noqa: E402
from graphc.models.cnn import LeNet, example_inputs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="epochs each trainer runs (taking turns)")
    parser.add_argument("--steps", type=int, default=32, help="steps per epoch")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--backend", default="ort-cpu")
    args = parser.parse_args()

    model = gc.capture(LeNet(), seed=0, **example_inputs())
    arts = gc.training.generate(model, gc.losses.cross_entropy(model.outputs[0].name, label="y"), gc.optim.SGD(0.01))
    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    data = {"x": rng.standard_normal((n, 1, 28, 28)).astype(np.float32), "y": rng.integers(0, 10, n)}
    loader = gc.data.DataLoader(data, batch_size=args.batch, seed=0)
    options = {"threads": THREADS} if args.backend.startswith("ort") else {}
    trainers = {"train metrics": gc.Trainer(arts, backend=args.backend, **options),
                "none": gc.Trainer(arts, backend=args.backend, metrics=[], **options)}
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for epoch in range(args.rounds + 1):  # the first epoch warms up
        for name, trainer in trainers.items():
            record = trainer.fit(loader, epoch + 1, progress=False, quiet=True).epochs[-1]
            if epoch:
                times[name].append(record.seconds / record.steps * 1e3)
    base = statistics.median(times["none"])
    print(f"LeNet batch {args.batch}, {args.backend}, {args.steps} steps x {args.rounds} epochs, ms/step (median, min):")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:14s} {med:7.3f}  {min(ts):7.3f}   {med - base:+.3f} ms ({med / base:.3f}x)")
    # the host side alone, steadier than the difference of two noisy step times
    batch = {"x": data["x"][:args.batch], "y": data["y"][:args.batch]}
    logits = gc.Trainer(arts, backend=args.backend).predict(batch)
    calls = 2000
    seconds = timeit.timeit(lambda: gc.metrics.compute(arts.manifest.loss, logits, batch), number=calls)
    print(f"  gc.metrics.compute on one step's [{args.batch}, 10] logits: {seconds / calls * 1e6:.1f} us")


if __name__ == "__main__":
    main()
