"""Time ``gc.vmap`` of an LSTM with mapped weights (an ensemble of ``B`` members, each on its own
sequences) the three ways graphc can write it: the members folded into the hidden size
(block-diagonal weights, ``vmap_rules_rnn._in_hidden``), the op written out (unrolled up to 64 steps, else a Scan over time)
whose cell's MatMuls are batched over the members (``_written_out``), and the Scan over the members (what a
body without rules becomes; forward only: autodiff refuses a recurrent op in a control-flow body).
Forward and forward+backward (``gc.grad`` of the outputs' sum by every stacked weight),
float32 on onnxruntime CPU, median ms per run. The numbers are ``graphc/dsl/vmap_rules_rnn.py``'s and
docs/api.md's.

    python scripts/bench_vmap_rnn.py --steps 50 --batch 16 --inputs 32 --members 4 16 64 --hidden 8 16 64
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import numpy as np

import graphc as gc
from graphc.dsl import vmap_rules, vmap_rules_rnn

FORMS = {"block-diagonal": 10 ** 9, "written out": 0}


class Ensemble(gc.nn.Module):
    """``B`` LSTMs of stacked weights (parameters, so ``gc.grad`` differentiates them), each on its own
    sequences ``x`` (fed)."""

    def __init__(self, members: int, args, hidden: int):
        super().__init__()
        self.net = gc.nn.LSTM(args.inputs, hidden).init_parameters(0)
        rng = np.random.default_rng(0)
        self.names = [k for k, _ in self.net.named_parameters()]
        for i, (_, p) in enumerate(self.net.named_parameters()):
            setattr(self, f"w{i}", gc.nn.Parameter(rng.standard_normal((members, *p.shape)) * 0.1, dtype="float32"))

    def forward(self, x):
        ws = [getattr(self, f"w{i}") for i in range(len(self.names))]
        member = lambda w, a: gc.func.functional_call(self.net, dict(zip(self.names, w)), (a,))[0]
        y = gc.vmap(member, fallback="scan")(ws, x)
        return {"y": y, "loss": gc.sum(y)}


def capture(members: int, args, hidden: int) -> tuple[gc.Model, dict]:
    x = np.random.default_rng(1).standard_normal((members, args.steps, args.batch, args.inputs))
    feeds = {"x": x.astype(np.float32)}
    return gc.capture(Ensemble(members, args, hidden), **feeds), feeds


def median_ms(model: gc.Model, feeds: dict, threads: int, budget_s: float) -> float:
    session = gc.Session(model, backend="ort-cpu", threads=threads)
    session.run(feeds)
    start = time.perf_counter()
    session.run(feeds)
    first = time.perf_counter() - start
    times = [first]
    for _ in range(max(0, min(20, int(budget_s / max(first, 1e-6))) - 1)):
        start = time.perf_counter()
        session.run(feeds)
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--members", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--hidden", type=int, nargs="+", default=[8, 16, 64])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-block-units", type=int, default=2048,
                        help="skip the block-diagonal form above this B*H (B 64 H 64: 8 s a forward)")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of runs per timing (at most 20 runs)")
    args = parser.parse_args()
    print(f"LSTM ensemble, T {args.steps}, N {args.batch}, I {args.inputs}, float32, ort-cpu, {args.threads} "
          f"thread(s), median ms: forward / forward+backward")
    for hidden in args.hidden:
        for members in args.members:
            row = []
            for form, units in FORMS.items():
                if units and members * hidden > args.max_block_units:
                    continue
                with mock.patch.object(vmap_rules_rnn, "BLOCK_DIAGONAL_UNITS", units):
                    model, feeds = capture(members, args, hidden)
                    grads = gc.grad(model, "loss")
                row.append(f"{form} {median_ms(model, feeds, args.threads, args.budget):.2f} / "
                           f"{median_ms(grads, feeds, args.threads, args.budget):.2f}")
            with mock.patch.dict(vmap_rules.RULES):
                del vmap_rules.RULES["LSTM"]
                model, feeds = capture(members, args, hidden)
            row.append(f"Scan over members {median_ms(model, feeds, args.threads, args.budget):.2f}")
            print(f"B {members:3d} H {hidden:3d} (B*H {members * hidden:5d}): " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
