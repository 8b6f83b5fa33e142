"""Mixed dtypes in DSL arithmetic: ``/`` of integers is a float32 true division, ``//`` and ``%`` round
down, as in torch; a Python number takes the Tensor's dtype (API.md), and is refused where that
would change its value (``int_t * 0.5``), where torch promotes the Tensor instead. Against numpy
(values, and the dtype torch gives) and, with torch installed, against torch's own results."""

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
]
IDS = [c[0] for c in CASES]
# a Python number the Tensor's integer or bool dtype would change: torch promotes the Tensor
REFUSED = {
    "int*0.5": lambda a: a * 0.5, "0.5-int": lambda a: 0.5 - a, "int>=0.5": lambda a: a >= 0.5,
    "int//2.5": lambda a: a // 2.5, "int%2.5": lambda a: a % 2.5, "int**0.5": lambda a: a ** 0.5,
    "pow(int,0.5)": lambda a: gc.pow(a, 0.5),
    "clip(int,-2.5,3.5)": lambda a: gc.clip(a, -2.5, 3.5), "where(int,0.5)": lambda a: gc.where(a > 0, a, 0.5),
    "int8+300": lambda a: a.astype("int8") + 300,
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


def test_a_constant_the_tensor_dtype_keeps_takes_it():
    """API.md: Python scalars are promoted to the tensor's dtype (2.0 and -3.0 fit an int64)."""
    model = gc.capture(lambda a: {"y": a * 2.0, "eq": a == -3.0, "f": a // 2.0}, a=gc.spec("int64", [5]))
    out = gc.Session(model, backend="numpy").run({"a": FEEDS["a"]})
    assert out["y"].dtype == np.int64 and out["f"].dtype == np.int64 and out["eq"].dtype == bool
    np.testing.assert_array_equal(out["y"], FEEDS["a"] * 2)
    np.testing.assert_array_equal(out["eq"], FEEDS["a"] == -3)
    np.testing.assert_array_equal(out["f"], FEEDS["a"] // 2)
