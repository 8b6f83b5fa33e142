"""float16 on ort-cpu rounds as the model says (``backends/narrow_casts.py``): onnxruntime's CPU
provider has no float16 MatMul, Gemm, Conv, Add or Relu kernel, casts such a node's inputs to
float32 itself and then drops its Cast back to float16 with the model's own Cast to float16, so
values stayed float32 (a Linear of an input of 1e5 under float16 autocast was finite). Against torch 2.13's
``torch.autocast("cpu", dtype=torch.float16)`` and the numpy backend, at every optimization level:
forward values, an ONNX chain of float16 nodes, an opset-11 Max (no float16 kernel before 12) and
a few training steps under ``generate(autocast="float16")``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc
import graphc.nn.functional as F
from graphc.backends import narrow_casts

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
LEVELS = ("disable", "basic", "all")
# op -> (fn(functional, *inputs), input shapes); the first input's first entry is 1e5, inf in float16
CASES = {
    "linear": (lambda f, x, w, b: f.linear(x, w, b), [(4, 5), (3, 5), (3,)]),
    "linear3d": (lambda f, x, w, b: f.linear(x, w, b), [(2, 4, 5), (3, 5), (3,)]),
    "matmul": (lambda f, a, b: a @ b, [(4, 6), (6, 3)]),
    "conv2d": (lambda f, x, w, b: f.conv2d(x, w, b, padding=1), [(2, 3, 5, 5), (4, 3, 3, 3), (4,)]),
}


def _inputs(op: str) -> list[np.ndarray]:
    arrays = [RNG.standard_normal(shape).astype(np.float32) for shape in CASES[op][1]]
    arrays[0].flat[0] = 1e5
    return arrays


def _assert_float16_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """The same infinities; finite values within one float16 ulp of the largest."""
    assert got.dtype == want.dtype == np.float16, what
    np.testing.assert_array_equal(got[~np.isfinite(want)], want[~np.isfinite(want)], err_msg=what)
    finite = np.isfinite(want)
    assert np.isfinite(got[finite]).all(), what
    ulp = np.spacing(np.abs(want[finite]).max())
    np.testing.assert_allclose(got[finite].astype(np.float32), want[finite].astype(np.float32), rtol=0,
                               atol=float(ulp), err_msg=what)


@pytest.mark.parametrize("op", sorted(CASES))
def test_float16_autocast_rounds_as_torch(op):
    """Overflow to inf where torch's does (ort-cpu gave -1.3e4 for a Linear's -inf), the rest within one
    float16 ulp at the output's scale (measured: 0 for the products and on ort-cpu conv2d; 1 for
    the Linears' bias added once, and numpy's conv2d)."""
    arrays = _inputs(op)
    fn, shapes = CASES[op]
    with torch.autocast("cpu", dtype=torch.float16):
        want = fn(torch.nn.functional, *map(torch.from_numpy, arrays)).detach().numpy()
    assert np.isinf(want).any() and np.isfinite(want).any()

    def captured(**kw):
        with gc.autocast("cpu", dtype="float16"):
            return fn(F, *(kw[f"x{i}"] for i in range(len(arrays))))

    model = gc.capture(captured, **{f"x{i}": gc.spec("float32", s) for i, s in enumerate(shapes)})
    feeds = {f"x{i}": a for i, a in enumerate(arrays)}
    _assert_float16_close(gc.Session(model, backend="numpy").run(feeds)["output"], want, f"{op} numpy")
    for level in LEVELS:
        got = gc.Session(model, backend="ort-cpu", graph_optimization_level=level).run(feeds)["output"]
        _assert_float16_close(got, want, f"{op} ort-cpu {level}")


def _chain_model(opset: int = 19):
    """x (float32) cast to float16, times a float16 weight, plus itself, Relu, cast back."""
    w = numpy_helper.from_array(np.full((3, 2), 0.3, np.float16), "w")
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("MatMul", ["h", "w"], ["p"]), helper.make_node("Add", ["p", "p"], ["s"]),
             helper.make_node("Relu", ["s"], ["r"]), helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [w])
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def test_a_chain_of_float16_nodes_rounds_at_each_node():
    """Cast, MatMul, Add, Relu, Cast: each float16 node's result rounded, as numpy's float16 (ort-cpu
    gave 3.0e4 where the input's 1e5 is inf in float16, and 0.6 for 0.5999)."""
    x = np.array([[1e5, 0.1234567, 1.0], [0.5, -0.25, 1.3]], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16)
        p = (h.astype(np.float32) @ np.full((3, 2), 0.3, np.float16).astype(np.float32)).astype(np.float16)
        want = np.maximum(p + p, np.float16(0)).astype(np.float32)
    assert np.isinf(want[0]).all()
    model = _chain_model()
    np.testing.assert_array_equal(gc.Session(model, backend="numpy").run({"x": x})["y"], want)
    for level in (*LEVELS, "extended"):
        got = gc.Session(model, backend="ort-cpu", graph_optimization_level=level).run({"x": x})["y"]
        np.testing.assert_array_equal(got, want, err_msg=level)


def test_kernels_follow_the_opset():
    """onnxruntime has a float16 Max from opset 12: at 11 it runs in float32 between Casts (it gave
    the float32 input back, 1e5 for float16's inf, 0.1234567 for 0.12347), at 12 the model is left as
    it is."""
    def model(opset):
        nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                 helper.make_node("Max", ["h", "h"], ["m"]),
                 helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)]
        graph = helper.make_graph(nodes, "max", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))

    x = np.array([1e5, 0.1234567], np.float32)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).astype(np.float32)
    for opset in (11, 12):
        for backend in ("numpy", "ort-cpu"):
            np.testing.assert_array_equal(gc.Session(model(opset), backend=backend).run({"x": x})["y"], want,
                                          err_msg=f"opset {opset} {backend}")
    at11, at12 = model(11).proto, model(12).proto
    assert narrow_casts.lower(at12) is at12
    assert narrow_casts.lower(at11) is not at11


class _MLP(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.head = gc.nn.Linear(5, 16), gc.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(gc.relu(self.fc(x)))


def test_float16_autocast_training_steps_are_torchs():
    """Three SGD steps of an MLP under ``generate(autocast="float16", loss_scale=256)``: losses and
    params as torch's autocast loop within 2e-6 (measured: numpy equal, ort-cpu 6e-8; before, ort-cpu
    1.2e-3 off, and numpy 2.1e-3 while its float16 Gemm added the bias after rounding the product)."""
    net = _MLP()
    model = gc.capture(net, seed=0, x=gc.spec("float32", ("N", 5)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(lr=0.5),
                                loss_scale=256.0, autocast="float16")
    batches = [{"x": (RNG.standard_normal((8, 5)) * 2).astype(np.float32), "y": RNG.integers(0, 3, 8)}
               for _ in range(3)]
    twin = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    state = net.state_dict()
    twin.load_state_dict({f"{i}.{k}": torch.from_numpy(np.array(state[f"{n}.{k}"]))
                          for i, n in ((0, "fc"), (2, "head")) for k in ("weight", "bias")})
    opt = torch.optim.SGD(twin.parameters(), lr=0.5)
    want = []
    for batch in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = twin(torch.from_numpy(batch["x"]))
        loss = torch.nn.functional.cross_entropy(out.float(), torch.from_numpy(batch["y"]))
        (loss * 256.0).backward()
        for p in twin.parameters():
            p.grad /= 256.0
        opt.step()
        want.append(loss.item())
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(arts, backend=backend)
        losses = [float(trainer.step(b)) for b in batches]
        np.testing.assert_allclose(losses, want, rtol=2e-6, atol=2e-7, err_msg=backend)
        params = trainer.state_dict()
        for i, n in ((0, "fc"), (2, "head")):
            for k in ("weight", "bias"):
                np.testing.assert_allclose(params[f"{n}.{k}"], getattr(twin[i], k).detach().numpy(), rtol=2e-6,
                                           atol=2e-7, err_msg=f"{backend} {n}.{k}")
