"""``request_timeout`` (``graphc serve --request-timeout``): a request the model runs on for ever
(a Loop whose trip count the request feeds) gets a 504 naming the model and the limit once the
limit passes; its run is stopped, so the worker thread and (numpy) the model's lock are free
again, and health checks and other models are answered all the while."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import onnx
import pytest

from graphc.serving.kserve.app import create_app
from graphc.serving.kserve.repository import load_models
from cli_util import one_line_error, run_cli
from serve_util import loop_model, mixed_feeds, mixed_model, running_server, serve_process
from stuck_loops import LONG_TRIPS, STUCK

LIMIT = 0.5
ENDLESS = 10**12  # trips: hours on either backend
BACKENDS = ["numpy", "ort-cpu"]


def loop_request(n: int, x: float = 0.0) -> dict:
    return {"inputs": [{"name": "n", "shape": [], "datatype": "INT64", "data": [n]},
                       {"name": "x", "shape": [1], "datatype": "FP32", "data": [x]}]}


def mixed_request() -> dict:
    feeds = mixed_feeds(2)
    types = {"x": "FP32", "idx": "INT64", "mask": "BOOL"}
    return {"inputs": [{"name": k, "shape": list(v.shape), "datatype": types[k], "data": v.ravel().tolist()}
                       for k, v in feeds.items()]}


@pytest.fixture(params=BACKENDS)
def server(request):
    models = {**load_models(loop_model(), name="loop", backend=request.param),
              **load_models(mixed_model(), name="mixed", backend=request.param)}
    with running_server(create_app(models, request_timeout=LIMIT)) as address:
        yield f"http://{address}", request.param


def post(base: str, model: str, payload: dict) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    reply = httpx.post(f"{base}/v2/models/{model}/infer", json=payload, timeout=8)
    return reply, time.monotonic() - start


def check_timed_out(reply: httpx.Response, took: float) -> str:
    assert reply.status_code == 504, reply.text
    message = reply.json()["error"]
    assert f"model 'loop' did not answer within the server's limit of {LIMIT:g} s for one request " \
           "(--request-timeout)" in message, message
    assert took < LIMIT + 2.0, took
    return message


def test_a_request_that_runs_for_ever_gets_a_504_while_the_server_answers_others(server):
    base, _ = server
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        endless = [pool.submit(post, base, "loop", loop_request(ENDLESS)) for _ in range(2)]
        time.sleep(0.1)
        assert httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200
        ok, _ = post(base, "mixed", mixed_request())
        assert ok.status_code == 200, ok.text
        assert not any(f.done() for f in endless)  # still running: the others were answered meanwhile
        for future in endless:
            check_timed_out(*future.result())


def test_after_timed_out_requests_the_threads_and_the_model_serve_again(server):
    base, _ = server
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # more than the worker threads on 2 CPUs (6)
        # each a 504 within the limit (check_timed_out), whether it ran, waited for a worker thread or, on
        # numpy (one run at a time), for the model's lock: which of these each meets depends on the machine's load
        for reply in pool.map(lambda _: post(base, "loop", loop_request(ENDLESS)), range(8)):
            check_timed_out(*reply)
    reply, took = post(base, "loop", loop_request(1000, 0.5))
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [1000.5], reply.text
    assert took < LIMIT, took
    assert post(base, "mixed", mixed_request())[0].status_code == 200


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_whose_body_runs_no_node_gets_a_504(backend):
    """onnxruntime checks RunOptions.terminate before nodes only: the session's copy of a Loop body
    of no nodes gets one (backends/loop_bodies.py); before, the run went on (hours at 1e12 trips)."""
    models = load_models(STUCK["empty"](), name="loop", backend=backend)
    with running_server(create_app(models, request_timeout=LIMIT)) as address:
        check_timed_out(*post(f"http://{address}", "loop", loop_request(LONG_TRIPS)))
        reply, took = post(f"http://{address}", "loop", loop_request(3, 1.0))
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [1.0], reply.text
    assert took < LIMIT, took


def test_a_run_within_the_limit_is_answered():
    models = load_models(loop_model(), name="loop", backend="numpy")
    with running_server(create_app(models, request_timeout=30)) as address:
        reply = httpx.post(f"http://{address}/v2/models/loop/infer", json=loop_request(20_000, 0.25), timeout=30)
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [20_000.25], reply.text


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan")])
def test_a_request_timeout_that_is_not_a_positive_finite_number_is_refused(value):
    with pytest.raises(ValueError, match="request_timeout must be a positive, finite number of seconds or None"):
        create_app(load_models(loop_model(), name="loop", backend="numpy"), request_timeout=value)


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf", "-inf"])
def test_graphc_serve_refuses_a_request_timeout_that_is_not_0_or_finite_positive(capsys, tmp_path, value):
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    error = one_line_error(run_cli(capsys, "serve", tmp_path / "loop.onnx", "--request-timeout", value))
    assert f"--request-timeout must be 0 (no limit) or a finite number of seconds, got {float(value)}" in error, error


def test_graphc_serve_request_timeout(tmp_path):
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "ort-cpu", "--request-timeout", str(LIMIT)) as (_, port):
        check_timed_out(*post(f"http://127.0.0.1:{port}", "loop", loop_request(ENDLESS)))
        reply, _ = post(f"http://127.0.0.1:{port}", "loop", loop_request(3, 1.0))
        assert reply.status_code == 200 and json.loads(reply.text)["outputs"][0]["data"] == [4.0], reply.text
