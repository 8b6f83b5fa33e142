"""The cap on a reply's size: a tiny request to a model whose output size it chooses (a Range of a
fed length) gets a JSON 400 naming the output and the limit once the reply would pass
``--max-reply-bytes``, without the server writing the rest of the reply; replies under it are
served, and so are other requests afterwards."""

from __future__ import annotations

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from graphc.serving.serve import DEFAULT_MAX_REPLY_BYTES, create_app
from serve_util import running_server, serve_process

CAP = 100_000


def _range_model() -> onnx.ModelProto:
    """n int64[1] -> y = arange(n) int64[M]."""
    nodes = [helper.make_node("Squeeze", ["n"], ["limit"]), helper.make_node("Range", ["zero", "limit", "one"], ["y"])]
    graph = helper.make_graph(nodes, "range", [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, ["M"])],
                              [numpy_helper.from_array(np.array(0, np.int64), "zero"),
                               numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("cap") / "range.onnx"
    onnx.save(_range_model(), str(path))
    return path


def _ask(http: httpx.Client, n: int, binary: bool) -> httpx.Response:
    request = {"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [n]}],
               "outputs": [{"name": "y", "parameters": {"binary_data": binary}}]}
    return http.post("/v2/models/range/infer", json=request)


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_replies_past_the_cap_are_a_400_naming_output_and_limit(model_file, binary):
    with serve_process(str(model_file), "--backend", "numpy", "--max-reply-bytes", str(CAP)) as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        small = _ask(http, 1000, binary)
        assert small.status_code == 200 and len(small.content) <= CAP
        if not binary:
            assert small.json()["outputs"][0]["data"] == np.arange(1000).tolist()
        big = _ask(http, 20_000 if binary else 30_000, binary)
        assert big.status_code == 400 and big.headers["content-type"] == "application/json"
        message = big.json()["error"]
        assert "output 'y'" in message and f"limit of {CAP} bytes for one reply (--max-reply-bytes)" in message
        assert _ask(http, 10, binary).status_code == 200 and proc.poll() is None


def test_a_huge_json_reply_is_refused_without_being_written(model_file):
    """10M int64 as JSON would take about 90 MB of text and some 400 MB of Python numbers: the
    server's peak memory grows by little more than the 80 MB array the model returns."""
    with serve_process(str(model_file), "--backend", "numpy", "--max-reply-bytes", str(CAP)) as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        assert _ask(http, 1000, False).status_code == 200
        before = _peak_rss_mb(proc.pid)
        assert _ask(http, 10_000_000, False).status_code == 400
        grown = _peak_rss_mb(proc.pid) - before
        assert grown < 200, f"peak RSS grew by {grown:.0f} MB"


def test_create_app_takes_the_cap_and_defaults_to_one_gib(model_file):
    assert DEFAULT_MAX_REPLY_BYTES == 1 << 30
    app = create_app(str(model_file), backend="numpy", max_reply_bytes=CAP)
    with running_server(app) as address, httpx.Client(base_url=f"http://{address}", timeout=60) as http:
        assert _ask(http, 1000, True).status_code == 200
        assert _ask(http, 20_000, True).status_code == 400
