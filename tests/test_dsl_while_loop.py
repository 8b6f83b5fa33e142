"""gc.while_loop: one ONNX Loop with no trip count whose body computes its own condition, checked
against the same loop in plain Python (values, step counts, zero steps), torch.autograd of the
unrolled Python while loop and float64 central differences (gradients by carried inputs and
closed-over parameters), on the numpy and ort-cpu backends; nested in gc.cond / gc.scan / itself,
under gc.vmap, exported for servers at opset 17, and its errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.errors import CaptureError

try:
    from dsl_util import check, rng, run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import check, rng, run_ort
from tests.torch_grad_util import TorchNS, assert_matches_torch, gc_grads

X = rng(0).standard_normal((4, 3)).astype(np.float32)


def _halve(x):
    """(steps, x halved until its squared norm is at most 0.5)."""
    return gc.while_loop(lambda i, y: (y * y).sum() > 0.5, lambda i, y: (i + 1, y * 0.5), (0, x))


def _py_halve(x):
    i, y = 0, x
    while (y * y).sum() > 0.5:
        i, y = i + 1, y * np.float32(0.5)
    return i, y


def _both(model, feeds):
    """Outputs on the numpy backend, checked equal to onnxruntime's."""
    ref = gc.Session(model, backend="numpy").run(feeds)
    ort = run_ort(model, feeds)
    for k, v in ref.items():
        np.testing.assert_allclose(ort[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    return ref


def test_a_loop_with_its_own_condition_and_a_symbolic_batch():
    model = gc.capture(lambda x: dict(zip(("i", "y"), _halve(x))), x=gc.spec("float32", ("N", 3)))
    check(model)
    (loop,) = [n for n in model.ir.graph if n.op_type == "Loop"]
    assert loop.inputs[0] is None and loop.inputs[1].producer().op_type == "Greater"  # no trip count
    steps = set()
    for x in (X, X[:1] * 0.01, X * 10, X[:0]):
        out, (i, y) = _both(model, {"x": x}), _py_halve(x)
        assert out["i"].dtype == np.int64 and int(out["i"]) == i
        np.testing.assert_array_equal(out["y"], y)
        steps.add(i)
    assert 0 in steps and len(steps) == 3  # zero steps (while, not do-while) and data-dependent counts


def test_eager_capture_gives_the_example_values():
    seen = {}

    def probe(x):
        i, y = _halve(x)
        seen.update(i=i.numpy(), y=y.numpy())
        return {"i": i, "y": y}

    for x in (X, X * 0.01):
        model = gc.capture(probe, x=x)
        i, y = _py_halve(x)
        assert int(seen["i"]) == i
        np.testing.assert_array_equal(seen["y"], y)
        np.testing.assert_array_equal(_both(model, {"x": x})["y"], y)


def test_carried_trees_jax_style_single_value_and_a_bare_body_result():
    def f(x):
        # torch: a tuple of trees, each unpacked into cond_fn and body_fn
        d = gc.while_loop(lambda t, d: d["n"] < 3, lambda t, d: (t * 2.0, {"n": d["n"] + 1, "s": [d["s"][0] + t]}),
                          (x, {"n": 0, "s": [x * 0]}))
        # JAX: one value passed whole and returned as such; a lone Tensor from body_fn for one carry
        single = gc.while_loop(lambda y: y.sum() < 100.0, lambda y: y + 1.0, x)
        tree = gc.while_loop(lambda c: c["k"] < 2, lambda c: {"k": c["k"] + 1, "v": c["v"] * 3.0}, {"k": 0, "v": x})
        one = gc.while_loop(lambda y: y.sum() < 50.0, lambda y: y * 2.0, (x.abs() + 1.0,))
        assert isinstance(d, tuple) and isinstance(d[1]["s"], list) and isinstance(tree, dict) and len(one) == 1
        return {"t": d[0], "n": d[1]["n"], "s": d[1]["s"][0], "single": single, "tree": tree["v"], "one": one[0]}

    model = gc.capture(f, x=gc.spec("float32", ("N", 3)))
    check(model)
    out = _both(model, {"x": X})
    np.testing.assert_allclose(out["t"], X * 8, rtol=1e-6)
    np.testing.assert_allclose(out["s"], X * 7, rtol=1e-6)
    assert int(out["n"]) == 3
    single = X.copy()
    while single.sum() < 100:
        single = single + 1
    np.testing.assert_allclose(out["single"], single, rtol=1e-6)
    np.testing.assert_allclose(out["tree"], X * 9, rtol=1e-6)
    one = np.abs(X) + 1
    while one.sum() < 50:
        one = one * 2
    np.testing.assert_allclose(out["one"], one, rtol=1e-6)


# -- nesting ----------------------------------------------------------------------------------------


def test_nested_in_cond_scan_and_another_while_loop():
    def f(x):
        in_cond = gc.cond(x.sum() > 0, lambda: _halve(x)[1], lambda: x - 1.0)

        def row(c, r):  # per row: double |r| until it passes c
            y = gc.while_loop(lambda y: y.sum() < c, lambda y: y * 2.0, r.abs() + 0.1)
            return c + 1.0, y

        _, in_scan = gc.scan(row, x.sum() * 0 + 4.0, x)

        def outer_body(k, y):  # inner loop: add 1 until the sum passes 5 k
            inner = gc.while_loop(lambda z: z.sum() < k.astype("float32") * 5.0, lambda z: z + 1.0, y)
            return k + 1, inner * 0.5

        k, in_while = gc.while_loop(lambda k, y: k < 4, outer_body, (0, x))
        return {"in_cond": in_cond, "in_scan": in_scan, "in_while": in_while, "k": k}

    def py(x):
        in_cond = _py_halve(x)[1] if x.sum() > 0 else x - 1
        c, rows = np.float32(4.0), []
        for r in x:
            y = np.abs(r) + np.float32(0.1)
            while y.sum() < c:
                y = y * 2
            rows.append(y)
            c = c + 1
        k, y = 0, x
        while k < 4:
            while y.sum() < k * 5.0:
                y = y + 1
            k, y = k + 1, y * np.float32(0.5)
        return {"in_cond": in_cond, "in_scan": np.stack(rows), "in_while": y, "k": k}

    model = gc.capture(f, x=gc.spec("float32", ("N", 3)))
    check(model)
    for x in (X, -X, X[:1]):
        out = _both(model, {"x": x})
        for k, v in py(x).items():
            np.testing.assert_allclose(out[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    eager = gc.capture(f, x=X)  # the eager capture runs the nested loops too
    for k, v in py(X).items():
        np.testing.assert_allclose(_both(eager, {"x": X})[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


# -- gradients ---------------------------------------------------------------------------------------


def _loop(M, cond_fn, body_fn, carried):
    """gc.while_loop, or for torch the plain Python while loop (unrolled under autograd)."""
    if isinstance(M, TorchNS):
        while bool(cond_fn(*carried)):
            carried = body_fn(*carried)
        return carried
    return gc.while_loop(cond_fn, body_fn, carried)


def _grow(M, w, s, x):
    """Grows ``x`` by the closed-over ``w`` and ``s`` until its squared norm passes 60; times the steps."""
    h, k = _loop(M, lambda h, k: (h * h).sum() < 60.0,
                 lambda h, k: (h * s + (h @ w).tanh() * 0.3, k + 1.0), (x, x.sum() * 0))
    return h * k


def _grow_data(dtype, scale=1.0):
    r = rng(1)
    return [r.standard_normal((3, 3)).astype(dtype), np.asarray(1.3, dtype), (r.standard_normal((4, 3)) * scale).astype(dtype)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gradients_by_carried_inputs_and_closed_over_params_match_torch(dtype):
    pytest.importorskip("torch")
    params = _grow_data(dtype)
    assert_matches_torch(_grow, params, {}, rng(2))  # values on both backends, numpy's gradients
    names = {f"p{i}": p for i, p in enumerate(params)}
    c = rng(3).standard_normal((4, 3)).astype(dtype)
    ref, ort = gc_grads(_grow, names, {}, c), gc_grads(_grow, names, {}, c, backend="ort-cpu")
    for k in names:
        np.testing.assert_allclose(ort[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("scale", [1.0, 10.0], ids=["steps", "zero_steps"])
def test_gradients_match_float64_central_differences(scale):
    """d sum(out * c) / d (w, s, x) of ``_grow`` against central differences of the Python loop; with
    zero steps the output is ``x * 0``."""
    params = _grow_data("float64", scale)
    c = rng(3).standard_normal((4, 3))

    def loss(w, s, x):
        h, k = x, 0.0
        while (h * h).sum() < 60.0:
            h, k = h * s + np.tanh(h @ w) * 0.3, k + 1.0
        return float((h * k * c).sum()), k

    steps = loss(*params)[1]
    assert (steps == 0) == (scale == 10.0) and (scale == 10.0 or steps > 2)
    got = gc_grads(_grow, {f"p{i}": p for i, p in enumerate(params)}, {}, c)
    for n, p in enumerate(params):
        want = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            hi, lo = [q.copy() for q in params], [q.copy() for q in params]
            hi[n][idx] += 1e-6
            lo[n][idx] -= 1e-6
            assert loss(*hi)[1] == loss(*lo)[1] == steps  # away from a change in the step count
            want[idx] = (loss(*hi)[0] - loss(*lo)[0]) / 2e-6
        np.testing.assert_allclose(got[f"p{n}"], want, rtol=1e-6, atol=1e-7, err_msg=f"p{n}")


def test_gradient_through_a_while_loop_nested_in_a_while_loop_matches_torch():
    pytest.importorskip("torch")

    def fn(M, w, x):
        def outer(k, y):
            inner = _loop(M, lambda z: (z * z).sum() < 20.0 * (k + 1.0), lambda z: (z * 1.5 + (z @ w).sin() * 0.1,), (y,))
            return k + 1.0, inner[0] * 0.5
        return _loop(M, lambda k, y: k < 3.0, outer, (x.sum() * 0, x))[1]

    assert_matches_torch(fn, _grow_data("float64")[::2], {}, rng(4))


@pytest.mark.parametrize("inside", ["cond", "scan"])
def test_gradient_through_a_while_loop_in_a_cond_branch_or_a_scan_body_matches_torch(inside):
    def fn(M, w, x):
        def grow(y, limit):
            return _loop(M, lambda z: (z * z).sum() < limit, lambda z: (z * 1.5 + (z @ w).sin() * 0.1,), (y,))[0]

        if inside == "cond":
            if isinstance(M, TorchNS):
                return grow(x, 30.0) if bool(x.sum() > 0) else x * 2.0
            return gc.cond(x.sum() > 0, lambda: grow(x, 30.0), lambda: x * 2.0)
        def row(c, r):
            y = grow(r + c * 0.1, 20.0)
            return c + y, y

        if isinstance(M, TorchNS):
            c, rows = x[0] * 0 + 4.0, []
            for r in x:
                c, y = row(c, r)
                rows.append(y)
            return M.stack(rows)
        return gc.scan(row, x[0] * 0 + 4.0, x)[1]

    w, x = _grow_data("float64")[::2]
    assert_matches_torch(fn, [w, x if x.sum() > 0 else -x], {}, rng(7))


@pytest.mark.parametrize("loop", ["while_loop", "fori_loop_of_a_fed_count"])
def test_gc_func_grad_in_an_eager_capture_runs_the_backward_loop(loop):
    """gc.func.grad of a loop of run-time length, captured eagerly: its backward Loop (with the tape's scan
    outputs) is evaluated at capture too, and the gradient matches float64 central differences."""
    x0, n = rng(5).standard_normal((4, 3)), np.asarray(3)

    def step(y):
        return y * 1.3 + y.sin() * 0.1

    def f(x, n):
        def loss(x):
            if loop == "while_loop":
                y = gc.while_loop(lambda y: (y * y).sum() < 60.0, step, x)
            else:
                y = gc.fori_loop(0, n, lambda i, y: step(y), x)
            return (y * y).sum()
        g = gc.func.grad(loss)(x)
        seen["g"] = g.numpy()
        return g

    def loss(x):
        y, k = x, 0
        while (y * y).sum() < 60.0 if loop == "while_loop" else k < n:
            y, k = y * 1.3 + np.sin(y) * 0.1, k + 1
        return (y * y).sum()

    seen = {}
    model = gc.capture(f, x=x0, n=n)
    want = np.zeros_like(x0)
    for idx in np.ndindex(x0.shape):
        hi, lo = x0.copy(), x0.copy()
        hi[idx] += 1e-6
        lo[idx] -= 1e-6
        want[idx] = (loss(hi) - loss(lo)) / 2e-6
    np.testing.assert_allclose(seen["g"], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_both(model, {"x": x0, "n": n})["output"], want, rtol=1e-6, atol=1e-7)


def test_training_graphs_of_a_module_with_a_while_loop_match_torch():
    """gc.training.generate of a Linear applied in a while loop: the gradients graph on numpy and ort-cpu
    against torch.autograd of the Python while loop with the same weights and MSE loss."""
    torch = pytest.importorskip("torch")

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = gc.nn.Linear(3, 3)

        def forward(self, x):
            return gc.while_loop(lambda h: (h * h).sum() < 40.0, lambda h: h * 1.2 + gc.tanh(self.fc(h)) * 0.2, x)

    model = gc.capture(Net(), x=gc.spec("float32", ("N", 3)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    assert "Loop" in {n.op_type for n in arts.gradients.ir.graph}
    batch = {"x": X, "y": rng(6).standard_normal((4, 3)).astype(np.float32)}
    ref = gc.Session(arts.gradients, backend="numpy").run(batch)
    w, b = (torch.tensor(model.params[k], requires_grad=True) for k in ("fc.weight", "fc.bias"))
    h = torch.from_numpy(X)
    while bool((h * h).sum() < 40.0):
        h = h * 1.2 + torch.tanh(h @ w.T + b) * 0.2
    torch.nn.functional.mse_loss(h, torch.from_numpy(batch["y"])).backward()
    for backend in ("numpy", "ort-cpu"):
        got = ref if backend == "numpy" else gc.Session(arts.gradients, backend=backend).run(batch)
        np.testing.assert_allclose(got["fc.weight_grad"], w.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=backend)
        np.testing.assert_allclose(got["fc.bias_grad"], b.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=backend)


# -- gc.vmap -----------------------------------------------------------------------------------------


def _vmapped(per_example: bool):
    def one(x):
        if per_example:  # each example its own number of steps
            return gc.while_loop(lambda y: (y * y).sum() < 30.0, lambda y: y * 1.5 + 0.1, x)
        return gc.while_loop(lambda k, y: k < 3, lambda k, y: (k + 1, y * 1.5 + 0.1), (0, x))[1]
    return lambda x: gc.vmap(one)(x)


@pytest.mark.parametrize("per_example", [False, True], ids=["shared_condition", "per_example_condition"])
def test_under_vmap(per_example):
    """One Loop over the batch, no fallback Scan and no PerformanceWarning: a shared condition as it is,
    a per-example one run to the largest with each finished example's carries frozen (vmap's Loop rule)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", gc.PerformanceWarning)
        model = gc.capture(_vmapped(per_example), x=gc.spec("float32", ("N", 3)))
    assert not any(issubclass(w.category, gc.PerformanceWarning) for w in caught)
    check(model)
    ops = {n.op_type for n in model.ir.graph}
    assert "Scan" not in ops and "Loop" in ops
    for x in (X, X[:1] * 5):
        want = []
        for row in x:
            if per_example:
                while (row * row).sum() < 30:
                    row = row * np.float32(1.5) + np.float32(0.1)
            else:
                for _ in range(3):
                    row = row * np.float32(1.5) + np.float32(0.1)
            want.append(row)
        np.testing.assert_allclose(_both(model, {"x": x})["output"], np.stack(want), rtol=1e-6)


def test_per_example_gradients_vmap_of_grad_match_central_differences():
    """gc.vmap(gc.func.grad(loss)) of a loop whose steps differ per example (batched: the tape stacked to the longest), captured
    symbolically and eagerly, against float64 central differences of each example's Python loop."""
    def loss(x):
        y = gc.while_loop(lambda y: (y * y).sum() < 30.0, lambda y: y * 1.3 + y.sin() * 0.1, x)
        return (y * y).sum()

    def py(x):
        while (x * x).sum() < 30.0:
            x = x * 1.3 + np.sin(x) * 0.1
        return (x * x).sum()

    x0 = rng(8).standard_normal((5, 3))
    want = np.zeros_like(x0)
    for idx in np.ndindex(x0.shape):
        hi, lo = x0[idx[0]].copy(), x0[idx[0]].copy()
        hi[idx[1]] += 1e-6
        lo[idx[1]] -= 1e-6
        want[idx] = (py(hi) - py(lo)) / 2e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error", gc.PerformanceWarning)  # no Scan over the examples
        for spec in (gc.spec("float64", ("N", 3)), x0):
            model = gc.capture(lambda x: gc.vmap(gc.func.grad(loss))(x), x=spec)
            np.testing.assert_allclose(_both(model, {"x": x0})["output"], want, rtol=1e-6, atol=1e-7)


# -- export ------------------------------------------------------------------------------------------


def test_exported_for_servers_at_opset_17(tmp_path):
    model = gc.capture(lambda x: _halve(x)[1], x=gc.spec("float32", ("N", 3)))
    served = gc.deploy.for_server(model)
    assert served.opset == 17
    check(served)
    np.testing.assert_array_equal(run_ort(served, {"x": X})["output"], _py_halve(X)[1])
    import onnxruntime as ort

    (written,) = gc.deploy.triton(model, tmp_path, "halve").rglob("model.onnx")
    session = ort.InferenceSession(str(written), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": X})[0], _py_halve(X)[1])


# -- errors ------------------------------------------------------------------------------------------


ERRORS = [
    ("float_condition", lambda x: gc.while_loop(lambda y: y.sum(), lambda y: y, (x,)), "must return a bool scalar"),
    ("vector_condition", lambda x: gc.while_loop(lambda y: y > 0, lambda y: y, (x,)), "bool[N,3]"),
    ("python_bool", lambda x: gc.while_loop(lambda y: True, lambda y: y, (x,)), "returned a Python bool"),
    ("dtype_change", lambda x: gc.while_loop(lambda y: y.sum() > 0, lambda y: y.astype("float64"), (x,)),
     "changes carried_inputs[0] from float32[N,3] to float64[N,3]"),
    ("shape_change", lambda x: gc.while_loop(lambda y: y.sum() > 0, lambda y: y[:, :2], (x,)),
     "changes carried_inputs[0] from float32[N,3] to float32[N,2]"),
    ("count", lambda x: gc.while_loop(lambda y, z: y.sum() > 0, lambda y, z: (y,), (x, x)),
     "body_fn returns 1 carried values, carried_inputs has 2"),
    ("not_a_tensor", lambda x: gc.while_loop(lambda y, s: y.sum() > 0, lambda y, s: (y, s), (x, "a")),
     "carried_inputs[1] is a str"),
    ("body_not_a_tensor", lambda x: gc.while_loop(lambda y: y.sum() > 0, lambda y: None, x),
     "body_fn's result is a NoneType"),
    ("no_carries", lambda x: gc.while_loop(lambda: x.sum() > 0, lambda: (), ()), "carried_inputs holds no Tensors"),
]


@pytest.mark.parametrize("fn,match", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_bad_loops_are_refused_naming_the_problem_and_the_users_line(fn, match):
    with pytest.raises(CaptureError, match="gc.while_loop") as info:
        gc.capture(fn, x=gc.spec("float32", ("N", 3)))
    assert match in str(info.value) and "test_dsl_while_loop.py" in str(info.value)
