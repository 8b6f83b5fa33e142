"""Clients that send infer requests and never read the replies, against `graphc serve` in its own
process: an unread reply keeps its request's ``--max-queue`` place until the client reads it or its
read timeout drops the connection, so such clients hold at most ``--max-queue`` replies (a 16 MB
output here); before, each reply was handed whole to the transport and its place freed at once,
so every connection held one reply for the read timeout, past the limit."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from serve_util import read_reply, rss_mb, serve_process

ELEMENTS = 4 << 20  # float32: a 16 MB output


def _fill_model() -> onnx.ModelProto:
    """shape int64[1] -> y = ConstantOfShape(shape, 1.0) float32[n]: an output as large as asked."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["y"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32)))]
    graph = helper.make_graph(nodes, "fill", [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _request(n: int) -> bytes:
    body = json.dumps({"inputs": [{"name": "shape", "shape": [1], "datatype": "INT64", "data": [n]}],
                       "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
    return b"POST /v2/models/fill/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
           b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def _not_reading(port: int, requests: int = 1) -> socket.socket:
    """A connection that sent ``requests`` pipelined requests for a 16 MB reply and read only the
    first reply's status line."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(_request(ELEMENTS) * requests)
    assert sock.recv(12) == b"HTTP/1.1 200"
    return sock


def _status(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_request(4))
        return read_reply(sock)[:12]


def test_unread_replies_hold_their_queue_places_until_the_read_timeout(tmp_path):
    onnx.save(_fill_model(), str(tmp_path / "fill.onnx"))
    with serve_process(str(tmp_path / "fill.onnx"), "--backend", "ort-cpu", "--max-queue", "2",
                       "--read-timeout", "3") as (proc, port):
        assert _status(port) == b"HTTP/1.1 200"
        before = rss_mb(proc.pid)
        # pipelined requests on one connection: the ones behind the unread reply wait, unrun
        stalled = [_not_reading(port, requests=4), _not_reading(port)]
        assert _status(port) == b"HTTP/1.1 503"  # the two unread replies hold the queue
        for _ in range(4):
            stalled.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            stalled[-1].sendall(_request(ELEMENTS))
            assert stalled[-1].recv(12) == b"HTTP/1.1 503"
        held = rss_mb(proc.pid) - before
        assert held < 3 * ELEMENTS * 4 / 1e6 + 30, f"{held:.0f} MB held for two unread 16 MB replies"
        # the read timeout drops the connections that stopped reading, and their places come back
        deadline = time.monotonic() + 15
        while _status(port) != b"HTTP/1.1 200":
            assert time.monotonic() < deadline, "the unread replies' places never came back"
            time.sleep(0.2)
        for sock in stalled:
            sock.close()
        assert proc.poll() is None
