"""Shared by the deploy and serve tests: small ONNX models with FP32/INT64/BOOL tensors, a
text-protobuf parser for Triton's config.pbtxt, and a server on a free loopback port."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def mixed_model(opset: int = 17) -> onnx.ModelProto:
    """x float32[N,4], idx int64[N,3], mask bool[N,4] -> y float32[N,4], s int64[N,3], m bool[N,4]."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4), "w")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Where", ["mask", "xw", "x"], ["y"]),
        helper.make_node("Add", ["idx", "one"], ["s"]),
        helper.make_node("Not", ["mask"], ["m"]),
    ]
    graph = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 3]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("s", TensorProto.INT64, ["N", 3]),
         helper.make_tensor_value_info("m", TensorProto.BOOL, ["N", 4])],
        [w, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else 10
    return model


def bfloat16_model() -> onnx.ModelProto:
    """x bfloat16[N], s float32[N] -> y = bfloat16(float(x) * 3 + s), z = x, w = bfloat16(s)."""
    bf16, f32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=f32),
             helper.make_node("Mul", ["xf", "three"], ["x3"]),
             helper.make_node("Add", ["x3", "s"], ["yf"]),
             helper.make_node("Cast", ["yf"], ["y"], to=bf16),
             helper.make_node("Identity", ["x"], ["z"]),
             helper.make_node("Cast", ["s"], ["w"], to=bf16)]
    graph = helper.make_graph(
        nodes, "bf16", [helper.make_tensor_value_info("x", bf16, ["N"]), helper.make_tensor_value_info("s", f32, ["N"])],
        [helper.make_tensor_value_info(n, bf16, ["N"]) for n in ("y", "z", "w")],
        [helper.make_tensor("three", f32, [], [3.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def mixed_feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 4)).astype(np.float32),
            "idx": rng.integers(-100, 100, size=(n, 3)).astype(np.int64),
            "mask": rng.random((n, 4)) < 0.5}


def sum_model() -> onnx.ModelProto:
    """x float32[n] -> y = ReduceSum(x) float32[]: a request as large as its input, a reply of one number."""
    graph = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0)], "sum",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def sum_request(megabytes: float) -> bytes:
    """An infer request (head and body) for ``sum_model`` whose binary tensor is ``megabytes`` MB of float32 ones."""
    data = np.ones(int(megabytes * 1e6) // 4, np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "x", "shape": [len(data) // 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    return b"POST /v2/models/sum/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n" \
           b"Content-Length: %d\r\n\r\n%s%s" % (len(header), len(header) + len(data), header, data)


def flood(port: int, pid: int, clients: int, request: bytes) -> tuple[float, float, list[bytes]]:
    """``clients`` connections that each send ``request`` at once, whole, then read its reply:
    the server's RSS (MB) before, its peak meanwhile (sampled every 10 ms), and the replies."""
    replies: list[bytes] = []
    before, peak, done = rss_mb(pid), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.01)

    def client() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            try:
                sock.sendall(request)
            except OSError:  # refused from its headers and closed after its linger: its reply is still read
                pass
            replies.append(read_reply(sock))

    sampler = threading.Thread(target=sample)
    sampler.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        done.set()
        sampler.join()
    return before, peak[0], replies


def fixed_model() -> onnx.ModelProto:
    """A model whose batch dim is fixed (x float32[2,3] -> y), for max_batch_size errors."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "fixed",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def loop_model() -> onnx.ModelProto:
    """y = x + n (float32[1]) by a Loop of n steps: a tiny body whose request takes as long as n says."""
    def info(name, kind, shape):
        return helper.make_tensor_value_info(name, kind, shape)

    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "one"], ["v_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [info("i", TensorProto.INT64, []), info("cond_in", TensorProto.BOOL, []),
                 info("v_in", TensorProto.FLOAT, [1])],
        [info("cond_out", TensorProto.BOOL, []), info("v_out", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(np.array(True), "go")),
         helper.make_node("Loop", ["n", "go", "x"], ["y"], body=body)],
        "loop", [info("n", TensorProto.INT64, []), info("x", TensorProto.FLOAT, [1])],
        [info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# -- text protobuf ------------------------------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|("(?:[^"\\]|\\.)*")|([A-Za-z_][\w.]*)|(-?\d+(?:\.\d+)?)|([:{}\[\],]))')


def _tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            if text[pos:].strip():
                raise ValueError(f"bad text protobuf at {text[pos:pos + 20]!r}")
            break
        pos = m.end()
        if m.group(1) is None:
            out.append(m.group(0).strip())
    return out


def _value(tokens: list[str], i: int) -> tuple[Any, int]:
    tok = tokens[i]
    if tok == "{":
        return _message(tokens, i + 1, "}")
    if tok.startswith('"'):
        return bytes(tok[1:-1], "utf-8").decode("unicode_escape"), i + 1
    if re.fullmatch(r"-?\d+", tok):
        return int(tok), i + 1
    return tok, i + 1  # an enum such as TYPE_FP32


def _message(tokens: list[str], i: int, end: str | None) -> tuple[dict[str, list[Any]], int]:
    """Fields as name -> list of values (repeated fields and ``[...]`` lists both append)."""
    fields: dict[str, list[Any]] = {}
    while i < len(tokens) and tokens[i] != end:
        name = tokens[i]
        i += 1
        if tokens[i] == ":":
            i += 1
        values = fields.setdefault(name, [])
        if tokens[i] == "[":
            i += 1
            while tokens[i] != "]":
                value, i = _value(tokens, i)
                values.append(value)
                if tokens[i] == ",":
                    i += 1
            i += 1
        else:
            value, i = _value(tokens, i)
            values.append(value)
    return fields, i + 1


def parse_pbtxt(text: str) -> dict[str, list[Any]]:
    """A small parser for the text protobuf subset Triton configs use."""
    fields, _ = _message(_tokens(text), 0, None)
    return fields


# -- a server on a free loopback port -------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a thread; yields ``"127.0.0.1:PORT"``."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextlib.contextmanager
def serve_process(*args: str, timeout: float = 60, descriptors: int | None = None,
                  setup: str = "") -> Iterator[tuple[Any, int]]:
    """`graphc serve ARGS --port P` in its own process; yields (process, port) once it has printed
    its "serving" line (which it prints only once it listens). Stopped with SIGTERM at the end.
    ``descriptors``: the process's limit on open files (soft and hard, as ``ulimit -n``); ``setup``:
    Python statements the process runs first (e.g. to set a module's constant)."""
    import resource
    import signal
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    port = free_port()
    cmd = [sys.executable, "-c", f"{setup}\nfrom graphc.cli import main; main()", "serve", *args, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=None if descriptors is None else limit)
    try:
        line = _first_line(proc, timeout)
        assert line.startswith("serving "), line
        assert re.search(r"\(backend (auto: )?(numpy|ort-cpu|ort-cuda)\)", line), line  # "auto" says what it chose
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stdout.close()


def _first_line(proc: Any, timeout: float) -> str:
    """The process's first line of output, read on a thread so that a hung start fails in time."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not lines:
        proc.kill()
        raise AssertionError("graphc serve printed nothing in time")
    return lines[0].rstrip("\n")


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (VmRSS from /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset, after any 408 reply) before ``deadline``."""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def read_reply(sock: socket.socket) -> bytes:
    """One whole HTTP reply (head and Content-Length bytes of body) read from ``sock``."""
    reply = b""
    while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < int(
            re.search(rb"(?i)content-length: *(\d+)", reply).group(1)):
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection in its reply: {reply[:200]!r}"
        reply += chunk
    return reply


def headed(port: int, head_length: int, model: str = "loop") -> socket.socket:
    """A connection that sent an infer request's head (``Expect: 100-continue``) and got the
    server's 100: the app is reading its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % (model.encode(), head_length))
    assert sock.recv(1024).startswith(b"HTTP/1.1 100"), "the server did not ask for the body"
    return sock
