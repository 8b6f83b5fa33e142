"""float16 and bfloat16 functions against torch 2.13 on the CPU in the same dtype: torch computes
reductions, scans, softmax, the norms, statistics, distances and composite activations of a narrow
float in float32 and rounds once, and graphc's graphs say the same (``graphc.dsl.upcast``). Each
output's error against a float64 oracle, in units of the output dtype's spacing, must stay within
2 or torch's own error, on the numpy and ort-cpu backends; inputs are sized and scaled so that
narrow accumulation loses digits (1,000-element sums) or overflows (squares of hundreds in
float16). Gradients of the same functions are torch.autograd's of the float32 upcast, and float32
graphs gain no node."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.model.dtypes import to_numpy

try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

N = 1000
NARROW = ("float16", "bfloat16")


def _f(M):
    """torch.nn.functional or graphc.nn.functional."""
    return torch.nn.functional if M is torch else F


def _u(lo, hi, *shape):
    return lambda r: r.uniform(lo, hi, shape)


# name -> (fn(M, *xs), input makers, spacing floor: outputs of order 1 whose entries cancel to
# about 0 (normalised values) are measured in the spacing at 1, not at each entry)
CASES = {
    "sum": (lambda M, x: M.sum(x, -1), [_u(0, 10, 4, N)], 0),
    "mean": (lambda M, x: M.mean(x, -1), [_u(0, 10, 4, N)], 0),
    "cumsum": (lambda M, x: M.cumsum(x, -1), [_u(0, 10, 4, N)], 0),
    "var": (lambda M, x: M.var(x, -1), [_u(-300, 300, 4, N)], 0),
    "std": (lambda M, x: M.std(x, -1), [_u(100, 110, 4, N)], 0),
    "softmax": (lambda M, x: M.softmax(x, -1), [_u(-3, 3, 4, N)], 0),
    "log_softmax": (lambda M, x: M.log_softmax(x, -1), [_u(-3, 3, 4, N)], 0),
    "logsumexp": (lambda M, x: M.logsumexp(x, -1), [_u(-3, 3, 4, N)], 0),
    "group_norm": (lambda M, x: _f(M).group_norm(x, 2), [_u(50, 60, 2, 4, 500)], 1),
    "instance_norm": (lambda M, x: _f(M).instance_norm(x), [_u(-300, 300, 2, 3, 500)], 1),
    "rms_norm": (lambda M, x: _f(M).rms_norm(x, [N]), [_u(-300, 300, 4, N)], 0),
    "normalize": (lambda M, x: _f(M).normalize(x, dim=-1), [_u(-300, 300, 4, 30)], 0),
    "cosine_similarity": (lambda M, a, b: _f(M).cosine_similarity(a, b), [_u(-300, 300, 4, 30)] * 2, 0),
    "pairwise_distance": (lambda M, a, b: _f(M).pairwise_distance(a, b), [_u(-300, 300, 4, 30)] * 2, 0),
    "einsum": (lambda M, a, b: M.einsum("ij,jk->ik", a, b), [_u(0.5, 1.5, 8, N), _u(0.5, 1.5, N, 8)], 0),
    "sdpa": (lambda M, q, k, v: _f(M).scaled_dot_product_attention(q, k, v),
             [_u(-3, 3, 1, 4, 64), _u(-3, 3, 1, 300, 64), _u(-3, 3, 1, 300, 64)], 1),
    "avg_pool1d": (lambda M, x: _f(M).avg_pool1d(x, 50), [_u(0, 10, 1, 2, 500)], 0),
    "gelu": (lambda M, x: _f(M).gelu(x), [_u(-3, 3, N)], 0),
    "gelu_tanh": (lambda M, x: _f(M).gelu(x, approximate="tanh"), [_u(-3, 3, N)], 0),
    "logsigmoid": (lambda M, x: _f(M).logsigmoid(x), [_u(-3, 3, N)], 0),
    "hardswish": (lambda M, x: _f(M).hardswish(x), [_u(-3, 3, N)], 0),
    "selu": (lambda M, x: _f(M).selu(x), [_u(-3, 3, N)], 0),
    "erfc": (lambda M, x: M.erfc(x), [_u(-3, 3, N)], 0),
    "sinc": (lambda M, x: M.sinc(x), [_u(-3, 3, N)], 1e-2),  # sin(pi k) is no exact 0 in any float
    "logaddexp": (lambda M, a, b: M.logaddexp(a, b), [_u(-3, 3, N)] * 2, 0),
    "lerp": (lambda M, a, b: M.lerp(a, b, 0.3), [_u(-3, 3, N)] * 2, 0),
    "addcdiv": (lambda M, a, b, c: M.addcdiv(a, b, c, value=0.5), [_u(-3, 3, N), _u(-3, 3, N), _u(0.5, 10, N)], 0),
    "cross_entropy": (lambda M, a, y: _f(M).cross_entropy(a, y),
                      [_u(-3, 3, N, 50), lambda r: r.integers(0, 50, N)], 0),
}
# onnxruntime's CPU kernels take no bfloat16 for the label arithmetic of these
NO_ORT_BFLOAT16 = {"cross_entropy"}
# what the narrow graphs may add to the float32 ones
CASTS = {"Cast"}


def _inputs(name: str, dtype: str) -> list[np.ndarray]:
    """The case's arrays, floats rounded to ``dtype`` (as graphc and torch both get them)."""
    r = np.random.default_rng(sum(map(ord, name)))
    arrays = [make(r) for make in CASES[name][1]]
    return [a.astype(np.float32).astype(to_numpy(dtype)) if a.dtype.kind not in "iu" else a for a in arrays]


def _torch(fn, arrays: list[np.ndarray], dtype) -> torch.Tensor:
    return fn(torch, *(torch.from_numpy(a.astype(np.float64)).to(dtype) if a.dtype.kind not in "iu"
                       else torch.from_numpy(a) for a in arrays))


def _spacings(got: np.ndarray, exact: np.ndarray, dtype: str, floor: float) -> float:
    """The largest ``|got - exact|`` in units of ``dtype``'s spacing at ``max(|exact|, floor)``."""
    finfo = torch.finfo(getattr(torch, dtype))
    scale = np.maximum(np.maximum(np.abs(exact), floor), finfo.tiny) * finfo.eps
    with np.errstate(invalid="ignore"):
        err = np.abs(np.asarray(got, np.float64) - exact) / scale
    return float(np.nanmax(np.where(np.isnan(got) & ~np.isnan(exact), np.inf, err)))


def _capture(name: str, arrays: list[np.ndarray]) -> gc.Model:
    names = [f"x{k}" for k in range(len(arrays))]
    return gc.capture(lambda **kw: CASES[name][0](gc, *(kw[n] for n in names)), **dict(zip(names, arrays)))


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("name", sorted(CASES))
def test_error_within_torchs(name, dtype):
    fn, _, floor = CASES[name]
    arrays = _inputs(name, dtype)
    exact = _torch(fn, arrays, torch.float64).numpy()
    want = _torch(fn, arrays, getattr(torch, dtype))
    bound = max(2.0, _spacings(want.double().numpy(), exact, dtype, floor))
    model = _capture(name, arrays)
    backends = ["numpy"] if dtype == "bfloat16" and name in NO_ORT_BFLOAT16 else ["numpy", "ort-cpu"]
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    for backend in backends:
        got = gc.Session(model, backend=backend).run(feeds)["output"]
        assert got.dtype == to_numpy(dtype), (backend, got.dtype)
        err = _spacings(got.astype(np.float64), exact, dtype, floor)
        assert err <= bound, f"{name} {dtype} on {backend}: {err:.2f} spacings, torch's {bound:.2f}"


def _ops(name: str, dtype: str) -> Counter:
    return Counter(n.op_type for n in _capture(name, _inputs(name, dtype)).proto.graph.node)


@pytest.mark.parametrize("name", ["sum", "softmax", "var", "group_norm", "gelu", "lerp", "sdpa", "hardswish"])
def test_narrow_graphs_add_only_casts_and_float32_none(name):
    wide, narrow = _ops(name, "float32"), _ops(name, "float16")
    assert set((narrow - wide).keys()) <= CASTS and not wide - narrow
    casts = Counter(n.op_type for n in _capture(name, _inputs(name, "float32")).proto.graph.node)["Cast"]
    assert casts == 0 or name == "sdpa", casts  # no float32 graph here casts, attention's mask aside


# one differentiable input per case (the others fixed inputs), and sizes small enough for float64 torch
GRADS = [c for c in sorted(CASES) if c not in {"cross_entropy"}]


@pytest.mark.parametrize("name", GRADS)
def test_gradient_is_torchs_in_float32(name):
    """``gc.grad`` of ``sum(f(x) * c)`` in float16 (numpy backend) against torch.autograd's of
    ``f`` on the float32 upcast of the same inputs, rounded to float16."""
    fn = CASES[name][0]
    arrays = _inputs(name, "float16")
    x, rest = arrays[0], {f"x{k}": a for k, a in enumerate(arrays) if k}
    want = _torch(fn, arrays, torch.float32).numpy()
    c = np.random.default_rng(1).uniform(-1, 1, want.shape).astype(np.float16)
    leaf = torch.from_numpy(x.astype(np.float32)).requires_grad_()
    out = fn(torch, leaf, *(torch.from_numpy(a.astype(np.float32)) for a in arrays[1:]))
    (out * torch.from_numpy(c.astype(np.float32))).sum().backward()
    expected = leaf.grad.numpy()

    def graphc_fn(_, x0, **kw):
        return fn(gc, x0, *(kw[f"x{k}"] for k in range(1, len(arrays))))

    got = gc_grads(graphc_fn, {"x0": x}, rest, c)["x0"]
    assert got.dtype == np.float16
    scale = np.maximum(np.abs(expected), np.abs(expected).max() * 1e-2)  # entries that cancel to about 0
    err = np.abs(got.astype(np.float32) - expected) - 2.0**-24  # float16's subnormal spacing
    np.testing.assert_array_less(err / scale, 4e-3, err_msg=name)  # 4 spacings
