"""graphc.model.inspection: op histogram, parameter stats and the FLOPs estimate of MatMul/Gemm/Conv."""

from __future__ import annotations

import numpy as np

import graphc as gc
from graphc.model.inspection import estimate_flops, op_histogram, param_stats
from graphc.models import EXAMPLES


def test_flops_of_the_cnn_follow_the_formula():
    factory, inputs = EXAMPLES["cnn"]
    model = gc.capture(factory(), **inputs())
    flops = estimate_flops(model, {"N": 4})
    conv = 2 * 4 * (6 * 28 * 28 * 1 * 25 + 16 * 10 * 10 * 6 * 25)
    gemm = 2 * 4 * (400 * 120 + 120 * 84 + 84 * 10)
    assert flops == {"Conv": conv, "Gemm": gemm}
    assert estimate_flops(model, {"N": 8})["Conv"] == 2 * conv


def test_flops_of_matmul_with_batch_dims():
    model = gc.capture(lambda a, b: a @ b, a=gc.spec("float32", ("B", 3, 5, 7)), b=gc.spec("float32", (7, 2)))
    assert estimate_flops(model, {"B": 2}) == {"MatMul": 2 * 2 * 3 * 5 * 2 * 7}


def test_histogram_and_params():
    factory, inputs = EXAMPLES["resnet"]
    model = gc.capture(factory(), **inputs())
    hist = op_histogram(model.ir.graph)
    assert hist["Conv"] == hist["BatchNormalization"] == 9
    elems, nbytes = param_stats(model)
    assert nbytes == 4 * elems == sum(v.nbytes for v in model.params.values())
    assert "BatchNormalization 9" in model.summary()


def test_tensor_index_gathers():
    idx = np.array([2, 0], np.int64)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    seen = {}

    def f(x, i):
        seen["v"] = x[i].numpy()
        return x[:, i]

    gc.capture(f, x=x, i=idx)
    np.testing.assert_array_equal(seen["v"], x[idx])
