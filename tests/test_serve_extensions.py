"""A KServe v2 conformance walk of `graphc serve` (its own process) on a trained, deployed model with
tritonclient.http and raw HTTP, and what it found: a parameter of a Triton extension the server does
not implement (an output's ``classification``, a request's ``sequence_id``, ``priority``, ``timeout``,
shared memory) was ignored and the plain answer sent, the server metadata listed one of the two
extensions it has, a Triton extension's route and a 405 did not say what was wrong, and a shape no
array can have got numpy's reshape message."""

from __future__ import annotations

import asyncio
import itertools
import json
import math

import httpx
import numpy as np
import pytest

import graphc as gc
from graphc.serving.kserve.protocol import MAX_EXTENT, ProtocolError, decode_request
from serve_util import serve_process
from trainer_models import blobs, bn_artifacts

httpclient = pytest.importorskip("tritonclient.http")
aioclient = pytest.importorskip("tritonclient.http.aio")
from tritonclient.utils import InferenceServerException  # noqa: E402

EXTENSIONS = "GET /v2 lists the ones it does: binary_tensor_data, model_configuration"
BATCH = blobs(5, seed=7)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``graphc serve`` of a repository holding a trained model deployed twice ("blobs", versions 1
    and 2; the config serves the latest) and once as "my.model-x"; yields (port, the trainer)."""
    root = tmp_path_factory.mktemp("walk")
    trainer = gc.Trainer(bn_artifacts(), backend="ort-cpu")
    trainer.fit(gc.data.DataLoader(blobs(128), batch_size=32), 2, progress=False)
    exported = trainer.export_inference(root / "blobs.onnx")
    for name in ("blobs", "blobs", "my.model-x"):
        gc.deploy.triton(exported, root / "repo", name, max_batch_size=16)
    with serve_process(str(root / "repo"), "--backend", "ort-cpu") as (_, port):
        yield port, trainer


@pytest.fixture(scope="module")
def client(served):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served[0]}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=f"http://127.0.0.1:{served[0]}", timeout=30) as http:
        yield http


def x_input(binary: bool = True) -> httpclient.InferInput:
    item = httpclient.InferInput("x", list(BATCH["x"].shape), "FP32")
    item.set_data_from_numpy(BATCH["x"], binary_data=binary)
    return item


def refused(call, status: int, message: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        call()
    assert info.value.status() == str(status) and info.value.message() == message, info.value


NOT_SERVED = ("model 'blobs' version '1' is in the repository but not served: the default version_policy, "
              "latest { num_versions: 1 } (its config.pbtxt sets none) serves version 2")


# -- the walk -------------------------------------------------------------------------------------

def test_health_metadata_versions_and_config_through_tritonclient(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata()["extensions"] == ["binary_tensor_data", "model_configuration"]
    assert client.is_model_ready("blobs") and client.is_model_ready("blobs", "2")
    assert not client.is_model_ready("blobs", "1") and not client.is_model_ready("nope")
    meta = client.get_model_metadata("blobs", "2")
    assert meta == client.get_model_metadata("blobs") and meta["versions"] == ["2"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"] + meta["outputs"]] == [
        ("x", "FP32", [-1, 8]), ("logits", "FP32", [-1, 3])]
    refused(lambda: client.get_model_metadata("blobs", "1"), 404, NOT_SERVED)
    refused(lambda: client.get_model_metadata("nope"), 404, "unknown model 'nope'; this server has blobs, my.model-x")
    assert client.get_model_config("blobs")["max_batch_size"] == 16  # the model_configuration extension
    assert [(m["name"], m["version"]) for m in client.get_model_repository_index()] == [("blobs", "2"),
                                                                                        ("my.model-x", "1")]


def test_infer_binary_json_async_and_aio_match_the_trainer(served, client):
    port, trainer = served
    want = trainer.predict(BATCH)["logits"]
    for binary in (True, False):
        out = httpclient.InferRequestedOutput("logits", binary_data=binary)
        result = client.infer("blobs", [x_input(binary)], outputs=[out], request_id="r7", model_version="2")
        np.testing.assert_allclose(result.as_numpy("logits"), want, rtol=1e-5, atol=1e-6)
        assert result.get_response()["id"] == "r7" and result.get_response()["model_version"] == "2"
    pending = client.async_infer("my.model-x", [x_input()])
    np.testing.assert_allclose(pending.get_result().as_numpy("logits"), want, rtol=1e-5, atol=1e-6)

    async def aio() -> np.ndarray:
        async with aioclient.InferenceServerClient(f"127.0.0.1:{port}") as aclient:
            return (await aclient.infer("blobs", [x_input()])).as_numpy("logits")

    np.testing.assert_allclose(asyncio.run(aio()), want, rtol=1e-5, atol=1e-6)
    refused(lambda: client.infer("blobs", [x_input()], model_version="1"), 404, NOT_SERVED)


def test_url_encoded_names_and_trailing_slashes(http):
    assert http.get("/v2/models/my%2Emodel-x/ready").json() == {"name": "my.model-x", "ready": True}
    assert http.get("/v2/models/bl%6Fbs/versions/%32").json()["versions"] == ["2"]
    reply = http.get("/v2/models/blobs/versions/2/")
    assert reply.status_code == 404 and reply.json()["error"] == (
        "no endpoint GET /v2/models/blobs/versions/2/ (a trailing slash is not redirected: "
        "/v2/models/blobs/versions/2)")


# -- extensions the server does not implement -----------------------------------------------------

def _message(where: str, extension: str, value: object) -> str:
    got = json.dumps(value) if value is None or isinstance(value, bool) else repr(value)  # JSON's null, true, false
    return (f"invalid infer request: {where}: this server does not implement Triton's {extension} extension "
            f"({EXTENSIONS}); leave the parameter out, got {got}")


SHARED = "system_shared_memory or cuda_shared_memory"


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_extension_parameters_are_refused_naming_them(client, binary):
    """Each was ignored: ``class_count=2`` (top-2 classes) got the raw [5, 3] logits, a sequence's
    request ran as a stateless one, an output bound for shared memory came back in the body."""
    classify = httpclient.InferRequestedOutput("logits", binary_data=binary, class_count=2)
    refused(lambda: client.infer("blobs", [x_input(binary)], outputs=[classify]), 400,
            _message("outputs[0].parameters.classification", "classification", 2))
    refused(lambda: client.async_infer("blobs", [x_input(binary)], outputs=[classify]).get_result(), 400,
            _message("outputs[0].parameters.classification", "classification", 2))
    refused(lambda: client.infer("blobs", [x_input(binary)], sequence_id=9, sequence_start=True), 400,
            _message("parameters.sequence_id", "sequence", 9))
    refused(lambda: client.infer("blobs", [x_input(binary)], priority=2), 400,
            _message("parameters.priority", "schedule_policy", 2))
    refused(lambda: client.infer("blobs", [x_input(binary)], timeout=1000), 400,
            _message("parameters.timeout", "schedule_policy", 1000))
    to_memory = httpclient.InferRequestedOutput("logits", binary_data=binary)
    to_memory.set_shared_memory("region", 60)
    refused(lambda: client.infer("blobs", [x_input(binary)], outputs=[to_memory]), 400,
            _message("outputs[0].parameters.shared_memory_region", SHARED, "region"))
    from_memory = httpclient.InferInput("x", [5, 8], "FP32")
    from_memory.set_shared_memory("region", 160)
    refused(lambda: client.infer("blobs", [from_memory]), 400,  # was: has neither 'data' nor binary_data_size
            _message("inputs[0].parameters.shared_memory_region", SHARED, "region"))
    # custom parameters (Triton's parameters extension) are still taken, and ignored
    custom = client.infer("blobs", [x_input(binary)], parameters={"my_setting": 3}).as_numpy("logits")
    np.testing.assert_array_equal(custom, client.infer("blobs", [x_input(binary)]).as_numpy("logits"))


def _body(**extra) -> dict:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}], **extra}


@pytest.mark.parametrize("body, where, extension, value", [
    (_body(outputs=[{"name": "logits", "parameters": {"classification": None}}]),
     "outputs[0].parameters.classification", "classification", None),
    (_body(parameters={"sequence_end": False, "custom": 1}), "parameters.sequence_end", "sequence", False),
    (_body(parameters={"sequence_start": True}), "parameters.sequence_start", "sequence", True),
    (_body(outputs=[{"name": "logits", "parameters": {"shared_memory_offset": 0}}]),
     "outputs[0].parameters.shared_memory_offset", SHARED, 0),
    (_body(outputs=[{"name": "logits", "parameters": {"binary_data": True, "shared_memory_byte_size": 12}}]),
     "outputs[0].parameters.shared_memory_byte_size", SHARED, 12),
])
def test_raw_extension_parameters_are_refused_any_value(http, body, where, extension, value):
    """Present at all, with null or false too: the server does not guess which values ask for nothing."""
    reply = http.post("/v2/models/blobs/infer", json=body)
    assert reply.status_code == 400 and reply.json()["error"] == _message(where, extension, value), reply.text


def test_a_large_body_is_refused_the_same(http):
    """A JSON part of 256 KiB or more is parsed a slice at a time (flat_data): same reply."""
    text = json.dumps(_body(outputs=[{"name": "logits", "parameters": {"classification": 3}}]))
    reply = http.post("/v2/models/blobs/infer", content=text[:-1] + " " * (300 << 10) + "}")
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == _message("outputs[0].parameters.classification", "classification", 3)


def _reserved(where: str, name: str, value: object) -> str:
    return (f"invalid infer request: {where}: parameter {name!r}: Triton reserves the parameter names starting with "
            f"'triton_' for its own features (its parameters extension), and this server implements none of them "
            f"({EXTENSIONS.replace('the ones', 'the extensions')}); leave the parameter out, got {json.dumps(value)}")


@pytest.mark.parametrize("body, where, name, value", [
    (_body(parameters={"triton_enable_empty_final_response": True}), "parameters.triton_enable_empty_final_response",
     "triton_enable_empty_final_response", True),
    (_body(parameters={"custom": 1, "triton_Mode": None}), "parameters", "triton_Mode", None),  # named in the message
    (_body(outputs=[{"name": "logits", "parameters": {"binary_data": False, "triton_x": 2}}]),
     "outputs[0].parameters.triton_x", "triton_x", 2),
    ({"inputs": [{**_body()["inputs"][0], "parameters": {"triton_": False}}]}, "inputs[0].parameters.triton_",
     "triton_", False),
])
def test_parameters_triton_reserves_are_refused_naming_them(http, body, where, name, value):
    """Triton reserves the ``triton_`` names (its parameters extension) and refuses them with a 400
    (tritonclient will not send one); here they were taken and ignored as custom parameters. As a
    large body (parsed a slice at a time) the same."""
    for text in (json.dumps(body), json.dumps(body)[:-1] + " " * (300 << 10) + "}"):
        reply = http.post("/v2/models/blobs/infer", content=text)
        assert reply.status_code == 400 and reply.json()["error"] == _reserved(where, name, value), reply.text
    with pytest.raises(InferenceServerException, match="reserved parameter"):  # tritonclient's own check
        httpclient.InferenceServerClient("127.0.0.1:1").infer("blobs", [x_input()], parameters={name: value})


def test_unknown_parameters_are_still_allowed(http):
    good = http.post("/v2/models/blobs/infer", json=_body()).json()
    for extra in ({"parameters": {"my_flag": True, "headers": {"a": 1}, "triton": 1, "my_triton_x": 2}},
                  {"outputs": [{"name": "logits", "parameters": {"note": "x"}}]}):
        reply = http.post("/v2/models/blobs/infer", json=_body(**extra))
        assert reply.status_code == 200 and reply.json() == good, reply.text


@pytest.mark.parametrize("call, path, extension", [
    (lambda c: c.get_inference_statistics("blobs"), "GET /v2/models/blobs/stats", "statistics"),
    (lambda c: c.load_model("blobs"), "POST /v2/repository/models/blobs/load", "model_repository"),
    (lambda c: c.unload_model("blobs"), "POST /v2/repository/models/blobs/unload", "model_repository"),
    (lambda c: c.get_trace_settings(), "GET /v2/trace/setting", "trace"),
    (lambda c: c.get_log_settings(), "GET /v2/logging", "logging"),
    (lambda c: c.get_system_shared_memory_status(), "GET /v2/systemsharedmemory/status", "system_shared_memory"),
    (lambda c: c.register_cuda_shared_memory("r", b"", 0, 8), "POST /v2/cudasharedmemory/region/r/register",
     "cuda_shared_memory"),
])
def test_an_unimplemented_extension_route_names_the_extension(client, call, path, extension):
    """They were 404s saying only ``no endpoint GET /v2/models/blobs/stats``."""
    refused(lambda: call(client), 404, f"no endpoint {path}: this server does not implement Triton's {extension} "
                                       f"extension ({EXTENSIONS})")


@pytest.mark.parametrize("method, path, allow", [
    ("OPTIONS", "/v2", "GET, HEAD"),
    ("PUT", "/v2/models/blobs", "GET, HEAD"),
    ("DELETE", "/v2/models/blobs/versions/2/ready", "GET, HEAD"),
    ("GET", "/v2/models/blobs/versions/2/infer", "POST"),
    ("PATCH", "/v2/repository/index", "POST"),
])
def test_a_405_names_the_method_the_path_and_what_it_takes(http, method, path, allow):
    """It said ``Method Not Allowed``, the Allow header alone naming the fix."""
    reply = http.request(method, path)
    assert reply.status_code == 405 and reply.headers["allow"] == allow, reply.headers
    assert reply.json() == {"error": f"method {method} is not allowed on {path}; it takes {allow}"}


# -- shapes no array can have ---------------------------------------------------------------------

def _extent_message(shape: list[int], datatype: str, itemsize: int) -> str:
    extent = math.prod(d or 1 for d in shape) * itemsize
    return (f"input 'x': shape {shape} of {datatype} spans {extent} bytes (its nonzero dims times {itemsize}), "
            f"past the limit of {MAX_EXTENT} bytes (numpy's, 2**63 - 1) that holds for an empty tensor too")


@pytest.mark.parametrize("binary", [True, False])
def test_an_empty_tensor_too_large_to_make_names_input_shape_and_limit(http, binary):
    """[2**32, 2**32, 0] got ``cannot reshape array of size 0 into shape (4294967296,4294967296,0)``."""
    shape = [2**32, 2**32, 0]
    if binary:
        head = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": shape,
                                       "parameters": {"binary_data_size": 0}}]}).encode()
        reply = http.post("/v2/models/blobs/infer", content=head,
                          headers={"Inference-Header-Content-Length": str(len(head))})
    else:
        reply = http.post("/v2/models/blobs/infer",
                          json={"inputs": [{"name": "x", "datatype": "FP32", "shape": shape, "data": []}]})
    assert reply.status_code == 400 and reply.json()["error"] == _extent_message(shape, "FP32", 4), reply.text
    # a quarter of it can be made, and is refused by the model for its dims, not by the decoder
    reply = http.post("/v2/models/blobs/infer",
                      json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2**60, 0], "data": []}]})
    assert reply.status_code == 400 and "got float32[1,1152921504606846976,0]" in reply.json()["error"], reply.text


DIMS = [0, 1, 3, 2**31, 2**32 + 1, 2**61, 2**62, 2**63 - 1]


@pytest.mark.parametrize("datatype, itemsize", [("INT8", 1), ("FP16", 2), ("FP32", 4), ("FP64", 8)])
def test_the_shape_check_refuses_exactly_what_numpy_cannot_make(datatype, itemsize):
    """Every empty shape of up to 3 dims from ``DIMS``: decoded exactly when numpy makes it, else
    the message naming the limit (never numpy's ValueError, which the decoder no longer catches)."""
    for rank in (1, 2, 3):
        for shape in itertools.product(DIMS, repeat=rank):
            if 0 not in shape:
                continue
            body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": []}]})
            try:
                np.zeros(0, np.dtype(datatype.lower().replace("fp", "float"))).reshape(shape)
            except ValueError:
                with pytest.raises(ProtocolError) as info:
                    decode_request(body.encode(), None)
                assert str(info.value) == _extent_message(list(shape), datatype, itemsize)
            else:
                assert decode_request(body.encode(), None).inputs["x"].shape == shape


def test_too_many_dims_names_the_limit():
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 65, "data": [1.0]}]})
    with pytest.raises(ProtocolError, match=r"input 'x': shape \[1, .*, 1\] has 65 dims, more than the limit of "
                                            r"64 \(numpy's\)$"):
        decode_request(body.encode(), None)
