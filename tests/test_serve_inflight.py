"""The bytes of request bodies and replies `graphc serve` holds at once, all requests together
(``--max-inflight-bytes``), against the server in its own process: a request whose body would pass
the budget gets a 503 with ``retry-after`` from its headers, its body unread; the budget comes
back whole after every way a request can end; many large requests at once stay within it."""

from __future__ import annotations

import json
import socket
import struct
import time

import onnx
import pytest

from serve_util import (closed_by_server, flood, headed, loop_model, read_reply, serve_process, sum_model,
                        sum_request)

MB = 1 << 20  # --max-body-bytes here; --max-inflight-bytes is two of them


def loop_body(n: int, x: float, length: int = MB) -> bytes:
    """The loop model's JSON request (y = x + n), padded with spaces to ``length`` bytes."""
    body = json.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [n]},
                                  {"name": "x", "datatype": "FP32", "shape": [1], "data": [x]}]}).encode()
    return body + b" " * (length - len(body))


def split(reply: bytes) -> tuple[bytes, dict]:
    head, body = reply.split(b"\r\n\r\n", 1)
    return head.lower(), json.loads(body)


def post(port: int, body: bytes, chunked: bool = False) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    framing = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(body) if chunked else \
        b"Content-Length: %d\r\n\r\n" % len(body)
    sock.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\n" + framing + body)
    return sock


def answered(sock: socket.socket, body: bytes) -> dict:
    """Send ``body`` on a connection the server asked for it (``headed``); its 200's JSON."""
    sock.sendall(body)
    head, reply = split(read_reply(sock))
    sock.close()
    assert head.startswith(b"http/1.1 200"), (head, reply)
    return reply


def refused(sock: socket.socket) -> str:
    """The 503 the server answered on ``sock`` with ``retry-after`` before its close; its message."""
    head, error = split(read_reply(sock))
    assert head.startswith(b"http/1.1 503") and b"retry-after: 1" in head and b"connection: close" in head, head
    assert closed_by_server(sock, time.monotonic() + 10)
    sock.close()
    return error["error"]


def assert_budget_free(port: int, within: float = 10.0) -> None:
    """The whole budget (two bodies of ``MB``) is taken again within ``within`` seconds, and both
    requests are answered; one byte kept by an earlier request refuses the second for good."""
    deadline = time.monotonic() + within
    while True:
        first = headed(port, MB)
        second = socket.create_connection(("127.0.0.1", port), timeout=30)
        second.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                       b"Expect: 100-continue\r\n\r\n" % MB)
        head = b""
        while b"\r\n\r\n" not in head:
            head += second.recv(1024)
        if head.startswith(b"HTTP/1.1 100"):  # asked for the body: taken from the budget
            break
        second.close()
        first.close()
        assert time.monotonic() < deadline, "the in-flight budget was not given back"
        time.sleep(0.1)
    assert answered(second, loop_body(3, 0.5))["outputs"][0]["data"] == [3.5]
    assert answered(first, loop_body(4, 0.5))["outputs"][0]["data"] == [4.5]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("inflight") / "loop.onnx"
    onnx.save(loop_model(), str(path))
    with serve_process(str(path), "--backend", "numpy", "--max-body-bytes", str(MB), "--max-inflight-bytes",
                       str(2 * MB), "--read-timeout", "2", "--request-timeout", "1") as (_, port):
        yield port


def test_past_the_budget_a_request_gets_a_503_from_its_headers_and_the_held_ones_are_answered(server):
    held = [headed(server, MB), headed(server, MB)]  # the server is reading both bodies: the budget is taken
    started = time.monotonic()
    for sock in (post(server, loop_body(2, 0.5, 200)), headed_and_silent(server)):  # a body, or only its head
        error = refused(sock)
        assert error.startswith(f"the server holds {2 * MB} bytes of requests and replies in flight, and this "
                                "request's "), error
        assert error.endswith(f"would pass its limit of {2 * MB} bytes (--max-inflight-bytes); retry later"), error
    assert time.monotonic() - started < 2  # not the read timeout: the bodies were never waited for
    assert "chunked body (at 200 bytes)" in refused(post(server, loop_body(2, 0.5, 200), chunked=True))
    assert [answered(sock, loop_body(n, 1.5))["outputs"][0]["data"] for sock, n in zip(held, (5, 6))] == [[6.5], [7.5]]
    assert_budget_free(server)


def headed_and_silent(port: int) -> socket.socket:
    """A request's head announcing a ``MB`` body (no ``Expect``), none of which is sent."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % MB)
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a killed client's kernel does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def cut_off(port: int, how) -> None:
    sock = headed(port, MB)
    sock.sendall(loop_body(3, 0.5)[:MB // 2])
    time.sleep(0.2)
    how(sock)


def _status(sock: socket.socket) -> bytes:
    reply = read_reply(sock)
    sock.close()
    return reply[9:12]


@pytest.mark.parametrize("ending", [
    "closed mid-body", "reset mid-body", "closed after its head", "408 mid-body", "400 bad input",
    "400 chunked, disconnected", "503 chunked past the budget", "504 request timeout", "disconnect mid-run"])
def test_the_budget_comes_back_whole_however_a_request_ends(server, ending):
    if ending == "closed mid-body":
        cut_off(server, socket.socket.close)
    elif ending == "reset mid-body":
        cut_off(server, reset)
    elif ending == "closed after its head":
        headed(server, MB).close()
    elif ending == "408 mid-body":  # --read-timeout 2
        sock = headed(server, MB)
        sock.sendall(b"{")
        assert _status(sock) == b"408"
    elif ending == "400 bad input":
        sock = headed(server, MB)
        body = loop_body(3, 0.5).replace(b'"x"', b'"z"')
        sock.sendall(body)
        assert _status(sock) == b"400"
    elif ending == "400 chunked, disconnected":
        sock = post(server, loop_body(3, 0.5, MB // 2), chunked=True)
        time.sleep(0.2)
        reset(sock)
    elif ending == "503 chunked past the budget":
        holders = [headed(server, MB), headed(server, MB // 2)]
        sock = post(server, loop_body(3, 0.5, MB), chunked=True)  # its first half fits, the rest does not
        assert _status(sock) == b"503"
        for holder in holders:
            holder.close()
    elif ending == "504 request timeout":  # --request-timeout 1
        sock = headed(server, MB)
        sock.sendall(loop_body(10 ** 9, 0.5))
        assert _status(sock) == b"504"
    else:
        sock = headed(server, MB)
        sock.sendall(loop_body(10 ** 9, 0.5))
        time.sleep(0.3)
        reset(sock)
    assert_budget_free(server)


def test_many_large_requests_at_once_hold_the_budget_not_their_sum(tmp_path):
    """32 binary requests of 41 MB written at once, whole, with --max-body-bytes 64 MiB (so the
    default budget is 256 MiB): the server grew by 1,271 MB before (every body held at once), 345-377 MB
    with the budget; the requests past it get 503s naming it."""
    onnx.save(sum_model(), str(tmp_path / "sum.onnx"))
    with serve_process(str(tmp_path / "sum.onnx"), "--backend", "numpy", "--max-body-bytes", str(64 * MB)) \
            as (proc, port):
        before, peak, replies = flood(port, proc.pid, 32, sum_request(41))
    statuses = sorted(reply[9:12] for reply in replies)
    assert len(statuses) == 32 and b"200" in statuses and set(statuses) <= {b"200", b"503"}, statuses
    for reply in replies:
        head, body = split(reply)
        if head.startswith(b"http/1.1 200"):
            assert body["outputs"][0]["data"] == [41e6 / 4], body
        else:
            assert body["error"].endswith(f"limit of {256 * MB} bytes (--max-inflight-bytes); retry later"), body
    assert peak - before < 600, f"the server grew by {peak - before:.0f} MB for 32 requests of 41 MB"


def test_a_budget_below_the_body_limit_is_refused_naming_both(tmp_path):
    import subprocess
    import sys

    from graphc.serving.kserve.infer import Limits

    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    done = subprocess.run([sys.executable, "-c", "from graphc.cli import main; main()", "serve", str(tmp_path / "loop.onnx"),
                           "--max-body-bytes", "1000", "--max-inflight-bytes", "999"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--max-inflight-bytes must be at least --max-body-bytes (1000), or a body the server takes could never " \
           "be read; got 999" in " ".join((done.stdout + done.stderr).split()), (done.stdout, done.stderr)
    with pytest.raises(ValueError, match=r"max_inflight_bytes must be a number of bytes of at least max_body_bytes "
                                         r"\(1000\).*got 999"):
        Limits(max_body_bytes=1000, max_inflight_bytes=999)
    assert Limits(max_body_bytes=1000).inflight.limit == 4000
