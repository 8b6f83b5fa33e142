"""A request answered while its body is still arriving (a 413 from its Content-Length or from the
bytes read so far) gets one reply, with ``connection: close``; then the server reads and drops at
most ``LINGER_BYTES`` more for at most ``LINGER_SECONDS`` and closes. It read an endless chunked
body for the whole read timeout (7.3 GB in 3 s on loopback) and then sent a second reply, a 408."""

from __future__ import annotations

import socket
import threading
import time

import onnx
import pytest

from graphc.serving.kserve.deadline_protocol import LINGER_BYTES, LINGER_SECONDS
from serve_util import loop_model, serve_process

HEAD = b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
BUFFERS = 32 << 20  # what the two kernels' socket buffers on loopback hold besides what the server read


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("linger") / "loop.onnx"
    onnx.save(loop_model(), str(path))
    return str(path)


class Replies(threading.Thread):
    """Reads ``sock`` until EOF or a reset (``closed``) or its timeout, noting when the first bytes came."""

    def __init__(self, sock: socket.socket):
        super().__init__(daemon=True)
        self.sock, self.data, self.first, self.closed = sock, b"", None, False
        self.start()

    def run(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.first = self.first or time.monotonic()
                self.data += chunk
            self.closed = True
        except ConnectionResetError:
            self.closed = True
        except TimeoutError:
            pass

    def only_one_413(self) -> None:
        self.join(20)
        assert self.data.count(b"HTTP/1.1 ") == 1, self.data[:400]  # never a second reply (the 408)
        head = self.data.split(b"\r\n\r\n", 1)[0].lower()
        assert head.startswith(b"http/1.1 413") and b"\r\nconnection: close" in head, head


@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["fast", "slow"])
def test_an_endless_chunked_body_past_the_limit_gets_one_413_and_is_read_no_further(model_file, pause):
    """fast: the byte bound ends it within a second; slow (1.3 MB/s): the time bound, 2 s after the 413,
    before the 3 s read timeout passes (which sent the second reply)."""
    limit = 1 << 20
    bound = limit + LINGER_BYTES + BUFFERS
    with serve_process(model_file, "--backend", "numpy", "--max-json-bytes", str(limit), "--read-timeout", "3") \
            as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
            replies, chunk, sent, start = Replies(sock), b"10000\r\n%s\r\n" % (b"1" * 65536), 0, time.monotonic()
            try:
                while sent <= bound and time.monotonic() - start < 10:
                    sock.sendall(chunk)
                    sent += len(chunk)
                    time.sleep(pause)
            except (BrokenPipeError, ConnectionResetError):
                pass
            closed = time.monotonic()
            assert sent <= bound, f"the server read on after its 413: the client sent {sent / 1e6:.0f} MB"
            replies.only_one_413()
    lingered = closed - replies.first
    if pause:
        assert LINGER_SECONDS - 0.5 < lingered < LINGER_SECONDS + 1.5, lingered
    else:
        assert lingered < 1.0, lingered


def test_a_content_length_body_twice_the_limit_sent_at_once_is_drained_and_gets_its_413(model_file):
    """16 MiB is more than loopback's socket buffers hold: a server that closed at once would reset
    the client while it sends; one that read the body to its end kept the connection open."""
    limit = 8 << 20
    with serve_process(model_file, "--backend", "numpy", "--max-json-bytes", str(limit)) as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
            sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n" % (2 * limit) + b"1" * (2 * limit))  # no reset
            replies = Replies(sock)
            replies.only_one_413()
            assert replies.closed, "the connection stayed open after its 413"
