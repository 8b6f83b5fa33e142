"""Mixes torch computes that graphc refused before: powers of int8/int16/uint8 Tensors (ONNX Pow has no kernel
for them; torch wraps as C), gcd/lcm and other control-flow ops outside a capture (a bool Tensor beside an
integer one), 0-D Tensor fill values, and writes of a Tensor of another dtype where torch casts it. Values
and dtypes against torch 2.13 on the numpy and ort-cpu backends, bit for bit; where torch refuses, graphc's
error names both dtypes."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


def _ints(dtype, shape, low=None):
    info = np.iinfo(dtype)
    return RNG.integers(info.min if low is None else low, int(info.max) + 1, shape).astype(dtype)


def _run_both(fn, feeds):
    """``fn`` captured on ``feeds`` and run on each backend: {backend: outputs}."""
    model = gc.capture(fn, **{k: gc.spec(str(v.dtype), v.shape) for k, v in feeds.items()})
    return {backend: gc.Session(model, backend=backend).run(feeds) for backend in BACKENDS}


def _assert_torchs(got, want):
    want = want.numpy()
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# name -> fn(M, a, b) of two Tensors of one narrow integer dtype (b's values small, some negative)
POWERS = {
    "a ** b": lambda M, a, b: a ** b, "pow(a, b[0])": lambda M, a, b: M.pow(a, b[0]),
    "a ** 3": lambda M, a, b: a ** 3, "a ** 100": lambda M, a, b: a.pow(100), "a ** 0": lambda M, a, b: a ** 0,
    "7 ** b": lambda M, a, b: 7 ** b, "300 ** b": lambda M, a, b: 300 ** b if a.dtype != M.uint8 else 44 ** b,
    "bool ** b": lambda M, a, b: (a > 0) ** b, "a ** a": lambda M, a, b: a ** a,
}


@pytest.mark.parametrize("dtype", ["int8", "int16", "uint8"])
@pytest.mark.parametrize("case", sorted(POWERS))
def test_narrow_integer_powers_wrap_as_torchs(case, dtype):
    a = _ints(dtype, (64,))
    a[:6] = [0, 1, 2, 3, 5, 7]
    if dtype != "uint8":
        a[6:8] = [-1, np.iinfo(dtype).min]
    b = RNG.integers(0 if dtype == "uint8" else -3, 20, (64,)).astype(dtype)
    want = POWERS[case](torch, torch.from_numpy(a), torch.from_numpy(b))
    for backend, got in _run_both(lambda a, b: POWERS[case](gc, a, b), {"a": a, "b": b}).items():
        _assert_torchs(got["output"], want)
    _assert_torchs(np.asarray(POWERS[case](gc, gc.tensor(a), gc.tensor(b)).numpy()), want)  # outside a capture


# name -> fn(M, a, b) of two int32/int64 Tensors, b's powers overflowing, negative, 0 (and past 2**53 in int64)
WIDE_POWERS = {
    "a ** b": lambda M, a, b: a ** b, "a ** 25": lambda M, a, b: a ** 25, "a ** 45": lambda M, a, b: a.pow(45),
    "a ** 2": lambda M, a, b: a ** 2, "a ** 3": lambda M, a, b: a ** 3, "a ** 1": lambda M, a, b: a ** 1,
    "a ** 0": lambda M, a, b: a ** 0, "3 ** b": lambda M, a, b: 3 ** b, "-3 ** b": lambda M, a, b: (-3) ** b,
}


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("case", sorted(WIDE_POWERS))
def test_int32_and_int64_powers_wrap_as_torchs(case, dtype):
    """onnxruntime's integer Pow goes through double: it saturated (3 ** 25 in int32 was INT_MIN) and lost low
    bits past 2**53 (3 ** 39 in int64); numpy's refused a negative power."""
    a = _ints(dtype, (64,))
    a[:10] = [3, -3, 2, -2, 7, 0, 1, -1, 5, 10]
    b = RNG.integers(-3, 70, (64,)).astype(dtype)
    b[:10] = [25, 25, 31, 33, 40, 0, -2, -3, -1, 19] if dtype == "int32" else [45, 39, 63, 65, 40, 0, -2, -3, -1, 19]
    want = WIDE_POWERS[case](torch, torch.from_numpy(a), torch.from_numpy(b))
    for backend, got in _run_both(lambda a, b: WIDE_POWERS[case](gc, a, b), {"a": a, "b": b}).items():
        _assert_torchs(got["output"], want)
    _assert_torchs(np.asarray(WIDE_POWERS[case](gc, gc.tensor(a), gc.tensor(b)).numpy()), want)  # outside a capture


# name -> fn(M, i, j) of an int8 Tensor i [6] and an int32 j [6] (both nonzero-free of |INT_MIN|)
NUMBER_THEORY = {
    "gcd(bool, int8)": lambda M, i, j: M.gcd(i > 0, i), "lcm(int8, bool)": lambda M, i, j: M.lcm(i, j > 0),
    "gcd(bool, int32)": lambda M, i, j: (j > 0).gcd(j), "gcd(int8, int32)": lambda M, i, j: M.gcd(i, j),
    "lcm(int32, int32)": lambda M, i, j: M.lcm(j, j + 1),
}


@pytest.mark.parametrize("case", sorted(NUMBER_THEORY))
def test_gcd_and_lcm_outside_a_capture_are_torchs(case):
    """Outside a capture each node was evaluated and dropped, a gc.fori_loop body's too: its Loop had no body."""
    i = np.array([-6, 0, 4, 9, 12, -7], np.int8)
    j = np.array([4, 6, 0, -15, 18, 21], np.int32)
    want = NUMBER_THEORY[case](torch, torch.from_numpy(i), torch.from_numpy(j))
    _assert_torchs(np.asarray(NUMBER_THEORY[case](gc, gc.tensor(i), gc.tensor(j)).numpy()), want)
    for backend, got in _run_both(lambda i, j: NUMBER_THEORY[case](gc, i, j), {"i": i, "j": j}).items():
        _assert_torchs(got["output"], want)


def test_a_loop_outside_a_capture_runs_its_body():
    out = gc.fori_loop(0, 3, lambda k, c: c * 2 + k, gc.tensor(np.array([1, 2], np.int32)))
    np.testing.assert_array_equal(out.numpy(), [12, 20])  # ((c * 2) * 2 + 1) * 2 + 2


# name -> fn(M, x, v) of an int8 x [2, 3] and a 0-D Tensor v (fill values torch reads as numbers)
FILLS = {
    "full_like": lambda M, x, v: M.full_like(x, v), "full_like float64": lambda M, x, v: M.full_like(x, v, dtype=M.float64),
    "new_full": lambda M, x, v: x.new_full((2, 2), v), "full": lambda M, x, v: M.full((3,), v),
    "fill_": lambda M, x, v: x.clone().fill_(v), "masked_fill": lambda M, x, v: x.masked_fill(x > 0, v),
}


@pytest.mark.parametrize("value", [np.array(-2.75), np.array(True), np.array(-5, np.int32), np.array(1.5, np.float16)],
                         ids=lambda v: str(v.dtype))
@pytest.mark.parametrize("case", sorted(FILLS))
def test_a_0d_tensor_fill_value_is_torchs(case, value):
    x = np.array([[1, -2, 3], [0, 5, -6]], np.int8)
    want = FILLS[case](torch, torch.from_numpy(x), torch.from_numpy(value))
    _assert_torchs(np.asarray(FILLS[case](gc, gc.tensor(x), gc.tensor(value)).numpy()), want)
    for backend, got in _run_both(lambda x, v: FILLS[case](gc, x, v), {"x": x, "v": value}).items():
        _assert_torchs(got["output"], want)


@pytest.mark.parametrize("case", sorted(FILLS))
def test_a_0d_fill_value_out_of_range_is_refused_where_torch_refuses_it(case):
    """torch reads the value as a number and checks it against int8 in full_like, new_full and masked_fill;
    fill_ casts it (wraps), full and a float64 full_like do not narrow it."""
    x, value = np.zeros((2, 3), np.int8), np.array(300)
    try:
        want = FILLS[case](torch, torch.from_numpy(x), torch.from_numpy(value))
    except RuntimeError as exc:
        assert "without overflow" in str(exc)
        with pytest.raises(gc.CaptureError, match="300 does not fit in int8"):
            FILLS[case](gc, gc.tensor(x), gc.tensor(value))
        return
    assert case in ("fill_", "full", "full_like float64")
    _assert_torchs(np.asarray(FILLS[case](gc, gc.tensor(x), gc.tensor(value)).numpy()), want)


def _write(index, value_of):
    """``fn(M, x, v)``: a clone of ``x`` with ``[index(M, x)] = value_of(v)`` written."""
    def fn(M, x, v):
        x = x.clone()
        x[index(M, x)] = value_of(v)
        return x
    return fn


# name -> fn(M, x, v) of an int32 x [2, 3] and a float64 v [3]: writes torch casts (copy_, masked_fill_)
WRITES = {
    "x[0] = v": _write(lambda M, x: 0, lambda v: v), "x[:, 1] = v[:2]": _write(lambda M, x: (slice(None), 1),
                                                                              lambda v: v[:2]),
    "x[...] = v": _write(lambda M, x: Ellipsis, lambda v: v), "x[0, 2] = v[1]": _write(lambda M, x: (0, 2),
                                                                                      lambda v: v[1]),
    "x[mask] = v[0]": _write(lambda M, x: x > 1, lambda v: v[0]), "x[mask] = v[:1]": _write(lambda M, x: x > 1,
                                                                                           lambda v: v[:1]),
    "x[mask] = bool": _write(lambda M, x: x > 1, lambda v: v[0] > 0),
    "x[None, 1] = v": _write(lambda M, x: (None, 1), lambda v: v),
    "copy_(v)": lambda M, x, v: x.clone().copy_(v), "copy_(300)": lambda M, x, v: x.clone().copy_(2 ** 40 + 3),
    "copy_(2.75)": lambda M, x, v: x.clone().copy_(-2.75), "masked_fill_(v[0])": lambda M, x, v: x.clone().masked_fill_(
        x > 1, v[0]),
    "index_put_(mask, v[0])": lambda M, x, v: x.clone().index_put_((x > 1,), v[0]),
}


@pytest.mark.parametrize("case", sorted(WRITES))
def test_writes_torch_casts_are_torchs(case):
    x = np.array([[1, -2, 3], [0, 5, -6]], np.int32)
    v = np.array([-2.75, 7.5, 1e3])
    want = WRITES[case](torch, torch.from_numpy(x), torch.from_numpy(v))
    _assert_torchs(np.asarray(WRITES[case](gc, gc.tensor(x), gc.tensor(v)).numpy()), want)
    for backend, got in _run_both(lambda x, v: WRITES[case](gc, x, v), {"x": x, "v": v}).items():
        _assert_torchs(got["output"], want)


# name -> fn(M, x, v) writing a 0-D int64 Tensor v through a bool mask of an int8 x: torch's masked_fill_
MASKED = {"x[mask] = v": _write(lambda M, x: x > 0, lambda v: v),
          "index_put_(mask, v)": lambda M, x, v: x.clone().index_put_((x > 0,), v),
          "masked_fill(mask, v)": lambda M, x, v: x.masked_fill(x > 0, v)}


@pytest.mark.parametrize("value", [300, -129, 100, -128])
@pytest.mark.parametrize("case", sorted(MASKED))
def test_masked_writes_of_a_0d_value_check_its_range_as_torch(case, value):
    """torch reads the value as a number: out of int8's range refused, else cast. Outside a capture and for a
    constant in one (gc.tensor(300) in a capture was written as 44; index_put_ wrote 44 outside one too)."""
    x = np.array([-3, -2, 0, 1, 2, 127], np.int8)
    try:
        want = MASKED[case](torch, torch.from_numpy(x), torch.tensor(value))
    except RuntimeError as exc:
        assert abs(value) > 128 and "without overflow" in str(exc)
        with pytest.raises(gc.CaptureError, match=f"{value} does not fit in int8"):
            MASKED[case](gc, gc.tensor(x), gc.tensor(value))
        with pytest.raises(gc.CaptureError, match=f"{value} does not fit in int8"):
            gc.capture(lambda x: MASKED[case](gc, x, gc.tensor(value)), x=gc.spec("int8", x.shape))
        return
    _assert_torchs(np.asarray(MASKED[case](gc, gc.tensor(x), gc.tensor(value)).numpy()), want)
    for backend, got in _run_both(lambda x: MASKED[case](gc, x, gc.tensor(value)), {"x": x}).items():
        _assert_torchs(got["output"], want)


# writes torch's index_put_ refuses: the source's dtype is not the destination's
REFUSED = {
    "x[idx] = v": _write(lambda M, x: M.tensor([1, 0]) if M is torch else gc.tensor(np.array([1, 0])), lambda v: v),
    "x[mask] = v (rows)": _write(lambda M, x: x[:, 0] > 0, lambda v: v),
    "x[[0], 1:] = v[:2]": _write(lambda M, x: ([0], slice(1, None)), lambda v: v[:2]),
    "index_put_(idx, v)": lambda M, x, v: x.clone().index_put_(((x[0] > 0).long(),), v),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_writes_torch_refuses_name_both_dtypes(case):
    x = np.array([[1, -2, 3], [0, 5, -6]], np.int32)
    v = np.array([-2.75, 7.5, 1e3])
    with pytest.raises(RuntimeError, match="dtypes match"):
        REFUSED[case](torch, torch.from_numpy(x), torch.from_numpy(v))
    with pytest.raises(gc.CaptureError, match="int32 vs float64"):
        REFUSED[case](gc, gc.tensor(x), gc.tensor(v))


# equation -> operand shapes: ``...`` standing for different numbers of dims, aligned right as torch's
ELLIPSES = {"...,...->...": [(3, 4), ()], "...,...": [(3, 4), (4,)], "i...,...->i...": [(3, 4), (4,)],
            "...j,j->...": [(2, 3, 4), (4,)], "...,...,...->...": [(3,), (2, 3), ()]}


@pytest.mark.parametrize("dtype", ["int8", "float64"])
@pytest.mark.parametrize("equation", sorted(ELLIPSES))
def test_einsum_ellipses_of_several_ranks_are_torchs(equation, dtype):
    operands = {f"t{k}": RNG.integers(-4, 5, shape).astype(dtype) for k, shape in enumerate(ELLIPSES[equation])}
    want = torch.einsum(equation, *[torch.from_numpy(t) for t in operands.values()])
    _assert_torchs(np.asarray(gc.einsum(equation, *[gc.tensor(t) for t in operands.values()]).numpy()), want)
    for backend, got in _run_both(lambda **ts: gc.einsum(equation, *ts.values()), operands).items():
        _assert_torchs(got["output"], want)


@pytest.mark.parametrize("opset", [17, 21])
@pytest.mark.parametrize("dtype", ["int8", "int16", "uint8", "int32", "int64"])
def test_tensor_powers_loop_over_the_largest_powers_bits(dtype, opset):
    """A Tensor power took one masked step per bit of its dtype (63 for int64: 79x ONNX Pow's time on 1M
    elements); now a Loop runs while the largest power has bits left. Full-range and negative powers (1 of base
    1, +-1 of base -1, 0 of the others) wrap as torch's; opset 17 finds the low bit by Mod (no BitwiseAnd)."""
    info = np.iinfo(dtype)
    a = _ints(dtype, (256,))
    b = _ints(dtype, (256,), low=info.min)
    if info.min:
        a[:6], b[:6] = [1, -1, -1, 0, 2, info.min], [-5, -3, info.min, -1, -2, -1]
    a[6:9], b[6:9] = [3, 0, 5], [info.max, 0, 0]
    want = torch.from_numpy(a) ** torch.from_numpy(b)
    model = gc.capture(lambda a, b: a ** b, opset=opset, a=gc.spec(dtype, [256]), b=gc.spec(dtype, [256]))
    ops = [node.op_type for node in model.proto.graph.node]
    assert ops.count("Loop") == 1 and ops.count("Mul") < 8, ops
    for backend in BACKENDS:
        _assert_torchs(gc.Session(model, backend=backend).run({"a": a, "b": b})["output"], want)
    _assert_torchs(np.asarray((gc.tensor(a) ** gc.tensor(b)).numpy()), want)  # outside a capture



def test_tensor_powers_under_vmap_are_torchs():
    """gc.vmap batches the power's Loop (each example's own largest power; a carry a uint64 would break it)."""
    a = RNG.integers(-50, 50, (4, 10))
    b = RNG.integers(-3, 40, (4, 10))
    b[0] = RNG.integers(0, 3, 10)
    want = torch.from_numpy(a) ** torch.from_numpy(b)
    for backend, got in _run_both(lambda a, b: gc.vmap(lambda x, y: x ** y)(a, b), {"a": a, "b": b}).items():
        _assert_torchs(got["output"], want)

# name -> fn(M, a, b) of a uint16/32/64 Tensor a and b: the powers torch 2.13 computes of them
UNSIGNED_POWERS = {
    "a ** 0": lambda M, a, b: a ** 0, "a ** 1": lambda M, a, b: a.pow(1), "a ** True": lambda M, a, b: a ** True,
    "a ** False": lambda M, a, b: a ** False, "1 ** b": lambda M, a, b: 1 ** b, "a ** 2.0": lambda M, a, b: a ** 2.0,
    "2.5 ** b": lambda M, a, b: 2.5 ** b, "a.double() ** b": lambda M, a, b: a.double() ** b,
    "a ** b.float()": lambda M, a, b: a ** b.float(),
}
_ULPS = {"float32": 2e-7, "float64": 4e-16}
# name -> (fn(a, b), what graphc's error says): the powers torch refuses
UNSIGNED_REFUSED = {
    "a ** b": (lambda a, b: a ** b, "not implemented for 'UInt"), "a ** 3": (lambda a, b: a ** 3, "for 'UInt"),
    "2 ** b": (lambda a, b: 2 ** b, "for 'UInt"), "a ** b[0]": (lambda a, b: a.pow(b[0]), "for 'UInt"),
    "a ** -1": (lambda a, b: a ** -1, "negative integer powers are not allowed"),
}


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("case", sorted(UNSIGNED_POWERS))
def test_wide_unsigned_powers_are_torchs(case, dtype):
    """torch 2.13 computes a uint16/32/64 Tensor to a Python power 0 or 1, 1 to its power, and its powers beside
    a float; graphc refused them all (ONNX Pow takes no uint16 input; promotion refused the dtype)."""
    a = RNG.integers(0, np.iinfo(dtype).max, 64, dtype=dtype, endpoint=True)
    b = RNG.integers(0, 40, 64).astype(dtype)
    want = UNSIGNED_POWERS[case](torch, torch.from_numpy(a), torch.from_numpy(b)).numpy()
    for backend, got in _run_both(lambda a, b: UNSIGNED_POWERS[case](gc, a, b), {"a": a, "b": b}).items():
        assert got["output"].dtype == want.dtype, backend
        np.testing.assert_allclose(got["output"], want, rtol=_ULPS.get(want.dtype.name, 0))  # float pow: an ulp


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
@pytest.mark.parametrize("case", sorted(UNSIGNED_REFUSED))
def test_wide_unsigned_powers_torch_refuses_are_refused(case, dtype):
    fn, message = UNSIGNED_REFUSED[case]
    with pytest.raises(Exception):
        fn(torch.zeros(3, dtype=getattr(torch, dtype)), torch.ones(3, dtype=getattr(torch, dtype)))
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(fn, a=gc.spec(dtype, [3]), b=gc.spec(dtype, [3]))
