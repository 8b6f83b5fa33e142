"""A Conv's weight gradient at spatial sizes known only at run time (x [N, C, "H", "W"]), lowered
as gathered columns times dy (``symbolic_spatial._gathered_weight_grad``) in runs of channels up
to a budget of column values and past it (an If) in smaller runs over runs of the batch: one
gradient graph and one session per backend fed several sizes (on both sides of the budget),
against the static-shape form's gradient at each size, torch.autograd in float64, and float64
central differences; past the budget no Gather's columns (onnxruntime's profile) exceed it."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper

import graphc
from graphc.backends.numpy import NumpyBackend
from graphc.passes.autodiff import gradient_model
from graphc.passes.autodiff import symbolic_spatial as spatial

torch = pytest.importorskip("torch")
F = torch.nn.functional
ort = pytest.importorskip("onnxruntime")
try:
    from test_autodiff_symbolic_spatial import check_grads, grad_proto, same_pads, torch_pad
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_symbolic_spatial import check_grads, grad_proto, same_pads, torch_pad

RNG = np.random.default_rng(0)

CASES = {  # name: (x channels, out channels, kernel, ONNX attrs, sizes, runs of gathered columns
    # within the budget, past it (each run of the batch))
    # 72 input channels of 9 taps: runs of 64 and 8 channels' columns, or 9 runs of 8
    "runs_stride2_dilated_asym": (72, 5, [3, 3], {"strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 0, 2]},
                                  [(9, 11), (12, 8), (15, 14)], (2, 9)),
    "same_upper_strided": (9, 4, [3, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, [(8, 9), (7, 6), (11, 10)],
                           (1, 2)),
    "same_lower_strided": (3, 4, [3, 2], {"auto_pad": "SAME_LOWER", "strides": [3, 1]}, [(8, 9), (10, 5)], (1, 1)),
    # 20 groups of 4 channels: runs of 16 groups and 4, or 10 runs of 2
    "grouped_runs": (80, 20, [3, 3], {"group": 20, "strides": [1, 2], "pads": [1, 1, 1, 1]}, [(8, 7), (5, 10)],
                     (2, 10)),
    "1d_stride3": (4, 3, [5], {"strides": [3], "pads": [2, 1]}, [(13,), (20,), (7,)], (1, 1)),
    "3d_8_taps": (2, 3, [2, 2, 2], {"strides": [1, 2, 1], "pads": [1, 0, 0, 0, 1, 1]}, [(4, 5, 6), (5, 6, 3)],
                  (1, 1)),
    "depthwise": (4, 4, [3, 3], {"group": 4, "pads": [1, 1, 1, 1]}, [(6, 6), (9, 5)], (0, 0)),
    "5x5": (2, 3, [5, 5], {"pads": [2, 2, 2, 2]}, [(6, 7), (9, 5)], (0, 0)),  # past 9 taps: the Conv
}


def _nodes(graph: onnx.GraphProto):
    """Every node of ``graph``, its subgraphs' (If branches) too."""
    for node in graph.node:
        yield node
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(a.g)


def _count(proto: onnx.ModelProto, op_type: str) -> int:
    return sum(node.op_type == op_type for node in _nodes(proto.graph))


def _gathers(proto: onnx.ModelProto) -> tuple[int, int]:
    """The gathered dW's runs (one Gather each; the forward and dx have none) within the budget
    (the If's then branch) and past it (a run of the batch: the Loop's body), (0, 0) where dW is
    not gathered (no If)."""
    ifs = [node for node in proto.graph.node if node.op_type == "If"]
    if not ifs:
        assert _count(proto, "Gather") == 0
        return 0, 0
    (node,) = ifs
    (loop,) = [n for n in _nodes(proto.graph) if n.op_type == "Loop"]
    return tuple(sum(n.op_type == "Gather" for n in _nodes(graph)) for graph in (
        onnx.helper.get_node_attr_value(node, "then_branch"), onnx.helper.get_node_attr_value(loop, "body")))


def _grads(proto: onnx.ModelProto, x: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Every output of ``proto`` on x, from the numpy backend and an onnxruntime session."""
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return {"numpy": NumpyBackend().prepare(proto).run({"x": x}),
            "ort": dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))}


def _forward(attrs: dict, kernel: list[int]):
    """torch's Conv of these ONNX attrs, as ``check_grads`` calls it (SAME pads from the size)."""
    n_sp, group = len(kernel), attrs.get("group", 1)
    conv = getattr(F, f"conv{n_sp}d")
    strides, dilations = attrs.get("strides", [1] * n_sp), attrs.get("dilations", [1] * n_sp)

    def forward(x, w, size):
        pads = attrs.get("pads", [0] * 2 * n_sp)
        if "auto_pad" in attrs:
            pads = same_pads(size, kernel, strides, dilations, attrs["auto_pad"] == "SAME_UPPER")
        return conv(torch_pad(x, pads), w, stride=strides, dilation=dilations, groups=group)

    return forward


def _rows(name: str, run_rows: int) -> int:
    """The rows of a run of the gathered dW's columns, runs of ``run_rows`` rows asked."""
    ci, _, kernel, attrs, _, _ = CASES[name]
    group = attrs.get("group", 1)
    return min(ci, spatial._run_channels(kernel, group, ci // group, run_rows)) * int(np.prod(kernel))


def _pixels(name: str, size) -> int:
    """The output pixels of one image of this size."""
    ci, co, kernel, attrs, _, _ = CASES[name]
    x, w = torch.zeros((1, ci, *size)), torch.zeros((co, ci // attrs.get("group", 1), *kernel))
    return int(np.prod(_forward(attrs, kernel)(x, w, size).shape[2:]))


def _columns(name: str, size) -> int:
    """The values of a run of the gathered dW's columns at this size (batch 2)."""
    return _rows(name, spatial._RUN_COLUMNS) * 2 * _pixels(name, size)


@pytest.mark.parametrize("name, budget", [(name, "default") for name in CASES] + [
    (name, "split") for name, case in CASES.items() if case[5] != (0, 0)])  # those gathered
def test_run_time_weight_gradient_matches_static_form_and_torch(name, budget, monkeypatch):
    """``split``: the budget of column values between the sizes, so that one session takes the
    runs within the budget at some and the bounded runs at others."""
    ci, co, kernel, attrs, sizes, runs = CASES[name]
    group, n_sp = attrs.get("group", 1), len(kernel)
    if budget == "split":
        counts = sorted(_columns(name, size) for size in sizes)
        monkeypatch.setattr(spatial, "_COLUMNS_BUDGET", counts[0])
        assert counts[0] < counts[-1]  # the smallest size in whole runs, the largest in bounded ones
    w = RNG.standard_normal([co, ci // group, *kernel]).astype(np.float32)
    proto = grad_proto("Conv", attrs, ci, n_sp, {"w": w})
    assert _gathers(proto) == runs  # none: dW the Conv of x by dy with axes swapped
    for size in sizes:  # each size against the static-shape form's gradient graph
        x = RNG.standard_normal((2, ci, *size)).astype(np.float32)
        want = _grads(grad_proto("Conv", attrs, ci, n_sp, {"w": w}, size=size), x)["ort"]
        for backend, got in _grads(proto, x).items():
            for key in ("x_grad", "w_grad"):
                scale = float(np.abs(want[key]).max())
                np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5 * scale,
                                           err_msg=f"{key}, size {size}, {backend}")
    check_grads(proto, {"w": w}, _forward(attrs, kernel), sizes, ci)


def test_float64_run_time_weight_gradient_matches_central_differences(monkeypatch):
    """A grouped, strided, dilated, asymmetrically padded Conv in float64: dW of one graph at three
    sizes, one within the budget of column values and two past it (one in one run of the batch,
    one in runs of 2 and 1 images), against central differences of the loss (step 1e-6) on the
    numpy backend and ort-cpu."""
    # a run's columns: 12 channels of 9 taps by 3 images of 3x8 outputs (7x9), of 5x5 (10x6) or
    # of 8x8 (16x9); past the budget one group (54 rows) by 144 // 25 = 5 images, or 144 // 64 = 2
    monkeypatch.setattr(spatial, "_COLUMNS_BUDGET", 108 * 3 * 24)
    ci, co, attrs = 12, 4, {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 2, 0, 1]}
    w = RNG.standard_normal([co, ci // 2, 3, 3])
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs), helper.make_node("Mul", ["y", "y"], ["sq"]),
             helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE,
                                                                            ["N", ci, "H", "W"])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.DOUBLE, [])],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    grads = graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["w"]))
    onnx.checker.check_model(grads.proto, full_check=True)
    assert _gathers(grads.proto) == (1, 2)  # both groups at once; past the budget one a run
    sessions = {"numpy": graphc.Session(grads, backend="numpy"), "ort": graphc.Session(grads, backend="ort-cpu")}
    tw = torch.tensor(w, requires_grad=False)

    def loss(x, weight):
        padded = F.pad(torch.tensor(x), [2, 1, 1, 0])  # ONNX pads [h0, w0, h1, w1] as torch's (w0, w1, h0, h1)
        return float((F.conv2d(padded, weight, stride=[2, 1], dilation=[1, 2], groups=2) ** 2).sum())

    for size in [(7, 9), (10, 6), (16, 9)]:
        x = RNG.standard_normal((3, ci, *size))
        want = np.zeros_like(w)
        for index in np.ndindex(*w.shape):
            step = torch.zeros_like(tw)
            step[index] = 1e-6
            want[index] = (loss(x, tw + step) - loss(x, tw - step)) / 2e-6
        for backend, session in sessions.items():
            got = session.run({"x": x})["w_grad"]
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                                       err_msg=f"size {size}, {backend}")


def test_conv_transpose_weight_gradient_on_both_sides_of_the_budget(monkeypatch):
    """A ConvTranspose's dW is the gathered dW of a Conv of dy (72 channels: runs of 64 and 8, or
    9 of 8) by x: one graph fed a size within the budget and one past it, against torch."""
    monkeypatch.setattr(spatial, "_COLUMNS_BUDGET", 576 * 2 * 4 * 5)  # 576 rows by x's 2 x 4 x 5 pixels
    w = RNG.standard_normal([5, 72, 3, 3]).astype(np.float32)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    proto = grad_proto("ConvTranspose", attrs, 5, 2, {"w": w})
    assert _gathers(proto) == (2, 9)

    def forward(x, w, size):
        return F.conv_transpose2d(x, w, stride=2, padding=1)

    check_grads(proto, {"w": w}, forward, [(4, 5), (6, 7), (3, 3)], 5)


def _largest_gather(proto: onnx.ModelProto, x: np.ndarray, tmp_path) -> int:
    """The most bytes a Gather (the dW's columns; the forward and dx have none) of one
    onnxruntime run of ``proto`` on x wrote, from the profiler's trace (subgraphs' nodes too)."""
    executable = graphc.backends.get_backend("ort-cpu").prepare(proto, profile=str(tmp_path / "trace"))
    executable.run({"x": x})
    events = json.loads(executable.end_profiling().read_text())
    sizes = [int(e["args"]["output_size"]) for e in events if e.get("args", {}).get("op_name") == "Gather"]
    assert sizes, "no Gather ran"
    return max(sizes)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[5] != (0, 0)])  # those gathered
def test_columns_past_the_budget_take_runs_of_the_batch(name, monkeypatch, tmp_path):
    """The budget two images' bounded runs at the largest size: there a batch of 5 takes runs of
    2, 2 and 1 images (smaller sizes more a run, or the unbounded runs where they fit); no
    Gather's columns exceed the budget, and x's and w's gradients match torch's on numpy and
    ort-cpu. Before the batch runs, the columns held all 5 images (2.5x the budget)."""
    ci, co, kernel, attrs, sizes, _ = CASES[name]
    group, n_sp = attrs.get("group", 1), len(kernel)
    largest = max(sizes, key=lambda size: _pixels(name, size))
    budget = _rows(name, spatial._BOUNDED_RUN_COLUMNS) * 2 * _pixels(name, largest)
    monkeypatch.setattr(spatial, "_COLUMNS_BUDGET", budget)
    w = RNG.standard_normal([co, ci // group, *kernel]).astype(np.float32)
    proto = grad_proto("Conv", attrs, ci, n_sp, {"w": w})
    x = RNG.standard_normal((5, ci, *largest)).astype(np.float32)
    assert _largest_gather(proto, x, tmp_path) <= budget * x.itemsize
    check_grads(proto, {"w": w}, _forward(attrs, kernel), sizes, ci, batch=5)


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case[5] != (0, 0) and _rows(
    name, spatial._RUN_COLUMNS) == _rows(name, spatial._BOUNDED_RUN_COLUMNS)])  # gathered, 3 of the 6
def test_same_runs_either_side_of_the_budget_take_one_if(name, monkeypatch):
    """Where runs of ``_RUN_COLUMNS`` and of ``_BOUNDED_RUN_COLUMNS`` rows are the same channels
    (3 of 3x2 taps, 4 of 5, 2 of 2x2x2) dW has one If, the batch runs' (whole batch where it fits),
    not another above it picking between the same runs; with the budget one image's columns at
    the largest size (a batch of 3: 3 runs there, fewer at the others), the gradients match
    torch's on numpy and ort-cpu (before: two Ifs)."""
    ci, co, kernel, attrs, sizes, _ = CASES[name]
    counts = sorted(_rows(name, spatial._BOUNDED_RUN_COLUMNS) * _pixels(name, size) for size in sizes)
    monkeypatch.setattr(spatial, "_COLUMNS_BUDGET", counts[-1])
    w = RNG.standard_normal([co, ci // attrs.get("group", 1), *kernel]).astype(np.float32)
    proto = grad_proto("Conv", attrs, ci, len(kernel), {"w": w})
    assert _count(proto, "If") == 1 and _count(proto, "Loop") == 1
    check_grads(proto, {"w": w}, _forward(attrs, kernel), sizes, ci, batch=3)


def test_an_empty_output_takes_the_whole_batch():
    """A Conv with no window (2 wide, kernel 3): the batch runs' images an image's output pixels
    into the budget, those counted 1 for none (a Div by 0 otherwise); dW and dx are zeros on
    the numpy backend (onnxruntime refuses the forward Conv)."""
    w = RNG.standard_normal([3, 4, 3]).astype(np.float32)
    got = NumpyBackend().prepare(grad_proto("Conv", {}, 4, 1, {"w": w})).run({"x": np.ones((2, 4, 2), np.float32)})
    assert not got["w_grad"].any() and got["w_grad"].shape == w.shape and not got["x_grad"].any()
