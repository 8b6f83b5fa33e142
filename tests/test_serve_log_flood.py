"""What a client makes `graphc serve` log: uvicorn warns once per request its HTTP parser refuses
(42 bytes of log for 11 bytes sent), so a stream of them filled a stdout pipe its reader did not
drain (about 1,560 requests for 64 KiB) and the event loop blocked writing to it, every connection
with it; such warnings are logged at most once per ``WARNING_INTERVAL`` seconds each."""

from __future__ import annotations

import signal
import socket

import onnx

from serve_util import mixed_model, read_reply, serve_process

REQUESTS = 300


def test_malformed_requests_are_answered_and_logged_once(tmp_path):
    onnx.save(mixed_model(), str(tmp_path / "mixed.onnx"))
    with serve_process(str(tmp_path / "mixed.onnx"), "--backend", "numpy") as (proc, port):
        for _ in range(REQUESTS):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(b"GARBAGE\r\n\r\n")
                assert read_reply(sock).startswith(b"HTTP/1.1 400")
        proc.send_signal(signal.SIGTERM)
        log = proc.stdout.read()  # the server's output once it stopped
    assert proc.wait(timeout=30) == 0
    assert log.count("Invalid HTTP request received.") == 1, log[-2000:]
