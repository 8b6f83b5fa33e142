"""Level 3's QDQ placement on hand-built graphs (passes/optimize/quantized_linear.py): a Gemm's float bias
between DequantizeLinears becomes int32 at the input scale times the weight's, and only where that is the
bias QGemm adds (weight per tensor or per output feature, alpha = beta = 1, in int32 range); per-tensor
QuantizeLinear/DequantizeLinear trade places with a view, values unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc as gc

try:
    from optimize_util import make_model, op_types, run_numpy, run_ort
except ImportError:  # tests/ collected as a package
    from tests.optimize_util import make_model, op_types, run_numpy, run_ort

RNG = np.random.default_rng(0)
F, K, N = TensorProto.FLOAT, 8, 8


def _gemm(weight_scale, axis=0, trans_b=1, bias=None, alpha=1.0):
    """``Gemm(DQ(Q(x)), DQ(w int8), bias)``, input scale 0.05 (uint8, zero point 128)."""
    w = RNG.integers(-127, 128, (N, K) if trans_b else (K, N)).astype(np.int8)
    ws = np.asarray(weight_scale, np.float32)
    b = RNG.standard_normal(N).astype(np.float32) if bias is None else bias
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], **({"axis": axis} if ws.ndim else {})),
             helper.make_node("Gemm", ["xd", "wd", "b"], ["y"], transB=trans_b, alpha=alpha)]
    inits = [("xs", np.float32(0.05)), ("xz", np.uint8(128)), ("w", w), ("ws", ws), ("wz", np.zeros(ws.shape, np.int8)),
             ("b", b)]
    return make_model(nodes, [("x", F, ["B", K])], [("y", F, ["B", N])], inits)


def _bias_node(model):
    gemm = next(n for n in model.ir.graph if n.op_type == "Gemm")
    return gemm.inputs[2].producer()


@pytest.mark.parametrize("weight_scale, axis, trans_b", [
    (np.linspace(1e-3, 1e-2, N), 0, 1),  # per output feature, PyTorch's [out, in] weight
    (np.linspace(1e-3, 1e-2, N), 1, 0),  # per output feature, [in, out]
    (0.004, 0, 1),  # per tensor
])
def test_the_bias_becomes_int32_at_the_input_times_weight_scale(weight_scale, axis, trans_b):
    model = _gemm(weight_scale, axis, trans_b)
    out = gc.optimize(model, level=3)
    dq = _bias_node(out)
    assert dq is not None and dq.op_type == "DequantizeLinear" and dq.inputs[0].const_value.numpy().dtype == np.int32
    scale = dq.inputs[1].const_value.numpy()
    np.testing.assert_array_equal(scale, (np.float32(0.05) * np.asarray(weight_scale, np.float32)).astype(np.float32))
    x = {"x": RNG.standard_normal((5, K)).astype(np.float32)}
    for run in (run_ort, run_numpy):
        diff = np.abs(run(out, x)["y"] - run(model, x)["y"])
        assert diff.max() <= 0.5 * scale.max() + 1e-6, (run.__name__, diff.max())  # the bias's rounding only


@pytest.mark.parametrize("case", ["along the input features", "alpha 2", "past int32"])
def test_a_bias_qgemm_would_not_add_stays_float(case):
    per_feature = np.linspace(1e-3, 1e-2, N)
    model = {"along the input features": lambda: _gemm(per_feature, axis=1, trans_b=1),
             "alpha 2": lambda: _gemm(0.004, alpha=2.0),
             "past int32": lambda: _gemm(1e-6, bias=np.full(N, 1e3, np.float32))}[case]()
    out = gc.optimize(model, level=3)
    assert _bias_node(out) is None  # still the float initializer
    assert op_types(out).count("DequantizeLinear") == 2


def _flatten_then_quantize(other_reader):
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("QuantizeLinear", ["f", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    outputs = [("y", F, ["B", 4])]
    if other_reader:
        nodes.append(helper.make_node("Relu", ["f"], ["r"]))
        outputs.append(("r", F, ["B", 4]))
    return make_model(nodes, [("x", F, ["B", 4, 5, 5])], outputs, [("s", np.float32(0.02)), ("z", np.uint8(7))])


@pytest.mark.parametrize("other_reader", [False, True])
def test_a_quantize_after_a_flatten_moves_before_it_unless_the_float_is_read(other_reader):
    model = _flatten_then_quantize(other_reader)
    out = gc.optimize(model, level=3)
    order = [t for t in op_types(out) if t in ("GlobalAveragePool", "Flatten", "QuantizeLinear")]
    assert order == (["GlobalAveragePool", "Flatten", "QuantizeLinear"] if other_reader
                     else ["GlobalAveragePool", "QuantizeLinear", "Flatten"])
    x = {"x": RNG.standard_normal((3, 4, 5, 5)).astype(np.float32)}
    for run in (run_ort, run_numpy):
        want, got = run(model, x), run(out, x)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=run.__name__)
