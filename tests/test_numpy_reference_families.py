"""The numpy backend against onnx.reference and onnxruntime on op families the edge test does not
cover: quantization, sequences, TopK/Unique/NonZero/CumSum/Trilu/Einsum, GridSample. Seeded, ~3 s.

Where one oracle is wrong the case names it and checks against the other (or torch)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from graphc.errors import BackendError
from graphc.model import ir_version_for
from tests.numpy_backend_util import feeds_of, numpy_vs_ort, run_numpy, run_ort, same_sequence
from tests.test_numpy_reference_edges import assert_same, ours, vs_reference

RNG = np.random.default_rng(0)


def _i64(*values):
    return np.array(values, np.int64)


def vs_ort(op, inputs, attrs, opset, n_outputs=1):
    got, want = numpy_vs_ort(op, inputs, attrs, opset, n_outputs)
    assert_same(got, want, f"{op}@{opset} {attrs} vs onnxruntime")


def test_quantize_saturates_and_rounds_half_to_even():
    """+inf saturates to the type's maximum (onnx.reference casts rint(inf) to int32 first: the
    minimum); so does onnxruntime in float32."""
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 300, -300, 1e9, np.inf, -np.inf], np.float32)
    for dtype in (np.uint8, np.int8, np.uint16, np.int16):
        zero = np.array(3, dtype)
        (got,) = ours("QuantizeLinear", [x, np.array(1, np.float32), zero], {}, 21)
        info = np.iinfo(dtype)
        want = np.clip(np.array([1, 1, 3, 3, 5, 5, 7, 303, -297, 1e9, np.inf, -np.inf]), info.min, info.max)
        np.testing.assert_array_equal(got, want.astype(dtype))
        vs_ort("QuantizeLinear", [x, np.array(1, np.float32), zero], {}, 21)
        vs_reference("QuantizeLinear", [x[:10], np.array(0.5, np.float32), zero], {}, 21)


@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_quantize_per_axis_and_blocked(op):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32) * 10
    if op == "DequantizeLinear":
        x = x.astype(np.int8)
    for axis, block in [(0, 0), (1, 0), (-1, 0), (2, 2), (2, 3), (1, 2), (-1, 4), (0, 1)]:
        shape = [x.shape[axis]]  # per axis: a vector; blocked: x's shape, the blocks' count on the axis
        if block:
            shape = list(x.shape)
            shape[axis] = -(-x.shape[axis] // block)
        scale = (RNG.random(shape) + 0.1).astype(np.float32)
        zero = RNG.integers(-3, 4, shape).astype(np.int8)
        attrs = {"axis": axis, "block_size": block} if block else {"axis": axis}
        vs_reference(op, [x, scale, zero], attrs, 21)
        vs_ort(op, [x, scale, zero], attrs, 21)


def test_dynamic_quantize_linear():
    """All zeros: the spec's scale (max(0, max x) - min(0, min x)) / 255 is 0 and so is y here;
    onnx.reference gives 1/255 and onnxruntime 1 (both outside the spec's formula)."""
    for x in [np.array([0.1, 254.6, -1], np.float32), np.array([1, 2, 3], np.float32), np.array([-1, -2], np.float32),
              RNG.standard_normal((3, 4)).astype(np.float32) * 100]:
        vs_reference("DynamicQuantizeLinear", [x], {}, 11)
        vs_ort("DynamicQuantizeLinear", [x], {}, 11, 3)
    for x in (np.zeros(4, np.float32), np.zeros((0, 2), np.float32)):  # empty: was numpy's 'zero-size array'
        (y, scale, zero), _ = numpy_vs_ort("DynamicQuantizeLinear", [x], {}, 11, 3)
        assert y.shape == x.shape and not y.any() and scale == 0 and zero == 0


def _sequence_model(nodes, inputs, sequence_out, opset=21):
    graph_inputs = [helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                    for i, x in enumerate(inputs)]
    out = (helper.make_tensor_sequence_value_info("out", TensorProto.FLOAT, None) if sequence_out
           else helper.make_tensor_value_info("out", TensorProto.FLOAT, None))
    model = helper.make_model(helper.make_graph(nodes, "seq", graph_inputs, [out]),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version_for({"": opset})
    return model


def _position_op(op, position):
    """SequenceConstruct(in0, in1, in2) then ``op`` at a constant ``position`` (None: absent)."""
    extra = [] if position is None else [helper.make_node("Constant", [], ["p"], value=helper.make_tensor(
        "p", TensorProto.INT64, [], [position]))]
    args = ["s", "in0"] if op == "SequenceInsert" else ["s"]
    return [helper.make_node("SequenceConstruct", ["in0", "in1", "in2"], ["s"]), *extra,
            helper.make_node(op, args + ([] if position is None else ["p"]), ["out"])]


THREE = [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * i for i in range(2)] + [np.full((1, 3), 20, np.float32)]


def _run_all(model, inputs, oracles=("ort", "reference")):
    """The numpy backend's outputs, then each oracle's."""
    feeds = feeds_of(model, inputs)
    run = {"ort": run_ort, "reference": lambda m, f: ReferenceEvaluator(m).run(None, f)}
    return [run_numpy(model, feeds)] + [run[name](model, feeds) for name in oracles]


@pytest.mark.parametrize("op, positions, valid", [
    ("SequenceInsert", [None, 0, 1, 3, -1, -3], [-3, 3]),
    ("SequenceErase", [None, 0, 2, -1, -3], [-3, 2]),
    ("SequenceAt", [0, 2, -1, -3], [-3, 2]),
])
def test_sequence_positions(op, positions, valid):
    """Negative positions count from the back; insert's range is [-n, n] (n appends), the others'
    [-n, n - 1]. onnx.reference inserts at n wrongly ([a, a, b, c], not [a, b, c, a]), so it is
    checked against onnxruntime; out of range was a wrapped Python index (SequenceAt -4 of 3 gave
    the last) or 'list index out of range', now a clear error."""
    for position in positions:
        model = _sequence_model(_position_op(op, position), THREE, op != "SequenceAt")
        got, want, ref = _run_all(model, THREE)
        same_sequence(got, want, f"{op} {position} vs onnxruntime")
        if position != 3:
            same_sequence(got, ref, f"{op} {position} vs onnx.reference")
    for position in (valid[0] - 1, valid[1] + 1):
        model = _sequence_model(_position_op(op, position), THREE, op != "SequenceAt")
        with pytest.raises(BackendError, match=rf"position {position} is outside \[{valid[0]}, {valid[1]}\] "
                                               r"for a sequence of 3 tensors"):
            run_numpy(model, feeds_of(model, THREE))


def test_split_to_sequence_and_concat_from_sequence():
    """keepdims is ignored when split is given (the spec; onnxruntime squeezes a scalar split of 1
    and refuses another scalar with keepdims 0). An empty axis gives an empty sequence (was
    numpy's 'integer modulo by zero')."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for axis, keepdims, split in itertools.product([0, 1, -1], [0, 1], [None, 1, 2, 3, "all"]):
        inputs = [x]
        nodes = []
        if split is not None:
            sizes = [1] * x.shape[axis] if split == "all" else [split]
            value = np.array(sizes if split == "all" else split, np.int64)
            nodes.append(helper.make_node("Constant", [], ["sp"], value=onnx.numpy_helper.from_array(value, "sp")))
        nodes.append(helper.make_node("SplitToSequence", ["in0"] + (["sp"] if split is not None else []), ["out"],
                                      axis=axis, keepdims=keepdims))
        model = _sequence_model(nodes, inputs, True)
        got, ref = _run_all(model, inputs, ("reference",))
        same_sequence(got, ref, f"SplitToSequence axis {axis} keepdims {keepdims} split {split}")
    model = _sequence_model([helper.make_node("SplitToSequence", ["in0"], ["out"])], [np.zeros((0, 3), np.float32)], True)
    for result in _run_all(model, [np.zeros((0, 3), np.float32)]):
        assert result == [[]]
    a, b = THREE[:2]
    for axis, new_axis in [(0, 0), (1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1), (-3, 1)]:
        model = _sequence_model([helper.make_node("SequenceConstruct", ["in0", "in1"], ["s"]),
                                 helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=axis, new_axis=new_axis)],
                                [a, b], False)
        got, want, ref = _run_all(model, [a, b])
        same_sequence(got, want, f"ConcatFromSequence {axis} {new_axis}")
        same_sequence(got, ref, f"ConcatFromSequence {axis} {new_axis}")


@pytest.mark.parametrize("new_axis", [0, 1])
def test_concat_from_an_empty_sequence_is_refused(new_axis):
    """ONNX defines no result (a sequence holds no element shape to take a rank and dims from);
    onnxruntime and onnx.reference refuse it too. Was numpy's 'need at least one array to concatenate'."""
    model = _sequence_model([helper.make_node("SequenceEmpty", [], ["s"], dtype=TensorProto.FLOAT),
                             helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=0, new_axis=new_axis)], [], False)
    with pytest.raises(BackendError, match=rf"ValueError: the sequence is empty: concatenating \(new_axis {new_axis}\) "
                                           "no tensors has no result in ONNX"):
        run_numpy(model, {})
    with pytest.raises(Exception, match="Must have 1 or more inputs"):
        run_ort(model, {})
    with pytest.raises(ValueError, match="need at least one array"):
        ReferenceEvaluator(model).run(None, {})


@pytest.mark.parametrize("axis, new_axis, tensors, message", [
    (1, 0, THREE[1:], r"sequence tensor 1 has shape \[1, 3\] and sequence tensor 0 \[2, 3\]: sequence tensors must "
                      r"have one rank and the same dims off axis 1"),
    (2, 0, THREE[:2], r"axis 2 is outside \[-2, 1\] for sequence tensors of rank 2"),
    (0, 1, THREE[1:], r"sequence tensor 1 has shape \[1, 3\] and sequence tensor 0 \[2, 3\]: new_axis 1 stacks "
                      r"tensors of one shape"),
    (-4, 1, THREE[:2], r"axis -4 is outside \[-3, 2\] for new_axis 1 and tensors of rank 2"),
])
def test_concat_from_sequence_of_mismatched_tensors_is_named(axis, new_axis, tensors, message):
    """Were numpy's 'all the input array dimensions except for the concatenation axis must match
    exactly', 'all input arrays must have the same shape' and AxisError; onnxruntime refuses each."""
    model = _sequence_model([helper.make_node("SequenceConstruct", ["in0", "in1"], ["s"]),
                             helper.make_node("ConcatFromSequence", ["s"], ["out"], axis=axis, new_axis=new_axis)],
                            tensors, False)
    with pytest.raises(BackendError, match=f"ValueError: {message}"):
        run_numpy(model, feeds_of(model, tensors))
    with pytest.raises(Exception, match="ConcatFromSequence"):
        run_ort(model, feeds_of(model, tensors))


def test_topk_ties_k0_and_int64_extremes():
    """Ties: the lower index first. int64's least value was sorted as the largest (its negation
    overflows). NaN is the largest, as numpy's sort and onnx.reference (onnxruntime: between 1 and -inf)."""
    x = np.array([[3, 1, 3, 2, 3, 1], [0, 0, 0, 0, 0, 0]], np.float32)
    for k, largest, axis in itertools.product([0, 1, 3, 6], [0, 1], [-1, 0]):
        k = min(k, x.shape[axis])
        vs_reference("TopK", [x, _i64(k)], {"axis": axis, "largest": largest}, 11)
        vs_ort("TopK", [x, _i64(k)], {"axis": axis, "largest": largest}, 11, 2)
    extremes = np.array([np.iinfo(np.int64).min, 5, np.iinfo(np.int64).max, -1], np.int64)
    for largest in (0, 1):
        got, want = numpy_vs_ort("TopK", [extremes, _i64(4)], {"largest": largest}, 11, 2)
        np.testing.assert_array_equal(got[1], [2, 1, 3, 0] if largest else [0, 3, 1, 2])
        assert_same(got, want, f"TopK largest {largest} vs onnxruntime")
    vs_reference("TopK", [np.array([np.nan, 1, np.inf, -np.inf], np.float32), _i64(4)], {}, 11)


def test_unique_nonzero_cumsum_trilu():
    """Unique unsorted: onnx.reference fails without an axis (IndexError) and takes axis 1 as 0,
    so it is checked against onnxruntime. NonZero of a scalar is [0, count] (the spec's [rank,
    count], onnx.reference's; was numpy's 'nonzero on 0d arrays'; onnxruntime gives [1, count]).
    CumSum exclusive over an empty axis: empty (was an IndexError; onnx.reference fails alike)."""
    u = np.array([[2, 1, 2], [0, 0, 0], [2, 1, 2], [1, 5, 1]], np.float32)
    for sorted_, axis in itertools.product([0, 1], [None, 0, 1, -1]):
        attrs = {"sorted": sorted_} | ({} if axis is None else {"axis": axis})
        vs_ort("Unique", [u], attrs, 11, 4)
        if sorted_:
            vs_reference("Unique", [u], attrs, 11)
    for shape in [(0,), (2, 0), (0, 3, 2), (3,)]:
        vs_reference("NonZero", [np.ones(shape, np.float32)], {}, 13)
    for value in (0, 1):
        vs_reference("NonZero", [np.array(value, np.float32)], {}, 13)
    c = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    for axis, exclusive, reverse in itertools.product([0, 1, -1, -2], [0, 1], [0, 1]):
        vs_reference("CumSum", [c, np.array(axis)], {"exclusive": exclusive, "reverse": reverse}, 14)
    for exclusive, reverse in itertools.product([0, 1], [0, 1]):
        vs_ort("CumSum", [np.zeros((2, 0), np.float32), np.array(1)], {"exclusive": exclusive, "reverse": reverse}, 14)
    t = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for k, upper in itertools.product([-100, -5, -3, -1, 0, 2, 4, 5, 100], [0, 1]):
        vs_reference("Trilu", [t, np.array(k)], {"upper": upper}, 14)
    vs_reference("Trilu", [np.zeros((2, 0, 3), np.float32), np.array(1)], {}, 14)


@pytest.mark.parametrize("equation, shapes", [
    ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("ii->", [(3, 3)]), ("...ij->...ji", [(2, 3, 4)]),
    ("...j,...j->...", [(2, 3, 4), (2, 3, 4)]), ("i...->...", [(2, 3, 4)]), ("...", [(2, 3)]),
    ("ij...,jk...->ik...", [(2, 3, 2), (3, 4, 2)]), ("...ii->...i", [(2, 3, 3)]), ("a b, b c -> a c", [(2, 3), (3, 2)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 3)]), ("i,j->ij", [(2,), (3,)]), ("ij,ij->", [(0, 3), (0, 3)]),
])
def test_einsum_repeated_indices_and_ellipsis(equation, shapes):
    inputs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    vs_reference("Einsum", inputs, {"equation": equation}, 12)


def test_grid_sample_modes_padding_and_corners():
    """Cubic with border padding: onnx.reference is off by up to 0.29 from torch's bicubic, which
    onnxruntime and this backend match (to 2e-6), so those two cases are checked against torch."""
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    grid = (RNG.random((1, 5, 6, 2)) * 2.6 - 1.3).astype(np.float32)
    grid[0, 0, :3] = [[1, 1], [-1, -1], [0.5, -0.25]]
    for mode, padding, corners in itertools.product(["linear", "nearest", "cubic"], ["zeros", "border", "reflection"],
                                                    [0, 1]):
        attrs = {"mode": mode, "padding_mode": padding, "align_corners": corners}
        vs_ort("GridSample", [x, grid], attrs, 20)
        if (mode, padding) != ("cubic", "border"):
            vs_reference("GridSample", [x, grid], attrs, 20)
            continue
        want = torch.nn.functional.grid_sample(torch.tensor(x), torch.tensor(grid), mode="bicubic",
                                               padding_mode="border", align_corners=bool(corners)).numpy()
        np.testing.assert_allclose(ours("GridSample", [x, grid], attrs, 20)[0], want, atol=1e-5)
    x3 = RNG.standard_normal((1, 2, 2, 3, 4)).astype(np.float32)
    grid3 = (RNG.random((1, 2, 3, 2, 3)) * 2.4 - 1.2).astype(np.float32)
    for mode, padding, corners in itertools.product(["linear", "nearest"], ["zeros", "border", "reflection"], [0, 1]):
        vs_reference("GridSample", [x3, grid3], {"mode": mode, "padding_mode": padding, "align_corners": corners}, 20)
    for mode in ("bilinear", "nearest", "bicubic"):  # opset 16's names; onnx.reference knows only 20's
        vs_ort("GridSample", [x, grid], {"mode": mode}, 16)


def _int4_round_trip(elem, scale, zero_point, x_shape, outputs, **attrs):
    """QuantizeLinear of x (float32 ``x_shape``) to ``elem`` with ``scale`` and the zero point
    (values of ``scale``'s shape) as initializers (the zero point packed two to a byte in the
    file), then DequantizeLinear, with ``attrs``; ``outputs`` names the graph outputs
    (onnxruntime's Python API hands out no int4 tensors)."""
    scale_t = onnx.numpy_helper.from_array(np.asarray(scale, np.float32), "scale")
    zp = helper.make_tensor("zp", elem, np.shape(scale), np.ravel(zero_point).tolist())
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["d"], **attrs)]
    types = {"q": elem, "d": TensorProto.FLOAT}
    graph = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(n, types[n], x_shape) for n in outputs], [scale_t, zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = ir_version_for({"": 21})
    onnx.checker.check_model(model, full_check=True)
    return model


def _int4_vs_reference(model, x, lo, hi, what):
    """The numpy backend's q (in [lo, hi]) and d equal onnx.reference's; returns d."""
    (q, d), want = run_numpy(model, {"x": x}), ReferenceEvaluator(model).run(None, {"x": x})
    assert q.dtype == want[0].dtype, what
    np.testing.assert_array_equal(q.astype(np.int8), want[0].astype(np.int8), err_msg=what)
    assert q.astype(np.int8).min() >= lo and q.astype(np.int8).max() <= hi, what
    np.testing.assert_array_equal(d, want[1], err_msg=what)
    return d


INT4 = [(TensorProto.INT4, [0, -3, 5], -8, 7), (TensorProto.UINT4, [0, 3, 15], 0, 15)]


@pytest.mark.parametrize("elem, zero_point, lo, hi", INT4)
def test_int4_quantize_and_dequantize(elem, zero_point, lo, hi):
    """Were 'Invalid integer data type 'V'' (numpy's iinfo knows no int4): saturating to [lo, hi],
    rounding half to even, per axis, as onnx.reference; the round trip as onnxruntime."""
    x = np.array([[-20, -2.25, 0.25], [1.5, 2.5, -0.5], [7.9, 30, -1]], np.float32)
    scale = [0.5, 1.0, 2.0]
    for axis in (0, 1):
        model = _int4_round_trip(elem, scale, zero_point, [3, 3], ["q", "d"], axis=axis)
        d = _int4_vs_reference(model, x, lo, hi, f"axis {axis}")
        round_trip = _int4_round_trip(elem, scale, zero_point, [3, 3], ["d"], axis=axis)
        np.testing.assert_array_equal(d, run_ort(round_trip, {"x": x})[0], err_msg=f"axis {axis} vs onnxruntime")


@pytest.mark.parametrize("elem, zero_point, lo, hi", INT4)
def test_blocked_int4_quantize_and_dequantize(elem, zero_point, lo, hi):
    """block_size: each run of block_size values along the axis shares one scale and zero point
    (the last block shorter where block_size does not divide the dim), as onnx.reference, on
    either axis of x [4, 6], with values saturating at both ends and halves rounding to even; the
    round trip as onnxruntime."""
    x = (RNG.standard_normal((4, 6)) * 12).astype(np.float32)
    x[0, :3] = [2.5, -3.5, 100]
    for axis, block in [(1, 2), (1, 4), (0, 3), (-1, 6), (0, 1)]:
        shape = [4, 6]
        shape[axis] = -(-shape[axis] // block)
        scale = (RNG.random(shape) * 2 + 0.25).astype(np.float32)
        zp = RNG.choice(zero_point, shape)
        what = f"axis {axis} block_size {block}"
        model = _int4_round_trip(elem, scale, zp, [4, 6], ["q", "d"], axis=axis, block_size=block)
        d = _int4_vs_reference(model, x, lo, hi, what)
        round_trip = _int4_round_trip(elem, scale, zp, [4, 6], ["d"], axis=axis, block_size=block)
        np.testing.assert_array_equal(d, run_ort(round_trip, {"x": x})[0], err_msg=f"{what} vs onnxruntime")
