"""A client that closes its connection while its request runs: the run stops, on either backend,
with or without --request-timeout; it ran on until it ended or the limit passed, holding a worker
thread, a CPU and a place in --max-queue (and on numpy the model: the next request to it waited
the whole limit). A client that only half-closes still gets its reply (``100 Continue`` probes
before it on HTTP/1.1; on HTTP/1.0, which takes no interim replies, the first bytes of the reply itself,
one at a time)."""

from __future__ import annotations

import json
import socket
import time

import httpx
import onnx
import pytest

from serve_util import closed_by_server, loop_model, serve_process

ENDLESS = 10**12  # Loop trips: hours on either backend


def infer(n: int, version: str = "1.1") -> bytes:
    body = json.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [n]},
                                  {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.5]}]}).encode()
    return b"POST /v2/models/loop/infer HTTP/%s\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        version.encode(), len(body), body)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("disconnect") / "loop.onnx"
    onnx.save(loop_model(), str(path))
    return str(path)


@pytest.mark.parametrize("backend, timeout, pipelined, version", [
    ("numpy", "60", False, "1.1"), ("ort-cpu", "0", False, "1.1"), ("ort-cpu", "60", True, "1.1"),
    ("numpy", "60", False, "1.0"), ("ort-cpu", "0", False, "1.0")])
def test_a_client_that_closes_mid_run_stops_the_run(model_file, backend, timeout, pipelined, version):
    """With --max-queue 1 the server holds one infer request: the next gets 503 until the run of
    the one whose client left has stopped (it used to be held for the whole run; on HTTP/1.0,
    as an ``ab`` or ``curl --http1.0`` client sends, until then still)."""
    with serve_process(model_file, "--backend", backend, "--request-timeout", timeout, "--max-queue", "1") as (_, port):
        url, body = f"http://127.0.0.1:{port}/v2/models/loop/infer", infer(10).split(b"\r\n\r\n", 1)[1]
        assert httpx.post(url, content=body, timeout=30).status_code == 200
        with socket.create_connection(("127.0.0.1", port)) as sock:
            # pipelined: the second request waits behind the running one (uvicorn told only it of the close)
            sock.sendall(infer(ENDLESS, version) + (infer(3) if pipelined else b""))
            time.sleep(0.5)
            assert httpx.post(url, content=body, timeout=30).status_code == 503  # it runs, held
        closed, statuses = time.monotonic(), []
        while time.monotonic() - closed < 5 and statuses[-1:] != [200]:
            reply = httpx.post(url, content=body, timeout=30)
            statuses.append(reply.status_code)
            time.sleep(0.1)
        assert statuses[-1] == 200, f"the run went on after its client closed: {statuses}"
        assert reply.json()["outputs"][0]["data"] == [10.5], reply.text
        assert time.monotonic() - closed < 3.0  # the server's probes every 0.5 s found the socket closed


@pytest.mark.parametrize("version", ["1.1", "1.0"])
def test_a_client_that_half_closes_gets_its_reply_and_interim_replies_only_on_http_1_1(model_file, version):
    with serve_process(model_file, "--backend", "numpy") as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(infer(30_000).replace(b"HTTP/1.1", f"HTTP/{version}".encode(), 1))
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            assert closed_by_server(sock, time.monotonic() + 1)
    interim, final = data.count(b"HTTP/1.1 100 Continue\r\n\r\n"), data.replace(b"HTTP/1.1 100 Continue\r\n\r\n", b"")
    assert (interim > 0) == (version == "1.1"), data[:200]
    assert final.startswith(b"HTTP/1.1 200 OK\r\n"), data[:300]
    assert json.loads(final.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == [30_000.5]


def test_an_http_1_0_client_that_half_closes_reads_its_reply_whole_after_every_probe(model_file):
    """A run longer than HTTP/1.0's nine probes (4 s): the bytes sent ahead as probes come at once,
    one each 0.5 s, and the reply after them (the 504 of --request-timeout 5) is whole: they are
    not sent twice."""
    with serve_process(model_file, "--backend", "numpy", "--request-timeout", "5") as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(infer(ENDLESS, "1.0"))
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(1.0)
            early = sock.recv(65536)  # the first probe
            sock.settimeout(30)
            data = early
            while chunk := sock.recv(65536):
                data += chunk
    assert early == b"H", early
    assert data.startswith(b"HTTP/1.1 504 Gateway Timeout\r\n") and data.count(b"HTTP/1.1") == 1, data[:300]
    assert "--request-timeout" in json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]


def test_an_http_1_0_request_that_expects_100_continue_gets_no_interim_reply(model_file):
    """RFC 9110: a server ignores an HTTP/1.0 request's 100-continue expectation and sends no 1xx
    to an HTTP/1.0 client; uvicorn sent ``HTTP/1.1 100 Continue`` before the reply."""
    with serve_process(model_file, "--backend", "numpy") as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            head, body = infer(7, "1.0").split(b"\r\n\r\n", 1)
            sock.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n" + body)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n"), data[:300]
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["outputs"][0]["data"] == [7.5]
