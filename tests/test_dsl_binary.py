"""torch's elementwise functions of two or three inputs, comparisons and bitwise ops
(``graphc.dsl.ops_binary``) against torch: each case ``fn(M, *params, **inputs)`` (``M`` the DSL's
``gc.nn.functional`` or torch, methods called on the tensors) is captured, checked by the full
ONNX checker and run on the numpy and ort-cpu backends; its output and the ``gc.grad``
gradients of ``sum(out * c)`` with respect to every float ``param`` must match torch's. The new
lowerings are also checked against float64 central differences."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, assert_matches_torch, run_both

R = np.random.default_rng(23)
X = R.standard_normal((2, 3, 4)).astype(np.float32)
Y = R.standard_normal((2, 3, 4)).astype(np.float32)
Z = R.standard_normal((2, 3, 4)).astype(np.float32)
POS = (np.abs(Y) + 0.1).astype(np.float32)
D = (np.sign(Y) * (np.abs(Y) + 0.5)).astype(np.float32)  # divisors away from 0
W = R.random((3, 4)).astype(np.float32)
NAN, INF = np.nan, np.inf
# both signs of zero, nan, infinities and ties, against every kind of other value
SA = np.array([0.0, -0.0, 0.0, 1.0, -1.0, 2.0, NAN, 3.0, INF, -INF, 0.0, -2.0, -0.0, -0.0, 0.0, INF, -INF, INF, NAN,
               -0.0, 2e38, -INF], np.float32)
SB = np.array([0.0, 0.0, -1.0, -0.0, 0.0, 2.0, 1.0, NAN, 1.0, 2.0, NAN, -3.0, -1.0, -0.0, -0.0, INF, -INF, NAN, INF,
               1.0, 2e38, -1.0], np.float32)
WITH_TIES = X.copy()
WITH_TIES[0, 1] = Y[0, 1]
WITH_ZERO = X.copy()
WITH_ZERO[0, :2] = 0
WITH_NAN = X.copy()
WITH_NAN[1, 2, 1:3] = NAN
I = np.array([[-7, 0, 5, 12, -128], [9, -3, 7, 1, 64]], np.int64)
J = np.array([[2, 3, -5, 18, 6], [-4, 3, 1, 7, 0]], np.int64)
SHIFTS = np.array([[0, 1, 3, 63, 64], [70, -1, 2, 62, 5]], np.int64)
I8 = np.array([[-128, -1, 5, 127, -8], [3, -100, 64, 0, 1]], np.int8)
S8 = np.array([[1, 7, 8, 2, -1], [0, 3, 1, 9, 6]], np.int8)
U8 = np.array([[255, 1, 128, 7, 0], [3, 200, 64, 16, 9]], np.uint8)
B1, B2 = X[0] > 0, Y[0] > 0
FIB = np.array([7540113804746346429, 0, -36], np.int64)  # F(92): Euclid's longest chain in int64
FIB_NEXT = np.array([4660046610375530309, 0, 24], np.int64)  # F(91)

# (id, fn(M, *params, **inputs), params (differentiated), inputs (graph inputs, not differentiated))
CASES = [
    # arithmetic
    ("add_alpha", lambda M, x, y: M.add(x, y, alpha=2.5) + x.add(y[0]) + M.add(x, 1.5), (X, Y), {}),
    ("sub_alpha", lambda M, x, y: M.sub(x, y, alpha=-0.5) * x.subtract(y, alpha=2) - M.subtract(x, 3), (X, Y), {}),
    ("add_int_alpha", lambda M, i, j: M.add(i, j, alpha=3) - i.sub(j, alpha=-2), (), {"i": I, "j": J}),
    ("add_mul_bool", lambda M, a, b: M.stack([M.add(a, b), a.mul(b), M.multiply(a, True), a.add(False)]), (),
     {"a": B1, "b": B2}),
    ("mul", lambda M, x, y: M.mul(x, y[:, :1]) + x.multiply(2.0) * M.multiply(y, x), (X, Y), {}),
    ("div", lambda M, x, d: M.div(x, d) + x.divide(d[0]) + M.true_divide(x, 3.0) + x.true_divide(d), (X, D), {}),
    ("div_rounding", lambda M, x, d: M.div(x * 5, d, rounding_mode="trunc") + x.div(d, rounding_mode="floor")
     + M.divide(x * 3, -0.7, rounding_mode="floor"), (X, D), {}),
    ("floor_divide", lambda M, x, d: M.floor_divide(x * 4, d) + x.floor_divide(-0.3), (), {"x": X, "d": D}),
    ("div_int", lambda M, i, j: M.div(i, j.abs() + 1) + i.true_divide(j + 20), (), {"i": I, "j": J}),
    ("div_int_rounding", lambda M, i, j: M.stack([M.div(i, j + 20, rounding_mode="trunc"), i.div(j + 20,
                                                  rounding_mode="floor"), i.floor_divide(-3)]), (), {"i": I, "j": J}),
    ("addcmul_addcdiv", lambda M, x, y, z, d: M.addcmul(x, y, z, value=0.5) + x.addcmul(y[0], z) * M.addcdiv(x, z, d)
     + x.addcdiv(y, d[:, :1], value=-2), (X, Y, Z, D), {}),
    ("addcmul_int", lambda M, i, j: M.addcmul(i, j, i, value=3), (), {"i": I, "j": J}),
    ("lerp_scalar", lambda M, x, y: M.lerp(x, y, 0.3) + x.lerp(y[0], 0.75), (X, Y), {}),
    ("lerp_tensor_weight", lambda M, x, y, w: M.lerp(x, y, w) * x.lerp(y[1], w * 2), (X, Y, W), {}),
    ("float_power", lambda M, x, y: M.float_power(x.abs() + 0.1, y) + x.float_power(2) + M.float_power(2.5, x),
     (X, Y), {}),
    ("float_power_int", lambda M, i, j: M.float_power(i, 3) * i.float_power(j.abs()), (), {"i": I, "j": J}),
    # float functions of two inputs
    ("atan2", lambda M, y, x: M.atan2(y, x) + y.arctan2(x[0]) + M.arctan2(x, y * 3), (X, Y), {}),
    ("atan2_special", lambda M, a, b: M.atan2(a, b), (), {"a": SA, "b": SB}),
    ("atan2_axes", lambda M, a, b: M.atan2(a, b) * 2, (np.array([0, 1, 0, -1, 2, -3], np.float32),
                                                      np.array([1, 0, -1, 0, -2, 3], np.float32)), {}),
    ("atan2_origin", lambda M, a, b: M.atan2(a, b), (np.array([0, -0.0, 0, 1], np.float32),  # gradients 0 at 0
                                                     np.array([0, 0, -0.0, 0], np.float32)), {}),
    ("atan2_int", lambda M, i, j: M.atan2(i, j), (), {"i": I, "j": J}),
    ("hypot", lambda M, x, y: M.hypot(x, y[0]) + x.hypot(y), (X, Y), {}),
    ("hypot_special", lambda M, a, b: M.hypot(a, b), (), {"a": SA, "b": SB}),
    ("xlogy", lambda M, x, y: M.xlogy(x, y) + x.xlogy(y[0] * 2), (X, POS), {}),
    ("xlogy_zero_x", lambda M, x, y: M.xlogy(x * 0, y) + x.xlogy(3.0), (X, POS), {}),
    ("xlogy_special", lambda M, a, b: M.xlogy(a, b), (), {"a": SA, "b": SB}),
    ("xlogy_zero_x_grad", lambda M, x, y: M.xlogy(x, y), (WITH_ZERO, POS), {}),  # d/dx at x == 0 is log(y)
    ("xlogy_int", lambda M, i, j: M.xlogy(i.abs(), j.abs()), (), {"i": I, "j": J}),
    ("copysign", lambda M, x, y: M.copysign(x, y) + x.copysign(-1.0) * M.copysign(x, y[1]), (X, Y), {}),
    ("copysign_special", lambda M, a, b: M.copysign(a, b), (), {"a": SA, "b": SB}),
    ("copysign_int", lambda M, i, j: M.copysign(i, j), (), {"i": I, "j": J}),
    ("fmax_fmin", lambda M, x, y: M.fmax(x, y) * 2 + x.fmin(y), (WITH_TIES, Y), {}),
    ("fmax_fmin_nan", lambda M, x, y: M.fmax(x, y) + M.fmin(y, x) * 3, (WITH_NAN, Y), {}),
    ("fmax_fmin_special", lambda M, a, b: M.stack([M.fmax(a, b), a.fmin(b)]), (), {"a": SA, "b": SB}),
    ("fmax_int", lambda M, i, j: M.fmax(i, j) - i.fmin(j), (), {"i": I, "j": J}),
    ("heaviside", lambda M, a, b: M.heaviside(a, b) + a.heaviside(b[:1]), (), {"a": SA, "b": SB}),
    ("logaddexp2", lambda M, x, y: M.logaddexp2(x * 40, y) + x.logaddexp2(x), (X, Y), {}),
    # comparisons
    ("comparisons", lambda M, a, b: M.stack([M.eq(a, b), a.ne(b), M.not_equal(a, 2.0), M.lt(a, b), a.less(b),
                                             M.le(a, b), a.less_equal(0.0), M.gt(a, b), a.greater(b),
                                             M.ge(a, b), a.greater_equal(b)]), (), {"a": SA, "b": SB}),
    ("comparisons_int", lambda M, i, j: M.stack([i.eq(j), M.ne(i, 7), i.lt(j), M.le(i, j), i.gt(0), M.ge(i, j)]),
     (), {"i": I, "j": J}),
    ("isclose", lambda M, x, y: M.stack([M.isclose(x, x + y * 1e-6), x.isclose(x + y * 1e-3, rtol=1e-3, atol=1e-4),
                                         M.isclose(x, x + y * 1e-9, 0, 0)]), (), {"x": X, "y": Y}),
    ("isclose_special", lambda M, a, b: M.stack([M.isclose(a, b), a.isclose(b, equal_nan=True), M.isclose(a, a),
                                                 M.isclose(a, a, equal_nan=True)]), (), {"a": SA, "b": SB}),
    ("isclose_int", lambda M, i, j: M.isclose(i, j, rtol=0.5, atol=1), (), {"i": I, "j": J}),
    # bitwise
    ("bitwise_int", lambda M, i, j: M.stack([M.bitwise_and(i, j), i.bitwise_or(j), M.bitwise_xor(i, -6), i & j,
                                             i | 12, 3 ^ i, M.bitwise_not(i), ~j]), (), {"i": I, "j": J}),
    ("bitwise_int8", lambda M, i, s: M.stack([i & s, i | s, i ^ s, ~i]), (), {"i": I8, "s": S8}),
    ("bitwise_bool", lambda M, a, b: M.stack([M.bitwise_and(a, b), a.bitwise_or(b), M.bitwise_xor(a, b),
                                              a.bitwise_not(), ~b, a & True, False | b]), (), {"a": B1, "b": B2}),
    ("shifts_int64", lambda M, i, s: M.stack([M.bitwise_left_shift(i, s), i.bitwise_right_shift(s), i << s, i >> s,
                                              i << 3, i >> 2, 5 << s.clamp(0, 10)]), (), {"i": I, "s": SHIFTS}),
    ("shifts_int8", lambda M, i, s: M.stack([i << s, i >> s, M.bitwise_right_shift(i, 1)]), (), {"i": I8, "s": S8}),
    ("shifts_uint8", lambda M, u, v: M.stack([u << (v % 9), u >> (v % 9), u >> 3]), (), {"u": U8, "v": U8}),
    # number theory
    ("gcd_lcm", lambda M, i, j: M.stack([M.gcd(i, j), i.gcd(j[0]), M.lcm(i, j), i.lcm(j[1])]), (), {"i": I, "j": J}),
    ("gcd_int8", lambda M, i, s: M.stack([M.gcd(i, s), i.lcm(s)]), (), {"i": I8, "s": S8}),
    ("gcd_fibonacci", lambda M, a, b: M.gcd(a, b) + M.gcd(b, a), (), {"a": FIB, "b": FIB_NEXT}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("name,fn,params,inputs", CASES, ids=IDS)
def test_output_and_gradients_match_torch(name, fn, params, inputs):
    assert_matches_torch(fn, params, inputs, R, signed_zeros=True)


# the new lowerings of differentiable functions, on one float64 input ``x`` split into their operands;
BOTH = ("numpy", "ort-cpu")
FD_CASES = [
    ("atan2", lambda M, x: M.atan2(x[0], x[1]), np.stack([X, Y]), BOTH),
    ("atan2_steep", lambda M, x: M.atan2(x[0], x[1] * 0.01), np.stack([X, Y]), BOTH),
    ("xlogy", lambda M, x: M.xlogy(x[0], x[1].abs() + 0.1), np.stack([X, Y]), BOTH),
    ("copysign", lambda M, x: M.copysign(x[0], x[1]), np.stack([X, Y]), BOTH),
    ("fmax_fmin", lambda M, x: M.fmax(x[0], x[1]) * M.fmin(x[1], x[0] + 0.1), np.stack([X, Y]), BOTH),
    ("lerp", lambda M, x: M.lerp(x[0], x[1], x[2]), np.stack([X, Y, Z]), BOTH),
    ("hypot_logaddexp2", lambda M, x: M.hypot(x[0], x[1]) + M.logaddexp2(x[0], x[1] * 3), np.stack([X, Y]), BOTH),
]


@pytest.mark.parametrize("name,fn,x,backends", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_gradients_match_central_differences(name, fn, x, backends):
    assert_grads_match_central_differences(fn, x, backends=backends)


def test_allclose_and_equal_give_bool_scalar_tensors():
    """torch returns Python bools; a graph returns bool scalar Tensors holding the same answers."""
    torch = pytest.importorskip("torch")
    near = (X + Y * 1e-7).astype(np.float32)
    cases = {"close": (lambda M, a, b: M.allclose(a, b), X, near), "far": (lambda M, a, b: M.allclose(a, b), X, Y),
             "nan": (lambda M, a, b: M.allclose(a, b, equal_nan=True), SA, SA), "nan_not": (
                 lambda M, a, b: M.allclose(a, b), SA, SA), "equal": (lambda M, a, b: M.equal(a, b), X, X.copy()),
             "unequal": (lambda M, a, b: a.equal(b), X, near), "equal_nan": (lambda M, a, b: M.equal(a, b), SA, SA),
             "shapes": (lambda M, a, b: M.equal(a, b), X, X[:1])}
    for key, (fn, a, b) in cases.items():
        with np.errstate(all="ignore"):
            model = gc.capture(lambda a, b: fn(F, a, b), a=a, b=b)
            got = run_both(model, {"a": a, "b": b})["output"]
        onnx.checker.check_model(model.proto, full_check=True)
        assert got.dtype == np.bool_ and got.shape == (), key
        assert bool(got) == fn(torch, torch.from_numpy(a), torch.from_numpy(b)), key


@pytest.mark.parametrize("call,message", [
    (lambda x, i: gc.add(i, i, alpha=0.5), "add: alpha=0.5 is not an integer, and the Tensors are int64"),
    (lambda x, i: gc.sub(x, x, alpha=x), "sub alpha= takes a Python number, got Tensor"),
    (lambda x, i: gc.sub(x > 0, x < 0), "sub of bool Tensors is not defined"),
    (lambda x, i: gc.div(x, x, rounding_mode="round"), "div rounding_mode='round'; expected None, 'trunc' or 'floor'"),
    (lambda x, i: gc.addcdiv(x, i, i), "addcdiv takes a float tensor1 or tensor2"),
    (lambda x, i: gc.hypot(i, i), "hypot takes float Tensors, got int64 and int64"),
    (lambda x, i: gc.lerp(i, i, 0), "lerp takes float Tensors, got int64 and int64 and int"),
    (lambda x, i: gc.lerp(x, x, i), "dtype mismatch float32 vs int64: torch's lerp does not promote"),
    (lambda x, i: gc.isclose(x, i), "dtype mismatch float32 vs int64: torch's isclose does not promote"),
    (lambda x, i: gc.heaviside(x, x.double()), "dtype mismatch float32 vs float64: torch's heaviside"),
    (lambda x, i: gc.polar(x, x.double()), "polar: both inputs must have the same dtype"),
    (lambda x, i: gc.dist(i, i), "dist: expected float Tensors"),
    (lambda x, i: i ** -2, "integers to negative integer powers are not allowed"),
    (lambda x, i: gc.isclose(x, x, rtol=-1), "isclose rtol=-1; expected a number >= 0"),
    (lambda x, i: gc.bitwise_and(x, x), "bitwise_and takes integer or bool Tensors, got float32"),
    (lambda x, i: ~x, "bitwise_not takes integer or bool Tensors, got float32"),
    (lambda x, i: x << 1, "bitwise_left_shift takes integer Tensors, got float32"),
    (lambda x, i: (x > 0) >> True, "bitwise_right_shift takes integer Tensors, got bool"),
    (lambda x, i: gc.gcd(x, x), "gcd takes integer Tensors, got float32"),
    (lambda x, i: gc.equal(x, x[:, :, :1].expand(-1, 3, 4).transpose(0, 2)), "equal.*the shapes may differ"),
])
def test_bad_arguments_name_the_problem(call, message):
    with pytest.raises(gc.GraphError, match=message) as err:
        gc.capture(call, x=gc.spec("float32", ("N", 3, 4)), i=gc.spec("int64", ("N", 3, 4)))
    assert "test_dsl_binary.py" in str(err.value)


def test_integer_bitwise_ops_need_opset_18():
    with pytest.raises(gc.GraphError, match="bitwise_and on integer Tensors needs opset >= 18.*opset 17"):
        gc.capture(lambda i: i & i, i=gc.spec("int64", [3]), opset=17)
    model = gc.capture(lambda b: b & ~b, b=gc.spec("bool", [3]), opset=17)  # bools: And, Not, from opset 1
    onnx.checker.check_model(model.proto, full_check=True)


def test_symbolic_batch_dims():
    """Euclid's Loop, the shifts and atan2 on a symbolic batch dim: one graph at two batch sizes, against numpy."""
    def fn(i, j, x):
        return {"gcd": gc.gcd(i, j), "lcm": i.lcm(j), "shl": i << (j & 7), "shr": i >> (j & 7),
                "atan2": gc.atan2(x, x[:1] - 0.5), "same": gc.equal(i, i)}
    model = gc.capture(fn, i=gc.spec("int64", ("N", 3)), j=gc.spec("int64", ("N", 3)), x=gc.spec("float32", ("N", 3)))
    onnx.checker.check_model(model.proto, full_check=True)
    assert all(tuple(o.shape) == ("N", 3) for o in model.outputs if o.name in ("gcd", "lcm", "shl", "shr"))
    rng = np.random.default_rng(3)
    for n in (1, 4):
        i, j = (rng.integers(-1000, 1000, (n, 3)) for _ in range(2))
        x = rng.standard_normal((n, 3)).astype(np.float32)
        out = run_both(model, {"i": i, "j": j, "x": x})
        want = {"gcd": np.gcd(i, j), "lcm": np.lcm(i, j), "shl": i << (j & 7), "shr": i >> (j & 7),
                "atan2": np.arctan2(x, x[:1] - 0.5), "same": np.asarray(True)}
        for k, v in want.items():
            np.testing.assert_allclose(out[k], v, rtol=1e-6, err_msg=f"{k} at N={n}")


def test_gcd_at_the_int64_minimum_does_not_trap():
    """|INT_MIN| is INT_MIN, so Euclid's steps can reach INT_MIN % -1, which traps the CPU (SIGFPE kills
    the process on onnxruntime); the gcd is Python's where it fits in int64."""
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    a = np.array([low, low, -7, 12, high], np.int64)
    b = np.array([high, 3, low, low, -1], np.int64)
    model = gc.capture(F.gcd, input=a, other=b)
    want = [math.gcd(int(p), int(q)) for p, q in zip(a, b)]
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_array_equal(gc.Session(model, backend=backend).run({"input": a, "other": b})["output"], want)
