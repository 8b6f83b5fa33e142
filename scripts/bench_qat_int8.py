"""int8 (QDQ export of a QAT model) vs float32 inference on onnxruntime CPU: models/qat_resnet.py trained
one step (the observers set the scales), exported by Trainer.export_inference; the same net with fake
quantization off as the float32 model; and the QDQ export with its weight DequantizeLinears folded to
float weights (what constant folding did before; onnxruntime 1.31 then quantizes those weights itself).
Median ms per run. 2 shared cores, --threads 2, onnxruntime 1.31 (noisy: other jobs ran):

    64px batch 1:   float32 0.84 ms, int8 QDQ 0.61 ms, weights folded 0.59 ms
    64px batch 32:  float32 152 ms,  int8 QDQ 53 ms,   weights folded 68 ms
    128px batch 1:  float32 34.8 ms, int8 QDQ 14.2 ms, weights folded 11.7 ms
    128px batch 32: float32 449 ms,  int8 QDQ 96 ms,   weights folded 160 ms

    python scripts/bench_qat_int8.py [--threads 2] [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import graphc as gc
from graphc import nn
from graphc.models.qat_resnet import QATResNet


def _export(net, px: int, path: Path) -> Path:
    model = gc.capture(net, training=True, x=gc.spec("float32", ("N", 3, px, px)))
    trainer = gc.Trainer(gc.training.generate(model, gc.losses.cross_entropy("output", label="y"),
                                              gc.optim.SGD(lr=0.01)), backend="ort-cpu")
    rng = np.random.default_rng(0)
    trainer.step({"x": rng.standard_normal((4, 3, px, px)).astype(np.float32), "y": rng.integers(0, 10, 4)})
    return trainer.export_inference(path)


def _fold_weight_dq(path: Path, out: Path) -> Path:
    """``path`` with each DequantizeLinear of a constant int8 weight replaced by the float weight."""
    m = onnx.load(path)
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    keep = []
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in consts:
            q, s, z = (consts[i] for i in n.input[:3])
            shape = [-1] + [1] * (q.ndim - 1) if s.ndim else []
            w = (q.astype(np.float32) - z.reshape(shape)) * s.reshape(shape)
            m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    onnx.save(m, out)
    return out


def _time(path: Path, x: np.ndarray, threads: int, runs: int) -> tuple[float, Counter]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.optimized_model_filepath = str(path.with_suffix(".ort.onnx"))
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    kernels = Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)
    for _ in range(3):
        session.run(None, {"x": x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for px in (64, 128):
            net = QATResNet(widths=(32, 64, 128))
            int8 = _export(net, px, folder / f"int8_{px}.onnx")
            folded = _fold_weight_dq(int8, folder / f"folded_{px}.onnx")
            for m in net.modules():
                if isinstance(m, nn.FakeQuantize):
                    m.disable_fake_quant()
            fp32 = _export(net, px, folder / f"fp32_{px}.onnx")
            for batch in (1, 32):
                x = np.random.default_rng(1).standard_normal((batch, 3, px, px)).astype(np.float32)
                row = []
                for name, path in (("float32", fp32), ("int8 QDQ", int8), ("QDQ, weights folded", folded)):
                    ms, kernels = _time(path, x, args.threads, args.runs)
                    row.append(f"{name} {ms:.2f} ms ({kernels['QLinearConv']} QLinearConv)")
                print(f"{px}px batch {batch}: " + ", ".join(row), flush=True)


if __name__ == "__main__":
    main()
