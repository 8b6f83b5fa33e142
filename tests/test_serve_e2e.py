"""End to end: gc.Trainer -> export -> gc.deploy.triton -> `graphc serve` (a subprocess) ->
tritonclient; and graceful shutdown on SIGTERM with a request in flight."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import graphc as gc
from serve_util import free_port, mixed_feeds, mixed_model
from trainer_models import blobs, bn_artifacts

httpclient = pytest.importorskip("tritonclient.http")


def start_serve(*args: str) -> tuple[subprocess.Popen, str]:
    """`graphc serve ARGS --port P` in a subprocess, once it answers ready."""
    port = free_port()
    return started([sys.executable, "-c", "from graphc.cli import main; main()", "serve", *args, "--port", str(port)],
                   port)


def started(cmd: list[str], port: int) -> tuple[subprocess.Popen, str]:
    """``cmd`` (a server on ``port``) in a subprocess, once it answers ready."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if client.is_server_ready():
                client.close()
                return proc, f"127.0.0.1:{port}"
        except Exception:  # noqa: BLE001 - not listening yet
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the server did not start:\n{proc.communicate()[0]}")


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_trained_model_exported_deployed_served(tmp_path):
    trainer = gc.Trainer(bn_artifacts(), backend="ort-cpu")
    trainer.fit(gc.data.DataLoader(blobs(256), batch_size=32), 3, progress=False)
    exported = trainer.export_inference(tmp_path / "blobs.onnx")
    gc.deploy.triton(exported, tmp_path / "repo", "blobs", max_batch_size=64, dynamic_batching=True)
    proc, url = start_serve(str(tmp_path / "repo"), "--backend", "ort-cpu")
    try:
        client = httpclient.InferenceServerClient(url)
        meta = client.get_model_metadata("blobs")
        assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [("x", "FP32", [-1, 8])]
        for n in (1, 64):
            batch = blobs(n, seed=n)
            item = httpclient.InferInput("x", [n, 8], "FP32")
            item.set_data_from_numpy(batch["x"])
            got = client.infer("blobs", [item]).as_numpy("logits")
            np.testing.assert_allclose(got, trainer.predict(batch)["logits"], rtol=1e-4, atol=1e-5)
        assert (got.argmax(1) == batch["y"]).mean() > 0.9  # it learned the blobs
        client.close()
    finally:
        assert stop(proc) == 0


def _raw_request(port: int, body: bytes) -> tuple[socket.socket, bytes]:
    """Open a connection, send an infer request's head and all of its body but 10 bytes, and
    return once the app is reading the body: the head asks ``Expect: 100-continue``, which the
    server answers when the app first waits for body bytes (no sleep that a loaded machine
    could outlast)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (f"POST /v2/models/mixed/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
    sock.sendall(head)
    interim = b""
    while b"\r\n\r\n" not in interim:
        chunk = sock.recv(1024)
        assert chunk, "the server closed the connection before reading the request"
        interim += chunk
    assert interim.startswith(b"HTTP/1.1 100"), interim
    sock.sendall(body[:-10])
    return sock, body[-10:]


def test_sigterm_finishes_in_flight_requests_and_exits_0(tmp_path):
    model_path = tmp_path / "mixed.onnx"
    model_path.write_bytes(mixed_model().SerializeToString())
    proc, url = start_serve(str(model_path), "--backend", "numpy")
    assert _answers_in_flight_and_exits_0(proc, int(url.rsplit(":", 1)[1]))[-1] == f"stopped serving {model_path}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_gc_serve_in_a_script_stops_as_the_cli_does(tmp_path, sig):
    """gc.serve called from a plain script: a signal lets the in-flight request be answered, then gc.serve
    returns and the script goes on to exit 0 (uvicorn re-raises the signal it stopped on: exit 143 or a
    KeyboardInterrupt, had serve_app not set handlers that ignore it)."""
    model_path = tmp_path / "mixed.onnx"
    model_path.write_bytes(mixed_model().SerializeToString())
    port = free_port()
    script = f"import graphc as gc; gc.serve({str(model_path)!r}, port={port}, backend='numpy'); print('returned')"
    proc, _ = started([sys.executable, "-c", script], port)
    assert _answers_in_flight_and_exits_0(proc, port, sig) == ["returned"]


def _answers_in_flight_and_exits_0(proc: subprocess.Popen, port: int, sig: int = signal.SIGTERM) -> list[str]:
    """Send ``proc`` (serving mixed.onnx on ``port``) ``sig`` with a request half sent; check the request is
    answered and the process exits 0; return its output's lines."""
    feeds = mixed_feeds(2)
    body = json.dumps({"inputs": [{"name": k, "shape": list(v.shape), "datatype": d, "data": v.ravel().tolist()}
                                  for (k, v), d in zip(feeds.items(), ("FP32", "INT64", "BOOL"))]}).encode()
    sock, rest = _raw_request(port, body)
    try:
        proc.send_signal(sig)
        time.sleep(0.5)
        assert proc.poll() is None, "the server quit with a request in flight"
        sock.sendall(rest)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < _length(reply):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    finally:
        sock.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    outputs = json.loads(reply.split(b"\r\n\r\n", 1)[1])["outputs"]
    assert outputs[1]["data"] == (feeds["idx"] + 1).ravel().tolist()
    assert proc.wait(timeout=30) == 0, proc.communicate()[0]
    return proc.communicate()[0].splitlines()


def _length(reply: bytes) -> int:
    for line in reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 1 << 30


def test_serve_cli_rejects_a_missing_source(tmp_path):
    result = subprocess.run([sys.executable, "-c", "from graphc.cli import main; main()", "serve",
                             str(tmp_path / "nothing.onnx")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no such model file or repository folder" in result.stderr
