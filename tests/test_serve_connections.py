"""Near its descriptor limit the server closes the longest-idle connections for new ones, and
answers a new client it has no room for with a 503. It ran out of descriptors: uvloop then accepts
each new connection and closes it at once, so under ``ulimit -n 256`` 400 connections that sent
nothing shut a well-behaved client out until the read timeout closed them (29.8 s at the default
30 s). Clients that send a request line and then a header now and then (slowloris) are closed for
new ones once their heads have been arriving for ``HEAD_TIMEOUT``: 400 of them held every
connection for the read timeout, a new client getting a reset or a 503 each time."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import onnx
import pytest

from serve_util import fixed_model, read_reply, serve_process

LIMIT = 256  # the server's RLIMIT_NOFILE
# The connections it holds: the limit less the 4 descriptors open when it is configured (stdin,
# stdout, stderr, the listening socket) and connections.HEADROOM_DESCRIPTORS.
CAP = LIMIT - 4 - 32
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


def first_line(sock: socket.socket) -> bytes | None:
    """The first line of what the server sent on ``sock`` before it closed it (b"" for nothing);
    None while it is open."""
    sock.setblocking(False)
    try:
        return sock.recv(4096).split(b"\r\n", 1)[0]
    except BlockingIOError:
        return None
    except OSError:
        return b""


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def infer(sock: socket.socket) -> bytes:
    sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
    return read_reply(sock)


def assert_new_client_served(port: int) -> None:
    """A new client's inference is answered, right, within 1 s."""
    start = time.monotonic()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/v2", timeout=10) as client:
        reply = client.post("/models/fixed/infer", json=json.loads(BODY))
    served = time.monotonic() - start
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [0.0, 2.0, 0.0, 4.0, 0.0, 6.0]
    assert served < 1.0, f"the new client waited {served:.1f} s"


def test_idle_connections_past_the_descriptor_limit_do_not_keep_a_new_client_out(model_file):
    with serve_process(model_file, "--backend", "numpy", descriptors=LIMIT) as (proc, port):
        arriving = connect(port)  # a request half sent: never closed for room
        arriving.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY[:10]))
        idle = idle_connections(port, IDLE)
        assert_new_client_served(port)

        keeper = connect(port)  # the most recently active: the idle ones opened after it close others
        assert infer(keeper).startswith(b"HTTP/1.1 200")
        idle += idle_connections(port, 100)
        assert infer(keeper).startswith(b"HTTP/1.1 200"), "a recently active connection was closed for room"

        arriving.sendall(BODY[10:])
        assert read_reply(arriving).startswith(b"HTTP/1.1 200"), "a request still arriving was closed for room"
        held = still_open(idle)
        assert held <= CAP - 2, f"{held} idle connections held past the cap of {CAP}"
        assert descriptors(proc.pid) < LIMIT - 8, "the server ran up to its descriptor limit"


def test_clients_sending_their_headers_slowly_are_closed_for_a_new_client(model_file):
    from graphc.serving.kserve.connections import HEAD_TIMEOUT

    with serve_process(model_file, "--backend", "numpy", descriptors=LIMIT) as (proc, port):
        baseline = descriptors(proc.pid)
        slow = [connect(port) for _ in range(IDLE)]
        for sock in slow:
            sock.sendall(b"POST /v2/models/fixed/infer HTTP/1.1\r\n")
        done = threading.Event()

        def trickle() -> None:  # a header line on each every 0.2 s, each head never ending
            for k in range(10_000):
                for sock in slow:
                    try:
                        sock.sendall(b"X-%d: y\r\n" % k)
                    except OSError:
                        pass
                if done.wait(0.2):
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            time.sleep(HEAD_TIMEOUT + 0.2)  # the heads held are late now
            peak = descriptors(proc.pid)
            assert_new_client_served(port)
            assert max(peak, descriptors(proc.pid)) < LIMIT - 8, "the server ran up to its descriptor limit"
        finally:
            done.set()
            sender.join()
        replies = [first_line(sock) for sock in slow]  # None: still open
        closed = [line for line in replies if line is not None]
        assert IDLE - CAP <= len(closed) < IDLE, len(closed)
        assert set(closed) <= {b"HTTP/1.1 503 Service Unavailable", b"HTTP/1.1 408 Request Timeout", b""}, set(closed)
        assert b"HTTP/1.1 408 Request Timeout" in closed, "no slow head was closed for the new client"
        for sock in slow:
            sock.close()
        deadline = time.monotonic() + 5
        while descriptors(proc.pid) > baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert descriptors(proc.pid) == baseline, f"{descriptors(proc.pid)} descriptors held, {baseline} before"


def test_past_the_limit_with_no_connection_idle_a_new_client_gets_a_503_naming_it(model_file):
    with serve_process(model_file, "--backend", "numpy", "--max-queue", "1000", descriptors=LIMIT) as (_, port):
        busy = [connect(port) for _ in range(CAP + 8)]
        for sock in busy:  # a request's body, half sent: never closed for room
            sock.sendall(HEAD + b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY[:10]))
        time.sleep(1.5)  # the server has read them all, past HEAD_TIMEOUT
        with connect(port) as sock:
            sock.sendall(GET)
            reply = read_reply(sock)
        head, body = reply.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503") and b"\r\nconnection: close" in head.lower(), head
        assert b"\r\nretry-after: 1" in head.lower(), head
        assert json.loads(body)["error"] == (f"the server holds the most connections its descriptor limit allows "
                                             f"({CAP}), none idle or late; try again later")
        answered = 0
        for sock in busy:  # the held ones are answered; the rest got their 503
            try:
                sock.sendall(BODY[10:])
                answered += read_reply(sock).startswith(b"HTTP/1.1 200")
            except (AssertionError, OSError):
                pass
        assert CAP - 8 <= answered <= CAP, answered
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v2", timeout=10) as client:
            assert client.post("/models/fixed/infer", json=json.loads(BODY)).status_code == 200


class Conn:
    def __init__(self, busy: bool = False, head_since: float | None = None):
        self.busy, self.evicted, self.since = busy, False, head_since

    def idle(self) -> bool:
        return not self.busy and self.since is None

    def head_since(self) -> float | None:
        return self.since

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


def test_past_the_cap_the_longest_late_head_is_closed_before_an_idle_connection():
    from graphc.serving.kserve.connections import HEAD_TIMEOUT, Connections

    now = time.monotonic()
    conns = Connections(cap=4)
    idle, young, late, later = Conn(), Conn(head_since=now), Conn(head_since=now - HEAD_TIMEOUT - 1), \
        Conn(head_since=now - HEAD_TIMEOUT - 2)
    for conn in (idle, young, late, later):
        assert conns.opened(conn)
    assert conns.opened(Conn()) and later.evicted and not (late.evicted or idle.evicted)
    assert conns.opened(Conn()) and late.evicted and not idle.evicted
    assert conns.opened(Conn()) and idle.evicted and not young.evicted  # a head within HEAD_TIMEOUT stays


def test_the_cap_leaves_room_for_the_descriptors_the_process_holds(tmp_path):
    """The reserve is what is open when the server is configured plus HEADROOM_DESCRIPTORS: a
    process that holds more files of its own gets a smaller cap (a fixed 64 did not change)."""
    import resource

    from graphc.serving.kserve.connections import HEADROOM_DESCRIPTORS, connection_cap, open_descriptors

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no descriptor limit")
    before = connection_cap()
    assert before == soft - open_descriptors() - HEADROOM_DESCRIPTORS
    files = [open(tmp_path / f"f{i}", "w") for i in range(100)]
    try:
        assert connection_cap() == before - 100
    finally:
        for f in files:
            f.close()
