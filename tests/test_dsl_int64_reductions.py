"""Sums, products and running sums of bool and integer Tensors are int64, with torch's values,
on the numpy and ort-cpu backends."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F

try:
    from torch_grad_util import run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import run_both

R = np.random.default_rng(8)


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "uint8", "int64"])
def test_sum_prod_cumsum_of_bool_and_ints_are_int64_as_torch(dtype):
    torch = pytest.importorskip("torch")
    x = (R.integers(0, 3, (3, 4)) > 0) if dtype == "bool" else R.integers(0, 4, (3, 4)).astype(dtype)
    cases = {"sum": lambda M, x: M.sum(x), "sum_dim": lambda M, x: x.sum(1), "prod": lambda M, x: M.prod(x, 0),
             "prod_all": lambda M, x: x.prod(), "cumsum": lambda M, x: M.cumsum(x, 1)}
    model = gc.capture(lambda x: {k: f(F, x) for k, f in cases.items()}, x=x)
    got = run_both(model, {"x": x})
    for k, f in cases.items():
        want = f(torch, torch.from_numpy(x)).numpy()
        assert want.dtype == np.int64 and got[k].dtype == np.int64, k
        np.testing.assert_array_equal(got[k], want, err_msg=k)
