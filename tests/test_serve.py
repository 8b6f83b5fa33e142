"""The KServe v2 server with the stock tritonclient.http client: health, metadata, JSON and
binary tensors, FP32/INT64/BOOL, batch 1 and 64, concurrency; outputs equal gc.Session's."""

from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.serving.serve import create_app
from serve_util import mixed_feeds, mixed_model, running_server

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

DATATYPES = {"x": "FP32", "idx": "INT64", "mask": "BOOL"}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A Triton repository written by gc.deploy.triton: "mixed" (batched) and "plain"."""
    root = tmp_path_factory.mktemp("repo")
    gc.deploy.triton(mixed_model(), root, "mixed", max_batch_size=64)
    gc.deploy.triton(mixed_model(), root, "plain")
    return root


@pytest.fixture(scope="module")
def url(repo):
    with running_server(create_app(repo, backend="ort-cpu")) as address:
        yield address


@pytest.fixture(scope="module")
def client(url):
    client = httpclient.InferenceServerClient(url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def reference():
    return gc.Session(mixed_model(), backend="ort-cpu")


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mixed") and client.is_model_ready("plain", "1")
    assert not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert meta["name"] == "graphc" and "binary_tensor_data" in meta["extensions"]
    assert {m["name"] for m in client.get_model_repository_index()} == {"mixed", "plain"}


def test_model_metadata_lists_names_datatypes_and_shapes(client):
    meta = client.get_model_metadata("mixed")
    assert meta["name"] == "mixed" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": n, "datatype": DATATYPES[n], "shape": [-1, 3 if n == "idx" else 4]}
                              for n in ("x", "idx", "mask")]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        ("y", "FP32", [-1, 4]), ("s", "INT64", [-1, 3]), ("m", "BOOL", [-1, 4])]
    assert client.get_model_metadata("mixed", model_version="1") == meta


def make_inputs(feeds, binary):
    inputs = []
    for name, array in feeds.items():
        item = httpclient.InferInput(name, list(array.shape), DATATYPES[name])
        item.set_data_from_numpy(array, binary_data=binary)
        inputs.append(item)
    return inputs


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_equals_session(client, reference, batch, binary):
    feeds = mixed_feeds(batch, seed=batch)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "s", "m")]
    result = client.infer("mixed", make_inputs(feeds, binary), outputs=outputs, request_id="r1")
    assert result.get_response()["id"] == "r1"
    for name, want in reference.run(feeds).items():
        got = result.as_numpy(name)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_default_outputs_are_all_binary_and_a_subset_can_be_asked(client, reference):
    feeds = mixed_feeds(3)
    want = reference.run(feeds)
    result = client.infer("plain", make_inputs(feeds, True), model_version="1")
    for name in ("y", "s", "m"):
        assert "binary_data_size" in result.get_output(name)["parameters"]
        np.testing.assert_array_equal(result.as_numpy(name), want[name])
    result = client.infer("mixed", make_inputs(feeds, False), outputs=[httpclient.InferRequestedOutput("s")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["s"]
    np.testing.assert_array_equal(result.as_numpy("s"), want["s"])


def test_client_sees_errors_as_exceptions(client):
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.infer("nope", make_inputs(mixed_feeds(1), True))
    with pytest.raises(InferenceServerException, match="no version '2'"):
        client.infer("mixed", make_inputs(mixed_feeds(1), True), model_version="2")
    assert client.infer("mixed", make_inputs(mixed_feeds(1), True)).as_numpy("y").shape == (1, 4)


def test_batch_over_max_batch_size_is_refused_like_triton(client):
    """"mixed" was deployed with max_batch_size=64 (config.pbtxt): 64 is served, 65 is a 400;
    "plain" (max_batch_size 0) has no such limit."""
    assert client.infer("mixed", make_inputs(mixed_feeds(64), True)).as_numpy("y").shape == (64, 4)
    with pytest.raises(InferenceServerException, match="input 'x': batch of 65 exceeds the max_batch_size of "
                                                        "model 'mixed', 64"):
        client.infer("mixed", make_inputs(mixed_feeds(65), True))
    assert client.infer("plain", make_inputs(mixed_feeds(65), True)).as_numpy("y").shape == (65, 4)


def test_concurrent_clients_get_their_own_answers(url, reference):
    errors, results = [], {}

    def worker(k: int) -> None:
        try:
            client = httpclient.InferenceServerClient(url)
            for i in range(5):
                feeds = mixed_feeds(1 + (k + i) % 7, seed=100 * k + i)
                got = client.infer("mixed", make_inputs(feeds, k % 2 == 0)).as_numpy("y")
                np.testing.assert_array_equal(got, reference.run(feeds)["y"])
            results[k] = True
            client.close()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 8


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_single_file_is_served_under_its_stem_on_any_backend(tmp_path, backend):
    onnx.save(mixed_model(), str(tmp_path / "classifier.onnx"))
    feeds = mixed_feeds(4)
    with running_server(create_app(tmp_path / "classifier.onnx", backend=backend)) as address:
        client = httpclient.InferenceServerClient(address)
        assert client.get_model_metadata("classifier")["name"] == "classifier"
        result = client.infer("classifier", make_inputs(feeds, True))
        np.testing.assert_allclose(result.as_numpy("y"), gc.Session(mixed_model(), backend=backend).run(feeds)["y"],
                                   rtol=1e-6, atol=1e-6)
        client.close()
    with running_server(create_app(tmp_path / "classifier.onnx", name="renamed")) as address:
        assert httpx.get(f"http://{address}/v2/models/renamed").json()["name"] == "renamed"


def post_body(url, inputs, outputs=None):
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
    return httpx.post(f"http://{url}/v2/models/mixed/infer", content=body, headers=headers)


def test_responses_carry_content_length_and_binary_headers(url):
    feeds = mixed_feeds(2)
    reply = post_body(url, make_inputs(feeds, True))  # no outputs listed: all binary
    assert reply.status_code == 200 and reply.headers["content-length"] == str(len(reply.content))
    assert reply.headers["content-type"] == "application/octet-stream"
    header_length = int(reply.headers["inference-header-content-length"])
    result = httpclient.InferenceServerClient.parse_response_body(reply.content, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("s"), feeds["idx"] + 1)
    reply = post_body(url, make_inputs(feeds, True), [httpclient.InferRequestedOutput("m", binary_data=False)])
    assert reply.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in reply.headers
    assert reply.json()["outputs"][0]["data"] == (~feeds["mask"]).ravel().tolist()


def test_app_mounted_under_a_prefix_still_infers(reference):
    from fastapi import FastAPI

    outer = FastAPI()
    outer.mount("/inner", create_app(mixed_model(), backend="ort-cpu"))
    feeds = mixed_feeds(2)
    payload = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": DATATYPES[k], "data": v.ravel().tolist()}
                          for k, v in feeds.items()]}
    with running_server(outer) as address, httpx.Client(base_url=f"http://{address}") as http:
        reply = http.post("/inner/v2/models/mixed/infer", json=payload)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][1]["data"] == reference.run(feeds)["s"].ravel().tolist()
        assert http.get("/inner/v2/models/mixed/infer").status_code == 405


def test_no_nagle_stalls_between_sequential_requests(client):
    """Nagle's algorithm with delayed ACKs would hold every reply ~40 ms; TCP_NODELAY (set by
    asyncio and uvloop on accepted connections) removes that floor. The fastest of 30 requests
    is compared, not the median, so a loaded machine slowing some requests cannot fail it, while
    a stall that holds each reply still does."""
    import time

    inputs = make_inputs(mixed_feeds(1), True)
    times = []
    for _ in range(30):
        start = time.perf_counter()
        client.infer("mixed", inputs)
        times.append(time.perf_counter() - start)
    assert min(times) < 0.035, times


def _unsigned_model() -> onnx.ModelProto:
    """u16 uint16[N,2], u32 uint32[N,2], u64 uint64[N,2] -> each passed through (Identity)."""
    from onnx import TensorProto, helper

    kinds = {"u16": TensorProto.UINT16, "u32": TensorProto.UINT32, "u64": TensorProto.UINT64}
    graph = helper.make_graph(
        [helper.make_node("Identity", [k], [f"{k}_out"]) for k in kinds], "unsigned",
        [helper.make_tensor_value_info(k, t, ["N", 2]) for k, t in kinds.items()],
        [helper.make_tensor_value_info(f"{k}_out", t, ["N", 2]) for k, t in kinds.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_unsigned_datatypes_round_trip(tmp_path, binary):
    onnx.save(_unsigned_model(), str(tmp_path / "unsigned.onnx"))
    top = {"u16": 2**16 - 1, "u32": 2**32 - 1, "u64": 2**64 - 1}  # the extremes survive the wire
    feeds = {k: np.array([[0, v], [v // 3, 7]], dtype=f"uint{k[1:]}") for k, v in top.items()}
    with running_server(create_app(tmp_path / "unsigned.onnx", backend="ort-cpu")) as address:
        client = httpclient.InferenceServerClient(address)
        meta = client.get_model_metadata("unsigned")
        assert [i["datatype"] for i in meta["inputs"]] == ["UINT16", "UINT32", "UINT64"]
        inputs = []
        for name, array in feeds.items():
            inputs.append(httpclient.InferInput(name, list(array.shape), f"UINT{name[1:]}"))
            inputs[-1].set_data_from_numpy(array, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput(f"{k}_out", binary_data=binary) for k in feeds]
        result = client.infer("unsigned", inputs, outputs=outputs)
        for name, array in feeds.items():
            got = result.as_numpy(f"{name}_out")
            assert got.dtype == array.dtype and np.array_equal(got, array), name
        client.close()


def test_a_string_model_is_refused_at_load_naming_the_tensor(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["text"], ["same"])], "strings",
                              [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
                              [helper.make_tensor_value_info("same", TensorProto.STRING, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "strings.onnx"))
    with pytest.raises(gc.ModelLoadError, match="input 'text' has dtype string"):
        create_app(tmp_path / "strings.onnx", backend="ort-cpu")


def test_a_sequence_output_is_refused_at_load_and_by_deploy(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0)], "seq",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])],
                              [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(gc.ModelLoadError, match="output 'parts' is a Sequence"):
        create_app(gc.load(model), name="seq", backend="numpy")
    with pytest.raises(gc.GraphError, match="output 'parts' is a Sequence"):
        gc.deploy.triton(model, tmp_path, "seq")


def triton_parse(text):
    """``text`` parsed by Triton's own ModelConfig proto (shipped with tritonclient's gRPC client),
    as json_format writes it: the oracle of the config route."""
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import json_format, text_format

    return json_format.MessageToDict(text_format.Parse(text, model_config_pb2.ModelConfig()),
                                     preserving_proto_field_name=True)


def assert_holds(got, want):
    """Every field Triton's parse set is in ``got`` with that value (64-bit integers as numbers)."""
    if isinstance(want, dict):
        for key, value in want.items():
            assert key in got, key
            assert_holds(got[key], value)
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_holds(g, w)
    else:
        assert got == (int(want) if isinstance(got, int) and isinstance(want, str) else want)


def test_model_config_is_the_config_pbtxt(client, repo, url):
    config = client.get_model_config("mixed")
    assert_holds(config, triton_parse((repo / "mixed" / "config.pbtxt").read_text()))
    assert config["max_batch_size"] == 64 and config["input"][1]["dims"] == [3]
    assert config["input"][1]["data_type"] == "TYPE_INT64" and config["instance_group"][0]["kind"] == "KIND_CPU"
    assert client.get_model_config("plain", "1") == client.get_model_config("plain")
    assert client.get_model_config("plain")["max_batch_size"] == 0
    assert client.get_model_config("plain")["input"][0]["dims"] == [-1, 4]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        client.get_model_config("nope")
    for path in ("/v2/models/nope/config", "/v2/models/mixed/versions/7/config"):
        reply = httpx.get(f"http://{url}{path}")
        assert reply.status_code == 404 and list(reply.json()) == ["error"], path


def test_model_config_is_completed_from_the_model(tmp_path):
    folder = gc.deploy.triton(mixed_model(), tmp_path / "repo", "m", max_batch_size=8)
    written = (folder / "config.pbtxt").read_text()
    # a hand-written config: no inputs or outputs (Triton fills them from the model), a
    # parameter, and a field graphc does not model
    text = ('max_batch_size: 8\nparameters { key: "note" value { string_value: "hi" } }\n'
            'model_warmup [ { name: "w" batch_size: 1 } ]\nsequence_batching { max_sequence_idle_microseconds: 9 }\n')
    (folder / "config.pbtxt").write_text(text)
    with pytest.warns(UserWarning, match=r"field 'sequence_batching' \(line 4\) is not one graphc serves"):
        app = create_app(tmp_path / "repo", backend="numpy")
    with running_server(app) as address:
        client = httpclient.InferenceServerClient(address)
        config = client.get_model_config("m")
        client.close()
    assert config["parameters"] == {"note": {"string_value": "hi"}} and "sequence_batching" not in config
    assert_holds(config, triton_parse(text.replace("sequence_batching", "# ")))
    assert_holds(config, triton_parse(written))
    with running_server(create_app(mixed_model(), name="solo", backend="numpy")) as address:
        solo = httpx.get(f"http://{address}/v2/models/solo/config").json()
    assert solo["name"] == "solo" and solo["max_batch_size"] == 0 and solo["backend"] == "onnxruntime"
    assert [(i["name"], i["dims"]) for i in solo["input"]] == [("x", [-1, 4]), ("idx", [-1, 3]), ("mask", [-1, 4])]


def test_a_bad_config_pbtxt_is_named(tmp_path):
    folder = gc.deploy.triton(mixed_model(), tmp_path, "m")
    (folder / "config.pbtxt").write_text('name: "m"\nmax_batch_size: "eight"\n')
    with pytest.raises(gc.ModelLoadError, match=r"config.pbtxt: not a Triton model configuration: 2:\d+"):
        create_app(tmp_path, backend="numpy")


def test_bf16_models_answer_on_onnxruntime_as_on_numpy():
    from graphc.model.dtypes import to_numpy
    from serve_util import bfloat16_model

    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4,)).astype(to_numpy("bfloat16")), "s": rng.standard_normal(4).astype(np.float32)}
    want = gc.Session(bfloat16_model(), backend="numpy").run(feeds)
    with running_server(create_app(bfloat16_model(), name="bf16", backend="ort-cpu")) as address:
        client = httpclient.InferenceServerClient(address)
        assert [i["datatype"] for i in client.get_model_metadata("bf16")["inputs"]] == ["BF16", "FP32"]
        inputs = []
        for name, datatype in (("x", "BF16"), ("s", "FP32")):
            inputs.append(httpclient.InferInput(name, [4], datatype))
            inputs[-1].set_data_from_numpy(feeds[name], binary_data=True)  # tritonclient sends BF16 only so
        outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("y", "z", "w")]
        result = client.infer("bf16", inputs, outputs=outputs)
        for name in ("y", "z", "w"):
            np.testing.assert_array_equal(result.as_numpy(name).view(np.uint16), want[name].view(np.uint16))
        client.close()


def _grid_model() -> onnx.ModelProto:
    """x float32[N,T,2,3] -> y = 2x, and the sum of each item's grid, s float32[N] (a scalar per item)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0)],
        "grid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T", 2, 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor("axes", TensorProto.INT64, [3], [1, 2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_outputs_are_reshaped_to_their_config_dims_as_triton_does(tmp_path):
    """Triton returns an output shaped as its config's dims (a -1 takes the reshape's variable
    sizes in order): the model gives y [B, T, 2, 3] and s [B]; the client sees [B, T, 6] and [B, 1]."""
    folder = gc.deploy.triton(_grid_model(), tmp_path, "grid", max_batch_size=8)
    config = (folder / "config.pbtxt").read_text()
    config = config.replace("dims: [ -1, 2, 3 ]", "dims: [ -1, 6 ]\n    reshape: { shape: [ -1, 2, 3 ] }")
    assert config.count("reshape") == 3  # x, y and deploy's own for the scalar s
    (folder / "config.pbtxt").write_text(config)
    x = np.random.default_rng(0).standard_normal((3, 5, 6)).astype(np.float32)
    with running_server(create_app(tmp_path, backend="numpy")) as address:
        client = httpclient.InferenceServerClient(address)
        meta = client.get_model_metadata("grid")
        assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [("y", [-1, -1, 6]), ("s", [-1, 1])]
        assert meta["inputs"][0]["shape"] == [-1, -1, 6]
        for binary in (True, False):
            item = httpclient.InferInput("x", list(x.shape), "FP32")
            item.set_data_from_numpy(x, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "s")]
            result = client.infer("grid", [item], outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("y"), 2 * x)
            np.testing.assert_allclose(result.as_numpy("s"), x.sum(axis=(1, 2))[:, None], rtol=1e-5)
        client.close()


def test_nan_and_infinity_outputs_are_written_as_triton_writes_them(tmp_path):
    """JSON has no NaN: Triton (since server PR 3870) writes the tokens NaN, Infinity and -Infinity, which
    tritonclient (rapidjson) and Python's json read back; binary outputs carry the exact bits."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "log",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "log.onnx"))
    x = np.array([-1.0, 0.0, np.inf, 2.0], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log(x)  # nan, -inf, inf, 0.693...
    with running_server(create_app(tmp_path / "log.onnx", backend="ort-cpu")) as address:
        client = httpclient.InferenceServerClient(address)
        feed = httpclient.InferInput("x", list(x.shape), "FP32")
        feed.set_data_from_numpy(x, binary_data=True)  # JSON data refuses non-finite numbers (a strict request)
        for binary in (False, True):
            result = client.infer("log", [feed], outputs=[httpclient.InferRequestedOutput("y", binary_data=binary)])
            np.testing.assert_array_equal(result.as_numpy("y"), want)
        client.close()
        header = b'{"inputs":[{"name":"x","shape":[4],"datatype":"FP32","parameters":{"binary_data_size":16}}]}'
        reply = httpx.post(f"http://{address}/v2/models/log/infer", content=header + x.tobytes(),
                           headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
    text = reply.text
    assert reply.status_code == 200 and '"data":[NaN,-Infinity,Infinity,0.69' in text, text
    np.testing.assert_array_equal(np.array(json.loads(text)["outputs"][0]["data"], np.float32), want)
