"""A request whose values size a tensor (a ConstantOfShape of a fed shape, an Expand to a fed
shape, a Range to a fed limit and the outer comparison of it, a ConstantOfShape of a size read off
a NonZero's output) is refused with a 413 naming the node, the shape, the bytes and
--max-tensor-bytes before anything is allocated, as is one whose tensors live at once pass
--max-request-bytes, on numpy and ort-cpu; requests under the bounds get exact results, and the
server answers others after. A model whose value-sized ops only its run reaches (in an If
branch) is refused at load on ort-cpu unless --allow-unchecked."""

from __future__ import annotations

import subprocess
import sys

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphc.backends.numpy.sizes import SIZES
from graphc.backends.value_sized import VALUE_SIZED, ShapePrepass
from graphc.errors import TensorTooLarge
from graphc.runtime.session import Session
from serve_util import serve_process

BOUND = 100_000_000
RNG = np.random.default_rng(0)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(name: str, nodes: list, inputs: list, inits: list = (), rank: int = 0) -> onnx.ModelProto:
    """float32 output ``y`` of ``rank`` symbolic dims."""
    out = helper.make_tensor_value_info("y", F32, [f"d{i}" for i in range(rank)])
    graph = helper.make_graph(nodes, name, inputs, [out], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _served_models() -> dict[str, onnx.ModelProto]:
    """fill: shape -> sum(ones(shape)); expand_sum: x[1], shape -> sum(expand(x, shape)); outer: n ->
    count of i < j for i, j in range(n) (an [n, n] bool comparison, no value-sized op makes it);
    picked: mask, n -> sum(ones([count_nonzero(mask), n])) (no shape inference finds that shape);
    tiles: x[1], r -> sum of three Tiles of x to [r], each live at the Sum."""
    one = helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill",
                           value=numpy_helper.from_array(np.array([1.0], np.float32)))
    shape_in = helper.make_tensor_value_info("shape", I64, ["k"])
    return {
        "fill": _model("fill", [one, helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)], [shape_in]),
        "expand_sum": _model("expand_sum", [helper.make_node("Expand", ["x", "shape"], ["e"], name="spread"),
                                            helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0)],
                             [helper.make_tensor_value_info("x", F32, [1]), shape_in]),
        "outer": _model("outer", [helper.make_node("Range", ["zero", "n", "step"], ["r"], name="count"),
                                  helper.make_node("Unsqueeze", ["r", "axis"], ["col"]),
                                  helper.make_node("Less", ["r", "col"], ["lt"], name="compare"),
                                  helper.make_node("Cast", ["lt"], ["f"], to=F32),
                                  helper.make_node("ReduceSum", ["f"], ["y"], keepdims=0)],
                        [helper.make_tensor_value_info("n", I64, [])],
                        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                         numpy_helper.from_array(np.array(1, np.int64), "step"),
                         numpy_helper.from_array(np.array([1], np.int64), "axis")]),
        "picked": _model("picked", [helper.make_node("NonZero", ["mask"], ["nz"]),
                                    helper.make_node("Shape", ["nz"], ["s"]),
                                    helper.make_node("Slice", ["s", "one", "two"], ["count"]),
                                    helper.make_node("Concat", ["count", "n"], ["dims"], axis=0),
                                    helper.make_node("ConstantOfShape", ["dims"], ["c"], name="rows",
                                                     value=numpy_helper.from_array(np.array([1.0], np.float32))),
                                    helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
                         [helper.make_tensor_value_info("mask", TensorProto.BOOL, ["k"]),
                          helper.make_tensor_value_info("n", I64, [1])],
                         [numpy_helper.from_array(np.array([1], np.int64), "one"),
                          numpy_helper.from_array(np.array([2], np.int64), "two")]),
        "tiles": _model("tiles", [*(helper.make_node("Tile", ["x", "r"], [t], name=t) for t in "abc"),
                                  helper.make_node("Sum", ["a", "b", "c"], ["d"], name="sum"),
                                  helper.make_node("ReduceSum", ["d"], ["y"], keepdims=0)],
                        [helper.make_tensor_value_info("x", F32, [1]), helper.make_tensor_value_info("r", I64, [1])]),
    }


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("bounded")
    for name, model in _served_models().items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))
    return root


def _infer(http: httpx.Client, model: str, **feeds: np.ndarray) -> httpx.Response:
    kinds = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32", np.dtype(bool): "BOOL"}
    inputs = [{"name": k, "shape": list(v.shape), "datatype": kinds[v.dtype],
               "data": v.ravel().tolist()} for k, v in feeds.items()]
    return http.post(f"/v2/models/{model}/infer", json={"inputs": inputs})


def _value(reply: httpx.Response) -> float:
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"][0]["data"][0]


def _refused(reply: httpx.Response, *words: str, option: str = "--max-tensor-bytes") -> None:
    assert reply.status_code == 413, reply.text
    message = reply.json()["error"]
    for word in (*words, f"limit of {BOUND:,} bytes", option):
        assert word in message, message


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_requests_over_the_tensor_bound_get_413_and_the_server_goes_on(repository, backend):
    with serve_process(str(repository), "--backend", backend, "--max-tensor-bytes", str(BOUND)) as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        assert _value(_infer(http, "fill", shape=np.array([1000, 7]))) == 7000
        _refused(_infer(http, "fill", shape=np.array([10 ** 9])),
                 "model 'fill'", "node 'fill' (ConstantOfShape)", "float32[1000000000]", "4,000,000,000 bytes")
        # numpy: a broadcast view of 1e12 elements, summed in one uncancellable call, were it not refused
        _refused(_infer(http, "expand_sum", x=np.array([2.0], np.float32), shape=np.array([10 ** 6, 10 ** 6])),
                 "node 'spread' (Expand)", "float32[1000000,1000000]", "4,000,000,000,000 bytes")
        assert _value(_infer(http, "expand_sum", x=np.array([2.0], np.float32), shape=np.array([3, 4]))) == 24
        # no value-sized op makes the [n, n] comparison: shape inference finds it from the Range's
        _refused(_infer(http, "outer", n=np.array(100_000)), "node 'compare' (Less)", "bool[100000,100000]",
                 "10,000,000,000 bytes")
        assert _value(_infer(http, "outer", n=np.array(100))) == 4950
        assert _value(_infer(http, "fill", shape=np.array([10]))) == 10 and proc.poll() is None


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_sizes_shape_inference_cannot_find_and_live_totals_are_bounded(repository, backend):
    """picked's [count, n] comes from a NonZero's output (ort-cpu: its sizing inputs run on numpy
    first); tiles' three [r] float32 Tiles are each under the tensor bound, 3 * 4r bytes at the Sum
    (+ the Sum's own 4r) over --max-request-bytes."""
    mask = np.arange(1000) % 3 == 0  # 334 set: a feed too large to be a constant for shape inference
    with serve_process(str(repository), "--backend", backend, "--max-tensor-bytes", str(BOUND),
                       "--max-request-bytes", str(BOUND)) as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        assert _value(_infer(http, "picked", mask=mask, n=np.array([5]))) == 334 * 5
        _refused(_infer(http, "picked", mask=mask, n=np.array([10 ** 6])), "model 'picked'",
                 "node 'rows' (ConstantOfShape)", "float32[334,1000000]", "1,336,000,000 bytes")
        assert _value(_infer(http, "tiles", x=np.array([2.0], np.float32), r=np.array([1000]))) == 6000
        _refused(_infer(http, "tiles", x=np.array([2.0], np.float32), r=np.array([10 ** 7])), "model 'tiles'",
                 "160,000,000 bytes of tensors at once (at node 'sum' (Sum))", option="--max-request-bytes")
        assert _value(_infer(http, "picked", mask=mask, n=np.array([2]))) == 668 and proc.poll() is None


def _if_model() -> onnx.ModelProto:
    """flag, shape -> sum(ones(shape)) in an If branch (node 'inner')."""
    fill = helper.make_node("ConstantOfShape", ["shape"], ["c"], name="inner",
                            value=numpy_helper.from_array(np.array([1.0], np.float32)))
    branch = helper.make_graph([fill, helper.make_node("ReduceSum", ["c"], ["s"], keepdims=0)], "b", [],
                               [helper.make_tensor_value_info("s", F32, [])])
    node = helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch)
    return _model("if", [node], [helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
                                 helper.make_tensor_value_info("shape", I64, [1])])


def test_ort_refuses_at_load_what_it_cannot_bound_unless_allowed(tmp_path):
    path = tmp_path / "branchy.onnx"
    onnx.save(_if_model(), str(path))
    assert Session(_if_model(), backend="numpy").unbounded_nodes == []
    assert Session(_if_model(), backend="ort-cpu").unbounded_nodes == [("node 'inner'", "graph 'b'")]
    cmd = [sys.executable, "-c", "from graphc.cli import main; main()", "serve", str(path), "--backend", "ort-cpu",
           "--port", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    message = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0 and "model 'branchy' version 1: --max-tensor-bytes cannot bound" in message, message
    assert "node 'inner' in graph 'b'" in message and "--backend numpy" in message and "--allow-unchecked" in message
    with serve_process(str(path), "--backend", "ort-cpu", "--allow-unchecked") as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
        assert _value(_infer(http, "branchy", flag=np.array(True), shape=np.array([6]))) == 6


def _single(op: str, inputs: list, feeds: dict, rank: int) -> tuple[onnx.ModelProto, dict]:
    names = [i.name for i in inputs]
    return _model(op, [helper.make_node(op, names, ["y"], name="grow")], inputs, rank=rank), feeds


def _x(*shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("x", F32, list(shape))


CASES = {  # op -> (model, feeds under the bound, the feed that takes it over, what the message names)
    "Tile": (*_single("Tile", [_x(2, 3), helper.make_tensor_value_info("r", I64, [2])],
                      {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "r": np.array([2, 3])}, 2),
             {"r": np.array([10 ** 5, 10 ** 3])}, "float32[200000,3000]"),
    "Pad": (*_single("Pad", [_x(2, 3), helper.make_tensor_value_info("p", I64, [4])],
                     {"x": np.ones((2, 3), np.float32), "p": np.array([1, 0, 2, 5])}, 2),
            {"p": np.array([0, 0, 10 ** 8, 0])}, "float32[100000002,3]"),
    "OneHot": (*_single("OneHot", [helper.make_tensor_value_info("i", I64, [3]), helper.make_tensor_value_info("d", I64, []),
                                   helper.make_tensor_value_info("v", F32, [2])],
                        {"i": np.array([0, 2, 1]), "d": np.array(4), "v": np.array([0.0, 5.0], np.float32)}, 2),
               {"d": np.array(10 ** 8)}, "float32[3,100000000]"),
    "Resize": (*_single("Resize", [_x(1, 1, 2, 2), helper.make_tensor_value_info("roi", F32, [0]),
                                   helper.make_tensor_value_info("s", F32, [4])],
                        {"x": np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2), "roi": np.zeros(0, np.float32),
                         "s": np.array([1, 1, 2, 3], np.float32)}, 4),
               {"s": np.array([1, 1, 10 ** 4, 10 ** 4], np.float32)}, "float32[1,1,20000,20000]"),
    "Col2Im": (*_single("Col2Im", [_x(1, 4, "L"), helper.make_tensor_value_info("image", I64, [2]),
                                   helper.make_tensor_value_info("block", I64, [2])],
                        {"x": np.arange(16, dtype=np.float32).reshape(1, 4, 4), "image": np.array([3, 3]),
                         "block": np.array([2, 2])}, 4),
               {"x": np.ones((1, 4, 1), np.float32), "image": np.array([10 ** 4 + 1, 10 ** 4 + 1])},
               "float32[1,1,10001,10001]"),
    "MelWeightMatrix": (*_single("MelWeightMatrix", [helper.make_tensor_value_info(n, I64, []) for n in ("m", "d", "r")]
                                 + [helper.make_tensor_value_info(n, F32, []) for n in ("lo", "hi")],
                                 {"m": np.array(8), "d": np.array(64), "r": np.array(16000),
                                  "lo": np.array(0, np.float32), "hi": np.array(8000, np.float32)}, 2),
                        {"d": np.array(10 ** 7), "m": np.array(100)}, "float32[5000001,100]"),
    "STFT": (*_single("STFT", [_x(1, "n", 1), helper.make_tensor_value_info("step", I64, []),
                               helper.make_tensor_value_info("w", F32, ["l"])],
                      {"x": RNG.standard_normal((1, 64, 1)).astype(np.float32), "step": np.array(8),
                       "w": np.hanning(16).astype(np.float32)}, 4),
             {"x": np.ones((1, 40_000, 1), np.float32), "step": np.array(1), "w": np.ones(20_000, np.float32)},
             "float32[1,20001,"),  # onnx's shape inference counts 20000 onesided bins (the kernels 10001)
    "Range": (*_single("Range", [helper.make_tensor_value_info(n, F32, []) for n in ("a", "b", "c")],
                       {"a": np.array(1.5, np.float32), "b": np.array(9, np.float32), "c": np.array(0.5, np.float32)}, 1),
              {"a": np.array(0, np.float32), "b": np.array(1e9, np.float32)}, "float32[2000000000]"),
}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("op", sorted(CASES))
def test_session_runs_bound_value_sized_tensors(op, backend):
    model, feeds, over, shape = CASES[op]
    session = Session(model, backend=backend)
    expected = Session(model, backend="numpy").run(feeds)["y"]
    got = session.run(feeds, max_tensor_bytes=BOUND)["y"]
    assert got.shape == expected.shape and np.allclose(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(TensorTooLarge) as refused:
        session.run({**feeds, **over}, max_tensor_bytes=BOUND)
    assert f"node 'grow' ({op}) would make {shape}" in str(refused.value)
    assert f"over the limit of {BOUND:,} bytes" in str(refused.value)


def test_numpy_checks_value_sized_nodes_shape_inference_cannot_see():
    """A ConstantOfShape in an If branch: the pre-pass sees only the main graph; the interpreter
    checks the node as the branch runs."""
    session = Session(_if_model(), backend="numpy")
    assert session.run({"flag": np.array(True), "shape": np.array([6])}, max_tensor_bytes=BOUND)["y"] == 6
    with pytest.raises(TensorTooLarge, match=r"node 'inner' \(ConstantOfShape\) would make float32\[1000000000\]"):
        session.run({"flag": np.array(True), "shape": np.array([10 ** 9])}, max_tensor_bytes=BOUND)


def test_models_without_value_sized_ops_are_not_checked():
    relu = _model("relu", [helper.make_node("Relu", ["x"], ["y"])], [_x("N", 4)], rank=2)
    assert ShapePrepass.of(relu) is None
    assert ShapePrepass.of(_served_models()["fill"]) is not None
    assert set(SIZES) == VALUE_SIZED  # the interpreter checks every op the pre-pass is kept for
