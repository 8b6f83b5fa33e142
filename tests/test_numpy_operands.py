"""numpy arrays where a gc.* function takes a Tensor: lifted as an op on numpy arrays alone lifts them (float64
as float32, other dtypes kept), inside a capture and outside, or refused by a CaptureError; never a bare Python
error from inside graphc (``gc.softmax(np_array)`` was ``AttributeError: ... no attribute 'value'``)."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

RNG = np.random.default_rng(0)

# operand kinds: "a" a float32 [2, 3] array, "s" a float32 [3, 3] one, "i" an int64 [2, 3] one of valid indices
_ARGSETS = [("a",), ("a", -1), ("a", "a"), ("s", "s"), ("a", "i")]


_NOT_TENSORS = {"broadcast_shapes"}  # takes shapes: a Tensor or array is iterated as one


def _functions():
    """(name, function) of the gc.* functions from graphc.dsl, gc.nn.functional's and gc.linalg's and gc.special's."""
    found = [(name, getattr(gc, name)) for name, (module, attr) in gc._LAZY.items()
             if attr is not None and module.startswith("graphc.dsl")]
    found += [(f"F.{name}", getattr(F, name)) for name in F.__all__]
    for space in ("linalg", "special"):
        module = getattr(gc, space)
        found += [(f"{space}.{name}", getattr(module, name)) for name in module.__all__]
    return [(name, fn) for name, fn in found if callable(fn) and not inspect.isclass(fn) and name not in _NOT_TENSORS]


def _operands(argset, as_tensor):
    arrays = {"a": RNG.random((2, 3)).astype(np.float32) + 0.5,
              "s": RNG.random((3, 3)).astype(np.float32) + 3 * np.eye(3, dtype=np.float32),
              "i": np.array([[0, 1, 1], [1, 0, 2]])}
    return [gc.as_tensor(arrays[kind]) if as_tensor else arrays[kind] if kind in arrays else kind
            for kind in argset]


def _outputs(out):
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,)) if isinstance(o, gc.Tensor)]


def test_every_function_that_takes_tensors_takes_numpy_arrays_or_refuses_them_clearly():
    """Each function, at each argument set its Tensor call accepts, given the arrays themselves: the same dtypes and
    shapes, or a CaptureError (the in-place forms, which write into a Tensor, as torch's). ``alias_copy(x, other)``
    took a second argument (lift's ``like``), torch's one."""
    called, wrong = 0, []
    for name, fn in _functions():
        for argset in _ARGSETS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    want = _outputs(fn(*_operands(argset, as_tensor=True)))
                except Exception:  # noqa: BLE001 - not this function's arguments
                    continue
                called += 1
                try:
                    got = _outputs(fn(*_operands(argset, as_tensor=False)))
                except gc.CaptureError:
                    continue
                except Exception as exc:  # noqa: BLE001 - the defect this test finds
                    wrong.append(f"{name}{argset}: {type(exc).__name__}: {exc}")
                    continue
            if [(o.dtype, o.shape) for o in got] != [(o.dtype, o.shape) for o in want]:
                wrong.append(f"{name}{argset}: {[(o.dtype, o.shape) for o in got]}, the Tensor call's "
                             f"{[(o.dtype, o.shape) for o in want]}")
    assert called > 800, called  # 855 calls at 3d62df3
    assert not wrong, "\n".join(wrong)


class _OnArrays(nn.Module):
    """``call(*arrays)`` beside the input ``x``, in a capture."""

    def __init__(self, call, *arrays):
        super().__init__()
        self.call, self.arrays = call, arrays

    def forward(self, x):
        return x, self.call(*self.arrays)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_functions_that_missed_the_lift_equal_torch_on_numpy_arrays_inside_a_capture_and_outside(dtype):
    """softmax and log_softmax (gc.* and F.*) emitted the array itself; F.max/min(a, b) read b as a dim; rsub, fill
    and isin refused arrays (a CaptureError); float_power was float32 on arrays. Each equal to torch's on the float32 Tensors (float64 arrays become float32, as a Python
    float), float_power on the float64 ones (torch's float64 whatever the inputs), on numpy and ort-cpu."""
    torch = pytest.importorskip("torch")
    a, b = RNG.standard_normal((2, 3)).astype(dtype), RNG.standard_normal((2, 3)).astype(dtype)
    ta, tb = torch.from_numpy(a).float(), torch.from_numpy(b).float()
    calls = {"softmax": (gc.softmax, (a, 0), torch.softmax(ta, 0)),
             "log_softmax": (gc.log_softmax, (a,), torch.log_softmax(ta, -1)),
             "F.softmax": (F.softmax, (a, -1), torch.softmax(ta, -1)),
             "F.log_softmax": (F.log_softmax, (a, 1), torch.log_softmax(ta, 1)),
             "F.max": (F.max, (a, b), torch.max(ta, tb)), "F.min": (F.min, (a, b), torch.min(ta, tb)),
             "rsub": (gc.rsub, (a, 1.5), torch.rsub(ta, 1.5)), "fill": (gc.fill, (a, 2.5), torch.fill(ta, 2.5)),
             "isin": (gc.isin, (a, a[:1]), torch.isin(ta, ta[:1])),
             "float_power": (gc.float_power, (abs(a), b), torch.float_power(torch.from_numpy(abs(a)),
                                                                             torch.from_numpy(b)))}
    x = np.zeros(1, np.float32)
    for name, (fn, args, want) in calls.items():
        want = want.numpy()
        outside = np.asarray(fn(*args))
        assert outside.dtype == want.dtype, name
        np.testing.assert_allclose(outside, want, rtol=1e-6, atol=1e-7, err_msg=name)
        model = gc.capture(_OnArrays(fn, *args), x=x)
        for backend in ("numpy", "ort-cpu"):
            inside = list(gc.Session(model, backend=backend).run({"x": x}).values())[1]
            assert inside.dtype == want.dtype, (name, backend)
            np.testing.assert_allclose(inside, want, rtol=1e-6, atol=1e-7, err_msg=f"{name} {backend}")


def test_bernoulli_takes_an_array_of_probabilities_and_max_refuses_one_as_its_dims():
    """``gc.bernoulli(x, p)`` with ``p`` an array of 0s and 1s draws exactly ``p`` (was: ``0 <= p <= 1`` on the
    array, numpy's ValueError); ``gc.max(x, array)`` is a CaptureError pointing at gc.maximum (was: that ValueError)."""
    p = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    drawn = np.asarray(gc.bernoulli(np.zeros((2, 3), np.float32), p))
    assert drawn.dtype == np.float32
    np.testing.assert_array_equal(drawn, p)
    with pytest.raises(gc.CaptureError, match="the axes must be ints, not a Tensor .*gc.maximum"):
        gc.max(p, p)
