"""float64 Tan, Sinh, Cosh, Asin, Acos, Atan, Asinh, Acosh, Atanh, Erf and Det run on ort-cpu (onnxruntime has
no double kernels for them: ``backends/doubles.py`` writes them out for the session) and agree with numpy's
(``math.erf``'s) values within a few ulps over wide grids, edges included (0, -0, tiny, huge, +-1, inf, nan);
gradients through them, in a training graph, run on ort-cpu too."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

import graphc as gc

RNG = np.random.default_rng(0)
with np.errstate(over="ignore"):
    GRID = np.concatenate([
        np.linspace(-30, 30, 6001), 10.0 ** np.arange(-320, 309, 0.25), -(10.0 ** np.arange(-320, 309, 0.25)),
        [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1 - 2**-53, -1 + 2**-53, 1 + 2**-52, 5e-324, 2.0**30],
        np.pi / 4 * np.arange(-40, 41), RNG.uniform(-1, 1, 4000), RNG.uniform(1, 3, 4000)])
WANT = {"Tan": np.tan, "Sinh": np.sinh, "Cosh": np.cosh, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan,
        "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh, "Erf": np.vectorize(math.erf)}


def _model(nodes, inputs, outputs, inits=(), opset=21) -> gc.Model:
    graph = helper.make_graph(nodes, "doubles", inputs, outputs, initializer=list(inits))
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _double(name, shape):
    return helper.make_tensor_value_info(name, onnx.TensorProto.DOUBLE, shape)


def _max_relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """The largest |got - want| / |want| over finite nonzero ``want``; elsewhere the two must be the same value."""
    finite = np.isfinite(want) & (want != 0)
    np.testing.assert_array_equal(got[~finite], want[~finite])
    return float(np.max(np.abs(got[finite] - want[finite]) / np.abs(want[finite])))


@pytest.mark.parametrize("op", list(WANT))
@pytest.mark.parametrize("opset", [21, 17])
def test_float64_elementwise_op_runs_on_ort_within_a_few_ulps(op, opset):
    model = _model([helper.make_node(op, ["x"], ["y"])], [_double("x", [GRID.size])], [_double("y", [GRID.size])],
                   opset=opset)
    with np.errstate(all="ignore"):
        want = WANT[op](GRID)
    # the numpy backend's float64 Erf (a Taylor series to 2.5) measures 2.8e-15
    for backend, bound in (("ort-cpu", 1e-15), ("numpy", 5e-15)):
        got = gc.Session(model, backend=backend).run({"x": GRID})["y"]
        assert got.dtype == np.float64
        error = _max_relative_error(got, want)
        print(f"{op} opset {opset} {backend}: max relative error {error:.3g}")
        assert error < bound, f"{op} on {backend}: max relative error {error:.3g}"


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (4, 5, 5), (2, 3, 6, 6), (0, 0), (3, 0, 0)])
def test_float64_det_runs_on_ort(shape):
    a = RNG.standard_normal(shape)
    model = _model([helper.make_node("Det", ["a"], ["d"])], [_double("a", shape)], [_double("d", shape[:-2])])
    want = np.linalg.det(a)
    for backend in ("ort-cpu", "numpy"):
        got = gc.Session(model, backend=backend).run({"a": a})["d"]
        assert got.shape == want.shape and got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=0, err_msg=backend)


def test_float64_det_pivots_singular_and_special_matrices_on_ort():
    perm = np.eye(4)[[2, 0, 3, 1]]  # a zero first pivot: wrong without the row swaps
    singular = np.array([[1.0, 2, 3], [2, 4, 6], [0, 1, 5]])
    cases = [perm, np.diag([1e-300, 1e300, 3.0, -2.0]), np.zeros((4, 4)),
             np.pad(singular, ((0, 1), (0, 1))) + np.diag([0, 0, 0, 1.0]),
             np.array([[np.nan, 1, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1.0]])]
    a = np.stack(cases)
    model = _model([helper.make_node("Det", ["a"], ["d"])], [_double("a", a.shape)], [_double("d", [len(cases)])])
    got = gc.Session(model, backend="ort-cpu").run({"a": a})["d"]
    with np.errstate(invalid="ignore"):
        want = np.linalg.det(a)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    assert got[0] == np.linalg.det(perm) == -1.0


def test_float64_det_of_symbolic_size_is_refused_naming_the_node():
    model = _model([helper.make_node("Det", ["a"], ["d"], name="the_det")], [_double("a", ["b", "n", "n"])],
                   [_double("d", ["b"])])
    with pytest.raises(gc.BackendError, match=r"no double kernel for Det.*'the_det'.*static size"):
        gc.Session(model, backend="ort-cpu")


def test_float32_ops_keep_onnxruntime_kernels():
    from graphc.backends import doubles

    nodes = [helper.make_node(op, ["x"], [op]) for op in WANT]
    outputs = [helper.make_tensor_value_info(op, onnx.TensorProto.FLOAT, [3]) for op in WANT]
    model = _model(nodes, [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])], outputs)
    proto = model.proto
    assert doubles.lower_double(proto) is proto


def _training_model() -> tuple[gc.Model, dict[str, np.ndarray], np.ndarray]:
    """loss = sum over the ops of sum(c_op * op(x * w)) (Acosh at x * w + 1.5) + 0.3 det(m * w_m)."""
    ops = list(WANT)
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "three_halves"], ["xw1"])]
    terms = []
    for op in ops:
        nodes += [helper.make_node(op, ["xw1" if op == "Acosh" else "xw"], [f"{op}_y"]),
                  helper.make_node("Mul", [f"{op}_y", "c"], [f"{op}_p"])]
        terms.append(f"{op}_p")
    nodes += [helper.make_node("Sum", terms, ["s"]), helper.make_node("ReduceSum", ["s"], ["elementwise"], keepdims=0),
              helper.make_node("Mul", ["m", "wm"], ["mw"]), helper.make_node("Det", ["mw"], ["det"]),
              helper.make_node("Mul", ["det", "three_tenths"], ["det_term"]),
              helper.make_node("Add", ["elementwise", "det_term"], ["loss"])]
    params = {"w": RNG.uniform(0.6, 1.2, 7), "wm": RNG.uniform(0.5, 1.5, (4, 4))}
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in params.items()]
    inits += [onnx.numpy_helper.from_array(RNG.standard_normal(7), "c"),
              onnx.numpy_helper.from_array(np.array(1.5), "three_halves"),
              onnx.numpy_helper.from_array(np.array(0.3), "three_tenths")]
    model = _model(nodes, [_double("x", [7]), _double("m", [4, 4])], [_double("loss", [])], inits)
    feeds = {"x": RNG.uniform(-0.8, 0.8, 7), "m": RNG.standard_normal((4, 4))}
    return model, feeds, params


def test_float64_gradients_through_written_out_ops_run_on_ort():
    model, feeds, params = _training_model()
    grads = gc.grad(model, "loss")
    for backend in ("numpy", "ort-cpu"):
        session = gc.Session(grads, backend=backend)
        got = session.run({**feeds, **params})
        for name, value in params.items():
            step = 1e-6 * RNG.standard_normal(value.shape)
            plus, minus = (session.run({**feeds, **params, name: value + s})["loss"] for s in (step, -step))
            np.testing.assert_allclose(np.sum(got[f"{name}_grad"] * step), (plus - minus) / 2, rtol=1e-7,
                                       err_msg=f"{backend} {name}")


def test_float64_ops_in_a_loop_body_and_an_if_branch_run_on_ort():
    """The rewrite reaches subgraphs: a fori_loop body and a cond branch of float64 Tan, Atan, Erf and Det."""
    x = np.array([0.1, -1.0, 2.5, 7.0])
    m = np.array([[2.0, 1.0], [0.5, 3.0]])

    def f(x, m):
        def body(i, acc):
            return acc + gc.tan(x * 0.1) + gc.atan(x) + gc.erf(x)
        looped = gc.fori_loop(0, 3, body, gc.zeros_like(x))
        return gc.cond(x.sum() > 0, lambda: looped * gc.det(m), lambda: looped)

    model = gc.capture(f, x=gc.spec("float64", (4,)), m=gc.spec("float64", (2, 2)))
    assert {n.op_type for n in model.proto.graph.node} >= {"Loop", "If"}
    want = 3 * (np.tan(x * 0.1) + np.arctan(x) + np.array([math.erf(v) for v in x])) * np.linalg.det(m)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x, "m": m})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-14, err_msg=backend)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_float64_gelu_runs_on_ort_within_a_few_ulps(approximate):
    """A float64 Gelu (torch's opset-20 exports, ``gc.optimize``'s fusion of x/2 (1 + erf(x/sqrt 2))) failed to
    load on ort-cpu ("no implementation for Erf(13)", the op's function body); it runs written out, to 2.4e-13 (a few ulps above
    -20) of the definition computed without cancellation (``math.erfc``; torch's float64 kernel, 1 + erf, loses every
    digit below x = -5.5), and torch's to its rounding."""
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-40, 40, 8001), RNG.standard_normal(2000), [0.0, -0.0, np.inf, -np.inf, np.nan]])
    model = _model([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], [_double("x", [x.size])],
                   [_double("y", [x.size])], opset=20)
    if approximate == "tanh":
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
        with np.errstate(over="ignore", invalid="ignore"):
            want = x / (1 + np.exp(-2 * u))  # NaN at -inf (-inf / inf), as torch's
    else:
        want = np.array([v / 2 * math.erfc(-v / math.sqrt(2)) if np.isfinite(v) else np.nan for v in x])
        want[np.isposinf(x)] = np.inf  # and NaN at -inf (-inf * 0), as torch's
    got = gc.Session(model, backend="ort-cpu").run({"x": x})["y"]
    assert got.dtype == np.float64
    # 2.4e-13 measured, in the tail (gelu < 1e-270): exp(-v) for v ~ 650 carries v's rounding, 650 * 2^-53 relative
    np.testing.assert_allclose(got, want, rtol=5e-13, atol=1e-300)
    torch_gelu = torch.nn.functional.gelu(torch.from_numpy(x), approximate=approximate).numpy()
    # torch's 1 + erf(z) (1 + tanh(u)) is off by up to an ulp of 1: x/2 * 2^-53 absolute for negative x
    np.testing.assert_allclose(got, torch_gelu, rtol=2e-15, atol=np.abs(x[np.isfinite(x)]).max() * 2.0**-54)


@pytest.mark.parametrize("ratio_dtype", [np.float32, np.float64])
def test_float64_training_dropout_on_ort_divides_in_double_by_its_own_mask(ratio_dtype):
    """onnxruntime's double Dropout scales by a float32 1 / (1 - ratio) (1.7e-8 relative off at ratio 0.3 before);
    its mask still decides, and the kept values are x / (1 - ratio) in double, as the numpy backend's: a constant
    training mode and one fed at run time (False: x itself, the mask all True)."""
    x = RNG.standard_normal((40, 50)) + 5
    ratio = onnx.numpy_helper.from_array(np.asarray(0.3, ratio_dtype), "ratio")
    mask = helper.make_tensor_value_info("mask", onnx.TensorProto.BOOL, (40, 50))
    fed = _model([helper.make_node("Dropout", ["x", "ratio", "t"], ["y", "mask"])],
                 [_double("x", (40, 50)), helper.make_tensor_value_info("t", onnx.TensorProto.BOOL, ())],
                 [_double("y", (40, 50)), mask], [ratio])
    fixed = _model([helper.make_node("Dropout", ["x", "ratio", "t"], ["y"])], [_double("x", (40, 50))],
                   [_double("y", (40, 50))], [ratio, onnx.numpy_helper.from_array(np.asarray(True), "t")])
    held = 1 - float(ratio_dtype(0.3))
    for backend in ("ort-cpu", "numpy"):
        y, kept = gc.Session(fed, backend=backend).run({"x": x, "t": np.asarray(True)}).values()
        assert 0.6 < kept.mean() < 0.8, backend
        np.testing.assert_array_equal(y, np.where(kept, x / held, 0), err_msg=backend)
        y, kept = gc.Session(fed, backend=backend).run({"x": x, "t": np.asarray(False)}).values()
        assert kept.all() and (y == x).all(), backend
        y = gc.Session(fixed, backend=backend).run({"x": x})["y"]
        assert 0.6 < (y != 0).mean() < 0.8, backend
        np.testing.assert_allclose(y[y != 0], (x / held)[y != 0], rtol=1e-15, err_msg=backend)
