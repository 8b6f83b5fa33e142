"""Mixed dtypes in DSL arithmetic: ``/`` of integers is a float32 true division, ``//`` and ``%`` round
down, as in torch; a Python number takes the Tensor's dtype (API.md), and is refused where that
would change its value (``int_t * 0.5``), where torch promotes the Tensor instead; an int out of an
integer dtype's range wraps where torch's op wraps it (``int8_t + 300``) and is refused where torch's
refuses it (``where``, ``clamp``, ``pow``, ``masked_fill``, ``fill_``); two bools compute as torch's
(``b < True``, ``b + b``, ``b ** True``). Against numpy (values, and the dtype torch gives) and, with
torch installed, against torch's own results."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import TorchNS, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, run_both

FEEDS = {"a": np.array([-7, -3, 5, 9, 0]), "b": np.array([2, 2, 3, 4, -3]),
         "a32": np.array([-7, -3, 5, 9, 0], np.int32), "b32": np.array([2, -2, 3, 4, 5], np.int32),
         "m": np.array([True, False, True, True, False]),
         "f": np.array([-2.5, -1.0, 0.4, 7.75, 3.0], np.float32), "g": np.array([2, -0.3, 0.25, 3, -1.5], np.float32),
         "h": np.array([0.5, -1, 2, 3.25, -4], np.float16),
         "e": np.array([1.0, -1.0, 7.5, -7.5, 1e30], np.float32), "d": np.array([0.1, 0.1, 0.0, 2.0, 7.0], np.float32)}
# name, fn(M, **inputs) with M gc or torch, the dtype torch gives, numpy's values
CASES = [
    ("int/int", lambda M, a, b: a / b, "float32", lambda a, b: a / b),
    ("int32/int32", lambda M, a32, b32: a32 / b32, "float32", lambda a32, b32: a32 / b32),
    ("int/2", lambda M, a: a / 2, "float32", lambda a: a / 2),
    ("3/int", lambda M, b: 3 / b, "float32", lambda b: 3 / b),
    ("bool/bool", lambda M, m: m / (m | True), "float32", lambda m: m / 1.0),
    ("int/float", lambda M, a, f: a / f, "float32", lambda a, f: a / f),
    ("int==-3.0", lambda M, a: a == -3.0, "bool", lambda a: a == -3.0),
    ("int+2", lambda M, a: a + 2, "int64", lambda a: a + 2),
    ("int32*2", lambda M, a32: a32 * 2, "int32", lambda a32: a32 * 2),
    ("float16*2.5", lambda M, h: h * 2.5, "float16", lambda h: h * np.float16(2.5)),
    ("int//int", lambda M, a, b: a // b, "int64", lambda a, b: a // b),
    ("int32//int32", lambda M, a32, b32: a32 // b32, "int32", lambda a32, b32: a32 // b32),
    ("int//-2", lambda M, a: a // -2, "int64", lambda a: a // -2),
    ("-7//int", lambda M, b: -7 // b, "int64", lambda b: -7 // b),
    ("float//float", lambda M, f, g: f // g, "float32", lambda f, g: f // g),
    ("float//float, quotient rounded up", lambda M, e, d: e // d, "float32", lambda e, d: e // d),
    ("int%int", lambda M, a, b: a % b, "int64", lambda a, b: a % b),
    ("int32%int32", lambda M, a32, b32: a32 % b32, "int32", lambda a32, b32: a32 % b32),
    ("int%-3", lambda M, a: a % -3, "int64", lambda a: a % -3),
    ("-7%int", lambda M, b: -7 % b, "int64", lambda b: -7 % b),
    ("float%float", lambda M, f, g: f % g, "float32", lambda f, g: f % g),
    ("float%-0.75", lambda M, f: f % -0.75, "float32", lambda f: f % np.float32(-0.75)),
    ("remainder(int,int)", lambda M, a, b: M.remainder(a, b), "int64", lambda a, b: np.remainder(a, b)),
    ("fmod(int,int)", lambda M, a, b: M.fmod(a, b), "int64", lambda a, b: np.fmod(a, b)),
    ("fmod(float,float)", lambda M, f, g: M.fmod(f, g), "float32", lambda f, g: np.fmod(f, g)),
    ("pow(2.0,int)", lambda M, b: M.pow(2.0, b), "float32", lambda b: 2.0 ** b),
    ("clip(int,-2,3)", lambda M, a: M.clip(a, -2, 3), "int64", lambda a: np.clip(a, -2, 3)),
    ("bool*0.5", lambda M, a: (a > 0) * 0.5, "float32", lambda a: (a > 0) * np.float32(0.5)),
    ("bool+1", lambda M, a: (a > 0) + 1, "int64", lambda a: (a > 0) + 1),
    ("bool<True", lambda M, m: m < True, "bool", lambda m: ~m),
    ("bool>=False", lambda M, m: m >= False, "bool", lambda m: m | True),
    ("bool==False", lambda M, m: m == False, "bool", lambda m: ~m),  # noqa: E712 - the comparison is the case
    ("bool>bool", lambda M, m: m > ~m, "bool", lambda m: m),
    ("bool**True", lambda M, m: m ** True, "bool", lambda m: m),
    ("bool**False", lambda M, m: m ** False, "bool", lambda m: m | True),
    ("bool+bool", lambda M, m, a: m + (a > 0), "bool", lambda m, a: m | (a > 0)),
    ("bool*True", lambda M, m: m * True, "bool", lambda m: m),
    ("max(bool,bool)", lambda M, m, a: M.maximum(m, a > 0), "bool", lambda m, a: m | (a > 0)),
    ("min(bool,bool)", lambda M, m, a: M.minimum(m, a > 0), "bool", lambda m, a: m & (a > 0)),
    ("int8+300 wraps", lambda M, a: a.to(M.int8) * 3 + 300, "int8", lambda a: a.astype(np.int8) * 3 + np.int8(44)),
    ("int8==300 as 44", lambda M, a: (a + 35).to(M.int8) == 300, "bool", lambda a: a + 35 == 44),
    ("300-int8", lambda M, a: 300 - a.to(M.int8), "int8", lambda a: np.int8(44) - a.astype(np.int8)),
    ("uint8+(-1)", lambda M, a: (a + 7).to(M.uint8) + -1, "uint8", lambda a: (a + 6).astype(np.uint8)),
    ("masked_fill(int8,2.5) truncates", lambda M, a: a.to(M.int8).masked_fill(a > 0, 2.5), "int8",
     lambda a: np.where(a > 0, 2, a)),
    ("masked_fill(int8,True)", lambda M, a: a.to(M.int8).masked_fill(a > 0, True), "int8",
     lambda a: np.where(a > 0, 1, a)),
    ("masked_fill(int8,int64[])", lambda M, a: a.to(M.int8).masked_fill(a > 0, a[3]), "int8",
     lambda a: np.where(a > 0, 9, a)),
    ("int8.mul_(int64) stays int8", lambda M, a: a.to(M.int8).mul_(a * 3), "int8",
     lambda a: (a * a * 3).astype(np.int8)),
    ("int8.copy_(float64) truncates", lambda M, a: a.to(M.int8).copy_(a.double() * 0.5), "int8",
     lambda a: np.trunc(a * 0.5).astype(np.int8)),
    ("int8.fill_(float64[])", lambda M, a: a.to(M.int8).fill_((a.double() * 0.5)[3]), "int8",
     lambda a: np.full(5, 4, np.int8)),
    ("clamp(bool,bool[])", lambda M, m: M.clamp(m, min=(~m)[1]), "bool", lambda m: m | True),
    ("clamp(bool,max=bool)", lambda M, m, a: M.clamp(m, max=a > 0), "bool", lambda m, a: m & (a > 0)),
    ("xlogy(int8,300) keeps 300", lambda M, a: M.xlogy((a + 8).to(M.int8), 300), "float32",
     lambda a: (a + 8).astype(np.float32) * np.log(np.float32(300))),
]
IDS = [c[0] for c in CASES]
# a Python number the Tensor's integer or bool dtype would change: torch promotes the Tensor
REFUSED = {
    "int*0.5": lambda a: a * 0.5, "0.5-int": lambda a: 0.5 - a, "int>=0.5": lambda a: a >= 0.5,
    "int//2.5": lambda a: a // 2.5, "int%2.5": lambda a: a % 2.5, "int**0.5": lambda a: a ** 0.5,
    "pow(int,0.5)": lambda a: gc.pow(a, 0.5),
    "clip(int,-2.5,3.5)": lambda a: gc.clip(a, -2.5, 3.5), "where(int,0.5)": lambda a: gc.where(a > 0, a, 0.5),
}
# an int out of an int8's range where torch's op takes a Scalar it checks (elsewhere it wraps: CASES)
OVERFLOWS = {
    "where(int8,300)": lambda M, a: M.where(a > 0, a.to(M.int8), 300),
    "clamp(int8,300)": lambda M, a: M.clamp(a.to(M.int8), 300),
    "add(int8,1,alpha=300)": lambda M, a: M.add(a.to(M.int8), 1, alpha=300),
    "int8**300": lambda M, a: a.to(M.int8) ** 300, "pow(int8,200)": lambda M, a: M.pow(a.to(M.int8), 200),
    "masked_fill(int8,300)": lambda M, a: a.to(M.int8).masked_fill(a > 0, 300),
    "fill_(int8,300)": lambda M, a: a.to(M.int8).fill_(300),
    "full_like(int8,300)": lambda M, a: M.full_like(a.to(M.int8), 300),
}
# what torch refuses of two bools, with the way out
BOOL_REFUSALS = {
    "bool-bool": (lambda m: m - m,
                  r"Sub\(bool\[5\], bool\[5\]\): torch has no - \(subtraction\) of bool Tensors; use \^"),
    "bool-True": (lambda m: m - True, r"torch has no - \(subtraction\) of bool Tensors"),
    "bool**bool": (lambda m: m ** m, r"Pow\(bool\[5\], bool\[5\]\): torch has no pow of bool Tensors; cast one"),
    "True**bool": (lambda m: True ** m, r"torch has no pow of bool Tensors"),
    "bool.add_(int8)": (lambda m: m.add_(m.to(gc.int8)), r"in-place\(bool\[5\], int8\[5\]\): the result's dtype int8 "
                                                       r"can't be cast to the written tensor's bool \(as torch's\)"),
    "int8.add_(float32)": (lambda m: m.to(gc.int8).add_(m.float()), r"the result's dtype float32 can't be cast to "
                                                                    r"the written tensor's int8"),
}

# what torch's kernels refuse (``not implemented for 'Bool'``, a value Tensor of dims), its message's words
TORCH_REFUSALS = {
    "addcmul(bool,bool,bool)": (lambda M, m: M.addcmul(m, m, ~m), "not implemented for 'Bool'"),
    "clamp(bool,False,True)": (lambda M, m: M.clamp(m, False, True), "not implemented for 'Bool'"),
    "clamp_min(bool,False)": (lambda M, m: M.clamp_min(m, False), "not implemented for 'Bool'"),
    "clamp(bool,bool,bool)": (lambda M, m: M.clamp(m, m, ~m), "not implemented for 'Bool'"),
    "bool.clamp_(False,True)": (lambda M, m: m.clone().clamp_(False, True), "not implemented for 'Bool'"),
    "lerp(bool,bool,0.5)": (lambda M, m: M.lerp(m, ~m, 0.5), "not implemented for 'Bool'"),
    "lerp(bool,bool,bool)": (lambda M, m: M.lerp(m, ~m, m), "not implemented for 'Bool'"),
    "float.fill_(float[1])": (lambda M, m: m.float().fill_(m.float()[:1]), "0-dim"),
    "masked_fill(float,float[1])": (lambda M, m: m.float().masked_fill(m, m.float()[:1]), "0-dim"),
}


def _run(fn, ref):
    names = ref.__code__.co_varnames[:ref.__code__.co_argcount]
    feeds = {n: FEEDS[n] for n in names}
    model = gc.capture(lambda **kw: fn(gc, **kw), **{n: gc.spec(v.dtype, v.shape) for n, v in feeds.items()})
    onnx.checker.check_model(model.proto, full_check=True)
    return run_both(model, feeds)["output"], feeds


@pytest.mark.parametrize("name,fn,dtype,ref", CASES, ids=IDS)
def test_promotion_matches_numpy(name, fn, dtype, ref):
    out, feeds = _run(fn, ref)
    assert out.dtype == dtype
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(out, ref(**feeds).astype(dtype), rtol=1e-6)


@pytest.mark.parametrize("name,fn,dtype,ref", CASES, ids=IDS)
def test_promotion_matches_torch(name, fn, dtype, ref):
    torch = pytest.importorskip("torch")
    out, feeds = _run(fn, ref)
    expected = fn(TorchNS(torch), **{k: torch.from_numpy(v) for k, v in feeds.items()}).numpy()
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("name", REFUSED)
def test_a_constant_the_tensor_dtype_would_change_is_refused(name):
    with pytest.raises(gc.CaptureError, match=r"the constant .* would become .* like the Tensor .*; cast the Tensor "
                                              r"first, e\.g\. t\.astype\('float32'\) \(at .*test_dsl_promotion\.py:"):
        gc.capture(REFUSED[name], a=gc.spec("int64", [5]))


@pytest.mark.parametrize("name", OVERFLOWS)
def test_an_int_out_of_range_is_refused_where_torch_refuses_it(name):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8_t without overflow"):
        OVERFLOWS[name](torch, torch.from_numpy(FEEDS["a"]))
    with pytest.raises(gc.CaptureError, match=r"the constant -?\d+ does not fit in int8, the Tensor operands' dtype "
                                              r"\(torch: value cannot be converted to type int8 without overflow\); "
                                              r"cast the Tensor first, e\.g\. t\.astype\('int64'\) \(at .*test_dsl_pro"):
        gc.capture(lambda a: OVERFLOWS[name](gc, a), a=gc.spec("int64", [5]))


@pytest.mark.parametrize("name", BOOL_REFUSALS)
def test_what_torch_refuses_of_bools_is_refused(name):
    fn, message = BOOL_REFUSALS[name]
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(fn, m=gc.spec("bool", [5]))


def test_a_constant_the_tensor_dtype_keeps_takes_it():
    """API.md: Python scalars are promoted to the tensor's dtype (2.0 and -3.0 fit an int64)."""
    model = gc.capture(lambda a: {"y": a * 2.0, "eq": a == -3.0, "f": a // 2.0}, a=gc.spec("int64", [5]))
    out = gc.Session(model, backend="numpy").run({"a": FEEDS["a"]})
    assert out["y"].dtype == np.int64 and out["f"].dtype == np.int64 and out["eq"].dtype == bool
    np.testing.assert_array_equal(out["y"], FEEDS["a"] * 2)
    np.testing.assert_array_equal(out["eq"], FEEDS["a"] == -3)
    np.testing.assert_array_equal(out["f"], FEEDS["a"] // 2)


@pytest.mark.parametrize("name", TORCH_REFUSALS)
def test_what_torchs_kernels_refuse_is_refused(name):
    """Before, these computed (bool addcmul/lerp as float or logical ops, a 1-element value broadcast)."""
    fn, torch_says = TORCH_REFUSALS[name]
    torch = pytest.importorskip("torch")
    with pytest.raises((RuntimeError, NotImplementedError), match=torch_says):
        fn(TorchNS(torch), torch.from_numpy(FEEDS["m"]))
    message = ("is not implemented for bool Tensors \\(not implemented for 'Bool'\\); cast them first" if "Bool" in
               torch_says else r"takes a 0-D Tensor value \(as torch's\), got one of 1 dims")
    with pytest.raises(gc.CaptureError, match=message + r".* at .*test_dsl_promotion\.py:"):
        gc.capture(lambda m: fn(gc, m), m=gc.spec("bool", [5]))


def test_a_fill_value_of_unknown_rank_is_trusted():
    """Only a known rank above 0 is refused: an unknown one runs (a 0-D value fed)."""
    model = gc.capture(lambda x, v: x.fill_(v), x=gc.spec("float32", [3]), v=gc.spec("float32", None))
    out = gc.Session(model, backend="numpy").run({"x": np.zeros(3, np.float32), "v": np.float32(2.5)})
    np.testing.assert_array_equal(out["output"], np.full(3, 2.5, np.float32))
