"""Hypothesis fuzzes the infer route (issue 10, items 3, 10, 12): valid requests (JSON and binary
extension) with one to three mutations anywhere in their JSON, binary section, headers or
encoding. Every reply is a 2xx or a 4xx with ``{"error": ...}``, never a 5xx, and the good
request sent right after each still succeeds. Datatypes come from the server's /openapi.json."""

from __future__ import annotations

import copy
import gzip
import json
import zlib

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphc.serving.serve import create_app
from serve_util import mixed_feeds, mixed_model, running_server

DATATYPES = {"x": "FP32", "idx": "INT64", "mask": "BOOL"}
FEEDS = mixed_feeds(2)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@pytest.fixture(scope="module")
def http():
    with running_server(create_app(mixed_model(), name="mixed", backend="ort-cpu", max_body_bytes=1 << 20,
                                   max_json_bytes=256 << 10)) as address:
        with httpx.Client(base_url=f"http://{address}", timeout=30) as client:
            yield client


@pytest.fixture(scope="module")
def schema_datatypes(http):
    """The datatypes the published schema allows for an input (its discriminator's mapping)."""
    schema = http.get("/openapi.json").json()
    mapping = schema["components"]["schemas"]["InferRequest"]["properties"]["inputs"]["items"]["discriminator"]
    return sorted(mapping["mapping"])


def json_request() -> dict:
    return {"id": "r", "inputs": [{"name": k, "shape": list(v.shape), "datatype": DATATYPES[k],
                                   "data": v.ravel().tolist()} for k, v in FEEDS.items()],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}


def binary_request() -> tuple[dict, bytes]:
    header = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": DATATYPES[k],
                          "parameters": {"binary_data_size": v.nbytes}} for k, v in FEEDS.items()],
              "parameters": {"binary_data_output": True}}
    return header, b"".join(v.tobytes() for v in FEEDS.values())


SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.sampled_from(["", "2", "false", "true", "FP32", "BYTES", "x", "y", "\x00", 1e308, -0.0, 2**63, 2**64]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
    st.sampled_from(["name", "shape", "datatype", "data", "parameters", "binary_data_size", "binary_data",
                     "binary_data_output", "inputs", "outputs", "id", "zz"]), inner, max_size=4), max_leaves=12)


def places(node, parent=None, key=None):
    """Every (container, key) in a JSON tree, so that a mutation can hit any of them."""
    if parent is not None:
        yield parent, key
    if isinstance(node, dict):
        for k, v in node.items():
            yield from places(v, node, k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from places(v, node, i)


def mutate(data, doc, datatypes):
    """One to three random replacements, deletions or insertions anywhere in ``doc``."""
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        spots = list(places(doc))
        if not spots:
            return data.draw(VALUES)
        parent, key = data.draw(st.sampled_from(spots))
        action = data.draw(st.sampled_from(["replace", "delete", "insert", "datatype"]))
        if action == "replace":
            parent[key] = data.draw(VALUES)
        elif action == "delete":
            del parent[key]
        elif action == "datatype" and isinstance(parent, dict) and "datatype" in parent:
            parent["datatype"] = data.draw(st.sampled_from(datatypes))
        elif isinstance(parent, list):
            parent.insert(key, data.draw(VALUES))
        else:
            parent[data.draw(st.sampled_from(["zz", "data", "parameters", "shape"]))] = data.draw(VALUES)
    return doc


def encode(data, body: bytes, headers: dict) -> tuple[bytes, dict]:
    """Maybe compress the body (or claim an encoding it does not have)."""
    encoding = data.draw(st.sampled_from(["identity", "identity", "gzip", "deflate", "gzip-lie", "br"]))
    if encoding == "gzip":
        return gzip.compress(body), {**headers, "Content-Encoding": "gzip"}
    if encoding == "deflate":
        return zlib.compress(body), {**headers, "Content-Encoding": "deflate"}
    if encoding == "gzip-lie":
        return body, {**headers, "Content-Encoding": "gzip"}
    if encoding == "br":
        return body, {**headers, "Content-Encoding": "br"}
    return body, headers


def assert_answered(http, reply: httpx.Response) -> None:
    assert reply.status_code < 500, reply.text
    if reply.status_code >= 400:
        assert isinstance(reply.json()["error"], str) and reply.json()["error"], reply.text
    good = http.post("/v2/models/mixed/infer", json=json_request())
    assert good.status_code == 200, good.text
    np.testing.assert_allclose(good.json()["outputs"][0]["data"],
                               np.where(FEEDS["mask"], FEEDS["x"] @ np.linspace(-1, 1, 16, dtype=np.float32)
                                        .reshape(4, 4), FEEDS["x"]).ravel(), rtol=1e-6)


@FUZZ
@given(data=st.data())
def test_fuzzed_json_requests_get_4xx_never_5xx(http, schema_datatypes, data):
    doc = mutate(data, copy.deepcopy(json_request()), schema_datatypes)
    body, headers = encode(data, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert_answered(http, http.post("/v2/models/mixed/infer", content=body, headers=headers))


@FUZZ
@given(data=st.data())
def test_fuzzed_binary_requests_get_4xx_never_5xx(http, schema_datatypes, data):
    header, payload = binary_request()
    if data.draw(st.booleans(), label="mutate header"):
        header = mutate(data, header, schema_datatypes)
    head = json.dumps(header).encode()
    cut = data.draw(st.integers(-8, 8), label="payload change")
    payload = payload[:cut] if cut < 0 else payload + data.draw(st.binary(min_size=cut, max_size=cut))
    length = data.draw(st.sampled_from([str(len(head)), str(len(head) - 3), str(len(head) + 5), "-1", "x", "0"]))
    body, headers = encode(data, head + payload, {"Inference-Header-Content-Length": length})
    assert_answered(http, http.post("/v2/models/mixed/infer", content=body, headers=headers))


@FUZZ
@given(body=st.binary(max_size=300))
def test_random_bytes_get_4xx_never_5xx(http, body):
    assert_answered(http, http.post("/v2/models/mixed/infer", content=body))
