"""Training an imported LSTM: graphc (the LSTM unrolled in train_step up to 4 steps, a Scan past that) against PyTorch eager.

A sequence classifier, nn.LSTM(32 -> 128, batch_first) + Linear(128 -> 10) on the last hidden
state, softmax cross-entropy, plain SGD, batch 32, at several sequence lengths. The same
torch module is exported with torch.onnx (opset 17), loaded with ``gc.load`` and trained with
``gc.Trainer`` on onnxruntime CPU; PyTorch trains the module itself. Both at 2 threads, rows
interleaved (``bench_train.interleaved_times``); ms per step, median / fastest. Needs torch.

    .venv/bin/python scripts/bench_recurrent.py [--lengths 8 32] [--rounds 10]

``--model lm`` instead trains a language model, Embedding(VOCAB -> H) + ``--kind`` (LSTM, GRU or RNN, H -> H)
+ Linear(H -> VOCAB) on every position's output, cross-entropy on next tokens; ``--hidden``,
``--batch`` and ``--optim adamw`` (AdamW(1e-3) both sides) set the rest. Past each kind's cap (RNN 32,
GRU and LSTM 4 steps) graphc's train_step differentiates a Scan per direction in reverse mode (``passes/autodiff/reverse_mode.py``).

    .venv/bin/python scripts/bench_recurrent.py --model lm --kind GRU --hidden 256 --batch 16 --optim adamw \
        --lengths 64 128 512

``--forms`` instead compares the gradient graph's forms of a DSL LSTM and GRU (32 -> 128,
batch 16, the same head and loss) at each length: the layer unrolled, a Scan whose gradient is
unrolled, a Scan differentiated in reverse mode (the caps ``MAX_UNROLLED_STEPS`` and
``MAX_SCAN_UNROLL`` set past or below the length). Per form: train_step nodes, generate and session
build seconds, ms per step at 1 and 2 threads (forms interleaved, median / fastest). Unrolled
forms run up to ``--unrolled-up-to`` steps (their session builds grow faster than linearly).

    .venv/bin/python scripts/bench_recurrent.py --forms [--lengths 8 32 128 512 2048] [--unrolled-up-to 512]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
from bench_train import LR, THREADS, interleaved_times
from graphc.passes.autodiff import recurrent, rules_control

import graphc as gc

FEATURES, HIDDEN, CLASSES, BATCH = 32, 128, 10, 32
FORMS_BATCH = 16
# form -> (recurrent.MAX_UNROLLED_STEPS, rules_control.MAX_SCAN_UNROLL) that select it at any length
# (each kind's own cap, CAPS, set with the first). A Scan written out for a layer is differentiated in
# reverse mode at any length (``REVERSE_MODE_KEY``): "scan, unrolled grad" applies to ``--kind scan`` only
FORMS = {"unrolled": (1 << 30, 0), "scan, unrolled grad": (0, 1 << 30), "scan, reverse mode": (0, 0)}
CAPS = ("MAX_UNROLLED_STEPS", "MAX_UNROLLED_RNN_STEPS", "MAX_UNROLLED_GRU_STEPS", "MAX_UNROLLED_LSTM_STEPS")


VOCAB = 1000


def _module(torch, model: str = "classifier", kind: str = "LSTM", hidden: int = HIDDEN):
    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.head = torch.nn.Linear(HIDDEN, CLASSES)

        def forward(self, x):
            return self.head(self.lstm(x)[1][0][0])  # last hidden state [N, HIDDEN]

    class LanguageModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, hidden)
            self.rnn = getattr(torch.nn, kind)(hidden, hidden, batch_first=True)
            self.head = torch.nn.Linear(hidden, VOCAB)

        def forward(self, x):
            return self.head(self.rnn(self.embed(x))[0]).reshape(-1, VOCAB)  # [N * T, VOCAB]

    torch.manual_seed(0)
    return Classifier() if model == "classifier" else LanguageModel()


def _batches(length: int, n: int = 4, model: str = "classifier", batch: int = BATCH):
    rng = np.random.default_rng(0)
    if model == "lm":
        return [{"x": rng.integers(0, VOCAB, (batch, length)).astype(np.int64),
                 "y": rng.integers(0, VOCAB, batch * length).astype(np.int64)} for _ in range(n)]
    return [{"x": rng.standard_normal((batch, length, FEATURES)).astype(np.float32),
             "y": rng.integers(0, CLASSES, batch).astype(np.int64)} for _ in range(n)]


def graphc_step(torch, length: int, folder: Path, args):
    path = folder / f"{args.model}_{args.kind}_{length}.onnx"
    example = torch.zeros((args.batch, length), dtype=torch.int64) if args.model == "lm" else \
        torch.zeros(args.batch, length, FEATURES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_module(torch, args.model, args.kind, args.hidden), (example,), str(path),
                          input_names=["x"], output_names=["logits"], dynamic_axes={"x": {0: "N"}},
                          opset_version=17, dynamo=False, do_constant_folding=args.model == "classifier")
    optim = gc.optim.AdamW(1e-3) if args.optim == "adamw" else gc.optim.SGD(LR)
    t0 = time.perf_counter()
    arts = gc.training.generate(gc.load(path), gc.losses.cross_entropy("logits", label="y"), optim)
    seconds = time.perf_counter() - t0
    trainer = gc.Trainer(arts, backend="ort-cpu", threads=THREADS)
    batches = _batches(length, model=args.model, batch=args.batch)
    nodes = len(arts.train_step.proto.graph.node)
    return (lambda i: trainer.step(batches[i % len(batches)])), seconds, nodes


def torch_step(torch, length: int, args):
    torch.set_num_threads(THREADS)
    net = _module(torch, args.model, args.kind, args.hidden)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3) if args.optim == "adamw" else \
        torch.optim.SGD(net.parameters(), lr=LR)
    batches = [{k: torch.from_numpy(v) for k, v in b.items()}
               for b in _batches(length, model=args.model, batch=args.batch)]

    def step(i):
        b = batches[i % len(batches)]
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(b["x"]), b["y"])
        loss.backward()
        opt.step()
        return float(loss.detach())

    return step


class _DslClassifier(gc.nn.Module):
    """The layer ``kind`` (gc.nn.LSTM or GRU; "scan": ``h <- tanh(h W + x_t U)`` by ``gc.scan``)
    and a Linear head on its last hidden state."""

    def __init__(self, kind: str, hidden: int):
        super().__init__()
        if kind == "scan":
            self.w, self.u = gc.nn.Linear(hidden, hidden, bias=False), gc.nn.Linear(FEATURES, hidden)
        else:
            self.rnn = getattr(gc.nn, kind)(FEATURES, hidden, batch_first=True)
        self.kind, self.head = kind, gc.nn.Linear(hidden, CLASSES)

    def forward(self, x):
        if self.kind == "scan":
            xs = gc.transpose(x, (1, 0, 2))
            last, _ = gc.scan(lambda h, x_t: (gc.tanh(self.w(h) + self.u(x_t)), ()), gc.zeros_like(self.u(xs[0])), xs)
        else:
            last = self.rnn(x)[1][0][0] if self.kind == "LSTM" else self.rnn(x)[1][0]
        return self.head(last)


def form_steppers(kind: str, hidden: int, length: int, form: str, threads: tuple[int, ...]):
    """(train_step nodes, generate s, {threads: (session build s, stepper)}) of one form."""
    with mock.patch.multiple(recurrent, **dict.fromkeys(CAPS, FORMS[form][0])), \
            mock.patch.object(rules_control, "MAX_SCAN_UNROLL", FORMS[form][1]):
        model = gc.capture(_DslClassifier(kind, hidden), seed=0, x=gc.spec("float32", ("N", length, FEATURES)))
        t0 = time.perf_counter()
        arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(LR))
        seconds = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    batches = [{"x": rng.standard_normal((FORMS_BATCH, length, FEATURES)).astype(np.float32),
                "y": rng.integers(0, CLASSES, FORMS_BATCH).astype(np.int64)} for _ in range(2)]
    steppers = {}
    for n in threads:
        t0 = time.perf_counter()
        trainer = gc.Trainer(arts, backend="ort-cpu", threads=n)
        steppers[n] = (time.perf_counter() - t0,
                       lambda i, trainer=trainer: trainer.step(batches[i % len(batches)]))
    return len(arts.train_step.proto.graph.node), seconds, steppers


def compare_forms(kinds: list[str], hidden: int, lengths: list[int], unrolled_up_to: int, rounds: int, per_round: int,
                  threads: tuple[int, ...]) -> None:
    print(f"DSL LSTM/GRU/gc.scan tanh cell {FEATURES}->{hidden} + Linear, batch {FORMS_BATCH}, SGD, ort-cpu; "
          "ms per step, median / fastest")
    print("| layer | T | form | train_step nodes | generate s | session s | "
          + " | ".join(f"{n} thread{'s' * (n > 1)} ms" for n in threads) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(threads))
    for kind in kinds:
        for length in lengths:
            forms = [f for f in FORMS if (length <= unrolled_up_to or f == "scan, reverse mode")
                     and (kind != "scan" or f != "unrolled")]
            built = {f: form_steppers(kind, hidden, length, f, threads) for f in forms}
            times = {n: interleaved_times({f: (built[f][2][n][1], per_round) for f in forms}, rounds, warmup=2)
                     for n in threads}
            for f in forms:
                nodes, seconds, steppers = built[f]
                cells = " | ".join(f"{times[n][f][0]:.2f} / {times[n][f][1]:.2f}" for n in threads)
                build = "/".join(f"{steppers[n][0]:.2f}" for n in threads)
                print(f"| {kind} | {length} | {f} | {nodes} | {seconds:.2f} | {build} | {cells} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=5)
    parser.add_argument("--forms", action="store_true", help="compare the gradient graph's forms (no torch)")
    parser.add_argument("--unrolled-up-to", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="--forms, --model lm: the layer's hidden size")
    parser.add_argument("--kinds", nargs="+", default=["LSTM", "GRU", "scan"], choices=["LSTM", "GRU", "RNN", "scan"])
    parser.add_argument("--model", default="classifier", choices=["classifier", "lm"])
    parser.add_argument("--kind", default="LSTM", choices=["LSTM", "GRU", "RNN"], help="--model lm: the layer")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--optim", default="sgd", choices=["sgd", "adamw"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    if args.forms:
        compare_forms(args.kinds, args.hidden, args.lengths, args.unrolled_up_to, args.rounds, args.per_round,
                      tuple(args.threads))
        return
    import torch

    what = (f"LSTM {FEATURES}->{HIDDEN} + Linear {HIDDEN}->{CLASSES}" if args.model == "classifier" else
            f"Embedding {VOCAB}->{args.hidden} + {args.kind} {args.hidden}->{args.hidden} + Linear -> {VOCAB} per step")
    print(f"{what}, batch {args.batch}, {args.optim}, {THREADS} threads; ms per step, median / fastest")
    print("| sequence length | graphc ort-cpu | PyTorch eager | PyTorch / graphc (median) "
          "| train_step nodes | generate s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for length in args.lengths:
            ours, seconds, nodes = graphc_step(torch, length, Path(folder), args)
            times = interleaved_times({"graphc": (ours, args.per_round),
                                       "torch": (torch_step(torch, length, args), args.per_round)}, args.rounds)
            (g_med, g_min), (t_med, t_min) = times["graphc"], times["torch"]
            print(f"| {length} | {g_med:.2f} / {g_min:.2f} | {t_med:.2f} / {t_min:.2f} | {t_med / g_med:.2f}x "
                  f"| {nodes} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
