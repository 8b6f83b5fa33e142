"""In-place complex math (``z.log_()``, ``gc.sqrt_(z)``, ... every op of ``graphc.dsl.complex_math.TABLE`` torch
has an in-place form of, and ``exp_``) against torch 2.13 in complex128: the written values, writes through a view
(``z[0].log_()`` writes ``z``), and the gradients of a complex Parameter as torch's ``.grad``."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl.complex_math import IN_PLACE

try:
    from complex_inplace_util import Written, torch_written
except ImportError:  # tests/ collected as a package
    from tests.complex_inplace_util import Written, torch_written

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
SHAPE = (3, 4)


def _parts(w):
    return (w.real,)


def _check(fn, backend="numpy", torch_fn=None):
    """graphc's ``fn`` as torch's; where torch cannot differentiate its in-place form (no derivative of
    ``acosh_``; ``asinh_`` overwrites the input its backward reads), as torch's ``torch_fn``."""
    z = (RNG.standard_normal(SHAPE) + 1j * RNG.standard_normal(SHAPE)) * 0.7
    r = RNG.standard_normal((*SHAPE, 2))
    model = gc.capture(Written(fn, z, _parts), r=gc.spec("float64", r.shape))
    got = gc.Session(gc.grad(model, "output_0"), backend=backend).run({"r": r})
    try:
        loss, real, grad = torch_written(torch, fn, z, r, _parts)
    except (NotImplementedError, RuntimeError):
        loss, real, grad = torch_written(torch, torch_fn, z, r, _parts)
    np.testing.assert_allclose(got["output_0"], loss, rtol=1e-12)
    np.testing.assert_allclose(got["output_1"], real, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got["z_grad"], grad, rtol=1e-10, atol=1e-12)


def _written(name, view=lambda w: w):
    """``view(w).<name>_()``, and torch's out-of-place ``v.copy_(v.clone().<name>())`` for ``_check``."""
    return (lambda m, w: getattr(view(w), f"{name}_")(),
            lambda m, w: view(w).copy_(getattr(view(w).clone(), name)()))


def test_in_place_is_every_table_op_torch_writes_in_place():
    z = torch.ones(2, dtype=torch.complex128)
    for name in IN_PLACE:
        getattr(z.clone(), f"{name}_")()  # torch takes it
    assert {"log", "sqrt", "sigmoid", "tanh", "asinh", "reciprocal", "sgn", "exp", "conj_physical"} <= set(IN_PLACE)


@pytest.mark.parametrize("name", IN_PLACE)
def test_each_method_writes_as_torch_s(name):
    """A ComplexTensor had no ``<name>_`` method ('log_ does not take complex Tensors')."""
    fn, torch_fn = _written(name)
    _check(fn, torch_fn=torch_fn)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("name", ["log", "sqrt", "sigmoid", "atanh"])
def test_a_write_into_a_view_writes_its_base(name, backend):
    for view in (lambda w: w[0], lambda w: w[1:, ::2], lambda w: w.transpose(0, 1)[2]):
        fn, torch_fn = _written(name, view)
        _check(fn, backend, torch_fn)


def test_torch_s_functions_write_a_complex_tensor():
    """``gc.sqrt_(z)`` refused a complex Tensor ('sqrt_ takes a Tensor input, got ComplexTensor')."""
    _check(lambda m, w: m.exp_(m.sqrt_(w[2])), torch_fn=lambda m, w: w[2].copy_(w[2].clone().sqrt().exp()))


def test_a_write_through_a_view_is_seen_by_the_base_s_parts():
    """``z.real`` after ``z[0][...] = v`` read the parts ``z`` was made of, not the written pair."""
    def fn(m, w):
        w.real  # noqa: B018 - holds the parts, as an op that read them would
        w[0][...] = 2 - 1j
    _check(fn)


def test_in_place_abs_is_refused_as_torch_refuses_it():
    with pytest.raises(gc.CaptureError, match=r"abs_ does not take complex Tensors"):
        gc.capture(lambda x: gc.view_as_real(gc.complex(x, x).abs_()), x=gc.spec("float64", (3,)))
