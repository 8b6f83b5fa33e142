"""gc.cond / gc.fori_loop / gc.scan: captured as If / Loop / Scan, checked, run on onnxruntime
and compared with the same computation in plain Python, in symbolic and eager capture."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
try:
    from dsl_util import check, rng, run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import check, rng, run_ort

X = rng(0).standard_normal((4, 3)).astype(np.float32)


def _cond_fn(x):
    return gc.cond(x.sum() > 0, lambda a: a * 2, lambda a: a - 1, x)


def _loop_fn(x):
    return gc.fori_loop(0, 5, lambda i, c: c * 0.5 + i.astype("float32"), x)


def _scan_fn(x):
    carry, ys = gc.scan(lambda c, row: (c + row, gc.relu(c * row)), gc.sum(x, axis=0) * 0, x)
    return {"carry": carry, "ys": ys}


def _py_cond(x):
    return x * 2 if x.sum() > 0 else x - 1


def _py_loop(x):
    for i in range(5):
        x = x * 0.5 + i
    return x


def _py_scan(x):
    c, ys = np.zeros(x.shape[1], np.float32), []
    for row in x:
        ys.append(np.maximum(c * row, 0))
        c = c + row
    return {"carry": c, "ys": np.stack(ys)}


CASES = [("cond", _cond_fn, _py_cond, "If"), ("loop", _loop_fn, _py_loop, "Loop"),
         ("scan", _scan_fn, _py_scan, "Scan")]


def _as_dict(v):
    return v if isinstance(v, dict) else {"output": v}


@pytest.mark.parametrize("name,fn,py,op", CASES, ids=[c[0] for c in CASES])
def test_control_flow_symbolic(name, fn, py, op):
    model = gc.capture(fn, x=gc.spec("float32", ("N", 3)))
    check(model)
    assert op in {n.op_type for n in model.ir.graph}
    for x in (X, -X, X[:1], np.abs(X[:2])):
        out = run_ort(model, {"x": x})
        for k, v in _as_dict(py(x)).items():
            np.testing.assert_allclose(out[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,fn,py,op", CASES, ids=[c[0] for c in CASES])
def test_control_flow_eager_values(name, fn, py, op):
    for x in (X, -X):
        seen = {}

        def probe(x):
            res = fn(x)
            seen.update({k: v.numpy() for k, v in _as_dict(res).items()})
            return res

        model = gc.capture(probe, x=x)
        check(model)
        expected = _as_dict(py(x))
        for k, v in expected.items():
            np.testing.assert_allclose(seen[k], v, rtol=1e-5, atol=1e-6)
        ort_out = run_ort(model, {"x": x})
        for k in expected:
            np.testing.assert_allclose(ort_out[k], seen[k], rtol=1e-5, atol=1e-6)


def test_fori_loop_with_tensor_bounds_and_tuple_carry():
    def f(x, n):
        return gc.fori_loop(1, n, lambda i, c: (c[0] + x, c[1] * 2.0), (x, x))

    model = gc.capture(f, x=gc.spec("float32", ("N", 3)), n=gc.spec("int64", ()))
    check(model)
    for n in (1, 2, 5):
        out = run_ort(model, {"x": X, "n": np.asarray(n, np.int64)})
        np.testing.assert_allclose(out["output_0"], X * max(n, 1), rtol=1e-6)
        np.testing.assert_allclose(out["output_1"], X * 2.0 ** max(n - 1, 0), rtol=1e-6)


def test_body_uses_outer_values_and_params():
    layer = gc.nn.Linear(3, 3)

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = layer

        def forward(self, x):
            bias = x.mean(axis=0)
            return gc.fori_loop(0, 3, lambda i, h: gc.tanh(self.fc(h) + bias), x)

    model = gc.capture(Net(), x=gc.spec("float32", ("N", 3)))
    check(model)
    p = model.params
    h = X
    for _ in range(3):
        h = np.tanh(h @ p["fc.weight"].T + p["fc.bias"] + X.mean(0))
    np.testing.assert_allclose(run_ort(model, {"x": X})["output"], h, rtol=1e-5, atol=1e-6)
    # the parameter is an initializer of the main graph, captured by name in the body
    assert set(model.ir.graph.initializers) == {"fc.weight", "fc.bias"}


def test_nested_control_flow():
    def f(x):
        def body(i, c):
            return gc.cond(i > 1, lambda: c + 1.0, lambda: c * 3.0)

        return gc.fori_loop(0, 4, body, x)

    model = gc.capture(f, x=X)
    check(model)
    expected = X.copy()
    for i in range(4):
        expected = expected + 1 if i > 1 else expected * 3
    np.testing.assert_allclose(run_ort(model, {"x": X})["output"], expected, rtol=1e-6)


def test_static_predicate_picks_a_branch():
    model = gc.capture(lambda x: gc.cond(True, lambda a: a + 1, lambda a: a - 1, x), x=gc.spec("float32", (3,)))
    assert "If" not in {n.op_type for n in model.ir.graph}


def test_scan_with_tuple_xs_and_outputs():
    def f(a, b):
        def step(c, xs):
            x, y = xs
            return c + x * y, (c, x - y)
        carry, (ys0, ys1) = gc.scan(step, gc.sum(a, axis=0) * 0, (a, b))
        return carry, ys0, ys1

    b = rng(1).standard_normal((4, 3)).astype(np.float32)
    model = gc.capture(f, a=gc.spec("float32", ("T", 3)), b=gc.spec("float32", ("T", 3)))
    check(model)
    out = run_ort(model, {"a": X, "b": b})
    c, cs = np.zeros(3, np.float32), []
    for x, y in zip(X, b):
        cs.append(c)
        c = c + x * y
    np.testing.assert_allclose(out["output_0"], c, rtol=1e-5)
    np.testing.assert_allclose(out["output_1"], np.stack(cs), rtol=1e-5)
    np.testing.assert_allclose(out["output_2"], X - b, rtol=1e-6)
    assert model.outputs[1].shape == ("T", 3)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_scan_over_no_rows_gives_the_initial_carry_and_empty_ys(backend):
    """ONNX's Scan of length 0: the final state is the initial one, each scan output has length
    0 (onnxruntime itself fails such a Scan; graphc's sessions guard it)."""
    def f(h, x):
        return gc.scan(lambda c, row: (c + row, gc.relu(c * row)), h, x)

    h, x = rng(2).standard_normal(3).astype(np.float32), np.zeros((0, 3), np.float32)
    model = gc.capture(f, h=gc.spec("float32", (3,)), x=gc.spec("float32", ("T", 3)))
    check(model)
    out = gc.Session(model, backend=backend).run({"h": h, "x": x})
    np.testing.assert_array_equal(out["output_0"], h)
    assert out["output_1"].shape == (0, 3) and out["output_1"].dtype == np.float32
    np.testing.assert_allclose(gc.Session(model, backend=backend).run({"h": h, "x": X})["output_0"], h + X.sum(0),
                               rtol=1e-6)  # with rows, as before
    eager = gc.capture(f, h=h, x=x)
    assert [s.shape for s in eager.outputs] == [(3,), (0, 3)]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("inside", ["if", "loop"])
def test_scan_over_no_rows_inside_a_subgraph(backend, inside):
    """A Scan in an If branch or a Loop body over a run-time length of 0 gives its initial carry
    (graphc's onnxruntime sessions guard Scans in subgraphs too, and the guarded copy is valid)."""
    from graphc.backends import scans

    def scan_sum(h, x):
        return gc.scan(lambda c, row: (c + row, gc.relu(c * row)), h, x)[0]

    def f(p, h, x):
        if inside == "if":
            return gc.cond(p, scan_sum, lambda h, x: h * 2.0, h, x)
        return gc.fori_loop(0, 2, lambda i, c: gc.where(p, scan_sum(c, x), c * 2.0), h)

    model = gc.capture(f, p=gc.spec("bool", ()), h=gc.spec("float32", (3,)), x=gc.spec("float32", ("T", 3)))
    check(model)
    onnx.checker.check_model(scans.guard_empty(model.proto), full_check=True)
    session, h = gc.Session(model, backend=backend), rng(3).standard_normal(3).astype(np.float32)
    steps = 2 if inside == "loop" else 1
    for x in (np.zeros((0, 3), np.float32), X):
        np.testing.assert_allclose(session.run({"p": np.array(True), "h": h, "x": x})["output"], h + steps * x.sum(0),
                                   rtol=1e-6)
    np.testing.assert_allclose(session.run({"p": np.array(False), "h": h, "x": X})["output"], h * 2.0 ** steps)


@pytest.mark.parametrize("inside", ["if", "loop"])
def test_eager_capture_of_a_scan_over_no_rows_in_a_subgraph_gives_its_empty_outputs(inside):
    """Evaluating a captured body at capture (example arrays), a Scan of no steps in it gave no
    scan outputs ("no eager value for 'scan_1'"); it gives them empty, of the body's dims."""
    def f(p, h, x):
        def body(c):
            carry, ys = gc.scan(lambda a, row: (a + row, a * row), c, x)
            return carry + ys.sum(axis=0) + 1.0
        if inside == "if":
            return gc.cond(p, body, lambda c: c * 2.0, h)
        return gc.fori_loop(0, 2, lambda i, c: body(c), h)

    feeds = {"p": np.array(True), "h": rng(4).standard_normal(3).astype(np.float32), "x": np.zeros((0, 3), np.float32)}
    model = gc.capture(f, **feeds)
    want = feeds["h"] + (1.0 if inside == "if" else 2.0)
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run(feeds)["output"], want, rtol=1e-6)
