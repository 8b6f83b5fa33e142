"""Near its descriptor limit the server closes the longest-idle connections for new ones, and
answers a new client it has no room for with a 503. It ran out of descriptors: uvloop then accepts
each new connection and closes it at once, so under ``ulimit -n 256`` 400 connections that sent
nothing shut a well-behaved client out until the read timeout closed them (29.8 s at the default
30 s)."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import onnx
import pytest

from serve_util import fixed_model, read_reply, serve_process

LIMIT = 256  # the server's RLIMIT_NOFILE
CAP = LIMIT - 64  # the connections it holds: connections.RESERVED_DESCRIPTORS kept for the rest
IDLE = 400
GET = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
BODY = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],
                               "data": [-1.0, 2.0, -3.0, 4.0, -5.0, 6.0]}]}).encode()
HEAD = b"POST /v2/models/fixed/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("connections") / "fixed.onnx"
    onnx.save(fixed_model(), str(path))
    return str(path)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def idle_connections(port: int, n: int) -> list[socket.socket]:
    """``n`` idle connections: half sent nothing, half are between requests (one answered)."""
    socks = []
    for i in range(n):
        socks.append(connect(port))
        if i % 2:
            socks[-1].sendall(GET)
            assert read_reply(socks[-1]).startswith(b"HTTP/1.1 200"), f"connection {i} was not answered"
    return socks


def still_open(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the server has not closed (no EOF or reset waiting)."""
    count = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            count += sock.recv(1) != b""
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def infer(sock: socket.socket) -> bytes:
    sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    return read_reply(sock)


def test_idle_connections_past_the_descriptor_limit_do_not_keep_a_new_client_out(model_file):
    with serve_process(model_file, "--backend", "numpy", descriptors=LIMIT) as (proc, port):
        arriving = connect(port)  # a request half sent: never closed for room
        arriving.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY[:10]))
        idle = idle_connections(port, IDLE)
        start = time.monotonic()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v2", timeout=10) as client:
            reply = client.post("/models/fixed/infer", json=json.loads(BODY))
        served = time.monotonic() - start
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [0.0, 2.0, 0.0, 4.0, 0.0, 6.0]
        assert served < 1.0, f"the new client waited {served:.1f} s"

        keeper = connect(port)  # the most recently active: the idle ones opened after it close others
        assert infer(keeper).startswith(b"HTTP/1.1 200")
        idle += idle_connections(port, 100)
        assert infer(keeper).startswith(b"HTTP/1.1 200"), "a recently active connection was closed for room"

        arriving.sendall(BODY[10:])
        assert read_reply(arriving).startswith(b"HTTP/1.1 200"), "a request still arriving was closed for room"
        held = still_open(idle)
        assert held <= CAP - 2, f"{held} idle connections held past the cap of {CAP}"
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) < LIMIT - 32, "the server ran up to its descriptor limit"


def test_past_the_limit_with_no_connection_idle_a_new_client_gets_a_503_naming_it(model_file):
    with serve_process(model_file, "--backend", "numpy", descriptors=LIMIT) as (_, port):
        busy = [connect(port) for _ in range(CAP + 8)]
        for sock in busy:
            sock.sendall(HEAD)  # a request's head, half sent
        time.sleep(1.0)  # the server has read them all
        with connect(port) as sock:
            sock.sendall(GET)
            reply = read_reply(sock)
        head, body = reply.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503") and b"\r\nconnection: close" in head.lower(), head
        assert b"\r\nretry-after: 1" in head.lower(), head
        assert json.loads(body)["error"] == (f"the server holds the most connections its descriptor limit allows "
                                             f"({CAP}), none idle; try again later")
        answered = 0
        for sock in busy:  # the held ones are answered; the rest got their 503 or were closed for room
            try:
                sock.sendall(b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
                answered += read_reply(sock).startswith(b"HTTP/1.1 200")
            except (AssertionError, OSError):
                pass
        assert CAP - 8 <= answered <= CAP, answered
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v2", timeout=10) as client:
            assert client.post("/models/fixed/infer", json=json.loads(BODY)).status_code == 200


class Conn:
    def __init__(self, busy: bool = False):
        self.busy, self.evicted = busy, False

    def idle(self) -> bool:
        return not self.busy

    def evict(self) -> None:
        self.evicted = True


def test_past_the_cap_the_least_recently_active_idle_connection_is_closed():
    from graphc.serving.kserve.connections import Connections

    conns = Connections(cap=3)
    a, b, c = Conn(), Conn(busy=True), Conn()
    for conn in (a, b, c):
        assert conns.opened(conn)
    conns.active(a)  # order now b (busy), c, a
    d = Conn()
    assert conns.opened(d) and c.evicted and not (a.evicted or b.evicted) and len(conns) == 3
    a.busy = d.busy = True
    e = Conn()
    assert not conns.opened(e) and len(conns) == 4  # none idle: over the cap until one is
    d.busy = False
    assert conns.admit(e) and d.evicted and len(conns) == 3
    conns.closed(a)
    conns.closed(d)  # closed already for room: nothing to forget
    assert len(conns) == 2 and Connections(cap=None).opened(Conn())
