"""Integer Tensors on ort-cpu as on the numpy backend, equal to torch: the nodes onnxruntime 1.31's CPU provider has
no integer kernel for (int64 Relu, int8/uint8 Trilu and Einsum, OneHot of int32 indices, int64 Resize) are written
out by backends/integers.py (they failed to load: "NOT_IMPLEMENTED: Could not find an implementation for
Relu(14)"), and common unary and binary ops over int8, int32, int64 and uint8."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.backends import integers

RNG = np.random.default_rng(0)

DTYPES = ["int8", "int32", "int64", "uint8"]

# name -> (graphc function of x, y; torch's, or None where torch has no such op on these dtypes)
OPS = {
    "relu": (lambda x, y: gc.relu(x), lambda T, x, y: T.relu(x)),
    "relu_method": (lambda x, y: F.relu(x), lambda T, x, y: T.relu(x)),
    "tril": (lambda x, y: gc.tril(x), lambda T, x, y: T.tril(x)),
    "triu": (lambda x, y: gc.triu(x, 1), lambda T, x, y: T.triu(x, 1)),
    "einsum": (lambda x, y: gc.einsum("ij,ij->i", x, y), lambda T, x, y: T.einsum("ij,ij->i", x, y)),
    "tensordot": (lambda x, y: gc.tensordot(x, y, 2), lambda T, x, y: T.tensordot(x, y, 2)),
    "one_hot": (lambda x, y: F.one_hot((gc.abs(x) % 3).int(), 3), None),  # int32 indices: torch takes int64 only
    "interpolate": (lambda x, y: F.interpolate(x[None], scale_factor=2), None),
    "neg": (lambda x, y: -x, lambda T, x, y: -x), "abs": (lambda x, y: gc.abs(x), lambda T, x, y: T.abs(x)),
    "sign": (lambda x, y: gc.sign(x), lambda T, x, y: T.sign(x)),
    "maximum": (gc.maximum, lambda T, x, y: T.maximum(x, y)), "minimum": (gc.minimum, lambda T, x, y: T.minimum(x, y)),
    "clamp": (lambda x, y: gc.clamp(x, 1, 4), lambda T, x, y: T.clamp(x, 1, 4)),
    "add": (gc.add, lambda T, x, y: x + y), "mul": (gc.mul, lambda T, x, y: x * y),
    "floor_divide": (gc.floor_divide, lambda T, x, y: T.floor_divide(x, y)),
    "remainder": (gc.remainder, lambda T, x, y: T.remainder(x, y)),
    "cumsum": (lambda x, y: gc.cumsum(x, 1), lambda T, x, y: T.cumsum(x, 1)),
    "amax": (lambda x, y: gc.amax(x, 1), lambda T, x, y: T.amax(x, 1)),
    "sort": (lambda x, y: gc.sort(x, 1).values, lambda T, x, y: T.sort(x, 1).values),
    "topk": (lambda x, y: gc.topk(x, 2)[0], lambda T, x, y: T.topk(x, 2).values),
}
_UNSIGNED_REFUSED = {"relu", "relu_method", "neg"}  # ONNX's Relu and Neg take no uint8: a CaptureError


def _operands(dtype):
    lo = 0 if dtype == "uint8" else -60
    x, y = (RNG.integers(lo, 60, (3, 4)).astype(dtype) for _ in range(2))
    y[y == 0] = 7
    return x, y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(OPS))
def test_integer_ops_run_on_ort_cpu_as_on_numpy_and_equal_torch(name, dtype):
    """Both backends equal (dtype and values; int8 products wrap the same way) and equal torch where it has the op;
    the one-hots and nearest resizes torch has no integer form of against numpy's own."""
    if dtype == "uint8" and name in _UNSIGNED_REFUSED:
        pytest.skip("ONNX has no uint8 Relu or Neg")
    x, y = _operands(dtype)
    fn, torch_fn = OPS[name]
    model = gc.capture(fn, x=x, y=y)
    got = {b: gc.Session(model, backend=b).run({"x": x, "y": y})["output"] for b in ("numpy", "ort-cpu")}
    if torch_fn is not None:
        torch = pytest.importorskip("torch")
        want = torch_fn(torch, torch.from_numpy(x), torch.from_numpy(y)).numpy()
    elif name == "one_hot":
        want = np.eye(3, dtype=np.int64)[np.abs(x.astype(np.int64)) % 3]
    else:
        want = np.repeat(x[None], 2, axis=2)  # nearest, scale 2 along the one spatial axis
    for backend, out in got.items():
        assert out.dtype == want.dtype, (backend, out.dtype, want.dtype)
        np.testing.assert_array_equal(out, want, err_msg=backend)


def test_written_out_integer_nodes_pass_the_checker_in_a_branch_too():
    """The session's copy is a valid model (onnx's full check), the rewrite reaching an If branch; a float Relu
    and an int32 Trilu (which have kernels) stay as they are."""
    x = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    model = gc.capture(lambda x, f: (gc.cond(x.sum() > 0, lambda: gc.relu(x), lambda: gc.tril(x.to(gc.int8)).long()),
                                     gc.relu(f), gc.tril(x.int())), x=x, f=np.ones(3, np.float32))
    lowered = integers.lower(model.proto)
    onnx.checker.check_model(lowered, full_check=True)
    ops = [n.op_type for graph in (lowered.graph, *[a.g for n in lowered.graph.node for a in n.attribute
                                                     if a.type == onnx.AttributeProto.GRAPH]) for n in graph.node]
    assert ops.count("Relu") == 1 and ops.count("Trilu") == 2 and "Max" in ops, ops
    for value in (x, -x):
        feeds = {"x": value, "f": np.ones(3, np.float32)}
        want = gc.Session(model, backend="numpy").run(feeds)
        got = gc.Session(model, backend="ort-cpu").run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("name, fn", [
    ("masked_fill(b, True)", lambda M, a, b: a.masked_fill(b, True)),
    ("masked_fill(b, b[0])", lambda M, a, b: a.masked_fill(b[None, :], b[2])),
    ("where(c, b, b) broadcast", lambda M, a, b: M.where(a[:, :1], b, a)),
])
def test_a_bool_where_runs_on_ort_cpu(name, fn):
    """onnxruntime has no bool Where ("Could not find an implementation for Where(16)"): written out as an And/Or,
    equal to torch's and the numpy backend's."""
    torch = pytest.importorskip("torch")
    a, b = RNG.random((3, 4)) < 0.5, RNG.random(4) < 0.5
    want = fn(torch, torch.from_numpy(a), torch.from_numpy(b)).numpy()
    model = gc.capture(lambda a, b: fn(gc, a, b), a=a, b=b)
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(model, backend=backend).run({"a": a, "b": b})["output"]
        assert out.dtype == want.dtype, backend
        np.testing.assert_array_equal(out, want, err_msg=backend)
