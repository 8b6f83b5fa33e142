"""Clients that pipeline requests faster than `graphc serve` answers them, against the server in its own
process: the requests waiting on a connection stay one read's worth, however long it goes on, and
every one is answered in order."""

from __future__ import annotations

import socket
import threading
import time

import onnx

from serve_util import loop_model, rss_mb, serve_process

REQUEST = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
REPLY_BODY = b'{"live":true}'


def pipeline(port: int, requests: int, counts: list[int]) -> None:
    """Send ``requests`` pipelined ``REQUEST``s in one write on one connection while reading the
    replies; ``counts`` gets the number of replies read once all are in."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sender = threading.Thread(target=sock.sendall, args=(REQUEST * requests,))
        sender.start()
        read, tail = 0, b""
        while read < requests:
            chunk = sock.recv(1 << 20)
            assert chunk, f"the server closed the connection after {read} of {requests} replies"
            data = tail + chunk
            read += data.count(REPLY_BODY)
            tail = data[-(len(REPLY_BODY) - 1):]
        sender.join()
        counts.append(read)


def test_pipelined_requests_are_read_as_they_are_answered_not_ahead_of_them(tmp_path):
    """uvicorn resumed reading after every reply, so a connection queued a read's worth of requests
    (thousands of 40-byte ones, each a cycle with its scope) per reply: four such clients grew the
    server by 1,194 MB in 4 s (122,000 requests each), and on for as long as they sent; two clients of
    30,000 requests, by 144 MB."""
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "numpy") as (proc, port):
        before, peak, counts = rss_mb(proc.pid), 0.0, [[] for _ in range(2)]
        clients = [threading.Thread(target=pipeline, args=(port, 30_000, c)) for c in counts]
        for t in clients:
            t.start()
        while any(t.is_alive() for t in clients):
            peak = max(peak, rss_mb(proc.pid))
            time.sleep(0.02)
        for t in clients:
            t.join()
        assert counts == [[30_000], [30_000]], counts  # every request answered
        assert peak - before < 60, f"the server grew by {peak - before:.0f} MB for 2 pipelining clients"
