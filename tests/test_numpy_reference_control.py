"""The numpy backend's Loop, Scan and If against onnxruntime and onnx.reference at the edges: no
iterations, carries that change shape or are sequences, scan axes and directions, nested bodies
reading outer values, and clear errors for what the spec forbids. About 1 s.

onnx.reference 1.23 is not the oracle where it is wrong: its Loop fails with an omitted cond or
no iterations ('need at least one array to concatenate'), returns the initial value of a carry
that changes shape and an empty sequence for a sequence carry, and runs no Scan with axes or
directions other than 0; onnxruntime refuses a Scan of no steps (or dies of SIGFPE, see
tests/test_ort_scan_guards.py), so those are checked against the spec's shapes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from graphc.errors import BackendError
from tests.numpy_backend_util import run_numpy, run_ort, same_sequence

H = '<ir_version: 9, opset_import: ["" : 18]>\n'
A = np.array([1.0, 2.0], np.float32)
XS = np.arange(24, dtype=np.float32).reshape(3, 4, 2)
ZS = np.arange(24, dtype=np.float32).reshape(4, 3, 2) / 2


def _model(text: str, check: bool = True) -> onnx.ModelProto:
    model = onnx.parser.parse_model(H + text)
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def _same(got, want, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        if isinstance(g, list):
            same_sequence([g], [w], what)
            continue
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=what)


def _vs(model, feeds, oracles=("ort",)):
    got = run_numpy(model, feeds)
    for oracle in oracles:
        want = run_ort(model, feeds) if oracle == "ort" else ReferenceEvaluator(model).run(None, feeds)
        _same(got, want, f"vs {oracle}")
    return got


LOOP = '''g (int64 n, bool c, float[2] a) => (float[2] s, float[?,2] ys, int32[?] ks) {
   s, ys, ks = Loop (n, c, a) <body: graph = body (int64 i, bool ci, float[2] si) => (bool co, float[2] so, float[2] y, int32 k)
       { co = Identity(ci)
         so = Add(si, si)
         y = Neg(si)
         k = Cast<to = 6>(i) }>
}'''


def test_loop_of_no_iterations_returns_its_initial_carries_and_empty_scan_outputs():
    model = _model(LOOP)
    for n, c in [(0, True), (3, False), (-1, True)]:
        s, ys, ks = _vs(model, {"n": np.array(n, np.int64), "c": np.array(c), "a": A})
        assert s.tolist() == A.tolist() and ys.shape == (0, 2) and ks.dtype == np.int32 and ks.shape == (0,)
    s, ys, ks = _vs(model, {"n": np.array(2, np.int64), "c": np.array(True), "a": A})
    assert ks.tolist() == [0, 1]  # onnx.reference: [[0], [1]], a scalar scanned out gains an axis


def test_loop_carries_that_change_shape_and_sequence_carries():
    grow = _model('''g (int64 n, float[1] a) => (float[?] s) {
       s = Loop (n, , a) <body: graph = body (int64 i, bool ci, float[?] si) => (bool co, float[?] so)
           { co = Identity(ci)
             so = Concat<axis = 0>(si, si) }>
    }''', check=False)
    (s,) = _vs(grow, {"n": np.array(3, np.int64), "a": np.array([1.5], np.float32)})
    assert s.shape == (8,)
    seq = _model('''g (int64 n, float[2] a) => (seq(float) s, int64 count) {
       e = SequenceEmpty<dtype = 1>()
       s = Loop (n, , e) <body: graph = body (int64 i, bool ci, seq(float) si) => (bool co, seq(float) so)
           { co = Identity(ci)
             f = Cast<to = 1>(i)
             x = Mul(a, f)
             so = SequenceInsert(si, x) }>
       count = SequenceLength(s)
    }''', check=False)
    s, count = _vs(seq, {"n": np.array(3, np.int64), "a": A})
    assert count == 3 and [t.tolist() for t in s] == [[0, 0], [1, 2], [2, 4]]
    _vs(seq, {"n": np.array(0, np.int64), "a": A}, ("ort", "reference"))


SCAN = '''g (float[3,2] st, float[3,4,2] xs, float[4,3,2] zs) => (float[3,2] s, float[?,?,?] ys, float[?,?,?] ws) {
   s, ys, ws = Scan (st, xs, zs) <body: graph = body (float[3,2] si, float[3,2] x, float[3,2] z) => (float[3,2] so, float[3,2] y, float[2,3] w)
       { so = Add(si, x)
         y = Sub(x, z)
         w = Transpose<perm = [1, 0]>(z) }, num_scan_inputs: int = 2, scan_input_axes: ints = [1, %d],
         scan_input_directions: ints = [%d, %d], scan_output_axes: ints = [%d, %d], scan_output_directions: ints = [%d, %d]>
}'''


@pytest.mark.parametrize("axes_and_directions", [(0, 1, 0, 0, 0, 0, 0), (-3, 0, 1, -1, 2, 1, 0), (0, 1, 1, 1, -2, 1, 1),
                                                 (-3, 0, 0, -3, -1, 0, 1)])
def test_scan_axes_and_directions_match_onnxruntime(axes_and_directions):
    model = _model(SCAN % axes_and_directions, check=False)
    feeds = {"st": np.ones((3, 2), np.float32), "xs": XS, "zs": ZS}
    s, ys, ws = _vs(model, feeds)
    in_axis, in_dirs, out_axes, out_dirs = axes_and_directions[0], axes_and_directions[1:3], axes_and_directions[3:5], axes_and_directions[5:]
    x, z = np.moveaxis(XS, 1, 0), np.moveaxis(ZS, in_axis, 0)  # a Python loop, the spec's order
    x, z = (x[::-1] if in_dirs[0] else x), (z[::-1] if in_dirs[1] else z)
    y_steps, w_steps = x - z, z.transpose(0, 2, 1)
    want = [(y_steps[::-1] if out_dirs[0] else y_steps), (w_steps[::-1] if out_dirs[1] else w_steps)]
    for got, steps, axis in zip((ys, ws), want, out_axes):
        np.testing.assert_array_equal(got, np.moveaxis(steps, 0, axis))
    np.testing.assert_array_equal(s, 1 + XS.sum(axis=1))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scan_of_no_steps_has_its_state_and_empty_outputs_on_the_output_axis(axis):
    shape = [3, 2]
    shape.insert(axis % 3, 0)
    model = _model(f'''g (float[3,2] st, float[{",".join(map(str, shape))}] xs) => (float[3,2] s, float[?,?,?] ys) {{
       s, ys = Scan (st, xs) <body: graph = body (float[3,2] si, float[3,2] x) => (float[3,2] so, float[3,2] y)
           {{ so = Add(si, x)
              y = Neg(x) }}, num_scan_inputs: int = 1, scan_input_axes: ints = [{axis}], scan_output_axes: ints = [{axis}]>
    }}''', check=False)
    s, ys = run_numpy(model, {"st": np.ones((3, 2), np.float32), "xs": np.zeros(shape, np.float32)})
    assert s.tolist() == [[1, 1]] * 3 and ys.shape == tuple(shape) and ys.dtype == np.float32


def test_if_branches_of_different_shapes_and_nested_bodies_reading_outer_values():
    branches = _model('''g (bool c, float[2] a) => (float[?] y) {
       y = If (c) <then_branch: graph = t () => (float[2] o) { o = Identity(a) },
                   else_branch: graph = e () => (float[3] o2) { z = Constant<value = float[1] {5}>()
                                                                 o2 = Concat<axis = 0>(a, z) }>
    }''', check=False)
    for c, want in [(True, [1, 2]), (False, [1, 2, 5])]:
        (y,) = _vs(branches, {"c": np.array(c), "a": A}, ("ort", "reference"))
        assert y.tolist() == want
    # a Loop body's If whose else branch Scans the main graph's xs, its body reading b (main) and si (Loop body)
    nested = _model('''g (int64 n, float[2] a, float[2] b, float[3,2] xs) => (float[2] s, float[?,2] ys) {
       s, ys = Loop (n, , a) <body: graph = body (int64 i, bool ci, float[2] si) => (bool co, float[2] so, float[2] y)
           { co = Identity(ci)
             two = Constant<value = int64 {2}>()
             m = Mod(i, two)
             zero = Constant<value = int64 {0}>()
             even = Equal(m, zero)
             so = If (even) <then_branch: graph = t () => (float[2] o) { o = Add(si, b) },
                             else_branch: graph = e () => (float[2] o2) {
                 o2, unused = Scan (si, xs) <body: graph = sb (float[2] q, float[2] x) => (float[2] q2, float[2] yk) {
                     qb = Mul(q, b)
                     q2 = Add(qb, x)
                     yk = Sub(x, si) }, num_scan_inputs: int = 1> }>
             y = Mul(so, b) }>
    }''')
    b, xs = np.array([0.5, -1.0], np.float32), np.arange(6, dtype=np.float32).reshape(3, 2)
    s, ys = _vs(nested, {"n": np.array(4, np.int64), "a": A, "b": b, "xs": xs})
    want = A.astype(np.float64)
    for i in range(4):
        if i % 2 == 0:
            want = want + b
        else:
            for x in xs:
                want = want * b + x
    np.testing.assert_allclose(s, want, rtol=1e-6)


GROWING_SCAN_OUTPUT = '''g (float[?] st, float[3,2] xs) => (float[?] s, float[?,?] ys) {
   s, ys = Scan (st, xs) <body: graph = body (float[?] si, float[2] x) => (float[?] so, float[?] y)
       { so = Concat<axis = 0>(si, x)
         y = Identity(so) }, num_scan_inputs: int = 1, scan_output_directions: ints = [1]>
}'''
STOPPING_LOOP = '''g (int64[?] n, bool[?] c, float[2] a) => (float[2] s) {
   s = Loop (n, c, a) <body: graph = body (int64 i, bool ci, float[2] si) => (bool co, float[2] so)
       { five = Constant<value = int64 {5}>()
         co = Less(i, five)
         so = Add(si, si) }>
}'''
IF_OF = '''g (bool[?] c, float[2] a) => (float[2] y) {
   y = If (c) <then_branch: graph = t () => (float[2] o) { o = Identity(a) },
               else_branch: graph = e () => (float[2] o2) { o2 = Neg(a) }>
}'''
TWO_SCANNED = '''g (float[2] st, float[?,2] xs, float[?,2] zs) => (float[2] s, float[?,?] ys) {
   s, ys = Scan (st, xs, zs) <body: graph = body (float[2] si, float[2] x, float[2] z) => (float[2] so, float[2] y)
       { so = Add(si, x)
         y = Sub(x, z) }, num_scan_inputs: int = 2, scan_input_axes: ints = [%d, 0], scan_output_axes: ints = [%d]>
}'''
ONE, ONES = np.array([1], np.int64), np.ones((3, 2), np.float32)


@pytest.mark.parametrize("text, feeds, message", [
    (GROWING_SCAN_OUTPUT, {"st": A, "xs": ONES}, r"scan output 'y' has shape \[6\] at iteration 1, \[4\] at iteration 0"),
    (STOPPING_LOOP, {"n": np.zeros(0, np.int64), "c": np.array([True]), "a": A},  # was: M absent, 6 iterations
     r"Loop's trip count M must hold exactly one value, got shape \[0\]"),
    (STOPPING_LOOP, {"n": ONE, "c": np.zeros(0, bool), "a": A}, r"Loop's cond must hold exactly one value, got shape \[0\]"),
    (IF_OF, {"c": np.array([True, False]), "a": A}, r"If's cond must hold exactly one value, got shape \[2\]"),
    (IF_OF, {"c": np.zeros(0, bool), "a": A}, r"If's cond must hold exactly one value, got shape \[0\]"),  # was: else
    (TWO_SCANNED % (0, 0), {"st": A, "xs": ONES, "zs": np.ones((4, 2), np.float32)},  # was: zs cut to 3
     r"scan input 1 \(body input 'z'\) has length 4 on its scanned axis 0, while scan input 0 has 3"),
    (TWO_SCANNED % (2, 0), {"st": A, "xs": ONES, "zs": ONES},
     r"scan_input_axes\[0\] is 2, outside \[-2, 1\] for scan input 0 \(body input 'x'\) of shape \[3, 2\]"),
    (TWO_SCANNED % (0, 2), {"st": A, "xs": ONES, "zs": ONES},  # was: wrapped to axis 0
     r"scan_output_axes\[0\] is 2, outside \[-2, 1\] for scan output 'y' of shape \[3, 2\]"),
])
def test_control_flow_refuses_what_the_spec_forbids(text, feeds, message):
    with pytest.raises(BackendError, match=r"node '(Loop|Scan|If)_0' \((Loop|Scan|If)\) failed .*" + message):
        run_numpy(_model(text, check=False), feeds)
