"""Creation, combinatorics and dtype-utility functions (graphc/dsl/ops_factories.py) against torch: constants
(values and dtypes exact where torch's formula allows), grids and products on the numpy and ort-cpu backends
(models through the full ONNX checker, symbolic sizes too), ``gc.grad`` gradients against torch.autograd and
float64 central differences, torch's promotion tables over graphc's dtypes, and the errors for what torch
refuses."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(5)
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
DUMMY = {"unused": np.zeros(1, np.float32)}  # a capture needs an input; the constants ignore it


def _dt(M, name):
    """dtype ``name`` in ``M``'s spelling: a torch.dtype, or graphc's string."""
    return getattr(M, name) if M is torch else name


def _torch(fn, *xs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.range is deprecated
        return fn(torch, *xs)


def _capture_run(fn, feeds):
    model = gc.capture(lambda **kw: fn(gc, *kw.values()), **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    return run_both(model, feeds)["output"]


# (id, fn(M)): constants whose values and dtype equal torch's exactly
CONSTANTS = [
    ("eye", lambda M: M.eye(3)),
    ("eye_rect_int", lambda M: M.eye(2, 4, dtype=_dt(M, "int64"))),
    ("eye_bool", lambda M: M.eye(3, 2, dtype=_dt(M, "bool"))),
    ("eye_empty", lambda M: M.eye(0)),
    ("linspace", lambda M: M.linspace(-3.3, 7.1, 11)),
    ("linspace_fused_halves", lambda M: M.linspace(0.1, 1e3, 100)),
    ("linspace_long", lambda M: M.linspace(-5, 5, 1000)),
    ("linspace_down", lambda M: M.linspace(1, 0, 7)),
    ("linspace_one", lambda M: M.linspace(0, 1, 1)),
    ("linspace_none", lambda M: M.linspace(0, 1, 0)),
    ("linspace_float64", lambda M: M.linspace(0.3, 17.9, 37, dtype=_dt(M, "float64"))),
    ("linspace_int_truncates_ends", lambda M: M.linspace(-3.3, 7.1, 11, dtype=_dt(M, "int64"))),
    ("linspace_int32", lambda M: M.linspace(1e-3, 2.5, 64, dtype=_dt(M, "int32"))),
    ("logspace_int", lambda M: M.logspace(0.1, 30.0, 100, base=2.0, dtype=_dt(M, "int64"))),
    ("logspace_exact_powers", lambda M: M.logspace(0, 3, 4)),
    ("range", lambda M: M.range(1, 4)),
    ("range_float_step", lambda M: M.range(0, 1, 0.1)),
    ("range_down", lambda M: M.range(5, 1, -2)),
    ("range_int", lambda M: M.range(1, 4, dtype=_dt(M, "int64"))),
    ("scalar_tensor", lambda M: M.scalar_tensor(3)),
    ("scalar_tensor_bool_is_float", lambda M: M.scalar_tensor(True)),
    ("scalar_tensor_int", lambda M: M.scalar_tensor(2, dtype=_dt(M, "int64"))),
    ("tensor_mixed_list", lambda M: M.tensor([[1, 2.5], [3, 4]])),
    ("tensor_ints", lambda M: M.tensor([1, 2, 3])),
    ("tensor_bools", lambda M: M.tensor([[True, False]])),
    ("tensor_python_int", lambda M: M.tensor(3)),
    ("tensor_numpy_float64_kept", lambda M: M.tensor(np.arange(3.0))),
    ("tensor_numpy_int32_kept", lambda M: M.tensor(np.int32(2))),
    ("tensor_dtype", lambda M: M.tensor([1, 2], dtype=_dt(M, "float64"))),
    ("as_tensor_list", lambda M: M.as_tensor([1.5, 2])),
    ("asarray_numpy", lambda M: M.asarray(np.arange(4, dtype=np.int16))),
    ("tril_indices", lambda M: M.tril_indices(3, 4, 1)),
    ("triu_indices", lambda M: M.triu_indices(4, 3, -1)),
    ("tril_indices_empty", lambda M: M.tril_indices(0, 3)),
    ("triu_indices_int32", lambda M: M.triu_indices(3, 3, dtype=_dt(M, "int32"))),
    ("block_diag_of_nothing", lambda M: M.block_diag()),
]


@pytest.mark.parametrize("name,fn", CONSTANTS, ids=[c[0] for c in CONSTANTS])
def test_constants_equal_torch(name, fn):
    want = _torch(fn).numpy()
    got = _capture_run(lambda M, unused: fn(M), DUMMY)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("args", [(-3.3, 7.1, 11), (0.1, 30.0, 100), (0.3, 17.9, 37), (-5, 5, 1000), (1, 0, 7)])
def test_logspace_within_rounding_of_torch(args, dtype):
    """torch's float logspace takes its powers in a vectorised kernel whose last bits numpy's pow does not
    reproduce: within a few units in the last place."""
    want = torch.logspace(*args, base=2.5, dtype=getattr(torch, dtype)).numpy()
    got = _capture_run(lambda M, unused: M.logspace(*args, base=2.5, dtype=dtype), DUMMY)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=4 * np.finfo(want.dtype).eps)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fn", ["linspace", "logspace"])
def test_half_precision_spacing_within_one_unit_of_torch(fn, dtype):
    """float16 and bfloat16 values, computed in float32 (linspace) or float64 (logspace) and rounded once:
    within one unit in the last place of the largest value."""
    kw = {"base": 2.0} if fn == "logspace" else {}
    want = getattr(torch, fn)(-3.3, 7.1, 11, dtype=getattr(torch, dtype), **kw).float().numpy()
    model = gc.capture(lambda unused: getattr(gc, fn)(-3.3, 7.1, 11, dtype=dtype, **kw), **DUMMY)
    got = gc.Session(model, backend="numpy").run(DUMMY)["output"]
    assert str(got.dtype) == dtype
    ulp = float(torch.finfo(getattr(torch, dtype)).eps) * np.abs(want).max()
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=0, atol=ulp)


def test_empty_is_zeros_of_torch_shape_and_dtype():
    x = np.ones((2, 3), np.float64)
    cases = [lambda M, x: M.empty(2, 3), lambda M, x: M.empty((4,), dtype=_dt(M, "int32")),
             lambda M, x: M.empty_like(x), lambda M, x: x.new_empty((3, 1)),
             lambda M, x: x.new_empty(2, dtype=_dt(M, "int64"))]
    for fn in cases:
        want = fn(torch, torch.from_numpy(x))
        got = _capture_run(fn, {"x": x})
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape)
        assert not got.any()


def test_new_tensor_and_as_tensor_of_a_tensor():
    x = R.standard_normal((2, 3))
    for fn in (lambda M, x: x.new_tensor([1, 2]), lambda M, x: x.new_tensor([1, 2], dtype=_dt(M, "int32")),
               lambda M, x: M.as_tensor(x, dtype=_dt(M, "float32")), lambda M, x: M.asarray(x) * 2):
        want = fn(torch, torch.from_numpy(x)).numpy()
        got = _capture_run(fn, {"x": x})
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)
    same = []
    gc.capture(lambda x: same.append(gc.as_tensor(x) is x and gc.asarray(x, dtype="float64") is x) or x, x=x)
    assert same == [True]


A3, B4, C2 = R.standard_normal(3), R.standard_normal(4), R.standard_normal(2)
M23, M32, T234 = R.standard_normal((2, 3)), R.standard_normal((3, 2)), R.standard_normal((2, 3, 4))
T342 = R.standard_normal((3, 4, 2))

# (id, fn(M, *xs), xs): values on both backends and gradients of every float input against torch's
CASES = [
    ("meshgrid_ij", lambda M, a, b: M.stack(M.meshgrid(a, b, indexing="ij")), [A3, B4]),
    ("meshgrid_xy_three", lambda M, a, b, c: M.stack(M.meshgrid([a, b, c], indexing="xy")), [A3, B4, C2]),
    ("meshgrid_0d", lambda M, s, b: M.stack(M.meshgrid(s, b, indexing="ij")), [np.asarray(1.5), B4]),
    ("meshgrid_one_xy", lambda M, a: M.meshgrid(a, indexing="xy")[0], [A3]),
    ("cartesian_prod", lambda M, a, b: M.cartesian_prod(a, b), [A3, B4]),
    ("cartesian_prod_three", lambda M, a, b, c: M.cartesian_prod(a, b, c), [A3, C2, C2]),
    ("cartesian_prod_one", lambda M, a: M.cartesian_prod(a) * 1, [A3]),
    ("combinations", lambda M, x: M.combinations(x), [B4]),
    ("combinations_r3", lambda M, x: M.combinations(x, r=3), [B4]),
    ("combinations_replacement", lambda M, x: M.combinations(x, 2, with_replacement=True), [A3]),
    ("combinations_r_too_large", lambda M, x: M.combinations(x, 5), [B4]),
    ("block_diag", lambda M, a, b, s: M.block_diag(a, b, s), [M23, B4, np.asarray(0.5)]),
    ("block_diag_one", lambda M, a: M.block_diag(a), [M32]),
    ("tensordot_2", lambda M, a, b: M.tensordot(a, b), [T234, T342]),
    ("tensordot_1", lambda M, a, b: M.tensordot(a, b, dims=1), [T234, R.standard_normal((4, 5))]),
    ("tensordot_0", lambda M, a, b: M.tensordot(a, b, dims=0), [M23, A3]),
    ("tensordot_pairs", lambda M, a, b: M.tensordot(a, b, dims=([1, 0], [0, 2])), [T234, T342]),
    ("tensordot_lists_negative", lambda M, a, b: M.tensordot(a, b, [[-1], [1]]), [T234, R.standard_normal((5, 4))]),
    ("hstack", lambda M, a, b, s: M.hstack([a, b, s]), [A3, B4, np.asarray(2.0)]),
    ("hstack_2d", lambda M, a, b: M.hstack((a, b)), [M32, M32]),
    ("vstack", lambda M, a, b: M.vstack([a, b]), [A3, M23]),
    ("row_stack", lambda M, a, b: M.row_stack([a, b]), [A3, A3]),
    ("dstack", lambda M, a, b: M.dstack([a, b]), [M23, M23]),
    ("dstack_1d", lambda M, a, b: M.dstack([a, b]), [A3, A3]),
    ("column_stack", lambda M, a, b, c: M.column_stack([a, b, c]), [A3, M32, A3]),
    ("concatenate_axis", lambda M, a, b: M.concatenate([a, b], axis=1), [M23, M23]),
    ("concatenate_dim", lambda M, a, b: M.concatenate((a, b), dim=0), [M23, M23]),
]


@pytest.mark.parametrize("name,fn,xs", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_torch(name, fn, xs):
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    want = fn(torch, *ts)
    c = R.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    names = [f"x{i}" for i in range(len(xs))]
    got = _capture_run(fn, {k: x.astype(np.float32) for k, x in zip(names, xs)})
    assert got.dtype == np.float32 and got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-5, atol=1e-5)
    for backend in ("numpy", "ort-cpu"):
        grads = gc_grads(lambda F, *args: fn(gc, *args), dict(zip(names, xs)), {}, c, backend=backend)
        np.testing.assert_allclose(grads["out"], want.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=backend)
        for k, t in zip(names, ts):
            np.testing.assert_allclose(grads[k], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=f"{backend} {k}")


@pytest.mark.parametrize("n,increasing", [(None, False), (5, True), (1, False), (0, True)])
def test_vander_values_and_gradients(n, increasing):
    """Values against torch.vander; gradients against torch.autograd of the powers written out, as
    torch.vander's own backward fails (it writes its cumprod in place)."""
    x = R.standard_normal(4)
    want = torch.vander(torch.from_numpy(x), N=n, increasing=increasing).numpy()
    got = _capture_run(lambda M, x: M.vander(x, N=n, increasing=increasing), {"x": x.astype(np.float32)})
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
    t = torch.tensor(x, requires_grad=True)
    powers = torch.arange(want.shape[1], dtype=torch.float64)
    out = t.unsqueeze(1) ** (powers if increasing else powers.flip(0))
    c = R.standard_normal(want.shape)
    (out * torch.from_numpy(c)).sum().backward()
    grads = gc_grads(lambda F, x: gc.vander(x, N=n, increasing=increasing), {"x": x}, {}, c)
    np.testing.assert_allclose(grads["out"], want, rtol=1e-12)
    np.testing.assert_allclose(grads["x"], t.grad.numpy(), rtol=1e-10, atol=1e-12)


# (id, fn(M, x)): the multi-op lowerings, float64 gradients against central differences
LOWERINGS = [
    ("meshgrid", lambda M, x: M.stack(M.meshgrid(x, x[:2] * 3, indexing="xy"))),
    ("cartesian_prod", lambda M, x: M.cartesian_prod(x, x * x)),
    ("combinations", lambda M, x: M.combinations(x, 3, with_replacement=True)),
    ("block_diag", lambda M, x: M.block_diag(x, x.reshape(2, 2), x[1])),
    ("vander", lambda M, x: M.vander(x, N=6)),
    ("tensordot", lambda M, x: M.tensordot(x.reshape(2, 2), x.reshape(2, 2) * x[0], dims=([0], [1]))),
]


@pytest.mark.parametrize("name,fn", LOWERINGS, ids=[c[0] for c in LOWERINGS])
def test_gradients_match_central_differences(name, fn):
    assert_grads_match_central_differences(lambda F, x: fn(gc, x), R.standard_normal(4) + 0.5)


# (id, fn(M, *xs), xs): integer and bool Tensors keep torch's dtypes
INT_CASES = [
    ("vander_int_is_int64", lambda M, x: M.vander(x), [np.array([2, -1, 3], np.int32)]),
    ("vander_bool_is_int64", lambda M, x: M.vander(x, 3), [np.array([True, False])]),
    ("unravel_index", lambda M, i: M.stack(M.unravel_index(i, (3, 4))), [np.array([0, 5, 11, 7])]),
    ("unravel_index_wraps", lambda M, i: M.stack(M.unravel_index(i, (2, 3))), [np.array([-1, 7, -7, 6])]),
    ("unravel_index_int32_0d", lambda M, i: M.stack(M.unravel_index(i, (4, 2, 3))), [np.asarray(17, np.int32)]),
    ("unravel_index_1d_shape", lambda M, i: M.unravel_index(i, (5,))[0], [np.array([[1, 4], [3, 0]])]),
    ("tensordot_int", lambda M, a, b: M.tensordot(a, b, dims=1),
     [np.arange(6).reshape(2, 3), np.arange(-3, 3).reshape(3, 2)]),
    ("combinations_bool", lambda M, x: M.combinations(x), [np.array([True, False, True])]),
    ("meshgrid_int", lambda M, a, b: M.stack(M.meshgrid(a, b, indexing="ij")), [np.arange(3), np.arange(2)]),
    ("block_diag_int", lambda M, a, b: M.block_diag(a, b), [np.ones((2, 2), np.int64), np.arange(3)]),
    ("hstack_int8", lambda M, a: M.hstack([a, a]), [np.arange(3, dtype=np.int8)]),
]


@pytest.mark.parametrize("name,fn,xs", INT_CASES, ids=[c[0] for c in INT_CASES])
def test_integer_values_and_dtypes_match_torch(name, fn, xs):
    want = fn(torch, *(torch.from_numpy(np.asarray(x)) for x in xs)).numpy()
    got = _capture_run(fn, {f"x{i}": x for i, x in enumerate(xs)})
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


# (id, fn, inputs with a symbolic dim N, the shape of each model output for N = 5)
SYMBOLIC = [
    ("meshgrid", lambda v: gc.stack(gc.meshgrid(v, v[:2], indexing="xy")), (2, 2, 5)),
    ("cartesian_prod", lambda v: gc.cartesian_prod(v, v), (25, 2)),
    ("vander", lambda v: gc.vander(v, N=3), (5, 3)),
    ("tensordot_batch", lambda v: gc.tensordot(gc.stack([v, v * 2], 1), gc.stack([v, v], 0), dims=1), (5, 5)),
    ("empty_like", lambda v: gc.empty_like(v) + v, (5,)),
]


@pytest.mark.parametrize("name,fn,shape", SYMBOLIC, ids=[c[0] for c in SYMBOLIC])
def test_symbolic_sizes_match_torch(name, fn, shape):
    v = R.standard_normal(5).astype(np.float32)
    model = gc.capture(fn, v=gc.spec("float32", ("N",)))
    onnx.checker.check_model(model.proto, full_check=True)
    got = run_both(model, {"v": v})["output"]
    want = {"meshgrid": lambda t: torch.stack(torch.meshgrid(t, t[:2], indexing="xy")),
            "cartesian_prod": lambda t: torch.cartesian_prod(t, t), "vander": lambda t: torch.vander(t, N=3),
            "tensordot_batch": lambda t: torch.tensordot(torch.stack([t, t * 2], 1), torch.stack([t, t], 0), dims=1),
            "empty_like": lambda t: t}[name](torch.from_numpy(v)).numpy()
    assert got.shape == shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_promote_types_and_can_cast_match_torch_for_every_pair():
    for a in DTYPES:
        for b in DTYPES:
            want = str(torch.promote_types(getattr(torch, a), getattr(torch, b))).removeprefix("torch.")
            got = gc.promote_types(a, b)
            assert got == want and isinstance(got, str), (a, b)
            assert gc.can_cast(a, b) == torch.can_cast(getattr(torch, a), getattr(torch, b)), (a, b)


def test_result_type_matches_torch():
    """Tensors with dims, 0-D Tensors and Python numbers of each kind, in both orders."""
    specs = {f"{d}_{r}": gc.spec(d, (2,) * r) for d in DTYPES for r in (0, 1)}
    numbers = [True, 3, 2.5]
    seen = []

    def record(**tensors):
        for name, t in tensors.items():
            for other in [*numbers, *(tensors[k] for k in list(tensors)[::7])]:
                seen.append((name, other, gc.result_type(t, other), gc.result_type(other, t)))
        return tensors["float32_1"]

    gc.capture(record, **specs)
    real = {name: torch.zeros((2,) * int(name[-1]), dtype=getattr(torch, name.rsplit("_", 1)[0])) for name in specs}
    assert len(seen) > 100
    for name, other, got, got_swapped in seen:
        t_other = other if isinstance(other, (bool, int, float)) else real[f"{other.dtype}_{other.ndim}"]
        want = str(torch.result_type(real[name], t_other)).removeprefix("torch.")
        assert got == got_swapped == want, (name, other)
    assert gc.result_type(2, 2.5) == str(torch.result_type(2, 2.5)).removeprefix("torch.")


def test_broadcast_shapes_matches_torch():
    for shapes in [((2, 1), (3,)), (5, (1, 5)), ((4, 1, 3), (1, 2, 1), ()), ((0, 1), (3,)), ()]:
        want = tuple(torch.broadcast_shapes(*shapes))
        assert gc.broadcast_shapes(*shapes) == want
    assert gc.broadcast_shapes(("N", 1), (3,)) == ("N", 3)


# (fn, the words the error must hold): each names the argument and what torch expects
ERRORS = [
    (lambda x: gc.linspace(0, 1, -1), "linspace: steps must be a non-negative int, got -1"),
    (lambda x: gc.logspace(0, 1, 2.5), "logspace: steps must be a non-negative int"),
    (lambda x: gc.linspace(x[0], 1, 3), "linspace: start must be a Python number"),
    (lambda x: gc.eye(-1), "eye: n must be a non-negative int, got -1"),
    (lambda x: gc.range(0, 1, 0), "range: step must be nonzero"),
    (lambda x: gc.range(1, 0, 1), "end 0 is not reached from start 1 by step 1"),
    (lambda x: gc.tril_indices(-2, 3), "tril_indices: row must be a non-negative int"),
    (lambda x: gc.tensor([x, x]), "tensor takes Python or numpy data, got a Tensor"),
    (lambda x: gc.tensor("ab"), "tensor: cannot make a Tensor of str"),
    (lambda x: gc.tensor([[1, 2], [3]]), r"tensor: data must nest sequences of equal lengths, got \[\[1, 2\], \[3\]\]"),
    (lambda x: x.new_tensor([1, [2]]), "new_tensor: data must nest sequences of equal lengths"),
    (lambda x: gc.scalar_tensor(x), "scalar_tensor: s must be a Python number, got Tensor"),
    (lambda x: gc.meshgrid(x, x, indexing="foo"), "meshgrid: indexing must be 'ij' or 'xy', got 'foo'"),
    (lambda x: gc.meshgrid(x.reshape(2, 2), x, indexing="ij"), "tensor 0 has rank 2; meshgrid takes ranks"),
    (lambda x: gc.combinations(x.reshape(2, 2)), "tensor 0 has rank 2; combinations takes ranks \\[1\\]"),
    (lambda x: gc.combinations(x, -1), "combinations: r must be a non-negative int, got -1"),
    (lambda x: gc.block_diag(x.reshape(1, 2, 2)), "tensor 0 has rank 3; block_diag takes ranks"),
    (lambda x: gc.cartesian_prod(x, x.astype("float64")), "dtype mismatch float32 vs float64"),
    (lambda x: gc.vander(x.reshape(2, 2)), "vander takes ranks \\[1\\]"),
    (lambda x: gc.vander(x, N=-1), "vander: N must be a non-negative int"),
    (lambda x: gc.cartesian_prod(x.reshape(2, 2)), "cartesian_prod takes ranks \\[1\\]"),
    (lambda x: gc.unravel_index(x, (2, 2)), "unravel_index's indices must be integers, got float32"),
    (lambda x: gc.unravel_index(x.astype("int64"), (2, -2)), "shape must hold non-negative ints"),
    (lambda x: gc.tensordot(x.reshape(2, 2), x, dims=([0], [0, 0])), "dims \\[0\\] and \\[0, 0\\] are not the same"),
    (lambda x: gc.tensordot(x.reshape(2, 2), x, dims=1), "contracted dims differ: size 2 in dim 1 of a, 4 in dim 0"),
    (lambda x: gc.tensordot(x, x, dims=-1), "tensordot dims=-1 must be in 0 .. 1"),
    (lambda x: gc.tensordot(x, x, dims=([3], [0])), "tensordot dims \\(3, 0\\) out of range"),
    (lambda x: gc.broadcast_shapes((2, 3), (4,)), "broadcast_shapes: \\(2, 3\\), \\(4,\\) do not broadcast"),
    (lambda x: gc.result_type(x, "a"), "result_type takes Tensors and Python numbers, got str"),
    (lambda x: gc.promote_types("float32", "string"), "promote_types: string is not a dtype torch promotes"),
]


@pytest.mark.parametrize("fn,match", ERRORS, ids=[m[:40] for _, m in ERRORS])
def test_bad_arguments_name_the_argument_and_the_line(fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=np.ones(4, np.float32))
    assert "test_dsl_factories.py:" in str(info.value)


def test_lowerings_run_at_opset_17():
    a, b = A3.astype(np.float32), B4.astype(np.float32)

    def fn(M, a, b):
        grid = M.stack(M.meshgrid(a, b, indexing="xy"))
        parts = [grid.sum(), M.cartesian_prod(a, b).sum(), M.combinations(b, 3).sum(), M.block_diag(a, b).sum(),
                 M.vander(a).sum(), M.tensordot(M.outer(a, b), M.outer(a, b)), M.hstack([a, b]).sum(),
                 M.stack(M.unravel_index(M.tensor([5, -1, 9]), (3, 4))).sum().to(M.float32)]
        return M.stack(parts)

    model = gc.capture(lambda a, b: fn(gc, a, b), a=a, b=b, opset=17)
    onnx.checker.check_model(model.proto, full_check=True)
    want = fn(torch, torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(run_both(model, {"a": a, "b": b})["output"], want, rtol=1e-5)
