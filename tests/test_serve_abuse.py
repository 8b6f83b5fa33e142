"""The server stays up under abuse (issue 10, items 8, 9, 11), each against `graphc serve` in its
own process: half-open connections are closed by a read deadline while a good request is still
served; failed large requests leave no memory behind; a port in use or a bad model is one line
and exit 2, and "serving" is printed only once the server listens."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import onnx
import pytest

from serve_util import (closed_by_server, headed, loop_model, mixed_feeds, mixed_model, read_reply, rss_mb,
                        serve_process)

READ_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("abuse") / "mixed.onnx"
    onnx.save(mixed_model(), str(path))
    return path


def good_payload() -> dict:
    feeds = mixed_feeds(2)
    return {"inputs": [{"name": k, "shape": list(v.shape), "datatype": d, "data": v.ravel().tolist()}
                       for (k, v), d in zip(feeds.items(), ("FP32", "INT64", "BOOL"))]}


def good_request(port: int) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v2/models/mixed/infer", json=good_payload(), timeout=10)


def half_open(port: int, kind: str) -> socket.socket:
    """A connection that sends nothing, part of its headers, or its headers and part of its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    if kind == "headers":
        sock.sendall(b"POST /v2/models/mixed/infer HTTP/1.1\r\nHost: x\r\nContent-Le")
    elif kind == "body":
        sock.sendall(b"POST /v2/models/mixed/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inputs\": [")
    return sock


def still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # data would be a reply; an open, silent connection raises
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def test_half_open_connections_are_closed_and_good_requests_served_meanwhile(model_file):
    timeout = 8.0  # long enough that the connections are surely held while the good request runs
    with serve_process(str(model_file), "--backend", "numpy", "--read-timeout", str(timeout)) as (_, port):
        start = time.monotonic()
        held = [half_open(port, kind) for kind in ("nothing", "headers", "body") for _ in range(100)]
        reply = good_request(port)
        assert reply.status_code == 200, reply.text
        assert all(still_open(s) for s in held), "the good request was not served while all were held"
        deadline = start + timeout + 30  # slack for a loaded machine; the server's deadline is `timeout`
        open_after = [s for s in held if not closed_by_server(s, deadline)]
        assert not open_after, f"{len(open_after)} of {len(held)} half-open connections still open"
        for sock in held:
            sock.close()
        assert good_request(port).status_code == 200


def test_a_request_cut_off_in_its_headers_gets_a_408(model_file):
    with serve_process(str(model_file), "--backend", "numpy", "--read-timeout", str(READ_TIMEOUT)) as (_, port):
        sock = half_open(port, "headers")
        sock.settimeout(READ_TIMEOUT + 10)
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
        sock.close()
        assert reply.startswith(b"HTTP/1.1 408"), reply
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1]) == {"error": "request not received in time"}


def test_failed_large_gzip_requests_leave_no_memory_behind(model_file):
    """20 requests of 20 MB each once decompressed (20 KB on the wire: a JSON header and 20 MB
    of binary tensor data), each a 400 once decoded: the server's RSS stays within 50 MB of what
    it was after the first one (before the fix each stayed alive in a reference cycle)."""
    header = json.dumps({"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 20 << 20}}]}).encode()
    body = gzip.compress(header + bytes(20 << 20), 1)
    headers = {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(header))}
    with serve_process(str(model_file), "--backend", "numpy") as (proc, port), \
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        def fail() -> None:
            reply = http.post("/v2/models/mixed/infer", content=body, headers=headers)
            assert reply.status_code == 400 and "needs 32 bytes, binary_data_size is 20971520" in reply.json()["error"]

        fail()  # the first one warms the allocator and the thread pool up
        before = rss_mb(proc.pid)
        for _ in range(19):
            fail()
        after = rss_mb(proc.pid)
        assert after - before < 50, f"RSS grew from {before:.0f} MB to {after:.0f} MB"
        assert good_request(port).status_code == 200


def test_closed_connections_with_large_heads_leave_no_memory_behind(model_file):
    """200 connections, each a health check with 10,000 header lines (60 KB, under the head limit),
    then closed: the server's RSS stays within 40 MB of what it was after the first 20 (each closed
    connection and its 10,000 headers stayed in a reference cycle until the cyclic GC ran: +240 MB
    for 200, 1 GB for 800)."""
    head = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + b"A: b\r\n" * 10_000 + b"\r\n"

    def check(n: int) -> None:
        for _ in range(n):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(head)
                assert read_reply(sock).startswith(b"HTTP/1.1 200")

    with serve_process(str(model_file), "--backend", "numpy") as (proc, port):
        check(20)  # warms the allocator up
        before = rss_mb(proc.pid)
        check(200)
        after = rss_mb(proc.pid)
        assert after - before < 40, f"RSS grew from {before:.0f} MB to {after:.0f} MB"


def graphc_serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from graphc.cli import main; main()", "serve", *args],
                          capture_output=True, text=True, timeout=120)


def test_port_in_use_is_one_line_naming_it_and_exit_2(model_file):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = graphc_serve(str(model_file), "--port", str(port))
    assert result.returncode == 2, result
    assert result.stdout == "", result.stdout  # never "serving ..."
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is already in use" in lines[0] and "--port" in lines[0], lines


def test_a_model_that_fails_to_load_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 this is not a model")
    result = graphc_serve(str(bad), "--port", "0")
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.strip().splitlines()) == 1 and "ModelLoadError" in result.stderr, result.stderr


def test_serving_is_printed_only_once_it_listens(model_file):
    with serve_process(str(model_file), "--backend", "numpy") as (_, port):
        # serve_process returned right after the "serving" line: the port must already answer.
        reply = httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5)
        assert reply.json() == {"ready": True}
        x = np.asarray(good_request(port).json()["outputs"][1]["data"])
        np.testing.assert_array_equal(x, (mixed_feeds(2)["idx"] + 1).ravel())



@pytest.mark.parametrize("name", ["a/b", "x y", "..", "a\\b"])
def test_a_name_no_url_can_reach_is_one_line_and_exit_2(model_file, name):
    result = graphc_serve(str(model_file), "--name", name, "--port", "0")
    assert result.returncode == 2 and result.stdout == "", result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"model name {name!r} must be a plain folder name" in lines[0], lines


def test_port_0_prints_the_port_the_system_chose(model_file):
    from serve_util import _first_line

    proc = subprocess.Popen([sys.executable, "-c", "from graphc.cli import main; main()", "serve", str(model_file),
                             "--backend", "numpy", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        line = _first_line(proc, 60)
        port = int(re.search(r"on http://127\.0\.0\.1:(\d+)/v2 ", line).group(1))
        assert port != 0, line
        assert httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=5).json() == {"live": True}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()

@pytest.mark.parametrize("takes_address", [True, False])
def test_on_ready_gets_the_address_when_it_takes_one(takes_address):
    """A callback of no argument (gc.serve's before the address was given) still works."""
    import asyncio

    from graphc.serving.kserve import server as kserver

    async def app(scope, receive, send):  # nothing connects; uvicorn's lifespan probe only
        if scope["type"] == "lifespan":
            raise RuntimeError("no lifespan")

    called = []
    ready = (lambda address: called.append(address)) if takes_address else (lambda: called.append(None))
    server = kserver.Server(kserver.config(app), on_ready=ready)
    sock = kserver.listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not called and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.01)
    server.should_exit = True
    thread.join(timeout=10)
    assert called == ([("127.0.0.1", port)] if takes_address else [None])


def test_the_default_read_timeout_is_at_most_30_s():
    import inspect

    from graphc.serving import serve as serving
    from graphc.serving.kserve import server

    assert server.DEFAULT_READ_TIMEOUT <= 30
    assert inspect.signature(serving.serve).parameters["read_timeout"].default == server.DEFAULT_READ_TIMEOUT
    config = server.config(object())
    assert config.timeout_keep_alive <= server.DEFAULT_READ_TIMEOUT and config.backlog >= 4096


def test_a_slow_request_with_a_small_body_never_holds_up_other_connections(tmp_path):
    # It is the model's first request, and a few hundred bytes: both once ran on the event loop.

    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    body = {"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [3_000_000]},
                       {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.0]}]}
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "ort-cpu") as (_, port):
        base = f"http://127.0.0.1:{port}/v2"
        replies: list[httpx.Response] = []
        slow = threading.Thread(target=lambda: replies.append(httpx.post(f"{base}/models/loop/infer", json=body,
                                                                        timeout=60)))
        started = time.monotonic()
        slow.start()
        time.sleep(0.3)
        assert httpx.get(f"{base}/health/live", timeout=10).status_code == 200
        answered = time.monotonic() - started
        slow.join()
        took = time.monotonic() - started
    assert replies[0].status_code == 200 and replies[0].json()["outputs"][0]["data"] == [3_000_000.0]
    # live answered while the model ran: well before the slow reply (a loaded machine stretches both), where a model
    # run on the event loop answers it only once the run ends
    assert took > 1.0 and answered < 0.5 * took, (answered, took)


def test_sigterm_is_prompt_with_a_stalled_body_and_answers_whole_requests(tmp_path):
    """A connection that sent its head and part of its body, then stalls, once held the shutdown
    for the whole read timeout (30 s); a request received whole before SIGTERM is still answered."""
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    body = json.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [1_000_000]},
                                  {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.5]}]}).encode()
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "ort-cpu") as (proc, port):
        stalled = headed(port, 1000)
        stalled.sendall(b'{"inputs": [')
        whole = headed(port, len(body))
        whole.sendall(body)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        reply = read_reply(whole)
        answered = time.monotonic() - start
        code = proc.wait(timeout=60)
        took = time.monotonic() - start
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == [1_000_000.5]
    assert closed_by_server(stalled, time.monotonic() + 1)
    # the stalled one is closed 2 s after it last sent a byte, not after the read timeout (30 s)
    assert code == 0 and took - answered < 10 and took < 25, (answered, took)
    stalled.close()
    whole.close()


@pytest.mark.parametrize("backend, gzipped", [("numpy", False), ("ort-cpu", True)])
def test_a_run_past_the_shutdown_grace_is_stopped_and_gets_a_json_503(tmp_path, backend, gzipped):
    """At SIGTERM uvicorn waits for requests in flight for SHUTDOWN_GRACE s (1 s here), then cancels them:
    the client got uvicorn's text/plain 500 "Internal Server Error", a traceback was logged, and the
    model's run went on in its worker thread, so the process did not exit until the run ended (a Loop
    of 10**9 steps: hours). A gzipped body runs on the other worker pool (anyio's), the same."""
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    body = json.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [10 ** 9]},
                                  {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.5]}]}).encode()
    coding = b""
    if gzipped:
        body, coding = gzip.compress(body), b"Content-Encoding: gzip\r\n"
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", backend,
                       setup="import graphc.serving.kserve.server as s; s.SHUTDOWN_GRACE = 1.0") as (proc, port):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
                     % (coding, len(body), body))
        time.sleep(1)  # the run is under way
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        reply = read_reply(sock)
        sock.close()
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - start
        output = proc.stdout.read() if code is not None else ""
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503") and b"content-type: application/json" in head.lower(), reply[:300]
    message = json.loads(body)["error"]
    assert "shutting down" in message and "'loop'" in message, message
    assert code == 0 and took < 15, (code, took)
    assert "Traceback" not in output, output


def fill_model() -> onnx.ModelProto:
    """y = n float32 values of 1.5 (ConstantOfShape): a request of a few bytes, a reply as large as n says."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["n"], ["y"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5]))],
        "fill", [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _descriptors_become(pid: int, wanted, seconds: float) -> bool:
    """Whether the count of ``pid``'s open descriptors satisfies ``wanted`` within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not wanted(open_descriptors(pid)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _not_reading(port: int, values: int) -> socket.socket:
    """A connection that asks for a reply of ``values`` float32s (binary) and never reads it."""
    head = json.dumps({"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [values]}],
                       "parameters": {"binary_data_output": True}}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(b"POST /v2/models/fill/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(head), head))
    return sock


def test_a_client_that_never_reads_its_reply_is_cut_off_at_the_read_timeout(tmp_path):
    """Its 40 MB reply, buffered by the server, once held the connection (and the memory) for good:
    the deadline closed the transport gracefully, which waits for the unread reply to be sent."""
    onnx.save(fill_model(), str(tmp_path / "fill.onnx"))
    with serve_process(str(tmp_path / "fill.onnx"), "--backend", "ort-cpu", "--read-timeout", "2") as (proc, port):
        idle = open_descriptors(proc.pid)
        sock = _not_reading(port, 10_000_000)
        assert _descriptors_become(proc.pid, lambda n: n > idle, 10), "the server never took the connection"
        closed = _descriptors_become(proc.pid, lambda n: n == idle, 2 + 15)  # slack for a loaded machine
        assert good_request_to(port, "fill").status_code == 200
        sock.close()
    assert closed, "the connection that stopped reading its reply is still open past the read timeout"


def good_request_to(port: int, model: str) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", timeout=10,
                      json={"inputs": [{"name": "n", "shape": [1], "datatype": "INT64", "data": [3]}]})


def test_sigterm_is_prompt_with_a_client_that_never_reads_itsread_reply(tmp_path):
    """A reply its client stopped reading once held a graceful shutdown for the whole read timeout
    (30 s here); it is dropped 2 s after the client last read, as a stalled request body is."""
    onnx.save(fill_model(), str(tmp_path / "fill.onnx"))
    with serve_process(str(tmp_path / "fill.onnx"), "--backend", "ort-cpu") as (proc, port):
        idle = open_descriptors(proc.pid)
        sock = _not_reading(port, 10_000_000)
        assert _descriptors_become(proc.pid, lambda n: n > idle, 10), "the server never took the connection"
        time.sleep(0.5)  # the reply is computed and buffered
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - start
        sock.close()
    assert code == 0 and took < 15, took


MALFORMED = {  # what the client sent after the request line and Host, what the parser says of it
    "chunk size": (b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n", "invalid character in chunk size"),
    "Content-Length": (b"Content-Length: 99999999999999999999\r\n\r\n{}", "content-length"),
    "both lengths": (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n", "content-length"),
    "header value": (b"X-Bad: a\x01b\r\nContent-Length: 2\r\n\r\n{}", "header value"),
}


def test_a_request_the_http_parser_refuses_gets_a_json_400_naming_why(model_file):
    """uvicorn answered these with a text/plain "Invalid HTTP request received.", not the
    {"error": ...} every other error is, and without saying what was wrong."""
    with serve_process(str(model_file), "--backend", "numpy") as (_, port):
        for case, (rest, why) in MALFORMED.items():
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /v2/models/mixed/infer HTTP/1.1\r\nHost: x\r\n" + rest)
            reply = read_reply(sock)
            assert closed_by_server(sock, time.monotonic() + 5), case
            sock.close()
            head, body = reply.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), (case, reply)
            message = json.loads(body)["error"]
            assert message.startswith("invalid HTTP request: ") and why in message.lower(), (case, message)
        assert good_request(port).status_code == 200
