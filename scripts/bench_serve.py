"""Benchmark the built-in KServe v2 server against onnxruntime called in-process.

    python scripts/bench_serve.py [--requests 2000] [--batches 1,64] [--clients 1,8]

Starts ``gc.serve`` on the two-layer net in a separate process on a free 127.0.0.1 port, drives
it with the stock ``tritonclient.http`` client (binary tensors, its default) from client
processes, each sending a fixed number of requests, then runs the same model with
``onnxruntime.InferenceSession.run`` in this process with as many threads. Prints p50/p99
latency and throughput of both, and the server's share of the in-process rate. Every loop is
bounded; the server is stopped with SIGTERM at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

FEATURES = 784


def two_layer_net(path: Path, hidden: int) -> str:
    """models/two_layer_net.py captured with a symbolic batch dim, saved to ``path``."""
    import graphc as gc
    from graphc.models.two_layer_net import TwoLayerNet, example_inputs

    model = gc.capture(TwoLayerNet(FEATURES, hidden, 10), **example_inputs())
    model.save(path)
    return f"models/two_layer_net.py {FEATURES}->{hidden}->10 ({model.inputs[0]}, opset {model.opset})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, backend: str, threads: int) -> subprocess.Popen:
    code = ("import graphc as gc, sys; gc.serve(sys.argv[1], port=int(sys.argv[2]), backend=sys.argv[3], "
            "name='net', log_level='warning', threads=int(sys.argv[4]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(model), str(port), backend, str(threads)])
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with status {proc.returncode}")
        try:
            if client.is_model_ready("net"):
                return proc
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not become ready within 60 s")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client_worker(port: int, batch: int, count: int, start: mp.Barrier, out: mp.Queue) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    x = np.random.default_rng(os.getpid()).random((batch, FEATURES), dtype=np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    for _ in range(5):  # warm the connection
        client.infer("net", [inp])
    start.wait()
    times = np.empty(count)
    cpu0 = time.process_time()
    for i in range(count):
        t0 = time.perf_counter()
        client.infer("net", [inp]).as_numpy("output")
        times[i] = time.perf_counter() - t0
    out.put((times, time.process_time() - cpu0))
    client.close()


def bench_server(server_pid: int, port: int, batch: int, clients: int, total: int) -> tuple[np.ndarray, float, float, float]:
    """Latencies, wall seconds, server CPU seconds and client CPU seconds of ``total`` requests."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(clients + 1), ctx.Queue()
    per = max(1, total // clients)
    procs = [ctx.Process(target=_client_worker, args=(port, batch, per, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    start.wait(timeout=120)
    t0, cpu0 = time.perf_counter(), process_cpu(server_pid)
    results = [out.get(timeout=300) for _ in procs]
    wall, server_cpu = time.perf_counter() - t0, process_cpu(server_pid) - cpu0
    for p in procs:
        p.join(timeout=30)
    return np.concatenate([r[0] for r in results]), wall, server_cpu, sum(r[1] for r in results)


def bench_inprocess(model: Path, batch: int, clients: int, total: int, threads: int) -> tuple[np.ndarray, float, float]:
    """Latencies, wall seconds and CPU seconds of ``total`` session.run calls from ``clients`` threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((batch, FEATURES), dtype=np.float32)
    per = max(1, total // clients)
    lats = np.empty((clients, per))
    barrier = threading.Barrier(clients + 1)

    def worker(row: int) -> None:
        for _ in range(5):
            session.run(None, {"x": x})
        barrier.wait()
        for i in range(per):
            t0 = time.perf_counter()
            session.run(None, {"x": x})
            lats[row, i] = time.perf_counter() - t0

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    return lats.ravel(), time.perf_counter() - t0, time.process_time() - cpu0


def row(label: str, lats: np.ndarray, wall: float, cpu: float, batch: int) -> tuple[str, float, float]:
    rps, cpu_us = len(lats) / wall, cpu / len(lats) * 1e6
    text = (f"{label:<10} {np.percentile(lats, 50) * 1e3:8.3f} {np.percentile(lats, 99) * 1e3:8.3f} "
            f"{rps:8.0f} {rps * batch:10.0f} {cpu_us:9.0f}")
    return text, rps, cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per configuration")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--clients", default="1,8")
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--threads", type=int, default=1,
                        help="onnxruntime intra-op threads, server and in-process alike (0: its default)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden width of the two-layer net")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "net.onnx"
        what = two_layer_net(model, args.hidden)
        port = free_port()
        server = start_server(model, port, args.backend, args.threads)
        print(f"{what}\nserver: gc.serve, backend {args.backend}, 127.0.0.1:{port}; clients: tritonclient.http "
              f"(binary tensors) in separate processes; {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f}; onnxruntime threads {args.threads or 'default'}; "
              f"{args.requests} requests per row\n")
        print("cpu us/req: CPU time per request of the server process (in-process: of session.run); "
              "rate: server req/s as a share of in-process req/s, measured; cpu: in-process CPU per run "
              "as a share of the server's CPU per request (the rate share on cores of its own); "
              "client cap: the highest rate share the clients' own CPU per request allows even with a "
              "server that costs nothing (each client is serial; all of them share the CPUs)\n")
        print(f"{'batch':>5} {'clients':>7}  {'where':<10} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
              f"{'samples/s':>10} {'cpu us/req':>9}  {'rate':>6} {'cpu':>6}  client cpu us/req  client cap")
        try:
            for batch in (int(b) for b in args.batches.split(",")):
                for clients in (int(c) for c in args.clients.split(",")):
                    lats, wall, server_cpu, client_cpu = bench_server(server.pid, port, batch, clients, args.requests)
                    s_text, s_rps, s_cpu = row("server", lats, wall, server_cpu, batch)
                    i_text, i_rps, i_cpu = row("in-process", *bench_inprocess(model, batch, clients, args.requests,
                                                                             args.threads), batch)
                    client_s = client_cpu / len(lats)
                    cap = min(clients, os.cpu_count() or 1) / client_s / i_rps
                    print(f"{batch:>5} {clients:>7}  {s_text}  {s_rps / i_rps:6.1%} {i_cpu / s_cpu:6.1%}  "
                          f"{client_s * 1e6:17.0f}  {cap:10.1%}")
                    print(f"{'':>5} {'':>7}  {i_text}", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
        print(f"\nserver exited with status {server.returncode} after SIGTERM")


if __name__ == "__main__":
    main()
