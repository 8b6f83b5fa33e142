"""A Conv's or ConvTranspose's weight gradient at run-time spatial sizes vs the static form, onnxruntime CPU.

    .venv/bin/python scripts/bench_runtime_dw.py [--threads 2] [--rounds 15] [--only 0,3,...]
        [--variants static,conv,whole,gathered,runs,runs8,taps]

Each case is loss = sum(op(x, w)**2) differentiated by graphc (``gradient_model``) for x and w:
forward, dx and dW in one graph. ``static`` is captured with x's dims fixed (the static rules);
the others with x [N, C, "H", "W"] (``passes/autodiff/symbolic_spatial.py``), their dW lowered
as: ``conv``, the Conv of x by dy with batch and channels swapped; ``whole``, the gathered
columns of all input channels at once; ``gathered``, the gathered columns a run of 64 channels
of a 3x3 kernel at a time; ``runs``, what graphc builds: an If taking those runs up to a budget
of column values and past it ``runs8`` over runs of the batch; ``whole_batch``, that If with
``runs8`` over the whole batch; ``runs8``, runs of 8 such channels; ``taps``, one
strided window and one GEMM per kernel tap (no column matrix). All sessions of a case are fed the same x, checked to agree, and timed in turn
(median ms); each row ends with every variant's time over the static form's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import time

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper

import graphc
from graphc.passes.autodiff import gradient_model
from graphc.passes.autodiff import symbolic_spatial as spatial

RNG = np.random.default_rng(0)

CASES = [  # (op, batch, in channels, out channels, side (of x), kernel, attributes)
    ("Conv", 8, 64, 64, 32, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 32, 32, 32, 32, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 8, 32, 32, 64, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 16, 64, 64, 64, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 8, 64, 64, 64, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("Conv", 32, 32, 64, 32, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("Conv", 16, 32, 32, 64, 3, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ("Conv", 8, 64, 64, 32, 3, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ("Conv", 16, 64, 64, 32, 3, {"pads": [1, 1, 1, 1], "group": 8}),
    ("Conv", 16, 128, 128, 32, 3, {"pads": [1, 1, 1, 1]}),
    ("ConvTranspose", 8, 64, 32, 16, 2, {"strides": [2, 2]}),
    # past the budget of column values: one run of the batch, three, six
    ("Conv", 8, 64, 64, 256, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 32, 64, 64, 256, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 16, 8, 8, 512, 3, {"pads": [1, 1, 1, 1]}),
    # runs of 64 and of 8 channels the same (8 channels or fewer, a stem's 3): no If between them
    ("Conv", 32, 3, 64, 64, 3, {"pads": [1, 1, 1, 1]}),
    ("Conv", 16, 8, 16, 32, 3, {"pads": [1, 1, 1, 1]}),
]


def _per_tap(g, image, kernel_of, kernel, strides, dilations, begin, end, group, per_group, out_channels):
    """dW [Co, Ci, *k] (dense) as one GEMM per kernel tap: its strided window of the
    channel-major, padded ``image`` [Ci, N*O] against ``kernel_of`` as [Co, N*O]."""
    n_sp, ci = len(kernel), per_group * group
    lead = g.transpose(image, [1, 0, *range(2, 2 + n_sp)])  # [Ci, N, *S]
    zeros = g.ints([0, 0])
    lead = g.op("Pad", lead, g.op("Concat", zeros, spatial._as_value(g, begin), zeros, spatial._as_value(g, end),
                                  axis=0))
    dy = g.op("Reshape", g.transpose(kernel_of, [1, 0, *range(2, 2 + n_sp)]), g.ints([out_channels, -1]))
    ones = g.ints([1] * n_sp)
    span = g.op("Add", g.op("Mul", g.op("Sub", spatial.spatial_of(g, kernel_of), ones), g.ints(strides)), ones)
    taps = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        first = g.ints([o * d for o, d in zip(offsets, dilations)])
        window = g.op("Slice", lead, first, g.op("Add", first, span), g.ints(list(range(2, 2 + n_sp))),
                      g.ints(strides))
        taps.append(g.unsqueeze(g.op("Gemm", dy, g.op("Reshape", window, g.ints([ci, -1])), transB=1), [2]))
    return g.op("Reshape", g.op("Concat", *taps, axis=2), g.ints([out_channels, ci, *kernel]))


@contextlib.contextmanager
def _lowering(variant: str):
    """symbolic_spatial's dW lowered as ``variant`` while a graph is built."""
    saved = {name: getattr(spatial, name) for name in ("_gathers", "_RUN_COLUMNS", "_weight_grad", "_COLUMNS_BUDGET",
                                                       "_batch_chunks")}
    if variant not in ("static", "runs", "whole_batch"):  # the forms alone, not graphc's If between two
        spatial._COLUMNS_BUDGET = 1 << 62
    if variant == "conv":
        spatial._gathers = lambda *args: False
    elif variant == "whole":
        spatial._RUN_COLUMNS = 1 << 40
    elif variant == "gathered":
        pass  # runs of _RUN_COLUMNS, unbounded
    elif variant == "runs8":
        spatial._RUN_COLUMNS = 72
    elif variant == "taps":
        spatial._weight_grad = _per_tap
    elif variant == "whole_batch":
        spatial._batch_chunks = lambda g, build, image, kernel_of, rows, shape: build(g, image, kernel_of)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(spatial, name, value)


def gradient_proto(case, w: np.ndarray, variant: str) -> onnx.ModelProto:
    """The gradient model (x_grad, w_grad) of loss = sum(op(x, w)**2)."""
    op, n, ci, co, side, k, attrs = case
    nodes = [helper.make_node(op, ["x", "w"], ["y"], **attrs), helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    dims = [n, ci, side, side] if variant == "static" else ["N", ci, "H", "W"]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with _lowering(variant):
        return graphc.Model(gradient_model(model, "loss", ["x", "w"])).proto


def session(proto: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # sessions timed in turn
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", help="case numbers, comma-separated (default: all)")
    parser.add_argument("--variants", default="static,conv,whole,gathered,runs,runs8,taps")
    args = parser.parse_args()
    variants = args.variants.split(",")
    picked = [int(i) for i in args.only.split(",")] if args.only else range(len(CASES))
    print(f"onnxruntime {ort.__version__} CPU, {args.threads} threads, median ms of {args.rounds}; x and w gradients")
    for i in picked:
        case = CASES[i]
        op, n, ci, co, side, k, attrs = case
        group = attrs.get("group", 1)
        dense = group == 1  # the per-tap GEMMs are written for dense convs only
        w_shape = [co, ci // group, k, k] if op == "Conv" else [ci, co // group, k, k]
        w = RNG.standard_normal(w_shape, np.float32)
        sessions = {v: session(gradient_proto(case, w, v), args.threads) for v in variants if dense or v != "taps"}
        x = RNG.standard_normal([n, ci, side, side], np.float32)
        results = {v: s.run(None, {"x": x}) for v, s in sessions.items()}
        first = next(iter(results.values()))
        for v, got in results.items():
            for a, b in zip(first, got):
                np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3 * float(np.abs(a).max()), err_msg=f"case {i}: {v}")
        times: dict[str, list[float]] = {v: [] for v in sessions}
        for _ in range(args.rounds):
            for v, s in sessions.items():
                start = time.perf_counter()
                s.run(None, {"x": x})
                times[v].append(time.perf_counter() - start)
        ms = {v: statistics.median(t) * 1e3 for v, t in times.items()}
        geometry = " ".join(f"{key}={value}" for key, value in attrs.items() if key != "pads")
        label = f"{i}: {op} N={n} {ci}->{co} {side}x{side} {k}x{k} {geometry}"
        ratios = " ".join(f"{v} {t / ms['static']:.2f}" for v, t in ms.items() if v != "static") if "static" in ms else ""
        print(f"{label:<60}" + "  ".join(f"{v} {t:7.2f}" for v, t in ms.items())
              + (f"  (/static: {ratios})" if ratios else ""), flush=True)


if __name__ == "__main__":
    main()
