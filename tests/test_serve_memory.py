"""What a request's tensors cost the server after its reply: a tiny request to a model whose
intermediate size it chooses (ConstantOfShape of a fed shape, summed to one number) makes the
session allocate hundreds of MB; on ort-cpu that memory must go back to the system, not stay in
onnxruntime's CPU arena for the server's life (five such requests to five models once held 16 GB
and the sixth got the server killed)."""

from __future__ import annotations

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphc.runtime.session import Session
from serve_util import rss_mb, serve_process

SIZE = 100_000_000  # float32 elements: 400 MB


def _fill_sum_model() -> onnx.ModelProto:
    """shape int64[k] -> y = ReduceSum(ConstantOfShape(shape, 1.0)) float32[]."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)]
    graph = helper.make_graph(nodes, "fill", [helper.make_tensor_value_info("shape", TensorProto.INT64, ["k"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("memory") / "fill.onnx"
    onnx.save(_fill_sum_model(), str(path))
    return path


def _fill(http: httpx.Client, n: int) -> float:
    reply = http.post("/v2/models/fill/infer",
                      json={"inputs": [{"name": "shape", "shape": [1], "datatype": "INT64", "data": [n]}]})
    assert reply.status_code == 200, reply.text
    return reply.json()["outputs"][0]["data"][0]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_value_sized_tensor_is_given_back_after_its_request(model_file, backend):
    with serve_process(str(model_file), "--backend", backend) as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        assert _fill(http, 1000) == 1000
        before = rss_mb(proc.pid)
        for _ in range(2):
            assert _fill(http, SIZE) > 0  # float32 sums of ones stop growing at 2**24 on some kernels
        held = rss_mb(proc.pid) - before
        assert held < 150, f"the server holds {held:.0f} MB more after two requests for a 400 MB tensor"
        assert _fill(http, 10) == 10 and proc.poll() is None


def test_sessions_take_cpu_arena_and_give_the_same_results(model_file):
    feeds = {"shape": np.array([3, 5])}
    for backend in ("numpy", "ort-cpu"):
        with_arena = Session(str(model_file), backend=backend).run(feeds)["y"]
        without = Session(str(model_file), backend=backend, cpu_arena=False).run(feeds)["y"]
        assert with_arena == without == 15
