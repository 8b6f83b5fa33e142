"""Training an imported LSTM: graphc (the LSTM unrolled in train_step) against PyTorch eager.

A sequence classifier, nn.LSTM(32 -> 128, batch_first) + Linear(128 -> 10) on the last hidden
state, softmax cross-entropy, plain SGD, batch 32, at several sequence lengths. The same
torch module is exported with torch.onnx (opset 17), loaded with ``gc.load`` and trained with
``gc.Trainer`` on onnxruntime CPU; PyTorch trains the module itself. Both at 2 threads, rows
interleaved (``bench_train.interleaved_times``); ms per step, median / fastest. Needs torch.

    .venv/bin/python scripts/bench_recurrent.py [--lengths 8 32] [--rounds 10]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from bench_train import LR, THREADS, interleaved_times

import graphc as gc

FEATURES, HIDDEN, CLASSES, BATCH = 32, 128, 10, 32


def _module(torch):
    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.head = torch.nn.Linear(HIDDEN, CLASSES)

        def forward(self, x):
            return self.head(self.lstm(x)[1][0][0])  # last hidden state [N, HIDDEN]

    torch.manual_seed(0)
    return Classifier()


def _batches(length: int, n: int = 4):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((BATCH, length, FEATURES)).astype(np.float32),
             "y": rng.integers(0, CLASSES, BATCH).astype(np.int64)} for _ in range(n)]


def graphc_step(torch, length: int, folder: Path):
    path = folder / f"lstm_{length}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_module(torch), (torch.zeros(BATCH, length, FEATURES),), str(path), input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "N"}}, opset_version=17, dynamo=False)
    t0 = time.perf_counter()
    arts = gc.training.generate(gc.load(path), gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(LR))
    seconds = time.perf_counter() - t0
    trainer = gc.Trainer(arts, backend="ort-cpu", threads=THREADS)
    batches = _batches(length)
    nodes = len(arts.train_step.proto.graph.node)
    return (lambda i: trainer.step(batches[i % len(batches)])), seconds, nodes


def torch_step(torch, length: int):
    torch.set_num_threads(THREADS)
    net = _module(torch)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    batches = [{k: torch.from_numpy(v) for k, v in b.items()} for b in _batches(length)]

    def step(i):
        b = batches[i % len(batches)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(b["x"]), b["y"])
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    args = parser.parse_args()
    import torch

    print(f"LSTM {FEATURES}->{HIDDEN} + Linear {HIDDEN}->{CLASSES}, batch {BATCH}, SGD, {THREADS} threads; "
          "ms per step, median / fastest")
    print("| sequence length | graphc ort-cpu | PyTorch eager | PyTorch / graphc (median) "
          "| train_step nodes | generate s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for length in args.lengths:
            ours, seconds, nodes = graphc_step(torch, length, Path(folder))
            times = interleaved_times({"graphc": (ours, args.per_round),
                                       "torch": (torch_step(torch, length), args.per_round)}, args.rounds)
            (g_med, g_min), (t_med, t_min) = times["graphc"], times["torch"]
            print(f"| {length} | {g_med:.2f} / {g_min:.2f} | {t_med:.2f} / {t_min:.2f} | {t_med / g_med:.2f}x "
                  f"| {nodes} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
