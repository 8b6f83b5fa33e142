"""``x[start:stop:step]`` reads as Python's (numpy's) slice, where ONNX's Slice clamps differently: a negative
step's start before the axis (``x[-17::-1]`` on 12 rows) is an empty slice, not row 0. Against numpy slicing
on the numpy and ort-cpu backends: static sizes, symbolic sizes, bounds and steps read at run time (from a dim
name ``T``); gradients against torch float64's (the same positions picked by indexing)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None)

BOUND = st.one_of(st.none(), st.integers(-10, 10))
STEP = st.one_of(st.none(), st.integers(-3, 3).filter(bool))
SLICE = st.builds(slice, BOUND, BOUND, STEP)
# a bound or step read at run time: ("T", c) is T + c, ("T", sign, c) the step sign * (T + c), c >= 1
RUN_TIME_BOUND = st.one_of(BOUND, st.tuples(st.just("T"), st.integers(-10, 10)))
RUN_TIME_STEP = st.one_of(STEP, st.tuples(st.just("T"), st.sampled_from([-1, 1]), st.integers(1, 3)))


def _run(model: gc.Model, feeds: dict, want: np.ndarray, what: str) -> None:
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run(feeds)["output"]
        assert got.shape == want.shape, (what, backend)
        np.testing.assert_array_equal(got, want, err_msg=f"{what} {backend}")


@FUZZ
@given(n=st.integers(0, 6), m=st.integers(0, 6), rows=SLICE, cols=SLICE)
def test_slices_of_static_and_symbolic_sizes_are_numpys(n, m, rows, cols):
    x = np.arange(n * m, dtype=np.float64).reshape(n, m)
    want = x[rows, cols]
    for shape in ((n, m), ("N", "M")):
        model = gc.capture(lambda x: x[rows, cols], x=gc.spec("float64", shape))
        if shape == (n, m):
            assert tuple(model.outputs[0].shape) == want.shape  # the size known at capture is numpy's too
        _run(model, {"x": x}, want, f"x{list(shape)}[{rows}, {cols}]")


def _at(value, t: int | gc.Tensor):
    """A drawn bound or step with the dim name's size ``t`` in place of ``"T"``."""
    if not isinstance(value, tuple):
        return value
    return t + value[1] if len(value) == 2 else value[1] * (t + value[2])


@FUZZ
@given(n=st.integers(0, 6), t=st.integers(0, 6), start=RUN_TIME_BOUND, stop=RUN_TIME_BOUND, step=RUN_TIME_STEP)
def test_slices_with_bounds_read_at_run_time_are_numpys(n, t, start, stop, step):
    def fn(x, y):
        T = y.shape[0]  # noqa: N806 - torch code's name
        return x[_at(start, T):_at(stop, T):_at(step, T)]

    x = np.arange(n, dtype=np.float64)
    want = x[_at(start, t):_at(stop, t):_at(step, t)]
    for shape in ((n,), ("N",)):
        model = gc.capture(fn, x=gc.spec("float64", shape), y=gc.spec("float64", ("T",)))
        _run(model, {"x": x, "y": np.zeros(t)}, want, f"x{list(shape)}[{start}:{stop}:{step}] at T={t}")


def test_a_negative_steps_start_before_the_axis_is_empty():
    """The found case: 12 rows, ``x[-17::-1]`` has none (Slice alone read row 0); its stop side and positive
    steps past either side were Python's already. Static, symbolic and run-time sizes, bounds and steps, through
    the full checker."""
    x = RNG.standard_normal((12, 3))
    cases = {"start": lambda x, T: x[-17::-1], "stop": lambda x, T: x[3:-20:-1],  # noqa: N803
             "both": lambda x, T: x[-30:-40:-2], "forward": lambda x, T: x[-20:30],  # noqa: N803
             "run": lambda x, T: x[-T - 13::-1], "step": lambda x, T: x[-17::-T]}  # noqa: N803
    for shape in ((12, 3), ("N", 3)):
        model = gc.capture(lambda x, y: {k: f(x, y.shape[0]) for k, f in cases.items()},
                           x=gc.spec("float64", shape), y=gc.spec("float64", ("T",)))
        onnx.checker.check_model(model.proto, full_check=True)
        for backend in BACKENDS:
            got = gc.Session(model, backend=backend).run({"x": x, "y": np.zeros(2)})
            for key, f in cases.items():
                np.testing.assert_array_equal(got[key], f(x, 2), err_msg=f"{key} {shape} {backend}")
    assert [len(f(x, 2)) for f in cases.values()] == [0, 4, 0, 12, 0, 0]


def test_a_write_through_such_a_slice_writes_nothing():
    """``x[-17::-1] = 5`` on 12 rows leaves x as it was (Slice's row 0 was written), beside a write that lands."""
    def fn(x):
        x = x * 1
        x[-17::-1] = 5.0
        x[-3:-30:-2] = 7.0
        return x

    x = RNG.standard_normal(12)
    want = x.copy()
    want[-17::-1], want[-3:-30:-2] = 5.0, 7.0
    for shape in ((12,), ("N",)):
        _run(gc.capture(fn, x=gc.spec("float64", shape)), {"x": x}, want, f"x{list(shape)}")

# slices of a [7, 5] param, some by bounds of T, some of its T-row prefix (a symbolic size): starts before
# the axis with negative steps (empty), beside ones inside it, and stops before it
_GRAD_SLICES = (
    lambda t, T: t[-17::-1],  # noqa: N803
    lambda t, T: t[3:-20:-1, -9::-2],  # noqa: N803
    lambda t, T: t[-T - 3:1:-2, 2:-T - 10:-1],  # noqa: N803 - empty at T >= 5
    lambda t, T: t[:T][-6::-1, T - 9::-3],  # noqa: N803 - a symbolic size: empty at T <= 5
    lambda t, T: t[-T - 20::-1],  # noqa: N803
)


class _Slices(nn.Module):
    """sum_k (k + 1) * sum(table[slice_k] ** 2): its gradient puts each slice's 2 * (k + 1) * x in place."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(RNG.standard_normal((7, 5)))

    def forward(self, y):
        T = y.shape[0]  # noqa: N806
        return sum((k + 1) * (f(self.table, T) ** 2).sum() for k, f in enumerate(_GRAD_SLICES))


def test_gradients_of_slices_past_the_axis_are_torchs():
    torch = pytest.importorskip("torch")
    net = _Slices().double()
    grads = gc.grad(gc.capture(net, y=gc.spec("float64", ("T",))), "output")
    cells = np.arange(35).reshape(7, 5)  # each slice of the flat positions picks them as the slice does
    for t in (2, 5, 7):
        table = torch.tensor(net.state_dict()["table"], requires_grad=True)
        loss = sum((k + 1) * (table.reshape(-1)[torch.tensor(f(cells, t).flatten())] ** 2).sum()
                   for k, f in enumerate(_GRAD_SLICES))
        loss.backward()
        for backend in BACKENDS:
            got = gc.Session(grads, backend=backend).run({"y": np.zeros(t)})
            np.testing.assert_allclose(got["output"], loss.item(), rtol=1e-14, err_msg=f"{backend} T={t}")
            np.testing.assert_array_equal(got["table_grad"], table.grad.numpy(), err_msg=f"{backend} T={t}")
