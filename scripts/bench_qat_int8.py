"""int8 (QDQ export of a QAT model) vs float32 inference on onnxruntime CPU: models/qat_resnet.py and a QAT
MLP (784-512-512-10 of its QLinear layers, the logits float) trained one step (the observers set the scales),
exported by Trainer.export_inference; the same nets with fake quantization off as the float32 models; and the
QDQ export with its weight DequantizeLinears folded to float weights (what constant folding did before;
onnxruntime 1.31 then quantizes those weights itself). Median ms per run, and the int8 kernels onnxruntime's
optimized graph holds (QLinearConv, QGemm, QLinearGlobalAveragePool; the float-output head was a float Gemm
and the pool a float GlobalAveragePool before level 3 quantized the Linear bias to int32 and moved the pool's
QuantizeLinear before the Flatten). 2 shared cores, --threads 2, --runs 30, onnxruntime 1.31 (noisy: load 8-10
from other jobs; the weights-folded column's head is a float Gemm, as every export's was before):

    resnet 64px batch 1:   float32 1.70 ms,  int8 QDQ 0.609 ms, weights folded 0.583 ms
    resnet 64px batch 32:  float32 120 ms,   int8 QDQ 43.9 ms,  weights folded 59.2 ms
    resnet 128px batch 1:  float32 13.5 ms,  int8 QDQ 10.5 ms,  weights folded 10.4 ms
    resnet 128px batch 32: float32 629 ms,   int8 QDQ 282 ms,   weights folded 216 ms
    mlp batch 1:           float32 0.0339 ms, int8 QDQ 0.0178 ms (3 QGemm), weights folded 0.0136 ms
    mlp batch 32:          float32 0.186 ms, int8 QDQ 0.0688 ms (3 QGemm), weights folded 0.0675 ms

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
from graphc.models.qat_resnet import QATResNet, QLinear, act_quant


def _export(net, shape: tuple[int, ...], path: Path) -> Path:
    model = gc.capture(net, training=True, x=gc.spec("float32", ("N", *shape)))
    trainer = gc.Trainer(gc.training.generate(model, gc.losses.cross_entropy("output", label="y"),
                                              gc.optim.SGD(lr=0.01)), backend="ort-cpu")
    rng = np.random.default_rng(0)
    trainer.step({"x": rng.standard_normal((4, *shape)).astype(np.float32), "y": rng.integers(0, 10, 4)})
    return trainer.export_inference(path)


def _mlp() -> nn.Module:
    return nn.Sequential(act_quant(), QLinear(784, 512, relu=True), QLinear(512, 512, relu=True),
                         QLinear(512, 10, out_quant=False))


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
    options.log_severity_level = 3  # the unused-initializer notes of the folded weights
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


_KERNELS = ("QLinearConv", "QGemm", "QLinearGlobalAveragePool", "Gemm")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    nets = [(f"resnet {px}px", lambda: QATResNet(widths=(32, 64, 128)), (3, px, px)) for px in (64, 128)]
    nets.append(("mlp 784-512-512-10", _mlp, (784,)))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, (label, make, shape) in enumerate(nets):
            net = make()
            int8 = _export(net, shape, folder / f"int8_{i}.onnx")
            folded = _fold_weight_dq(int8, folder / f"folded_{i}.onnx")
            for m in net.modules():
                if isinstance(m, nn.FakeQuantize):
                    m.disable_fake_quant()
            fp32 = _export(net, shape, folder / f"fp32_{i}.onnx")
            for batch in (1, 32):
                x = np.random.default_rng(1).standard_normal((batch, *shape)).astype(np.float32)
                row = []
                for name, path in (("float32", fp32), ("int8 QDQ", int8), ("QDQ, weights folded", folded)):
                    ms, kernels = _time(path, x, args.threads, args.runs)
                    counts = ", ".join(f"{kernels[k]} {k}" for k in _KERNELS if kernels[k])
                    row.append(f"{name} {ms:.3g} ms ({counts})")
                print(f"{label} batch {batch}: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
