"""An adversarial audit of `graphc serve`, against the server in its own process over raw sockets
and httpx: what a pipelining, half-closing, careless or hostile client found wrong, each a test
that failed before its fix. (What the audit tried and found right is in the session's report;
most of it is already covered by test_serve_abuse.py, test_serve_errors.py and test_serve_fuzz.py.)"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import zlib

import httpx
import onnx
import pytest

from serve_util import closed_by_server, loop_model, serve_process

INFER = b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\n"


def loop_body(n: int, x: float = 0.5) -> bytes:
    """An infer request for the loop model: y = x + n, taking longer the larger ``n``."""
    return json.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [n]},
                                  {"name": "x", "datatype": "FP32", "shape": [1], "data": [x]}]}).encode()


def infer(body: bytes, length: int | None = None, headers: bytes = b"") -> bytes:
    return INFER + b"%sContent-Length: %d\r\n\r\n%s" % (headers, len(body) if length is None else length, body)


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    path = tmp_path_factory.mktemp("audit") / "loop.onnx"
    onnx.save(loop_model(), str(path))
    with serve_process(str(path), "--backend", "ort-cpu", "--read-timeout", "10") as (_, port):
        yield port


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def replies(sock: socket.socket, count: int) -> list[tuple[bytes, dict]]:
    """The next ``count`` replies on ``sock``, each as (status line, JSON body); nothing after them.
    Interim ``100 Continue`` replies (the server's probes of a half-closed client) are skipped, as
    every HTTP/1.1 client skips them."""
    out, data = [], b""
    while len(out) < count:
        head, _, rest = data.partition(b"\r\n\r\n")
        if _ and head == b"HTTP/1.1 100 Continue":
            data = rest
            continue
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head + b"\r\n") if _ else None
        if length is None or len(rest) < int(length.group(1)):
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {out}: {data[:300]!r}"
            data += chunk
            continue
        out.append((head.split(b"\r\n")[0], json.loads(rest[:int(length.group(1))])))
        data = rest[int(length.group(1)):]
    assert not data, data
    return out


def y_of(reply: dict) -> float:
    return reply["outputs"][0]["data"][0]


# -- pipelining: a request the parser refuses is answered after the ones before it --------------

PIPELINED_GARBAGE = {
    # The request line of the next request is not HTTP.
    "bad request line": (b"GARBAGE / HTTP/1.1\r\n\r\n", 1),
    # A second, queued request whose chunked body breaks.
    "bad chunk in a queued request": (INFER + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 1),
    # Two good requests, then garbage: both are answered, in order.
    "after two requests": (infer(loop_body(10, 2.0)) + b"\x16\x03\x01garbage\r\n\r\n", 2),
}


@pytest.mark.parametrize("case", PIPELINED_GARBAGE)
def test_a_pipelined_request_the_parser_refuses_is_answered_after_the_ones_before_it(port, case):
    """The 400 for unparseable bytes went out at once, ahead of the reply still being computed for
    the request before them: a pipelining client read it as that request's reply."""
    garbage, answered = PIPELINED_GARBAGE[case]
    with connect(port) as sock:
        sock.sendall(infer(loop_body(300_000)) + garbage)
        got = replies(sock, answered + 1)
        assert closed_by_server(sock, time.monotonic() + 10)
    assert [status for status, _ in got] == [b"HTTP/1.1 200 OK"] * answered + [b"HTTP/1.1 400 Bad Request"], got
    assert y_of(got[0][1]) == 300_000.5
    if answered == 2:
        assert y_of(got[1][1]) == 12.0
    assert got[-1][1]["error"].startswith("invalid HTTP request: "), got[-1]


H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"


def test_a_request_with_a_body_that_asks_to_upgrade_gets_a_400_naming_the_upgrade(port):
    """``curl --http2`` sends ``Upgrade: h2c`` with its POST: httptools ends such a request at its headers,
    so the app answered an empty body (400 "malformed JSON ... EOF at column 0") and the body was dropped."""
    with connect(port) as sock:
        sock.sendall(infer(loop_body(3), headers=H2C) + infer(loop_body(4)))
        [(status, reply)] = replies(sock, 1)
        assert closed_by_server(sock, time.monotonic() + 10)
    assert status == b"HTTP/1.1 400 Bad Request", (status, reply)
    assert "switch protocols (Upgrade: 'h2c') and has a body" in reply["error"], reply
    assert "without Upgrade" in reply["error"], reply


def test_a_request_pipelined_behind_a_bodiless_upgrade_request_is_answered(port):
    """A GET asking to upgrade is answered over HTTP/1.1, but uvicorn dropped the bytes after it in the
    same read: the request pipelined behind it was never answered."""
    with connect(port) as sock:
        sock.settimeout(5)
        sock.sendall(b"GET /v2/models/loop/ready HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n" + infer(loop_body(3)))
        (first, ready), (second, reply) = replies(sock, 2)
    assert first == b"HTTP/1.1 200 OK" and ready == {"name": "loop", "ready": True}, (first, ready)
    assert second == b"HTTP/1.1 200 OK" and y_of(reply) == 3.5, (second, reply)


def test_a_pipelined_request_that_times_out_is_answered_after_the_one_before_it(tmp_path):
    """A request cut off in its head behind one still computing: its 408 went out first, read by
    the client as the reply to the request before it."""
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "ort-cpu", "--read-timeout", "1") as (_, port), \
            connect(port) as sock:
        sock.sendall(infer(loop_body(3_000_000)) + INFER + b"Content-Le")  # about 3 s of Loop
        (first, reply), (second, late) = replies(sock, 2)
        assert closed_by_server(sock, time.monotonic() + 10)
    assert first == b"HTTP/1.1 200 OK" and y_of(reply) == 3_000_000.5, (first, reply)
    assert second == b"HTTP/1.1 408 Request Timeout" and late == {"error": "request not received in time"}


def test_a_content_length_shorter_than_the_body_gets_the_error_for_the_body_it_announced(port):
    """A careless client's Content-Length of 10 for a longer body: its reply is the 400 for the
    10 bytes it announced (malformed JSON), not the parser's complaint about the bytes after them."""
    with connect(port) as sock:
        sock.sendall(infer(loop_body(10), length=10))
        (status, reply), (_, after) = replies(sock, 2)
    assert status == b"HTTP/1.1 400 Bad Request" and reply["error"].startswith("malformed JSON"), reply
    assert after["error"].startswith("invalid HTTP request"), after


# -- half-closed connections ----------------------------------------------------------------------

def test_a_client_that_half_closes_after_its_requests_gets_every_reply(port):
    """A client may shut its side down once its request is sent (HTTP/1.0 tools, ``nc -N``); the
    server dropped the connection at that EOF, and the reply, of any request it computed on a
    thread (a health check answered at once was spared)."""
    with connect(port) as sock:
        sock.sendall(infer(loop_body(100_000)) + infer(loop_body(10, 1.0)))
        sock.shutdown(socket.SHUT_WR)
        got = replies(sock, 2)
        assert closed_by_server(sock, time.monotonic() + 10), "the server kept a half-closed connection open"
    assert [y_of(reply) for _, reply in got] == [100_000.5, 11.0]


def test_a_client_that_half_closes_in_its_body_or_headers_is_closed_at_once(port):
    for partial in (infer(loop_body(10))[:-5], INFER + b"Content-Le"):
        with connect(port) as sock:
            sock.sendall(partial)
            sock.shutdown(socket.SHUT_WR)
            start = time.monotonic()
            assert closed_by_server(sock, start + 5) and time.monotonic() - start < 2, partial


# -- headers ------------------------------------------------------------------------------------

def test_a_repeated_header_is_read_as_one_list_not_as_its_last_line(port):
    """A header given twice reads as the comma-joined list (RFC 9110, 5.3); the server read only the
    last line, so which length or coding applied depended on the order of the lines."""
    body = loop_body(10)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        twice = [("Inference-Header-Content-Length", "3"), ("Inference-Header-Content-Length", str(len(body)))]
        reply = http.post("/v2/models/loop/infer", content=body, headers=twice)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"] == (f"bad Inference-Header-Content-Length header '3, {len(body)}': expected a "
                                         "byte count of at most 20 digits")
        coded = [("Content-Encoding", "gzip"), ("Content-Encoding", "identity")]
        reply = http.post("/v2/models/loop/infer", content=body, headers=coded)
        assert reply.status_code == 415 and "'gzip, identity'" in reply.json()["error"], reply.text
        assert http.post("/v2/models/loop/infer", content=body).status_code == 200


def test_a_transfer_coding_besides_chunked_is_a_501_naming_it(port):
    """The HTTP parser unchunks ``Transfer-Encoding: gzip, chunked`` and passes the body on still
    gzip-coded: it was parsed as it came (a client that meant Content-Encoding got "malformed JSON")."""
    body = zlib.compress(loop_body(10))
    with connect(port) as sock:
        sock.sendall(INFER + b"Transfer-Encoding: deflate, chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        [(status, reply)] = replies(sock, 1)
    assert status == b"HTTP/1.1 501 Not Implemented", (status, reply)
    assert reply["error"].startswith("unsupported Transfer-Encoding 'deflate, chunked'"), reply


@pytest.mark.parametrize("path, request_json", [
    ("/v2/models/loop/infer", {"inputs": [{"name": "n" * 1_000_000, "datatype": "INT64", "shape": [], "data": [1]}]}),
    ("/v2/models/loop/infer", {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1] * 100_000, "data": [1.0]}]}),
    ("/v2/models/" + "m" * 60_000, None),
])
def test_an_error_quotes_a_huge_name_or_shape_briefly(port, path, request_json):
    """Errors quoted what the client sent in full: a megabyte-long input name came back in a
    megabyte of error; now the message keeps its start and its end (what the model expects)."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        reply = http.post(path, json=request_json) if request_json else http.get(path)
    message = reply.json()["error"]
    assert 400 <= reply.status_code < 500 and len(message) < 4200 and "characters left out)..." in message, message[:300]
    assert message.startswith(("model 'loop': unknown input 'nnnn", "input 'x': shape [1, 1, 1",
                               "unknown model 'mmmm")), message[:100]
    assert message.endswith(("x: float32[1]", "has 100000 dims, more than the limit of 64 (numpy's)",
                             "; this server has loop")), message[-100:]


# -- methods --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, path, allow", [
    ("GET", "/v2/models/loop/infer", "POST"),
    ("POST", "/v2/health/live", "GET, HEAD"),
    ("DELETE", "/v2/models/loop", "GET, HEAD"),
    ("GET", "/v2/repository/index", "POST"),
])
def test_a_405_says_which_methods_are_allowed(port, method, path, allow):
    """RFC 9110, 15.5.6: a 405 must carry ``Allow``; the JSON error reply dropped it."""
    reply = httpx.request(method, f"http://127.0.0.1:{port}{path}", timeout=30)
    assert reply.status_code == 405, reply.text
    assert reply.json() == {"error": f"method {method} is not allowed on {path}; it takes {allow}"}
    assert reply.headers.get("allow") == allow, reply.headers


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/loop",
                                  "/v2/models/loop/ready", "/v2/models/loop/config"])
def test_head_is_answered_as_get_without_a_body(port, path):
    """Every server must support HEAD where it supports GET (RFC 9110, 9.1); it got a 405."""
    get = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30)
    head = httpx.head(f"http://127.0.0.1:{port}{path}", timeout=30)
    assert head.status_code == get.status_code == 200 and head.content == b"", head
    assert head.headers["content-length"] == get.headers["content-length"]


# -- compressed bodies ----------------------------------------------------------------------------

def test_decompressing_bombs_never_stalls_other_connections(tmp_path):
    """Bodies were inflated on the event loop: while gzip bombs (300 KB on the wire, past the
    64 MB body limit inflated) kept arriving, a health check waited for them (median 0.9 s
    measured; now about 2 ms)."""
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = deflater.compress(bytes(100 << 20)) + deflater.flush()
    stop = threading.Event()
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "ort-cpu",
                       "--max-body-bytes", str(64 << 20)) as (_, port):
        url = f"http://127.0.0.1:{port}"

        def attack() -> None:
            with httpx.Client(timeout=30) as http:
                while not stop.is_set():
                    reply = http.post(f"{url}/v2/models/loop/infer", content=bomb,
                                      headers={"Content-Encoding": "gzip", "Inference-Header-Content-Length": "2"})
                    assert reply.status_code == 413, reply.text

        attackers = [threading.Thread(target=attack, daemon=True) for _ in range(2)]
        for thread in attackers:
            thread.start()
        waits = []
        try:
            with httpx.Client(timeout=30) as http:
                time.sleep(0.5)
                end = time.monotonic() + 4
                while time.monotonic() < end:
                    start = time.monotonic()
                    assert http.get(f"{url}/v2/health/live").status_code == 200
                    waits.append(time.monotonic() - start)
                    time.sleep(0.01)
        finally:
            stop.set()
            for thread in attackers:
                thread.join(30)
    waits.sort()
    assert waits[len(waits) // 2] < 0.05, f"median health check {waits[len(waits) // 2]:.3f} s under gzip bombs"


@pytest.mark.parametrize("path", ["/v2/models/loop/infer/", "/v2/models/loop/", "/v2/health/ready/"])
def test_a_trailing_slash_is_not_redirected_to_the_host_the_client_named(port, path):
    """Starlette redirected a path with a trailing slash (307) to a Location built from the Host
    header, so a forged Host sent a client elsewhere; such a path is a 404 naming it."""
    reply = httpx.request("POST" if "infer" in path else "GET", f"http://127.0.0.1:{port}{path}",
                          headers={"Host": "attacker.example"}, json={"inputs": []}, timeout=30)
    assert reply.status_code == 404 and "location" not in reply.headers, (reply.status_code, reply.headers)
    assert path in reply.json()["error"]
