"""Time every models/ example on the numpy backend, onnx's ReferenceEvaluator, onnxruntime CPU
(2 threads) and, for the two-layer net and the CNN, a hand-written numpy forward reading the
same parameters. All ratios come from the same run.

    python scripts/bench_backends.py                 # batch 1 and 64, every example
    python scripts/bench_backends.py --batch 64 --model cnn --model resnet

Targets (issue 3): numpy backend >= 20x faster than ReferenceEvaluator on the CNN and ResNet
at batch 64, and within 2x of the hand-written numpy forward.
"""

from __future__ import annotations

import os
import sys

# BLAS threads are set before numpy loads (``--blas-threads N``, default 1): with more BLAS
# threads than free cores OpenBLAS's spin-waiting makes timings erratic (a 3 MFLOP Gemm was
# seen taking 70 ms on a busy 2-core box). The numpy backend, the hand-written forward and
# ReferenceEvaluator all share the setting; onnxruntime always gets 2 intra-op threads.
if __name__ == "__main__":  # imported (by a test), the process keeps its own settings
    _BLAS = sys.argv[sys.argv.index("--blas-threads") + 1] if "--blas-threads" in sys.argv else "1"
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = _BLAS

import argparse  # noqa: E402
import time
import warnings

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import as_strided
from rich.console import Console
from rich.table import Table

import graphc as gc
from graphc.backends.numpy import NumpyBackend
from graphc.models import EXAMPLES


def time_per_run(fn, budget_s: float = 1.0, max_runs: int = 200) -> float:
    """Median seconds per call: one warm-up, then as many calls as fit in ``budget_s``."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_runs and (len(times) < 3 or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# -- hand-written numpy forwards (what one would write without graphc) ---------------------------
def hand_two_layer(p, x):
    h = np.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0)
    return h @ p["fc2.weight"].T + p["fc2.bias"]


def _conv2d(x, w, b, pad):
    if pad:
        x = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    n, c, h, wd = x.shape
    m, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    s = x.strides
    cols = as_strided(x, (n, oh, ow, c, kh, kw), (s[0], s[2], s[3], s[1], s[2], s[3]))
    y = cols.reshape(n * oh * ow, -1) @ w.reshape(m, -1).T + b
    return y.reshape(n, oh, ow, m).transpose(0, 3, 1, 2)


def _maxpool2(x):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))


def hand_cnn(p, x):
    x = _maxpool2(np.maximum(_conv2d(x, p["conv1.weight"], p["conv1.bias"], 2), 0))
    x = _maxpool2(np.maximum(_conv2d(x, p["conv2.weight"], p["conv2.bias"], 0), 0))
    x = x.reshape(x.shape[0], -1)
    x = np.maximum(x @ p["fc1.weight"].T + p["fc1.bias"], 0)
    x = np.maximum(x @ p["fc2.weight"].T + p["fc2.bias"], 0)
    return x @ p["fc3.weight"].T + p["fc3.bias"]


HAND = {"two_layer_net": hand_two_layer, "cnn": hand_cnn}


def example_feeds(model: gc.Model, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for spec in model.inputs:
        if spec.name in model.params:
            continue
        shape = tuple(batch if not isinstance(d, int) else d for d in spec.shape)
        if spec.dtype.startswith("int"):
            feeds[spec.name] = rng.integers(0, 100, size=shape).astype(spec.dtype)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return feeds


def bench_model(name: str, batch: int, budget: float, with_reference: bool) -> dict:
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    factory, inputs = EXAMPLES[name]
    model = gc.capture(factory(), **inputs())
    proto = model.proto
    feeds = example_feeds(model, batch, np.random.default_rng(0))
    row = {"model": name, "batch": batch}

    exe = NumpyBackend().prepare(proto)
    out = exe.run(feeds)[exe.output_names[0]]
    row["numpy"] = time_per_run(lambda: exe.run(feeds), budget)

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ort_out = session.run(None, feeds)[0]
    row["ort"] = time_per_run(lambda: session.run(None, feeds), budget)
    row["max_err_vs_ort"] = float(np.max(np.abs(out - ort_out)))

    if with_reference:
        ref = ReferenceEvaluator(proto)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            row["reference"] = time_per_run(lambda: ref.run(None, feeds), budget, max_runs=20)

    if name in HAND:
        params = model.params
        x = feeds[next(iter(feeds))]
        hand_out = HAND[name](params, x)
        row["hand_err"] = float(np.max(np.abs(hand_out - out)))
        row["hand"] = time_per_run(lambda: HAND[name](params, x), budget)
    return row


def _ms(v):
    return f"{v * 1e3:.3f}" if v is not None else "-"


def _ratio(a, b):
    return f"{a / b:.1f}x" if a is not None and b is not None else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(EXAMPLES), help="(repeatable)")
    parser.add_argument("--batch", type=int, action="append", help="default: 1 and 64")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds of timing per cell")
    parser.add_argument("--no-reference", action="store_true", help="skip ReferenceEvaluator")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads for the numpy columns")
    args = parser.parse_args(argv)

    rows = []
    for name in args.model or list(EXAMPLES):
        for batch in args.batch or [1, 64]:
            rows.append(bench_model(name, batch, args.budget, not args.no_reference))

    table = Table(title=f"time per run (ms), ratios from the same run; numpy BLAS threads: {args.blas_threads}")
    for col in ("model", "batch", "numpy", "reference", "ort-cpu (2 thr)", "hand numpy",
                "reference / numpy", "numpy / hand", "numpy / ort", "max |numpy - ort|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["model"], str(r["batch"]), _ms(r["numpy"]), _ms(r.get("reference")), _ms(r["ort"]),
                      _ms(r.get("hand")), _ratio(r.get("reference"), r["numpy"]), _ratio(r["numpy"], r.get("hand")),
                      _ratio(r["numpy"], r["ort"]), f"{r['max_err_vs_ort']:.1e}")
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
