"""Complex values through ``gc.fori_loop``, ``gc.while_loop``, ``gc.scan`` and ``gc.cond`` (carries, mixed with
real ones, scanned inputs and outputs, branch outputs, values a body closes over, nested loops) against the same
Python loops in torch 2.13: values, and gradients of complex Parameters as torch's ``.grad`` (graphc's pair of
it), in complex128 (1e-10) and complex64 (1e-5), on the numpy backend and ort-cpu; eager capture's values; a
loop under ``gc.vmap``; and what stays refused."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

N = 4
TOL = {"complex128": (1e-10, 1e-12), "complex64": (1e-5, 1e-5)}


# -- the same loops in torch (Python control flow) and graphc ---------------------------------------------


def fori(m, lo, hi, body, init):
    if m is gc:
        return gc.fori_loop(lo, hi, body, init)
    for i in range(lo, hi):
        init = body(i, init)
    return init


def while_(m, cond_fn, body, carried):
    if m is gc:
        return gc.while_loop(cond_fn, body, carried)
    while bool(cond_fn(*carried)):
        carried = body(*carried)
    return carried


def scan(m, fn, init, xs):
    if m is gc:
        return gc.scan(fn, init, xs)
    ys = []
    for x in xs:
        init, y = fn(init, x)
        ys.append(y)
    return init, (m.stack(ys) if not isinstance(ys[0], tuple) else tuple(m.stack(list(c)) for c in zip(*ys)))


def cond(m, pred, true_fn, false_fn, *operands):
    if m is gc:
        return gc.cond(pred, true_fn, false_fn, *operands)
    return true_fn(*operands) if bool(pred) else false_fn(*operands)


def _phasor(m, z, w, r):
    """A recurrence on complex phasors with a real carry beside: c <- c * z + w, s <- s + |c|."""
    def body(i, carry):
        c, s = carry
        return c * z + w * 0.5, s + c.abs()
    c, s = fori(m, 0, 5, body, (w, m.zeros_like(r[..., 0])))
    return c, s


def _while(m, z, w, r):
    """A complex carry and a step count, while the count is under 4 and |c| stays bounded."""
    def body(k, c, s):
        return k + 1, c * z - w.conj() * 0.25, s * 0.5 + c.real
    k, c, s = while_(m, lambda k, c, s: (k < 4) & (c.abs().sum() < 1e6), body,
                     (m.zeros_like(r[0, 0], dtype=m.int64), w, r[..., 0]))
    return c * (k + 1), s


def _scan(m, z, w, r):
    """Complex xs (rows of a complex matrix), a complex carry, complex and real ys."""
    def step(c, x):
        c = c * x + w.exp() * 0.1
        return c, (c.conj() * 2j, c.angle())
    c, (ys, angles) = scan(m, step, w, (z.unsqueeze(0) * r[:3, :1]).exp())
    return c + ys.sum(0), angles.sum(0)


def _cond(m, z, w, r):
    """A branch on data returning a complex value and a real one."""
    out = cond(m, r.sum() > 0, lambda a, b: (a * b, b.abs()), lambda a, b: (a.conj() / (b + 2), b.real), z, w)
    return out[0], out[1] + r[..., 1]


def _nested(m, z, w, r):
    """A fori_loop in a scan's body, closing over the complex ``z`` and the scan's complex carry."""
    def step(c, x):
        inner = fori(m, 0, 3, lambda i, a: a * z + c * 0.1, x)
        return c + inner * 0.5, inner.abs()
    c, ys = scan(m, step, w, z.unsqueeze(0) + w.unsqueeze(0) * r[:2, :1])
    return c, ys.sum(0)


CASES = {"fori_loop": _phasor, "while_loop": _while, "scan": _scan, "cond": _cond, "nested": _nested}


class _Model(gc.nn.Module):
    """``fn`` on two complex Parameters; the loss weighs the complex result's pair by ``r``, adds the real one."""

    def __init__(self, fn, z, w, dtype):
        super().__init__()
        self.fn = fn
        self.z, self.w = gc.nn.Parameter(z, dtype=dtype), gc.nn.Parameter(w, dtype=dtype)

    def forward(self, r):
        c, s = self.fn(gc, self.z, self.w, r)
        return (gc.view_as_real(c) * r).sum() + s.sum(), c, s


def _torch(fn, z, w, r):
    zt, wt = torch.tensor(z, requires_grad=True), torch.tensor(w, requires_grad=True)
    rt = torch.from_numpy(r)
    c, s = fn(torch, zt, wt, rt)
    loss = (torch.view_as_real(c.resolve_conj()) * rt).sum() + s.sum()
    loss.backward()
    return {"output_0": loss.detach().numpy(), "output_1": c.detach().numpy(), "output_2": s.detach().numpy(),
            "z_grad": torch.view_as_real(zt.grad.resolve_conj()).numpy(),
            "w_grad": torch.view_as_real(wt.grad.resolve_conj()).numpy()}


def _data(dtype, sign=1.0):
    rng = np.random.default_rng(1)
    z = np.exp(1j * rng.uniform(-np.pi, np.pi, N)) * rng.uniform(0.6, 1.0, N)
    w = (rng.standard_normal(N) + 1j * rng.standard_normal(N)) * 0.5
    r = rng.standard_normal((N, 2)) * 0.5 + 0.2 * sign
    part = np.float64 if dtype == "complex128" else np.float32
    return z.astype(dtype), w.astype(dtype), r.astype(part)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("dtype", ["complex128", "complex64"])
@pytest.mark.parametrize("case", list(CASES))
def test_complex_values_through_control_flow_match_torch(case, dtype, backend):
    """Before: each refused ('fori_loop does not take complex Tensors', 'scan ...', 'trace_subgraph ...')."""
    if backend != "numpy":
        pytest.importorskip("onnxruntime")
    fn = CASES[case]
    rtol, atol = TOL[dtype]
    for sign in ((1.0, -1.0) if case == "cond" else (1.0,)):
        z, w, r = _data(dtype, sign)
        model = gc.capture(_Model(fn, z, w, getattr(gc, dtype)), r=gc.spec(r.dtype, r.shape))
        got = gc.Session(gc.grad(model, "output_0"), backend=backend).run({"r": r})
        want = _torch(fn, z, w, r)
        assert got["output_1"].dtype == np.dtype(dtype)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=f"{name} ({sign})")


@pytest.mark.parametrize("case", list(CASES))
def test_eager_capture_gives_torchs_values(case):
    """Eager capture (example arrays): the loops' complex results' ``.numpy()`` during the capture."""
    z, w, r = _data("complex128")
    seen = {}

    def fn(z, w, r):
        c, s = CASES[case](gc, z, w, r)
        seen.update(c=c.numpy(), s=s.numpy())
        return c, s

    gc.capture(fn, z=z, w=w, r=r)
    with torch.no_grad():
        c, s = CASES[case](torch, *(torch.from_numpy(a) for a in (z, w, r)))
    assert seen["c"].dtype == np.complex128
    np.testing.assert_allclose(seen["c"], c.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(seen["s"], s.numpy(), rtol=1e-12, atol=1e-12)


def test_a_complex_value_a_body_closes_over_stays_valid_after_it():
    """Before: ``view_as_real(z)`` in the body kept the body's pair on ``z``, so the graph's output after the
    loop named a value of the body (KeyError on the numpy backend, an invalid model for onnxruntime)."""
    x = np.linspace(0.0, 1.0, N)

    def fn(x):
        z = gc.complex(x, x * 2)
        c = gc.fori_loop(0, 3, lambda i, c: c + gc.view_as_real(z)[:, 1], x)
        return c, gc.view_as_real(z)

    model = gc.capture(fn, x=gc.spec("float64", (N,)))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})
        np.testing.assert_allclose(got["output_0"], x + 3 * 2 * x, rtol=1e-15)
        np.testing.assert_allclose(got["output_1"], np.stack([x, 2 * x], -1), rtol=1e-15)


def test_vmap_over_a_complex_loop():
    """Per example: a phasor recurrence on ``exp(i * theta)`` as a real function of real inputs, mapped."""
    rng = np.random.default_rng(2)
    theta, amp = rng.uniform(-3, 3, (5, N)), rng.uniform(0.5, 1.0, (5, N))

    def one(m, theta, amp):
        z = m.polar(amp, theta)
        return fori(m, 0, 4, lambda i, c: c * z + 0.1j, z * 0).abs()

    model = gc.capture(lambda t, a: gc.vmap(lambda t, a: one(gc, t, a))(t, a),
                       t=gc.spec("float64", theta.shape), a=gc.spec("float64", amp.shape))
    want = torch.vmap(lambda t, a: one(torch, t, a))(torch.from_numpy(theta), torch.from_numpy(amp)).numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"t": theta, "a": amp})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fn, match", [
    (lambda x, z: gc.fori_loop(0, 2, lambda i, c: z, x),
     r"carried value 0 changes dtype from float64 to complex128"),
    (lambda x, z: gc.fori_loop(0, 2, lambda i, c: gc.view_as_complex(gc.view_as_real(c).float()), z),
     r"carried value 0 changes dtype from complex128 to complex64"),
    (lambda x, z: gc.scan(lambda c, e: (c * e, e), x, z),
     r"carried value 0 changes dtype from float64 to complex128"),
    (lambda x, z: gc.while_loop(lambda c: c.abs().sum() < 9, lambda c: c.real, z),
     r"body_fn changes carried_inputs\[0\] from complex128\[4\] to float64\[4\]"),
    (lambda x, z: gc.cond(x.sum() > 0, lambda: z, lambda: x),
     r"branch output 0 has dtype complex128 vs float64"),
    (lambda x, z: gc.fori_loop(0, 2, lambda i, c: z.mul_(1j) * 0 + c, x),
     r"in-place write into \w+, a value from outside the gc.cond/gc.fori_loop/gc.scan body"),
])
def test_what_cannot_be_carried_is_refused_naming_the_line(fn, match):
    """A complex value where the init (or the other branch) is real, a complex dtype that changes, a write
    into a complex value from outside the body: errors naming the user's line. Before: a complex value in the
    carry or a branch was 'does not take complex Tensors' whatever its init."""
    def captured(x):
        return fn(x, gc.complex(x, x * 2))
    with pytest.raises(gc.CaptureError, match=match) as err:
        gc.capture(captured, x=gc.spec("float64", (N,)))
    assert "test_complex_control.py" in str(err.value)
