"""How many requests `graphc serve` holds, and what a stalled request leaves behind, against the
server in its own process: past ``--max-queue`` requests are refused from their headers with a
503 while the held ones are answered; a body that stops arriving gets a 408 and its bytes go; a
request head past ``MAX_HEAD_BYTES`` gets a 431, a URL past ``MAX_URL_BYTES`` a 414."""

from __future__ import annotations

import json
import socket
import time

import httpx
import onnx

from serve_util import closed_by_server, headed, loop_model, mixed_model, read_reply, rss_mb, serve_process


def loop_body(n: int, x: float) -> bytes:
    return json.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [], "data": [n]},
                                  {"name": "x", "datatype": "FP32", "shape": [1], "data": [x]}]}).encode()


def post(port: int, body: bytes, length: int | None = None, headers: bytes = b"") -> socket.socket:
    """A connection that sent an infer request for the loop model: its head (Content-Length
    ``length``, the body's by default; ``headers`` more lines) and ``body``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
                 % (headers, len(body) if length is None else length, body))
    return sock


def split(reply: bytes) -> tuple[bytes, dict]:
    head, body = reply.split(b"\r\n\r\n", 1)
    return head.lower(), json.loads(body)


def test_requests_past_max_queue_are_refused_at_once_and_the_held_ones_answered(tmp_path):
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "ort-cpu", "--max-queue", "2") as (_, port):
        bodies = [loop_body(200_000, 0.5), loop_body(100_000, 1.5)]
        held = [headed(port, len(body)) for body in bodies]  # the server reads both bodies: the queue is full
        refused = [post(port, loop_body(5, 0.0)) for _ in range(3)]
        # headers only, announcing a 200 MB body: refused without waiting for a byte of it
        refused.append(post(port, b"", length=200 << 20))
        for sock in refused:
            head, error = split(read_reply(sock))
            assert head.startswith(b"http/1.1 503") and b"connection: close" in head, head
            assert "holds its limit of 2 infer requests at once (--max-queue)" in error["error"], error
            assert closed_by_server(sock, time.monotonic() + 30)
            sock.close()
        assert httpx.get(f"http://127.0.0.1:{port}/v2/health/live", timeout=30).status_code == 200
        for sock, body, want in zip(held, bodies, (200_000.5, 100_001.5)):
            sock.sendall(body)
            head, reply = split(read_reply(sock))
            assert head.startswith(b"http/1.1 200") and reply["outputs"][0]["data"] == [want], (head, reply)
            sock.close()
        # the held requests gave their places back
        for _ in range(3):
            sock = post(port, loop_body(7, 1.0))
            head, reply = split(read_reply(sock))
            assert head.startswith(b"http/1.1 200") and reply["outputs"][0]["data"] == [8.0], (head, reply)
            sock.close()


def test_the_default_queue_limit_holds_more_than_a_thread_pool():
    import inspect

    from graphc.serving import serve as serving
    from graphc.serving.kserve import infer

    assert 32 < infer.DEFAULT_MAX_QUEUE == inspect.signature(serving.serve).parameters["max_queue"].default


def stall_bodies(port: int, header: bytes, count: int) -> list[socket.socket]:
    """``count`` requests that each send 8 MB of a 16 MB binary body, then nothing."""
    stalled = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(b"POST /v2/models/mixed/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(header), len(header) + (16 << 20), header))
        sock.sendall(bytes(8 << 20))
        stalled.append(sock)
    return stalled


def test_a_body_that_stalls_gets_a_408_and_its_bytes_are_freed(tmp_path):
    """Three rounds of 20 stalled 8 MB bodies: each is answered 408 and closed at the read timeout,
    and the memory they held is reused by the next round (it grows by 160 MB a round if kept)."""
    onnx.save(mixed_model(), str(tmp_path / "mixed.onnx"))
    header = json.dumps({"inputs": [{"name": "x", "shape": [4 << 20, 1], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16 << 20}}]}).encode()
    with serve_process(str(tmp_path / "mixed.onnx"), "--backend", "numpy", "--read-timeout", "6") as (proc, port):
        before, after = rss_mb(proc.pid), []
        for _ in range(3):
            stalled = stall_bodies(port, header, 20)
            deadline = time.monotonic() + 30  # until the server has read what was sent
            while (grown := rss_mb(proc.pid)) - before < 100 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert grown - before > 100, (before, grown)  # the partial bodies are held
            for sock in stalled:
                reply = read_reply(sock)
                assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
                assert split(reply)[1] == {"error": "request not received in time"}
                assert closed_by_server(sock, time.monotonic() + 30)
                sock.close()
            after.append(rss_mb(proc.pid))
        # a leak grows by a round's 160 MB every round; the allocator may settle over the first two (one CI run
        # under load: 238, 292, 292 MB), so the last round is held to the second and all to less than one round
        said = f"RSS {before:.0f} MB at first, then {after} MB after each round"
        assert after[-1] - after[1] < 50 and after[-1] - after[0] < 100, said


def test_a_head_past_the_limit_gets_a_431_at_once_and_one_within_it_is_served(tmp_path):
    """httptools bounds neither a header, nor the header list, nor a chunked body's trailers: a
    client sent 1.4 GB of headers in 4 s (or 416 MB of trailers), all held by the server (RSS 125 MB
    -> 1.5 GB) until the read timeout."""
    from graphc.serving.kserve.deadline_protocol import MAX_HEAD_BYTES

    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    body = loop_body(3, 0.5)
    many = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 90) for i in range(1000))
    chunked = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n" % (len(body), body)
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "numpy", "--read-timeout", "120") as (_, port):
        for extra in (b"X-Big: %s\r\n" % (b"b" * MAX_HEAD_BYTES), many, chunked + many):  # header, headers, trailers
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # well within the read timeout
            sock.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\n" + extra)  # and more to come
            head, error = split(read_reply(sock))
            assert head.startswith(b"http/1.1 431") and b"connection: close" in head, head
            assert error == {"error": "the request line and headers (trailers included) exceed the server's limit of "
                                      f"{MAX_HEAD_BYTES} bytes"}, error
            assert closed_by_server(sock, time.monotonic() + 30)
            sock.close()
        within = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 90) for i in range(MAX_HEAD_BYTES // 100 - 20))
        small_chunks = b"".join(b"1\r\n%s\r\n" % body[i:i + 1] for i in range(len(body)))  # 6 bytes a byte
        for sent in (b"%sContent-Length: %d\r\n\r\n%s" % (within, len(body), body),  # headers within the limit
                     b"Transfer-Encoding: chunked\r\n\r\n%s0\r\n%s\r\n" % (small_chunks, within)):  # and trailers
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\n" + sent)
            head, reply = split(read_reply(sock))
            assert head.startswith(b"http/1.1 200") and reply["outputs"][0]["data"] == [3.5], (head, reply)
            sock.close()
        # many small requests pipelined in one write are not one large head
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        one = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n%s\r\n" % (b"X-Pad: %s\r\n" % (b"p" * 900))
        sock.sendall(one * 300)
        replies = b""
        while replies.count(b'{"live":true}') < 300:
            chunk = sock.recv(65536)
            assert chunk, replies[-300:]
            replies += chunk
        assert replies.count(b"HTTP/1.1 200") == 300
        sock.close()


def test_a_url_past_the_limit_gets_a_414_naming_it(tmp_path):
    """httptools parses no URL over 65535 bytes: one of 66-70 KB, read in one recv, got a 400
    "invalid HTTP request: User callback error", naming neither the URL nor its length."""
    from graphc.serving.kserve.deadline_protocol import MAX_URL_BYTES

    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "numpy") as (_, port):
        for length, writes in ((66_000, 1), (70_000, 1), (70_000, 2)):  # the URL in one write, or in two
            url = b"/v2/models/loop?q=" + b"a" * (length - 18)
            request = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % url
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            for part in (request[:40_000], request[40_000:]) if writes == 2 else (request,):
                sock.sendall(part)
                time.sleep(0.1)
            head, error = split(read_reply(sock))
            assert head.startswith(b"http/1.1 414") and b"connection: close" in head, head
            assert error["error"].startswith("invalid HTTP request: the request line is too long: its URL exceeds "
                                             f"the server's limit of {MAX_URL_BYTES} bytes ("), error
            assert closed_by_server(sock, time.monotonic() + 30)
            sock.close()
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # one within it is served
        sock.sendall(b"GET /v2/models/loop?q=%s HTTP/1.1\r\nHost: x\r\n\r\n" % (b"a" * 65_000))
        head, reply = split(read_reply(sock))
        assert head.startswith(b"http/1.1 200") and reply["name"] == "loop", (head, reply)
        sock.close()


def test_a_body_that_stalls_gives_its_queue_place_back_with_its_408(tmp_path):
    """A client that stalls its body (at a chunk boundary or in a Content-Length body) and reads
    nothing more holds its --max-queue place until its 408, no longer: the place was held through
    the 2 s linger after it as well."""
    onnx.save(loop_model(), str(tmp_path / "loop.onnx"))
    body = loop_body(3, 0.5)
    with serve_process(str(tmp_path / "loop.onnx"), "--backend", "numpy", "--read-timeout", "2",
                       "--max-queue", "2") as (_, port):
        url = f"http://127.0.0.1:{port}/v2/models/loop/infer"
        chunked = socket.create_connection(("127.0.0.1", port), timeout=60)
        chunked.sendall(b"POST /v2/models/loop/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"a\r\n%s\r\n" % body[:10])
        stalled = [post(port, body[:10], length=len(body)), chunked]
        started = time.monotonic()
        time.sleep(0.2)
        assert httpx.post(url, content=body, timeout=30).status_code == 503
        statuses = []
        while time.monotonic() - started < 4.5 and statuses[-1:] != [200]:
            statuses.append(httpx.post(url, content=body, timeout=30).status_code)
            time.sleep(0.05)
        waited = time.monotonic() - started
        assert statuses[-1] == 200 and waited < 3.0, (waited, statuses)  # before: 4 s, 2 s more
        for sock in stalled:
            assert read_reply(sock).startswith(b"HTTP/1.1 408")
            sock.close()
