"""``gc.optim.Adadelta``, ``Rprop``, ``ASGD`` and ``Adafactor`` on float32, float16 and bfloat16 params
against torch.optim 2.13 (single-tensor path): float32 params as torch's float32 steps to 2 ulps of
the param's largest entry over 5 steps; float16 and bfloat16 params step in float32, param and
state rounded to their dtype once a step, as torch's float32 steps rounded so; Adafactor's eps1
None is the half dtype's machine epsilon (torch's ``finfo(param.dtype).eps``), numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from test_optim import run_steps, torch_steps

RNG = np.random.default_rng(0)
SPECS = [gc.optim.Adadelta(0.5, rho=0.8, eps=1e-5, weight_decay=0.1), gc.optim.Rprop(0.05, etas=(0.3, 1.5)),
         gc.optim.ASGD(0.05, lambd=0.01, alpha=0.5, t0=1, weight_decay=0.1), gc.optim.Adafactor(0.05, weight_decay=0.1)]
IDS = [s.kind for s in SPECS]
BACKENDS = ["numpy", "ort-cpu"]
ULP = {np.float32: 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _start(shape, dtype, scale: float = 1.0):
    """A start and 5 gradients (every other one 3x) exact in ``dtype``."""
    p0 = RNG.normal(size=shape).astype(dtype).astype(np.float64)
    grads = [(RNG.normal(size=shape) * scale * (3.0 if t % 2 else 1.0)).astype(dtype).astype(np.float64)
             for t in range(5)]
    return p0, grads


def _assert_within(got, want, ulps: float, unit: float, what: str) -> None:
    got, want = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=ulps * unit * np.abs(want).max(), err_msg=what)


@pytest.mark.parametrize("shape", [(5,), (3, 4)], ids=["1d", "2d"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_params_step_as_torch_float32(spec, backend, shape):
    torch = pytest.importorskip("torch")
    p0, grads = _start(shape, np.float32)
    got = run_steps(spec, backend, grads, p0, dtype=np.float32)
    want = torch_steps(torch, spec, p0, grads, np.float32)
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        assert p_graph.dtype == np.float32
        _assert_within(p_graph, p_torch, 2, ULP[np.float32], f"step {t}")
        for slot, value in state_graph.items():  # ASGD's eta and mu: float64 here, torch's default dtype there
            if slot not in ("eta", "mu"):
                _assert_within(value, state_torch[slot], 6, ULP[np.float32], f"step {t} {slot}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_params_step_in_float32_rounded_once_a_step(spec, backend, dtype):
    torch = pytest.importorskip("torch")
    np_dtype = gc.model.dtypes.to_numpy(dtype)
    p0, grads = _start((3, 4), np_dtype)
    got = run_steps(spec, backend, grads, p0, dtype=np_dtype)
    want = torch_steps(torch, spec, p0, grads, np.float32, store=getattr(torch, dtype))
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        assert p_graph.dtype == np_dtype
        _assert_within(p_graph, p_torch, 1, ULP[dtype], f"step {t}")
        for slot, value in state_graph.items():
            if slot not in ("eta", "mu"):
                assert value.dtype == np_dtype, slot
                _assert_within(value, state_torch[slot], 1, ULP[dtype], f"step {t} {slot}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_adafactor_eps1_none_is_the_half_dtypes_epsilon(backend, dtype):
    """Gradients of about 1e-3, whose squares fall under eps1^2 of the half dtype (2^-20, 2^-14) but
    not under float32's: the steps are those of eps1 = finfo(dtype).eps (bfloat16 was numpy's
    'data type bfloat16 not inexact' from inside generate)."""
    torch = pytest.importorskip("torch")
    np_dtype = gc.model.dtypes.to_numpy(dtype)
    p0, grads = _start((3, 4), np_dtype, scale=1e-3)
    got = run_steps(gc.optim.Adafactor(0.05), backend, grads, p0, dtype=np_dtype)
    eps1 = float(torch.finfo(getattr(torch, dtype)).eps)
    store = getattr(torch, dtype)
    want = torch_steps(torch, gc.optim.Adafactor(0.05, eps=(eps1, 1e-3)), p0, grads, np.float32, store=store)
    float32_eps = torch_steps(torch, gc.optim.Adafactor(0.05), p0, grads, np.float32, store=store)
    assert not np.array_equal(want[-1][0], float32_eps[-1][0])  # eps1 binds
    for t, ((p_graph, _), (p_torch, _)) in enumerate(zip(got, want), start=1):
        _assert_within(p_graph, p_torch, 1, ULP[dtype], f"step {t}")
