"""/openapi.json describes the v2 routes (issue 10, item 12), the infer operation with the real
request and response schemas; and an unexpected exception inside any request is a JSON 500, the
server keeps serving (item 10)."""

from __future__ import annotations

import httpx
import pytest

from graphc.serving.kserve import app, repository
from graphc.serving.serve import create_app
from serve_util import mixed_model, running_server

ROUTES = {"/v2/health/live": "get", "/v2/health/ready": "get", "/v2": "get", "/v2/repository/index": "post",
          "/v2/models/{name}": "get", "/v2/models/{name}/versions/{version}": "get",
          "/v2/models/{name}/ready": "get", "/v2/models/{name}/versions/{version}/ready": "get",
          "/v2/models/{name}/config": "get", "/v2/models/{name}/versions/{version}/config": "get",
          "/v2/models/{name}/infer": "post", "/v2/models/{name}/versions/{version}/infer": "post"}


@pytest.fixture(scope="module")
def address():
    with running_server(create_app(mixed_model(), name="mixed", backend="numpy")) as address:
        yield address


@pytest.fixture(scope="module")
def schema(address):
    reply = httpx.get(f"http://{address}/openapi.json")
    assert reply.status_code == 200
    return reply.json()


def resolve(schema, node):
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def test_every_v2_route_is_described(schema):
    assert schema["openapi"].startswith("3.")
    for path, method in ROUTES.items():
        assert method in schema["paths"][path], path
    operation_ids = [op["operationId"] for item in schema["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))


def test_infer_schema_is_the_protocol(schema):
    infer = schema["paths"]["/v2/models/{name}/infer"]["post"]
    body = resolve(schema, infer["requestBody"]["content"]["application/json"]["schema"])
    assert set(body["required"]) == {"inputs"}
    items = body["properties"]["inputs"]["items"]
    assert items["discriminator"]["propertyName"] == "datatype"
    assert "BYTES" not in items["discriminator"]["mapping"] and "FP32" in items["discriminator"]["mapping"]
    fp32 = resolve(schema, {"$ref": items["discriminator"]["mapping"]["FP32"]})
    assert fp32["properties"]["shape"]["items"] == {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
    data = resolve(schema, fp32["properties"]["data"]["anyOf"][0])["anyOf"][0]  # the flat form
    value = resolve(schema, data["items"])
    # FP32's largest value and what rounds to it (half a step past it rounds to infinity)
    assert value["type"] == "number" and value["exclusiveMaximum"] == 2.0**128 - 2.0**103
    int8 = resolve(schema, {"$ref": items["discriminator"]["mapping"]["INT8"]})
    value = resolve(schema, resolve(schema, int8["properties"]["data"]["anyOf"][0])["anyOf"][0]["items"])
    assert (value["type"], value["minimum"], value["maximum"]) == ("integer", -128, 127)
    params = resolve(schema, body["properties"]["parameters"]["anyOf"][0])
    assert params["properties"]["binary_data_output"]["anyOf"][0] == {"type": "boolean"}
    assert "application/octet-stream" in infer["requestBody"]["content"]
    assert any(p["name"] == "Inference-Header-Content-Length" for p in infer["parameters"])
    response = resolve(schema, infer["responses"]["200"]["content"]["application/json"]["schema"])
    assert {"model_name", "outputs"} <= set(response["required"])
    for code in ("400", "404", "413"):
        error = resolve(schema, infer["responses"][code]["content"]["application/json"]["schema"])
        assert error["properties"]["error"]["type"] == "string"


def test_unexpected_exceptions_are_json_500s_and_the_server_keeps_serving(address, monkeypatch):
    def boom(*_args, **_kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(repository.ServedModel, "infer", boom)
    payload = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    reply = httpx.post(f"http://{address}/v2/models/mixed/infer", json=payload)
    assert reply.status_code == 500 and reply.json() == {"error": "internal error: RuntimeError: boom"}
    # a route answered by FastAPI's router: the same JSON, and nothing escapes to uvicorn
    monkeypatch.setattr(app.ModelRegistry, "get", boom)
    reply = httpx.get(f"http://{address}/v2/models/mixed")
    assert reply.status_code == 500 and reply.json() == {"error": "internal error: RuntimeError: boom"}
    monkeypatch.undo()
    assert httpx.get(f"http://{address}/v2/models/mixed").json()["name"] == "mixed"
    assert httpx.get(f"http://{address}/v2/health/live").json() == {"live": True}
