"""The numpy backend against onnx.reference.ReferenceEvaluator (and onnxruntime where it agrees with
the spec) at the edges: zero-sized dims, empty reductions, negative axes and indices, conv and pool
geometry (auto_pad, dilations, ceil_mode, kernels narrower than the stride). Seeded, about 2 s.

Where onnx.reference is wrong the case says so and checks the spec's answer another way."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from graphc.errors import BackendError
from tests.numpy_backend_util import feeds_of, node_model, numpy_vs_ort, run_numpy, run_ort

RNG = np.random.default_rng(0)


def reference(op_type, inputs, attrs, opset):
    model = node_model(op_type, inputs, attrs, opset)
    return ReferenceEvaluator(model).run(None, feeds_of(model, inputs))


def ours(op_type, inputs, attrs, opset):
    model = node_model(op_type, inputs, attrs, opset)
    return run_numpy(model, feeds_of(model, inputs))


def assert_same(got, want, what):
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        tol = 2e-3 if g.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol, equal_nan=True,
                                   err_msg=what)


def vs_reference(op_type, inputs, attrs, opset):
    assert_same(ours(op_type, inputs, attrs, opset), reference(op_type, inputs, attrs, opset),
                f"{op_type}@{opset} {attrs} {[None if x is None else x.shape for x in inputs]}")


REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]


def _reduce_cases():
    for op, shape, dtype in itertools.product(REDUCE, [(2, 0, 3), (0,), (1, 3), (2, 3, 4)],
                                              [np.float32, np.float16, np.int32]):
        if dtype == np.int32 and op in ("ReduceLogSum", "ReduceLogSumExp", "ReduceL2"):
            continue
        axes_choices = [None, [], [-1]] + ([[0, -1], [1]] if len(shape) > 1 else [])
        for axes, keepdims, noop in itertools.product(axes_choices, (0, 1), (0, 1)):
            reduced = range(len(shape)) if not axes and not (noop and axes is not None) else axes
            if op == "ReduceMean" and dtype == np.int32 and any(shape[a] == 0 for a in reduced):
                continue  # 0/0 in integers: raises, test_integer_mean_of_nothing_raises
            yield op, shape, dtype, axes, keepdims, noop


@pytest.mark.parametrize("op", REDUCE)
def test_reductions_match_onnx_reference_on_empty_and_negative_axes(op):
    for _, shape, dtype, axes, keepdims, noop in (c for c in _reduce_cases() if c[0] == op):
        x = (RNG.random(shape) * 4 + 0.5).astype(dtype)
        inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
        attrs = {"keepdims": keepdims, "noop_with_empty_axes": noop}
        (got,) = ours(op, inputs, attrs, 18)
        (want,) = reference(op, inputs, attrs, 18)
        assert got.dtype == x.dtype  # the spec's; onnx.reference's ReduceSumSquare of int32 over all axes is int64
        assert_same([got], [want.astype(x.dtype)], f"{op} {attrs} axes {axes} on {x.dtype}{shape}")


def test_mean_of_nothing_is_nan_without_a_warning():
    """The spec leaves it undefined; it is 0/0 (onnx.reference: NaN; onnxruntime: 0)."""
    x = np.zeros((2, 0, 3), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's np.mean warns "Mean of empty slice"
        for opset, inputs, attrs in [(18, [x, np.array([1], np.int64)], {}), (13, [x], {"axes": [-2]}),
                                     (18, [x], {"keepdims": 0})]:
            (got,) = ours("ReduceMean", inputs, attrs, opset)
            assert got.dtype == np.float32 and got.size and np.isnan(got).all()


def test_integer_mean_of_nothing_raises():
    with pytest.raises(BackendError, match=r"ReduceMean over an empty set \(axes \[1\] .* is 0/0, which int32"):
        ours("ReduceMean", [np.zeros((2, 0), np.int32), np.array([1], np.int64)], {}, 18)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_family_on_empty_axes(op, opset):
    for shape, axis in [((2, 0), -1), ((0, 3), 1), ((2, 0, 3), 1)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        vs_reference(op, [x], {"axis": axis}, opset)
        got, want = numpy_vs_ort(op, [x], {"axis": axis}, opset)
        assert_same(got, want, f"{op} vs onnxruntime")


def test_flatten_of_empty_tensors():
    """The numpy Flatten asked numpy for (rows, -1), which an empty tensor cannot resolve (grad fuzz find;
    onnx.reference fails the same way, so onnxruntime is the oracle)."""
    for shape, axis in [((0, 4, 1, 1), 2), ((3, 0, 2), 1), ((3, 0, 2), 2), ((0, 2), 0), ((2, 0), -1)]:
        x = RNG.standard_normal(shape).astype(np.float32)
        got, want = numpy_vs_ort("Flatten", [x], {"axis": axis}, 21)
        assert_same(got, want, f"Flatten {shape} axis={axis} vs onnxruntime")

def test_conv_transpose_same_with_a_kernel_narrower_than_the_stride():
    """Output input * strides (the spec); the pads are negative and split rounding down, as
    onnx.reference has it. onnxruntime and onnx's shape inference clamp the total pad to 0 instead
    (3 wide, kernel 1, stride 2: 5 wide, not 6), so it is not compared."""
    for n, k, s, d, op, auto_pad in itertools.product([1, 3, 4], [1, 2, 3], [1, 2, 3, 4], [1, 2], [0, 1],
                                                      ["SAME_UPPER", "SAME_LOWER"]):
        if op >= s:  # onnx.reference refuses output_padding past the stride
            continue
        x = RNG.standard_normal((1, 2, n)).astype(np.float32)
        w = RNG.standard_normal((2, 1, k)).astype(np.float32)
        attrs = {"auto_pad": auto_pad, "strides": [s], "dilations": [d], "output_padding": [op]}
        (got,) = ours("ConvTranspose", [x, w], attrs, 18)
        assert got.shape[2] == n * s
        vs_reference("ConvTranspose", [x, w, RNG.standard_normal(1).astype(np.float32)], attrs, 18)
    x = np.arange(1, 4, dtype=np.float32).reshape(1, 1, 3)
    for auto_pad, stride, want in [("SAME_UPPER", 2, [0, 1, 0, 2, 0, 3]), ("SAME_LOWER", 2, [1, 0, 2, 0, 3, 0]),
                                   ("SAME_LOWER", 3, [0, 1, 0, 0, 2, 0, 0, 3, 0])]:
        (got,) = ours("ConvTranspose", [x, np.ones((1, 1, 1), np.float32)], {"auto_pad": auto_pad, "strides": [stride]}, 18)
        np.testing.assert_array_equal(got.ravel(), want)


def _spec_same_pads(spatial, kernel, strides, dilations, auto_pad):
    """A pool's explicit pads for auto_pad SAME_*, by the spec: output ceil(size / stride)."""
    begin, end = [], []
    for n, k, s, dl in zip(spatial, kernel, strides, dilations):
        total = max((-(-n // s) - 1) * s + (k - 1) * dl + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else big)
        end.append(big if auto_pad == "SAME_UPPER" else small)
    return begin + end


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool", "Conv"])
def test_pools_and_conv_geometry(op):
    """Random pads, strides, dilations, ceil_mode. SAME_* is checked against the oracle run on the
    spec's explicit pads: onnx.reference and onnxruntime pad SAME pools as if undilated (MaxPool
    4x6, kernel [2, 1], strides 3, dilations [2, 1], SAME_LOWER: 1x2, not ceil(4/3) x 2)."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        nd = int(rng.integers(1, 3))
        spatial = [int(rng.integers(1, 7)) for _ in range(nd)]
        kernel = [int(rng.integers(1, 4)) for _ in range(nd)]
        strides = [int(rng.integers(1, 4)) for _ in range(nd)]
        dilations = [int(rng.integers(1, 3)) for _ in range(nd)]
        auto_pad = str(rng.choice(["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
        pads = [int(rng.integers(0, 3)) for _ in range(2 * nd)]
        x = rng.standard_normal((2, 2, *spatial)).astype(np.float32)
        attrs = {"strides": strides, "dilations": dilations}
        inputs = [x]
        if op == "Conv":
            inputs += [rng.standard_normal((3, 2, *kernel)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
        else:
            attrs["kernel_shape"] = kernel
            if auto_pad == "NOTSET" and op != "LpPool":  # onnx.reference's LpPool pads ceil_mode's extra wrongly
                attrs["ceil_mode"] = int(rng.integers(0, 2))
            if op == "AveragePool":
                attrs["count_include_pad"] = int(rng.integers(0, 2))
            if op == "LpPool":
                attrs["p"] = int(rng.integers(1, 4))
        explicit = dict(attrs, pads=pads if auto_pad == "NOTSET" else
                        [0] * 2 * nd if auto_pad == "VALID" else _spec_same_pads(spatial, kernel, strides, dilations, auto_pad))
        effective = [(k - 1) * dl + 1 for k, dl in zip(kernel, dilations)]
        begin, end = explicit["pads"][:nd], explicit["pads"][nd:]
        if any(n + b + e < f or max(b, e) >= k for n, b, e, f, k in zip(spatial, begin, end, effective, kernel)):
            continue  # no window, or pads onnxruntime refuses (not under the kernel's size)
        if op == "MaxPool":  # onnx.reference's MaxPool takes uneven pads wrongly (1 window, not 2, for 2 wide,
            model = node_model(op, inputs, explicit, 19)  # kernel 2, pads [0, 1]; [1, 0] raises IndexError)
            # a window all padding has no maximum: -inf here, the lowest float32 there (undefined)
            want = [np.where(w == np.finfo(np.float32).min, -np.inf, w) for w in run_ort(model, feeds_of(model, inputs))]
        else:
            want = reference(op, inputs, explicit, 19)
        assert_same(ours(op, inputs, dict(attrs, auto_pad=auto_pad) if auto_pad != "NOTSET" else explicit, 19),
                    want, f"{op} {auto_pad} {explicit} on {spatial}")


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_with_no_window_is_empty(op):
    """Pads of 2 and 1 on 1 wide, kernel 3 dilated 2, stride 2: floor(-1 / 2) + 1 = 0 windows."""
    x = np.ones((2, 2, 1, 2), np.float32)
    vs_reference(op, [x], {"strides": [2, 3], "dilations": [2, 1], "pads": [2, 2, 1, 0], "kernel_shape": [3, 2]}, 19)


def _i64(*values):
    return np.array(values, np.int64)


def test_indexing_and_integer_arithmetic_at_the_edges():
    """Regression guards: these agree today (Slice steps past the ends, negative indices,
    Div truncating and Mod's two signs, broadcasting against 0 and 1)."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for starts, ends, axes, steps in [(-1, -100, 2, -1), (10, -10, -1, -2), (0, 2**62, 1, 2**62),
                                      (-(2**62), 2**62, 0, 3), (3, 0, 2, -5), (-1, -(2**63), 2, -1)]:
        vs_reference("Slice", [x, _i64(starts), _i64(ends), _i64(axes), _i64(steps)], {}, 13)
    for axis in (0, -1, 1):
        vs_reference("Gather", [x, _i64(-1, 0, -2)], {"axis": axis}, 13)
    vs_reference("GatherND", [x, np.array([[-1, 0], [0, -2]], np.int64)], {}, 13)
    for reduction in ("none", "add", "mul", "max", "min"):
        vs_reference("ScatterND", [x, np.array([[-1, 0], [0, -1], [-1, 0]], np.int64),
                                   RNG.standard_normal((3, 4)).astype(np.float32)], {"reduction": reduction}, 18)
    a, b = np.array([-7, 7, -7, 7, 0, -1, 5], np.int32), np.array([2, -2, -2, 2, 3, 4, -3], np.int32)
    vs_reference("Div", [a, b], {}, 14)
    for fmod in (0, 1):
        vs_reference("Mod", [a, b], {"fmod": fmod}, 13)
    for sa, sb in [((0, 3), (1, 3)), ((2, 1, 3), (0, 1)), ((), (2, 0))]:
        vs_reference("Add", [RNG.random(sa).astype(np.float32), RNG.random(sb).astype(np.float32)], {}, 13)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# (op, inputs, attrs, opset, what the message says). onnxruntime refuses every one; onnx.reference
# broadcasts some (a bias of 2 for 1 channel, PRelu's slope [2, 3] on [1, 3], a scale of 1 for 3 channels).
REFUSED = [
    ("Conv", [_f32(1, 1, 3), _f32(1, 1, 2), _f32(2)], {}, 19, r"bias B has shape \[2\], expected \[1\]"),
    ("Conv", [_f32(1, 1, 3), _f32(1, 1, 2), _f32(1, 1)], {}, 19, r"bias B has shape \[1, 1\], expected \[1\]"),
    ("ConvTranspose", [_f32(1, 1, 3), _f32(1, 1, 2), _f32(2)], {}, 19, r"bias B has shape \[2\], expected \[1\]"),
    ("ConvTranspose", [_f32(1, 2, 3), _f32(2, 2, 2), _f32(2)], {"group": 2}, 19, r"bias B has shape \[2\], expected \[4\] .*group 2"),
    ("QLinearConv", [np.ones((1, 1, 3), np.uint8), np.float32(0.1), np.uint8(0), np.ones((1, 1, 2), np.uint8),
                     np.float32(0.1), np.uint8(0), np.float32(0.2), np.uint8(0), np.ones(2, np.int32)], {}, 10,
     r"bias B has shape \[2\], expected \[1\]"),
    ("Gemm", [_f32(2, 3), _f32(3, 4), _f32(2, 1, 4)], {}, 13, r"C has shape \[2, 1, 4\].* to \[2, 4\]"),
    ("Gemm", [_f32(1, 3), _f32(3, 4), _f32(2, 4)], {}, 13, r"C has shape \[2, 4\].* to \[1, 4\]"),
    ("Gemm", [_f32(2, 3), _f32(3, 4), _f32(3)], {}, 13, r"C has shape \[3\].* to \[2, 4\]"),
    ("BatchNormalization", [_f32(2, 3, 4), _f32(1), _f32(3), _f32(3), _f32(3)], {}, 15,
     r"scale has shape \[1\], expected \[3\]"),
    ("BatchNormalization", [_f32(2, 3, 4), _f32(3), _f32(3), _f32(2), _f32(3)], {"training_mode": 1}, 15,
     r"input_mean has shape \[2\], expected \[3\]"),
    ("InstanceNormalization", [_f32(2, 3, 4), _f32(3), _f32(1)], {}, 15, r"B has shape \[1\], expected \[3\]"),
    ("LayerNormalization", [_f32(2, 3, 4), _f32(3)], {}, 17, r"Scale has shape \[3\].* to \[2, 3, 4\]"),
    ("LayerNormalization", [_f32(2, 3, 4), _f32(4), _f32(2, 2, 4)], {}, 17, r"B has shape \[2, 2, 4\]"),
    ("PRelu", [_f32(1, 3), _f32(2, 3)], {}, 16, r"slope has shape \[2, 3\].* to \[1, 3\]"),
    ("PRelu", [_f32(2, 3, 4), _f32(3)], {}, 16, r"slope has shape \[3\].* to \[2, 3, 4\]"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[f"{c[0]}-{i}" for i, c in enumerate(REFUSED)])
def test_parameters_of_the_wrong_shape_are_refused(case):
    op, inputs, attrs, opset, message = case
    inputs = [np.asarray(x) for x in inputs]
    with pytest.raises(BackendError, match=rf"node '{op.lower()}_node' \({op}\) failed.*: ValueError: {message}"):
        ours(op, inputs, attrs, opset)


def test_parameters_that_broadcast_unidirectionally_are_accepted():
    x = _f32(2, 3, 4)
    vs_reference("LayerNormalization", [x, _f32(1, 4), _f32(2, 1, 4)], {}, 17)
    vs_reference("PRelu", [x, _f32(3, 1)], {}, 16)
    vs_reference("Gemm", [_f32(2, 3), _f32(3, 4), _f32(2, 1)], {}, 13)


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("Conv", [_f32(1, 1, 3), _f32(1, 1, 3)], {"dilations": [3], "strides": [2]},
     (r"on spatial axis 0: it spans \(kernel 3 - 1\) \* dilation 3 \+ 1 = 7, the input 3 \+ pads 0 \+ 0 = 3, "
      r"so the output would be -1 long \(stride 2\)")),
    ("MaxPool", [_f32(1, 1, 4, 3)], {"kernel_shape": [1, 3], "dilations": [1, 3]}, r"axis 1: .* = 7, .* -3 long"),
    ("AveragePool", [_f32(1, 1, 3)], {"kernel_shape": [6], "pads": [1, 0]}, r"= 6, the input 3 \+ pads 1 \+ 0 = 4"),
    ("LpPool", [_f32(1, 1, 3)], {"kernel_shape": [5], "auto_pad": "VALID"}, r"= 5, .* would be -1 long"),
    ("ConvTranspose", [_f32(1, 1, 3), _f32(1, 1, 3)], {"pads": [5, 5]},
     r"pads \[5, 5\] crop more than the full output \[5\] .* would be \[-5\]"),
])
def test_a_kernel_that_does_not_fit_is_refused(op, inputs, attrs, message):
    """Was numpy's 'negative dimensions are not allowed' (Conv) or a silently empty output (pools:
    MaxPool 3 wide, kernel 3 dilated 3, gave [1, 1, 0]); onnxruntime refuses them too. An output
    of 0 windows stays empty (test_pool_with_no_window_is_empty)."""
    with pytest.raises(BackendError, match=message):
        ours(op, inputs, attrs, 19)


@pytest.mark.parametrize("op, want", [("GlobalAveragePool", np.nan), ("GlobalMaxPool", -np.inf),
                                      ("GlobalLpPool", 0.0)])
def test_global_pools_over_empty_spatial_dims(op, want):
    """As ReduceMean/ReduceMax/ReduceL2 over the spatial axes: NaN (0/0, no 'Mean of empty slice'
    warning), -inf (ReduceMax's spec for an empty set; numpy raised 'zero-size array'), 0.
    onnxruntime refuses empty spatial dims; onnx.reference gives NaN and raises for the maximum."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for dtype in (np.float32, np.float16):
            (got,) = ours(op, [np.zeros((2, 3, 0, 4), dtype)], {}, 13)
            assert got.shape == (2, 3, 1, 1) and got.dtype == dtype
            np.testing.assert_array_equal(got, np.full(got.shape, want, dtype))
    if op == "GlobalAveragePool":
        vs_reference(op, [np.zeros((2, 3, 0), np.float32)], {}, 13)
    for op_ in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):  # empty batch: as onnxruntime
        got, want_ = numpy_vs_ort(op_, [np.zeros((0, 3, 2), np.float32)], {}, 13)
        assert_same(got, want_, op_)


F = np.ones
U8 = np.ones((), np.uint8)
S = np.full((), 0.1, np.float32)


@pytest.mark.parametrize("op, inputs, attrs, opset, message", [
    ("Conv", [F((1, 4, 5, 5), np.float32), F((2, 3, 3, 3), np.float32)], {}, 18,
     r"W has shape \[2, 3, 3, 3\]: its input channels \(dim 1\) are 3, expected X's channels C / group = 4 / 1 = 4"),
    ("Conv", [F((1, 4, 5, 5), np.float32), F((3, 2, 3, 3), np.float32)], {"group": 2}, 18,
     r"group is 2, which does not divide X's channels C = 4 and W's output channels M = 3"),
    ("ConvTranspose", [F((1, 4, 5), np.float32), F((3, 2, 3), np.float32)], {}, 18,
     r"W has shape \[3, 2, 3\]: its input channels \(dim 0\) are 3, expected X's channels C = 4"),
    ("QLinearConv", [F((1, 2, 4, 4), np.uint8), S, U8, F((3, 2, 3, 3), np.uint8), np.full(2, 0.1, np.float32),
                     F(3, np.uint8), S, U8], {}, 10,
     r"w_scale has shape \[2\], expected one value or one per output channel \[M\] = \[3\]"),
    ("QLinearConv", [F((1, 2, 4, 4), np.uint8), S, U8, F((3, 2, 3, 3), np.uint8), S, F(2, np.uint8), S, U8], {}, 10,
     r"w_zero_point has shape \[2\], expected one value or one per output channel \[M\] = \[3\]"),
    ("GroupNormalization", [F((2, 4, 3), np.float32), F(2, np.float32), F(4, np.float32)], {"num_groups": 2}, 21,
     r"scale has shape \[2\], expected \[4\] \(one value per channel\)"),
    ("GroupNormalization", [F((2, 4, 3), np.float32), F(2, np.float32), F(4, np.float32)], {"num_groups": 2}, 18,
     r"bias has shape \[4\], expected \[2\] \(opset 18: one value per group\)"),
    ("GroupNormalization", [F((2, 4, 3), np.float32), F(4, np.float32), F(4, np.float32)], {"num_groups": 3}, 21,
     r"num_groups is 3, which does not divide X's channels C = 4"),
    ("Gemm", [F((2, 3), np.float32), F((3, 4), np.float32), F(4, np.float32)], {"broadcast": 0}, 6,
     r"C has shape \[4\], expected \[2, 4\] \(broadcast 0"),
    ("Gemm", [F((2, 3), np.float32), F((4, 4), np.float32)], {}, 13,
     r"A has shape \[2, 3\] and B \[4, 4\]: the inner dims differ \(A's last is 3, B's second to last is 4\)"),
    ("MatMul", [F((7, 2, 3), np.float32), F((5, 3, 5), np.float32)], {}, 13,
     r"A has shape \[7, 2, 3\] and B \[5, 3, 5\]: the batch dims \[7\] and \[5\] do not broadcast"),
    ("MatMul", [F(3, np.float32), F(4, np.float32)], {}, 13,
     r"A has shape \[3\] and B \[4\]: the inner dims differ \(A's last is 3, B's only one is 4\)"),
    ("Concat", [F((2, 3), np.float32), F((2, 3, 1), np.float32)], {"axis": 0}, 13,
     r"input 1 has shape \[2, 3, 1\] and input 0 \[2, 3\]: inputs must have one rank and the same dims off axis 0"),
    ("Concat", [F((2, 3), np.float32), F((2, 4), np.float32)], {"axis": 2}, 13, r"axis 2 is outside \[-2, 1\]"),
    ("Reshape", [F((2, 3), np.float32), np.array([4, -1], np.int64)], {}, 14,
     r"cannot reshape the input \[2, 3\] \(6 values\) to shape \[4, -1\] .*: its other dims hold 4 values"),
    ("Reshape", [F((2, 3), np.float32), np.array([0, 0, 0], np.int64)], {}, 14,
     r"shape \[0, 0, 0\] has a 0 at position 2, which copies a dim of the input, but the input \[2, 3\] has rank 2"),
    ("Expand", [F((2, 3), np.float32), np.array([4, 3], np.int64)], {}, 13,
     r"the input \[2, 3\] does not broadcast with shape \[4, 3\]"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 3, 3, 3), np.float32), F((1, 18, 3, 3), np.float32)], {}, 19,
     r"W has shape \[2, 3, 3, 3\]: its input channels \(dim 1\) are 3, expected X's channels C / group = 4 / 1 = 4"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((3, 2, 3, 3), np.float32), F((1, 18, 3, 3), np.float32)],
     {"group": 2}, 19, r"group is 2, which does not divide X's channels C = 4 and W's output channels M = 3"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 4, 3, 3), np.float32), F((1, 54, 3, 3), np.float32)],
     {"offset_group": 3}, 19, r"offset_group is 3, which does not divide X's channels C = 4"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 4, 3, 3), np.float32), F((1, 18, 3, 3), np.float32)],
     {"kernel_shape": [2, 2]}, 19, r"kernel_shape is \[2, 2\], but W has shape \[2, 4, 3, 3\]: expected its spatial dims \[3, 3\]"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 4, 3, 3), np.float32), F((1, 16, 3, 3), np.float32)], {}, 19,
     r"offset has shape \[1, 16, 3, 3\], expected \[1, 18, 3, 3\] \(\[N, offset_group \* kH \* kW = 1 \* 3 \* 3 \* 2, oH, oW\], "
     r"the output 3 x 3\)"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 4, 3, 3), np.float32), F((1, 18, 3, 3), np.float32)],
     {"pads": [0, 0, 1, 0]}, 19, r"offset has shape \[1, 18, 3, 3\], expected \[1, 18, 4, 3\]"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 4, 3, 3), np.float32), F((1, 18, 3, 3), np.float32), None,
                    F((1, 8, 3, 3), np.float32)], {}, 19, r"mask has shape \[1, 8, 3, 3\], expected \[1, 9, 3, 3\]"),
    ("DeformConv", [F((1, 4, 5, 5), np.float32), F((2, 4, 3, 3), np.float32), F((1, 18, 3, 3), np.float32),
                    F(3, np.float32)], {}, 19, r"bias B has shape \[3\], expected \[2\]"),
    ("DeformConv", [F((1, 4, 5, 5, 1), np.float32), F((2, 4, 3, 3, 1), np.float32), F((1, 18, 3, 3, 1), np.float32)],
     {}, 19, r"X has shape \[1, 4, 5, 5, 1\], expected \[N, C, H, W\]: the numpy backend's DeformConv is 2-D"),
    ("QuantizeLinear", [F((4, 6), np.float32), F((4, 4), np.float32), F((4, 4), np.int8)], {"axis": 1, "block_size": 2}, 21,
     r"y_scale has shape \[4, 4\], expected \[4, 3\] \(blocked: x's shape with ceil\(6 / block_size 2\) = 3 on axis 1\)"),
    ("QuantizeLinear", [F((4, 6), np.float32), F((4, 3), np.float32), F((2, 3), np.int8)], {"axis": 1, "block_size": 2}, 21,
     r"y_zero_point has shape \[2, 3\], expected \[4, 3\]"),
    ("DequantizeLinear", [F((4, 6), np.int8), F((2, 6), np.float32)], {"axis": 0, "block_size": 4}, 21,
     r"x_scale has shape \[2, 6\], expected \[1, 6\] \(blocked: x's shape with ceil\(4 / block_size 4\) = 1 on axis 0\)"),
    ("DequantizeLinear", [F((4, 6), np.int8), F(5, np.float32)], {"axis": 1}, 21,
     r"x_scale has shape \[5\], expected \[6\] \(per axis: one value per index of x's axis 1, 6 long\)"),
])
def test_mismatched_shapes_are_named(op, inputs, attrs, opset, message):
    """Each was numpy's own error (matmul's gufunc signature, 'operands could not be broadcast',
    'tuple index out of range') or, for Gemm's opset-6 broadcast 0, GroupNormalization's
    num_groups not dividing C, a DeformConv offset of other spatial dims than the output's
    (which sized the output) and a blocked scale of more blocks than x has (the extra ignored),
    a result. onnxruntime refuses each DeformConv and quantization case too."""
    with pytest.raises(BackendError, match=rf"node '{op.lower()}_node' \({op}\) failed .*: ValueError: {message}"):
        ours(op, inputs, attrs, opset)


def test_deform_conv_output_is_sized_by_both_pads_as_onnx_reference_and_onnxruntime():
    """Asymmetric pads, strides, dilations, two groups and offset groups, a mask and a bias: the output is
    (H + pad_begin + pad_end - dilated kernel) / stride + 1 per axis, as Conv's."""
    x, w = _f32(2, 4, 7, 6), _f32(6, 2, 3, 2)
    attrs = {"pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2], "group": 2, "offset_group": 2}
    oh, ow = (7 + 3 - 3) // 2 + 1, (6 + 1 - 3) // 1 + 1
    inputs = [x, w, _f32(2, 2 * 6 * 2, oh, ow), _f32(6), RNG.random((2, 2 * 6, oh, ow)).astype(np.float32)]
    vs_reference("DeformConv", inputs, attrs, 19)
    got, want = numpy_vs_ort("DeformConv", inputs, attrs, 19)
    assert_same(got, want, "DeformConv vs onnxruntime")


def test_gemm_before_opset_7_broadcasts_c_only_when_asked():
    """onnx.reference's broadcast 0 adds C without beta (the spec: alpha A B + beta C)."""
    a, b = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    full, row = RNG.standard_normal((2, 4)).astype(np.float32), RNG.standard_normal(4).astype(np.float32)
    (got,) = ours("Gemm", [a, b, full], {"alpha": 0.5, "beta": 2.0}, 6)
    np.testing.assert_allclose(got, 0.5 * (a @ b) + 2 * full, rtol=1e-5)
    vs_reference("Gemm", [a, b, row], {"alpha": 0.5, "beta": 2.0, "broadcast": 1}, 6)


def test_int64_division_past_2_53_is_exact():
    """Div of int64 truncates exactly where a float64 quotient rounds (|a| past 2**53), as onnxruntime's."""
    a = _i64(2**62 + 1, -(2**62) - 3, 2**63 - 1, -(2**63) + 1, 2**53 + 1, -7, 7, 0)
    b = _i64(1, 2, -3, 7, 1, 2, -2, 5)
    want = [abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1) for x, y in zip(a.tolist(), b.tolist())]
    got, ort_got = numpy_vs_ort("Div", [a, b], opset=14)
    np.testing.assert_array_equal(got[0], np.array(want, np.int64))
    np.testing.assert_array_equal(ort_got[0], got[0])
