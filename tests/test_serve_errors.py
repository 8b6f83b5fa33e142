"""Bad requests never hurt the server: each gets a 4xx with {"error": ...} naming the problem,
and the good request sent right after it still succeeds."""

from __future__ import annotations

import gzip
import json
import socket

import httpx
import numpy as np
import pytest

from graphc.serving.serve import create_app
from serve_util import mixed_model, running_server

LIMIT = 64 << 10
X = np.arange(8, dtype=np.float32).reshape(2, 4)
IDX = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
MASK = np.array([[True, False, True, False]] * 2)
RNG = np.random.default_rng(0)


def tensor(name, array, datatype, data=None, shape=None):
    return {"name": name, "shape": list(array.shape) if shape is None else shape, "datatype": datatype,
            "data": array.ravel().tolist() if data is None else data}


def good_inputs():
    return [tensor("x", X, "FP32"), tensor("idx", IDX, "INT64"), tensor("mask", MASK, "BOOL")]


def binary_request(arrays, sizes=None, extra=b""):
    """(body, header length) of a binary-extension request; ``sizes`` overrides binary_data_size."""
    names = {"x": "FP32", "idx": "INT64", "mask": "BOOL"}
    inputs = [{"name": n, "shape": list(a.shape), "datatype": names[n],
               "parameters": {"binary_data_size": (sizes or {}).get(n, a.nbytes)}} for n, a in arrays.items()]
    header = json.dumps({"inputs": inputs}).encode()
    return header + b"".join(a.tobytes() for a in arrays.values()) + extra, len(header)


@pytest.fixture(scope="module")
def http():
    with running_server(create_app(mixed_model(), name="mixed", backend="ort-cpu", max_body_bytes=LIMIT)) as address:
        with httpx.Client(base_url=f"http://{address}", timeout=30) as client:
            yield client


def check(http, reply, status, match):
    """``reply`` is the expected error; then a good JSON and a good binary request both work."""
    assert reply.status_code == status, reply.text
    message = reply.json()["error"]
    assert match in message, message
    ok = http.post("/v2/models/mixed/infer", json={"inputs": good_inputs()})
    assert ok.status_code == 200, ok.text
    np.testing.assert_array_equal(ok.json()["outputs"][1]["data"], (IDX + 1).ravel().tolist())
    body, length = binary_request({"x": X, "idx": IDX, "mask": MASK})
    ok = http.post("/v2/models/mixed/infer", content=body, headers={"Inference-Header-Content-Length": str(length)})
    assert ok.status_code == 200, ok.text


def infer(http, payload, path="/v2/models/mixed/infer", **kwargs):
    return http.post(path, json=payload, **kwargs) if not isinstance(payload, bytes) else \
        http.post(path, content=payload, **kwargs)


CASES = {
    "unknown model": ("/v2/models/nope/infer", {"inputs": []}, 404, "unknown model 'nope'; this server has mixed"),
    "unknown version": ("/v2/models/mixed/versions/7/infer", {"inputs": []}, 404, "no version '7'"),
    "unknown input": (None, {"inputs": good_inputs() + [tensor("z", X, "FP32")]}, 400, "unknown input 'z'"),
    "missing input": (None, {"inputs": good_inputs()[:2]}, 400, "missing input 'mask'"),
    "wrong datatype": (None, {"inputs": [tensor("x", X, "FP64")] + good_inputs()[1:]}, 400,
                       "input 'x': datatype FP64, model 'mixed' expects FP32"),
    "unknown datatype": (None, {"inputs": [tensor("x", X, "FLOAT")] + good_inputs()[1:]}, 400,
                         "unknown datatype 'FLOAT'"),
    "BYTES datatype": (None, {"inputs": [tensor("x", X, "BYTES", data=["a"] * 8)] + good_inputs()[1:]}, 400,
                       "BYTES (strings) is not supported"),
    "shape vs data length": (None, {"inputs": [tensor("x", X, "FP32", shape=[3, 4])] + good_inputs()[1:]}, 400,
                             "shape [3, 4] needs 12 elements, data has 8"),
    "wrong rank": (None, {"inputs": [tensor("x", X, "FP32", shape=[8])] + good_inputs()[1:]}, 400, "input 'x'"),
    "fixed dim": (None, {"inputs": [tensor("x", np.zeros((2, 2), np.float32), "FP32")] + good_inputs()[1:]}, 400,
                  "input 'x'"),
    "floats for INT64": (None, {"inputs": good_inputs()[:1] + [tensor("idx", IDX, "INT64", data=[1.5] * 6),
                                                              good_inputs()[2]]}, 400,
                         "inputs[1].data[0]: Input should be a valid integer, got 1.5"),
    "INT64 overflow": (None, {"inputs": good_inputs()[:1] + [tensor("idx", IDX, "INT64", data=[2**63] + [1] * 5),
                                                            good_inputs()[2]]}, 400,
                       "inputs[1].data[0]: Input should be less than or equal to 9223372036854775807"),
    "ragged data": (None, {"inputs": [tensor("x", X, "FP32", data=[[1, 2, 3, 4], [5]])] + good_inputs()[1:]}, 400,
                    "input 'x'"),
    "negative dim": (None, {"inputs": [tensor("x", X, "FP32", shape=[-2, -4])] + good_inputs()[1:]}, 400,
                     "inputs[0].shape[0]: Input should be greater than or equal to 0, got -2"),
    "no data": (None, {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32"}] + good_inputs()[1:]}, 400,
                "neither 'data' nor parameters.binary_data_size"),
    "unknown output": (None, {"inputs": good_inputs(), "outputs": [{"name": "zz"}]}, 400, "unknown output 'zz'"),
    "not an object": (None, [1, 2, 3], 400, "invalid infer request"),
    "inputs missing": (None, {"outputs": []}, 400, "inputs"),
    "malformed JSON": (None, b'{"inputs": [', 400, "malformed JSON in the request body (its JSON part, KServe's "
                       "inference header): Invalid JSON: EOF while parsing a list at line 1 column 12"),
    "not JSON at all": (None, b"\x00\xff garbage", 400, "malformed JSON in the request body (its JSON part, "
                        "KServe's inference header): Invalid JSON: expected value at line 1 column 1"),
}


def with_x(data=None, shape=None, **request):
    """A good request whose x input has ``data`` / ``shape`` replaced, plus top-level ``request`` keys."""
    return {"inputs": [tensor("x", X, "FP32", data=data, shape=shape)] + good_inputs()[1:], **request}


def with_idx(data):
    return {"inputs": good_inputs()[:1] + [tensor("idx", IDX, "INT64", data=data)] + good_inputs()[2:]}


# Nothing is coerced (issue 10, item 3) and malformed data is a 400, never a 500 (item 10): each
# error names the field as a path into the request.
STRICT_CASES = {
    "null in FP32 data": (with_x(data=[0.5, None] * 4), "inputs[0].data[1]: Input should be a valid number, got null"),
    "1e400 in FP32 data": (json.dumps(with_x(data=[1.5] * 8)).replace("1.5", "1e400", 1).encode(),
                           "inputs[0].data[0]: Input should be a finite number, got inf"),
    "NaN literal in FP32 data": (json.dumps(with_x(data=[1.5] * 8)).replace("1.5", "NaN", 1).encode(),
                                 "inputs[0].data[0]: Input should be a finite number"),
    "beyond FP32's range": (with_x(data=[1e39] + [0] * 7), "inputs[0].data[0]: Input should be less than 34028235677973366"),
    "string dim": (with_x(shape=["2", 4]), "inputs[0].shape[0]: Input should be a valid integer, got '2'"),
    "boolean dim": (with_x(shape=[True, 4]), "inputs[0].shape[0]: Input should be a valid integer, got true"),
    "float dim": (with_x(shape=[2.0, 4]), "inputs[0].shape[0]: Input should be a valid integer, got 2.0"),
    "binary_data_output as a string": (with_x(parameters={"binary_data_output": "false"}),
                                       "parameters.binary_data_output: Input should be a valid boolean, got 'false'"),
    "binary_data as a number": ({"inputs": good_inputs(), "outputs": [{"name": "y", "parameters": {"binary_data": 0}}]},
                                "outputs[0].parameters.binary_data: Input should be a valid boolean, got 0"),
    "binary_data_size as a string": ({"inputs": [{**tensor("x", X, "FP32"), "parameters": {"binary_data_size": "32"}}]
                                      + good_inputs()[1:]},
                                     "inputs[0].parameters.binary_data_size: Input should be a valid integer"),
    "boolean in FP32 data": (with_x(data=[True] + [0.5] * 7), "inputs[0].data[0]: Input should be a valid number, got true"),
    "dict inside data": (with_x(data=[0.5] * 7 + [{"a": 1}]), "inputs[0].data[7]: Input should be a valid number"),
    "null in INT64 data": (with_idx([1, 2, None, 4, 5, 6]), "inputs[1].data[2]: Input should be a valid integer, got null"),
    "boolean in INT64 data": (with_idx([1, True, 3, 4, 5, 6]), "inputs[1].data[1]: Input should be a valid integer, got true"),
    "dict in nested INT64 data": (with_idx([[1, 2, 3], [4, {"b": [1]}, 6]]), "inputs[1].data[1][1]: Input should be a valid integer"),
    "mixed nesting": (with_x(data=[[0.5] * 4, 0.5]), "inputs[0].data[1]: Input should be a valid array, got 0.5"),
    "integer for BOOL": ({"inputs": good_inputs()[:2] + [tensor("mask", MASK, "BOOL", data=[1, 0] * 4)]},
                         "inputs[2].data[0]: Input should be a valid boolean, got 1"),
    "name not a string": ({"inputs": [{**tensor("x", X, "FP32"), "name": 7}] + good_inputs()[1:]},
                          "inputs[0].name: Input should be a valid string, got 7"),
    "id not a string": (with_x(id=5), "id: Input should be a valid string, got 5"),
    "both data and binary_data_size": ({"inputs": [{**tensor("x", X, "FP32"), "parameters": {"binary_data_size": 32}}]
                                        + good_inputs()[1:]}, "input 'x' has both 'data' and parameters.binary_data_size"),
    # quoted as JSON writes them, not as Python does (None, True, False)
    "null for the inputs list": ({"inputs": None}, "inputs: Input should be a valid array, got null"),
    "null for a name": ({"inputs": [{**tensor("x", X, "FP32"), "name": None}] + good_inputs()[1:]},
                        "inputs[0].name: Input should be a valid string, got null"),
    "false in nested INT64 data": (with_idx([[1, 2, 3], [4, 5, False]]),
                                   "inputs[1].data[1][2]: Input should be a valid integer, got false"),
    "huge zero-size shape": (with_x(data=[], shape=[0, 2**62, 2**62]), "input 'x': shape [0, 4611686018427387904"),
}


@pytest.mark.parametrize("case", STRICT_CASES)
def test_nothing_is_coerced_and_malformed_data_is_a_400(http, case):
    payload, match = STRICT_CASES[case]
    check(http, infer(http, payload), 400, match)


@pytest.mark.parametrize("case", CASES)
def test_bad_json_request(http, case):
    path, payload, status, match = CASES[case]
    check(http, infer(http, payload, path or "/v2/models/mixed/infer"), status, match)


def test_duplicate_input(http):
    check(http, infer(http, {"inputs": good_inputs() + good_inputs()[:1]}), 400, "input 'x' is given twice")


def binary_post(http, body, length):
    return http.post("/v2/models/mixed/infer", content=body, headers={"Inference-Header-Content-Length": str(length)})


def test_truncated_binary_payload(http):
    body, length = binary_request({"x": X, "idx": IDX, "mask": MASK})
    check(http, binary_post(http, body[:-5], length), 400, "input 'mask': binary data truncated")


def test_binary_size_not_matching_shape(http):
    body, length = binary_request({"x": X, "idx": IDX, "mask": MASK}, sizes={"x": 16})
    check(http, binary_post(http, body, length), 400, "input 'x': shape [2, 4] of FP32 needs 32 bytes")


def test_extra_binary_bytes(http):
    body, length = binary_request({"x": X, "idx": IDX, "mask": MASK}, extra=b"tail")
    check(http, binary_post(http, body, length), 400, "4 bytes of binary data that no input claims")


@pytest.mark.parametrize("byte", [2, 255])
def test_binary_bool_bytes_other_than_0_and_1_are_refused(http, byte):
    """numpy read such a byte as a bool that is neither: the backends disagreed (Where took x's branch on
    onnxruntime, xw's on numpy) and Not sent back BOOL bytes of 253 or 254 (onnxruntime)."""
    body, length = binary_request({"x": X, "idx": IDX, "mask": MASK})
    body = bytearray(body)
    body[-MASK.size + 5] = byte  # the mask's element [1, 1]
    check(http, binary_post(http, bytes(body), length), 400,
          f"input 'mask': BOOL element 5 (flat index) is byte {byte}; BOOL binary data holds one byte per element, "
          "0 (false) or 1 (true)")


@pytest.mark.parametrize("value, match", [
    ("99999", "but the body has only"), ("ten", "bad Inference-Header"),
    # more digits than int() converts (4300) was a 500; past 20 digits no length is meant
    ("9" * 5000, "expected a byte count of at most 20 digits"), ("1" * 21, "at most 20 digits"),
    ("0" * 30 + "99999", "but the body has only")])
def test_bad_header_length(http, value, match):
    body, _ = binary_request({"x": X, "idx": IDX, "mask": MASK})
    check(http, binary_post(http, body, value), 400, match)


def test_oversized_body_by_content_length(http):
    big = {"inputs": [tensor("x", np.zeros((1, LIMIT // 4), np.float32), "FP32")]}
    check(http, infer(http, big), 413, f"exceeds the server's limit of {LIMIT} bytes")


def test_oversized_body_while_streaming(http):
    chunks = (b"x" * 4096 for _ in range(LIMIT // 4096 + 4))  # chunked: no Content-Length to check
    check(http, http.post("/v2/models/mixed/infer", content=chunks), 413, "exceeds the server's limit")


@pytest.mark.parametrize("path, length", [("/v2/models/mixed/infer", 10 * LIMIT), ("/v2/models/nope/infer", 100),
                                          ("/v2/health/live", 100)])
def test_an_answer_before_the_100_continue_closes_the_connection(http, path, length):
    """A client that waits for ``100 Continue`` and gets an answer instead never sends its body;
    the connection stayed open for it, and the client's next request on it was read as that body."""
    sock = socket.create_connection((http.base_url.host, http.base_url.port), timeout=10)
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-Continue\r\n\r\n"
                 % (path.encode(), length))
    reply = b""
    sock.settimeout(5)
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except TimeoutError:
        pytest.fail(f"the connection was kept open after {reply[:60]!r}")
    finally:
        sock.close()
    head = reply.split(b"\r\n\r\n", 1)[0].lower()
    assert not head.startswith(b"http/1.1 100") and b"connection: close" in head, reply


def test_gzip_bodies_are_read_and_bombs_refused(http):
    body = gzip.compress(json.dumps({"inputs": good_inputs()}).encode())
    reply = http.post("/v2/models/mixed/infer", content=body, headers={"Content-Encoding": "gzip"})
    assert reply.status_code == 200, reply.text
    bomb = gzip.compress(b" " * (LIMIT * 4))
    check(http, http.post("/v2/models/mixed/infer", content=bomb, headers={"Content-Encoding": "gzip"}),
          413, "decompressed request body exceeds")
    check(http, http.post("/v2/models/mixed/infer", content=b"nope", headers={"Content-Encoding": "gzip"}),
          400, "not valid gzip data")
    check(http, http.post("/v2/models/mixed/infer", content=body[:-12], headers={"Content-Encoding": "gzip"}),
          400, "request body is gzip data cut short")
    check(http, http.post("/v2/models/mixed/infer", content=body + body, headers={"Content-Encoding": "gzip"}),
          400, f"request body has {len(body)} bytes after its gzip stream")
    check(http, http.post("/v2/models/mixed/infer", content=b"{}", headers={"Content-Encoding": "br"}),
          415, "unsupported Content-Encoding 'br'")


def test_unknown_routes_and_methods(http):
    check(http, http.get("/v2/models/nope"), 404, "unknown model 'nope'")
    check(http, http.get("/v2/models/mixed/versions/3/ready"), 404, "no version '3'")
    check(http, http.get("/v3/anything"), 404, "no endpoint GET /v3/anything: the server's routes are under /v2")
    # a browser's first look: it said "(a trailing slash is not redirected: )", a fix that names no path
    check(http, http.get("/"), 404, "no endpoint GET /: the server's routes are under /v2 (GET /openapi.json lists them)")
    check(http, http.get("/v2/models/mixed/infer"), 405, "method GET is not allowed on /v2/models/mixed/infer; it takes POST")


def _sent(http, request_line: bytes) -> tuple[int, str]:
    """(status, error) of a request sent as ``request_line`` exactly (httpx cannot send ``OPTIONS *``)."""
    with socket.create_connection((http.base_url.host, http.base_url.port), timeout=10) as sock:
        sock.sendall(request_line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, body = reply.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)["error"]


OFF_V2 = "the server's routes are under /v2 (GET /openapi.json lists them)"


@pytest.mark.parametrize("request_line, status, message", [
    # Starlette's URL quoted it as "/*"
    (b"OPTIONS * HTTP/1.1", 404, f"no endpoint OPTIONS *: {OFF_V2}"),
    # the router matched the decoded path, the message quoted it: "GET /v2/models/a/b", a path not sent
    (b"GET /v2/models/a%2Fb HTTP/1.1", 404, "no endpoint GET /v2/models/a%2Fb"),
    (b"GET /v2/models/a%2Fb/x%20y?q=1 HTTP/1.1", 404, "no endpoint GET /v2/models/a%2Fb/x%20y"),
    (b"GET /v3/%41 HTTP/1.1", 404, f"no endpoint GET /v3/%41: {OFF_V2}"),
    (b"GET /v2/models/mi%78ed/infer HTTP/1.1", 405, "method GET is not allowed on /v2/models/mi%78ed/infer; it takes POST"),
])
def test_errors_quote_the_request_target_as_sent(http, request_line, status, message):
    got_status, error = _sent(http, request_line)
    assert (got_status, error) == (status, message)


def test_empty_outputs_list_means_every_output(http):
    reply = http.post("/v2/models/mixed/infer", json={"inputs": good_inputs(), "outputs": []})
    assert [o["name"] for o in reply.json()["outputs"]] == ["y", "s", "m"]


def _cast_model(datatype: str):
    """y = Cast(x, float32) for an x of ``datatype``: every wire dtype decodes the same values."""
    import onnx
    from onnx import TensorProto, helper

    from graphc.model.dtypes import to_onnx
    from graphc.serving.kserve.protocol import DATATYPES

    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "cast",
                              [helper.make_tensor_value_info("x", to_onnx(DATATYPES[datatype]), [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("datatype", ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "FP16", "BF16",
                                      "FP64"])
def test_other_datatypes_in_json_and_binary(datatype):
    from graphc.model.dtypes import to_numpy
    from graphc.serving.kserve.protocol import DATATYPES

    values = np.array([1, 2], dtype=to_numpy(DATATYPES[datatype]))
    with running_server(create_app(_cast_model(datatype), name="cast", backend="numpy")) as address:
        with httpx.Client(base_url=f"http://{address}") as http:
            item = {"name": "x", "shape": [2], "datatype": datatype}
            reply = http.post("/v2/models/cast/infer", json={"inputs": [{**item, "data": [1, 2]}]})
            assert reply.json()["outputs"][0]["data"] == [1.0, 2.0], reply.text
            header = json.dumps({"inputs": [{**item, "parameters": {"binary_data_size": values.nbytes}}]}).encode()
            reply = http.post("/v2/models/cast/infer", content=header + values.tobytes(),
                              headers={"Inference-Header-Content-Length": str(len(header))})
            assert reply.json()["outputs"][0]["data"] == [1.0, 2.0], reply.text


@pytest.mark.parametrize(("datatype", "data", "bad"), [("UINT8", [300, 1], "300"), ("UINT8", [-1, 1], "-1"),
                                                       ("INT8", [1, -129], "-129")])
def test_json_integers_out_of_range_are_refused_not_wrapped(datatype, data, bad):
    with running_server(create_app(_cast_model(datatype), name="cast", backend="numpy")) as address:
        with httpx.Client(base_url=f"http://{address}") as http:
            item = {"name": "x", "shape": [2], "datatype": datatype, "data": data}
            reply = http.post("/v2/models/cast/infer", json={"inputs": [item]})
            assert reply.status_code == 400 and f"inputs[0].data[{data.index(int(bad))}]: Input should be" in \
                reply.json()["error"] and f"got {bad}" in reply.json()["error"], reply.text
            reply = http.post("/v2/models/cast/infer", json={"inputs": [{**item, "data": [1, 2]}]})
            assert reply.json()["outputs"][0]["data"] == [1.0, 2.0], reply.text


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_json_floats_that_round_to_the_largest_finite_value_are_taken_as_torch_rounds_them(backend):
    """FP16/BF16/FP32 JSON data is refused only where the value would round to infinity. It was
    refused past ``finfo.max`` itself, so FLT_MAX written as C (3.40282347e+38) or numpy and Rust's
    shortest float32 (3.4028235e+38) write it was a 400; torch (float64 -> dtype, bfloat16 through
    float32) decides which numbers are finite and what they become."""
    torch = pytest.importorskip("torch")
    import ml_dtypes

    from graphc.model.dtypes import to_numpy
    from graphc.serving.kserve.protocol import DATATYPES

    kinds = {"FP16": torch.float16, "BF16": torch.bfloat16, "FP32": torch.float32}
    for datatype, kind in kinds.items():
        top = float(ml_dtypes.finfo(to_numpy(DATATYPES[datatype])).max)
        half_step = 2.0 ** (np.log2(top) // 1 - {"FP16": 10, "BF16": 7, "FP32": 23}[datatype] - 1)
        # (0.99 of the half step, not the float64 just below it: torch rounds float64 to float16
        # through float32 too, numpy, as IEEE, directly)
        values = [top, float(str(np.float32(top))), top + half_step / 2, top + 0.99 * half_step, top + half_step,
                  2 * top]
        with running_server(create_app(_cast_model(datatype), name="cast", backend=backend)) as address:
            with httpx.Client(base_url=f"http://{address}") as http:
                for value in values:
                    want = torch.tensor([value, -value], dtype=torch.float64).to(kind).float()
                    item = {"name": "x", "shape": [2], "datatype": datatype, "data": [value, -value]}
                    reply = http.post("/v2/models/cast/infer", json={"inputs": [item]})
                    if torch.isfinite(want).all():
                        assert reply.status_code == 200, (datatype, value, reply.text)
                        assert reply.json()["outputs"][0]["data"] == want.tolist(), (datatype, value)
                    else:
                        assert reply.status_code == 400 and "inputs[0].data[0]: Input should be less than" in \
                            reply.json()["error"], (datatype, value, reply.text)


def test_json_with_too_many_lists_and_objects_is_refused_before_it_holds_the_server():
    """Validating a JSON list or object holds the GIL for 3-18 us, the event loop with it: 2 MB of
    ``outputs`` entries held every connection, health checks included, for seconds (32 MB: 38 s).
    Past MAX_JSON_CONTAINERS the request gets a 413 at once; nested data within it is still served."""
    import threading
    import time

    from graphc.serving.kserve.protocol import MAX_JSON_CONTAINERS

    many = b'{"inputs":[],"outputs":[' + b'{"name":"y","parameters":{}},' * (MAX_JSON_CONTAINERS // 2) + b'{"name":"y"}]}'
    rows = MAX_JSON_CONTAINERS // 4  # x nested as rows of 4: rows + 1 lists
    x = RNG.standard_normal((rows, 4)).astype(np.float32)
    nested = {"inputs": [tensor("x", x, "FP32", data=x.tolist()), tensor("idx", np.zeros((rows, 3), np.int64), "INT64"),
                         tensor("mask", np.ones((rows, 4), bool), "BOOL")], "outputs": [{"name": "y"}]}
    app = create_app(mixed_model(), name="mixed", backend="ort-cpu")
    with running_server(app) as address, httpx.Client(base_url=f"http://{address}", timeout=60) as http:
        replies, worst = [], 0.0
        sender = threading.Thread(target=lambda: replies.append(http.post("/v2/models/mixed/infer", content=many)))
        sender.start()
        while sender.is_alive():
            start = time.monotonic()
            assert httpx.get(f"http://{address}/v2/health/live", timeout=60).status_code == 200
            worst = max(worst, time.monotonic() - start)
        assert replies[0].status_code == 413, replies[0].text
        assert f"lists and objects ('[' and '{{' counted), more than the server's limit of {MAX_JSON_CONTAINERS}" in \
            replies[0].json()["error"]
        # the old parse held it 5.9 s here; 2 s leaves a loaded CI machine room (0.29 s measured quiet)
        assert worst < 2.0, f"a health check waited {worst:.2f} s"
        reply = http.post("/v2/models/mixed/infer", json=nested)
        assert reply.status_code == 200, reply.text[:300]
        w = np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)
        np.testing.assert_allclose(np.array(reply.json()["outputs"][0]["data"]).reshape(rows, 4), x @ w, rtol=1e-6,
                                   atol=1e-6)
