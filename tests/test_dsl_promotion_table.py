"""Every elementwise op of two or three inputs promotes its operands as torch 2.13's ``result_type``: a bool
or integer Tensor beside a float one, a narrower width beside a wider one of its category, a 0-D Tensor only
where its category is higher; ops that compute in float (``atan2``, ``xlogy``, ``copysign``, ``ldexp``) make
an integer result type float32. Per dtype pair, the output dtypes and values of the ops torch computes for it
are torch's, on the numpy and ort-cpu backends, and gradients of promoted float64 cases are torch's to 1e-12;
where torch does not promote (``isclose``, ``heaviside``, ``polar``, ``lerp``'s dimensioned weight) the capture
error names both dtypes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)

# op -> fn(M, a, b); M is torch or graphc
OPS = {
    "add": lambda M, a, b: M.add(a, b), "sub": lambda M, a, b: M.sub(a, b), "mul": lambda M, a, b: a * b,
    "div": lambda M, a, b: a / b, "div_trunc": lambda M, a, b: M.div(a, b, rounding_mode="trunc"),
    "floor_divide": lambda M, a, b: a // b, "remainder": lambda M, a, b: a % b, "fmod": lambda M, a, b: M.fmod(a, b),
    "pow": lambda M, a, b: a ** b, "float_power": lambda M, a, b: M.float_power(a, b),
    "atan2": lambda M, a, b: M.atan2(a, b), "hypot": lambda M, a, b: M.hypot(a, b),
    "xlogy": lambda M, a, b: M.xlogy(a, b), "copysign": lambda M, a, b: M.copysign(a, b),
    "fmax": lambda M, a, b: M.fmax(a, b), "fmin": lambda M, a, b: M.fmin(a, b),
    "maximum": lambda M, a, b: M.maximum(a, b), "minimum": lambda M, a, b: M.minimum(a, b),
    "logaddexp": lambda M, a, b: M.logaddexp(a, b), "logaddexp2": lambda M, a, b: M.logaddexp2(a, b),
    "eq": lambda M, a, b: a == b, "lt": lambda M, a, b: a < b, "ge": lambda M, a, b: M.ge(a, b),
    "equal": lambda M, a, b: M.equal(a, b),
    "bitwise_and": lambda M, a, b: a & b, "bitwise_left_shift": lambda M, a, b: M.bitwise_left_shift(a, b),
    "gcd": lambda M, a, b: M.gcd(a, b), "lcm": lambda M, a, b: M.lcm(a, b),
    "nextafter": lambda M, a, b: M.nextafter(a, b), "ldexp": lambda M, a, b: M.ldexp(a, b),
    "where": lambda M, a, b: M.where(a > 2, a, b), "lerp": lambda M, a, b: M.lerp(a, a * 3, b),
    "clamp": lambda M, a, b: M.clamp(a, b, b + 1), "addcmul": lambda M, a, b: M.addcmul(a, a, b, value=2),
    "addcdiv": lambda M, a, b: M.addcdiv(b, b, a), "dist": lambda M, a, b: M.dist(a, b),
    "xlog1py": lambda M, a, b: M.special.xlog1py(a, b), "igamma": lambda M, a, b: M.igamma(a, b),
}
# (a's dtype and shape, b's); a Python number for b
PAIRS = [
    (("float32", (3, 4)), ("int64", (4,))),
    (("int64", (3, 4)), ("float32", (4,))),
    (("bool", (3, 4)), ("float64", (4,))),
    (("int32", (3, 4)), ("int64", (4,))),
    (("float16", (3, 4)), ("float32", (4,))),
    (("float32", (3, 4)), ("float64", ())),
    (("int64", (3, 4)), ("int32", ())),
    (("int32", (3, 4)), ("float64", ())),
    (("bool", (3, 4)), 2),
    (("float16", (3, 4)), 3),
    (("int32", (3, 4)), True),
]


def _draw(dtype, shape):
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    if dtype.startswith("int"):
        return RNG.integers(1, 5, shape).astype(dtype)
    return RNG.uniform(0.5, 3.0, shape).astype(dtype)


def _torch_out(fn, a, b):
    """torch's output of ``fn`` as a numpy array (None where torch refuses the pair)."""
    try:
        out = fn(torch, a, b)
    except (RuntimeError, TypeError, NotImplementedError):
        return None
    return np.asarray(out) if isinstance(out, bool) else out.numpy()


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "-".join(f"{x[0]}{list(x[1])}" if isinstance(x, tuple)
                                                                  else repr(x) for x in p))
def test_result_dtypes_and_values_are_torchs(pair, tmp_path):
    (da, sa), b_spec = pair
    a = _draw(da, sa)
    b = _draw(*b_spec) if isinstance(b_spec, tuple) else b_spec
    tb = torch.from_numpy(np.array(b)) if isinstance(b_spec, tuple) else b
    want = {op: _torch_out(fn, torch.from_numpy(a), tb) for op, fn in OPS.items()}
    want = {op: w for op, w in want.items() if w is not None}
    specs = {"a": gc.spec(da, sa)} | ({"b": gc.spec(*b_spec)} if isinstance(b_spec, tuple) else {})

    def fn(a, b=b):
        return {op: OPS[op](gc, a, b) for op in want}

    model = gc.capture(fn, **specs)
    model.save(tmp_path / "m.onnx")
    onnx.checker.check_model(str(tmp_path / "m.onnx"), full_check=True)
    feeds = {"a": a} | ({"b": np.array(b)} if isinstance(b_spec, tuple) else {})
    half = "float16" in (da, b_spec[0] if isinstance(b_spec, tuple) else "")
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)
        for op, w in want.items():
            assert got[op].dtype == w.dtype, (op, backend, got[op].dtype, w.dtype)
            np.testing.assert_allclose(got[op].astype(np.float64), w.astype(np.float64), rtol=2e-3 if half else 1e-6,
                                       atol=1e-6, err_msg=f"{op} on {backend}")


# op -> fn(M, x, i) of a float64 x [3, 4] and an int64 i [4]: gradients to x through a promoted op
GRADIENTS = {
    "atan2": lambda M, x, i: M.atan2(x, i), "hypot": lambda M, x, i: M.hypot(i, x),
    "xlogy": lambda M, x, i: M.xlogy(i, x), "copysign": lambda M, x, i: M.copysign(x, i - 2),
    "lerp": lambda M, x, i: M.lerp(x, x * 3, x.sum() * 0 + 0.25) + M.lerp(i.double(), x, 0.5),
    "clamp": lambda M, x, i: M.clamp(x, i.float().reshape(1, 4) * 0.5, i.float().reshape(1, 4)),
    "addcmul": lambda M, x, i: M.addcmul(x, x, i, value=2), "logaddexp": lambda M, x, i: M.logaddexp(x, i),
    "fmax": lambda M, x, i: M.fmax(x, i), "x32 * x64": lambda M, x, i: x.float() * x,
    "x[4] * x[] f32": lambda M, x, i: x[0] * x[1, 2].float(),
}


@pytest.mark.parametrize("op", sorted(GRADIENTS))
def test_gradients_through_promotion_are_torchs(op):
    x = RNG.uniform(0.5, 3.0, (3, 4))
    i = np.array([1, 2, 3, 4])
    c = RNG.standard_normal((3, 4))
    tx = torch.tensor(x, requires_grad=True)
    want = GRADIENTS[op](torch, tx, torch.from_numpy(i))
    (want * torch.from_numpy(c[:want.shape[0]] if want.ndim == 2 else c[0])).sum().backward()

    def fn(x, i, c):
        out = GRADIENTS[op](gc, x, i)
        return {"out": out, "loss": gc.sum(out * (c if out.ndim == 2 else c[0]))}

    model = gc.grad(gc.capture(fn, x=gc.spec("float64", (3, 4)), i=gc.spec("int64", (4,)),
                               c=gc.spec("float64", (3, 4))), "loss", wrt=["x"])
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x, "i": i, "c": c})
        assert got["out"].dtype == want.detach().numpy().dtype, (op, backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-6 if want.dtype == torch.float32
                                   else 1e-12, atol=1e-12)
        np.testing.assert_allclose(got["x_grad"], tx.grad.numpy(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("fn, message", [
    (lambda x, i: gc.isclose(x, x.float()), "dtype mismatch float64 vs float32: torch's isclose does not promote"),
    (lambda x, i: gc.heaviside(x, i), "dtype mismatch float64 vs int64: torch's heaviside does not promote"),
    (lambda x, i: gc.lerp(x, x, x.float()), "dtype mismatch float64 vs float32: torch's lerp does not promote"),
    (lambda x, i: gc.polar(x, x.float()), "polar: both inputs must have the same dtype .* float64 and float32"),
    (lambda x, i: gc.hypot(i, i.int()), "hypot takes float Tensors, got int64 and int32"),
    (lambda x, i: i ** -1, "integers to negative integer powers are not allowed"),
])
def test_where_torch_does_not_promote_the_error_names_the_dtypes(fn, message):
    with pytest.raises(gc.CaptureError, match=message):
        gc.capture(fn, x=gc.spec("float64", (3, 4)), i=gc.spec("int64", (4,)))
