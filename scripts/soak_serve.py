"""Soak the built-in KServe v2 server with good, malformed, oversized and half-open traffic.

    python scripts/soak_serve.py [--clients 4] [--seconds 60] [--fuzz-share 0.6] [--big 100] [--big-mb 200]
                                 [--hold 5000] [--flood 20000] [--read-timeout 30] [--phases mix,memory,half-open]

Starts `graphc serve` on a small model (x float32[N,16] -> relu(x @ w)) in its own process,
then runs three phases and prints what it saw:

1. mix: ``--clients`` processes for ``--seconds``: good requests (JSON and binary, outputs
   checked against numpy), fuzzed requests (a good one with 1-3 random mutations of its JSON,
   binary section, length header or encoding), oversized ones (a Content-Length past the limit,
   a 64 MB gzip bomb) and half-open connections (nothing, partial headers, partial body; each client
   holds up to 50), ``--fuzz-share`` of them fuzzed, the rest 5:2:1 good, oversized, half-open.
   Reports requests and replies by status, HTTP 500s, p50/p99 of the good ones.
2. memory: ``--big`` failed requests of ``--big-mb`` MB each once decompressed (gzip; a binary
   tensor whose size does not match its shape), plus 10 gzip JSON bodies of that size (refused
   past the JSON limit): server RSS before and after.
3. half-open: ``--hold`` connections opened and held, then one good request (its latency);
   then up to ``--flood`` in all, held by the attacker for as long as the run lasts: how long
   until a good request is served again, and the server's open descriptors over time.

Every loop is bounded; the server is stopped with SIGTERM at the end.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from graphc.serving.kserve.connections import raise_descriptor_limit

FEATURES = 16
W = np.linspace(-1, 1, FEATURES * FEATURES, dtype=np.float32).reshape(FEATURES, FEATURES)


def write_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Relu", ["xw"], ["y"])], "soak",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", FEATURES])], [numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# -- requests -------------------------------------------------------------------------------------

def good_json(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}


def good_binary(x: np.ndarray) -> tuple[dict, bytes]:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                        "parameters": {"binary_data_size": x.nbytes}}],
            "parameters": {"binary_data_output": False}}, x.tobytes()


def http_post(port: int, body: bytes, headers: dict[str, str], timeout: float = 30) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, reply body); status 0 if the connection failed."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (f"POST /v2/models/soak/infer HTTP/1.1\r\nHost: soak\r\nContent-Length: {len(body)}\r\n{head}"
               "Connection: close\r\n\r\n").encode() + body
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(request)
            reply = b""
            while chunk := sock.recv(1 << 16):
                reply += chunk
    except OSError:
        return 0, b""
    head_end = reply.find(b"\r\n\r\n")
    if not reply.startswith(b"HTTP/1.1 ") or head_end < 0:
        return 0, reply
    return int(reply[9:12]), reply[head_end + 4:]


def good_request(port: int, rng: random.Random, timeout: float = 30) -> tuple[bool, float]:
    """A good JSON or binary request; (answered correctly, seconds)."""
    x = np.asarray([[rng.uniform(-1, 1) for _ in range(FEATURES)] for _ in range(rng.randint(1, 8))], np.float32)
    if rng.random() < 0.5:
        body, headers = json.dumps(good_json(x)).encode(), {"Content-Type": "application/json"}
    else:
        header, payload = good_binary(x)
        head = json.dumps(header).encode()
        body, headers = head + payload, {"Inference-Header-Content-Length": str(len(head))}
    start = time.perf_counter()
    status, reply = http_post(port, body, headers, timeout)
    elapsed = time.perf_counter() - start
    if status != 200:
        return False, elapsed
    got = np.asarray(json.loads(reply)["outputs"][0]["data"], np.float32).reshape(x.shape)
    return bool(np.allclose(got, np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)), elapsed


ODD = [None, True, False, 0, -1, 2**63, 2**64, -2**70, 1.5, 1e308, -0.0, "", "2", "false", "FP32", "BYTES", "\x00",
       [], [None], [[1, 2], [3]], {}, {"a": 1}, {"binary_data_size": -1}, {"binary_data": "true"}]


def spots(node, parent=None, key=None):
    if parent is not None:
        yield parent, key
    if isinstance(node, dict):
        for k, v in list(node.items()):
            yield from spots(v, node, k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from spots(v, node, i)


def mutated(doc: dict, rng: random.Random) -> object:
    """``doc`` with one to three random replacements, deletions or insertions anywhere in it."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        places = list(spots(doc))
        if not places:
            return rng.choice(ODD)
        parent, key = rng.choice(places)
        action = rng.random()
        if action < 0.5:
            parent[key] = copy.deepcopy(rng.choice(ODD))
        elif action < 0.7:
            del parent[key]
        elif isinstance(parent, list):
            parent.insert(key, copy.deepcopy(rng.choice(ODD)))
        else:
            parent[rng.choice(["zz", "data", "shape", "parameters", "datatype"])] = copy.deepcopy(rng.choice(ODD))
    return doc


def fuzzed_request(rng: random.Random) -> tuple[bytes, dict[str, str]]:
    x = np.asarray(np.random.default_rng(rng.randrange(1 << 30)).random((2, FEATURES)), np.float32)
    if rng.random() < 0.5:
        body, headers = json.dumps(mutated(good_json(x), rng)).encode(), {}
    else:
        header, payload = good_binary(x)
        head = json.dumps(mutated(header, rng) if rng.random() < 0.7 else header).encode()
        cut = rng.randint(-8, 8)
        payload = payload[:cut] if cut < 0 else payload + os.urandom(cut)
        length = rng.choice([len(head), len(head), len(head) - 3, len(head) + 5, -1, "x"])
        body, headers = head + payload, {"Inference-Header-Content-Length": str(length)}
    encoding = rng.random()
    if encoding < 0.15:
        body, headers = gzip.compress(body), {**headers, "Content-Encoding": "gzip"}
    elif encoding < 0.2:
        headers = {**headers, "Content-Encoding": "gzip"}  # a lie
    return body, headers


def gzip_of_zeros(header: bytes, size: int) -> bytes:
    """gzip of ``header`` followed by ``size`` zero bytes, built without holding them."""
    deflate = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk, parts = bytes(1 << 20), [deflate.compress(header)]
    for start in range(0, size, len(chunk)):
        parts.append(deflate.compress(chunk[:min(len(chunk), size - start)]))
    parts.append(deflate.flush())
    return b"".join(parts)


def oversized_request(port: int, rng: random.Random, bomb: bytes) -> int:
    if rng.random() < 0.5:  # says it is 1 GB, sends a little, waits for the verdict
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(b"POST /v2/models/soak/infer HTTP/1.1\r\nHost: soak\r\nContent-Length: 1000000000\r\n\r\n"
                             b'{"inputs": [')
                reply = sock.recv(4096)
            return int(reply[9:12]) if reply.startswith(b"HTTP/1.1 ") else 0
        except OSError:
            return 0
    return http_post(port, bomb, {"Content-Encoding": "gzip"})[0]


def half_open(port: int, rng: random.Random) -> socket.socket | None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        return None
    kind = rng.randrange(3)
    try:
        if kind == 1:
            sock.sendall(b"POST /v2/models/soak/infer HTTP/1.1\r\nHost: soak\r\nContent-Le")
        elif kind == 2:
            sock.sendall(b"POST /v2/models/soak/infer HTTP/1.1\r\nHost: soak\r\nContent-Length: 500\r\n\r\n{\"in")
    except OSError:
        pass
    return sock


# -- phase 1: mixed traffic -----------------------------------------------------------------------

def mix_worker(port: int, seconds: float, fuzz_share: float, seed: int, out: mp.Queue) -> None:
    rng = random.Random(seed)
    bomb = gzip_of_zeros(b"", 64 << 20)  # a JSON body: refused past the JSON limit (32 MiB decoded)
    statuses: Counter = Counter()
    kinds: Counter = Counter()
    latencies, wrong, examples_500 = [], 0, []
    held: list[socket.socket] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        roll = rng.random()
        rest = (roll - fuzz_share) / (1 - fuzz_share) if roll >= fuzz_share else 0  # the others keep their ratios
        if roll < fuzz_share:
            kinds["fuzzed"] += 1
            body, headers = fuzzed_request(rng)
            status, reply = http_post(port, body, headers)
            statuses[status] += 1
            if status >= 500 and len(examples_500) < 5:
                examples_500.append((body[:300], headers, reply[:300]))
        elif rest < 0.625:
            kinds["good"] += 1
            ok, elapsed = good_request(port, rng)
            statuses[200 if ok else "good-failed"] += 1
            wrong += not ok
            latencies.append(elapsed)
        elif rest < 0.875:
            kinds["oversized"] += 1
            statuses[oversized_request(port, rng, bomb)] += 1
        else:
            kinds["half-open"] += 1
            sock = half_open(port, rng)
            if sock is not None:
                held.append(sock)
            if len(held) > 50:
                held.pop(0).close()
    for sock in held:
        sock.close()
    out.put((statuses, kinds, latencies, wrong, examples_500))


def phase_mix(port: int, clients: int, seconds: float, fuzz_share: float) -> None:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=mix_worker, args=(port, seconds, fuzz_share, 1000 + i, out)) for i in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    statuses, kinds = Counter(), Counter()
    for r in results:
        statuses.update(r[0])
        kinds.update(r[1])
    latencies = np.concatenate([r[2] for r in results]) * 1000
    examples = [e for r in results for e in r[4]]
    print(f"mix: {clients} clients x {seconds:.0f} s: {sum(kinds.values())} requests/connections {dict(kinds)}")
    print(f"  replies by status: {dict(sorted(statuses.items(), key=str))}")
    print(f"  HTTP 5xx: {sum(v for k, v in statuses.items() if isinstance(k, int) and k >= 500)} "
          f"(of {kinds['fuzzed']} fuzzed); good requests answered wrongly or not at all: {sum(r[3] for r in results)}")
    if len(latencies):
        print(f"  good requests: p50 {np.percentile(latencies, 50):.1f} ms, p99 {np.percentile(latencies, 99):.1f} ms")
    for body, headers, reply in examples:
        print(f"  500 example: {headers} {body!r} -> {reply!r}")


# -- phase 2: memory ------------------------------------------------------------------------------

def phase_memory(pid: int, port: int, count: int, megabytes: int) -> None:
    size = megabytes * 1_000_000
    header = json.dumps({"inputs": [{"name": "x", "shape": [2, FEATURES], "datatype": "FP32",
                                     "parameters": {"binary_data_size": size}}]}).encode()
    binary = gzip_of_zeros(header, size)
    plain = gzip_of_zeros(b'{"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32", "data": [' +
                          b"0," * (size // 2 - 40), 0)
    rng = random.Random(7)
    http_post(port, binary, {"Content-Encoding": "gzip", "Inference-Header-Content-Length": str(len(header))})
    before = rss_mb(pid)
    statuses: Counter = Counter()
    start = time.perf_counter()
    peak = before
    for _ in range(count):
        statuses[http_post(port, binary, {"Content-Encoding": "gzip",
                                          "Inference-Header-Content-Length": str(len(header))}, 120)[0]] += 1
        peak = max(peak, rss_mb(pid))
    for _ in range(10):
        statuses[("json", http_post(port, plain, {"Content-Encoding": "gzip"}, 120)[0])] += 1
    ok, _ = good_request(port, rng)
    print(f"memory: {count} failed requests of {megabytes} MB decoded ({len(binary) / 1e3:.0f} KB on the wire) "
          f"+ 10 gzip JSON bodies of {megabytes} MB decoded, in {time.perf_counter() - start:.0f} s: "
          f"statuses {dict(statuses)}")
    print(f"  server RSS {before:.0f} MB before, {rss_mb(pid):.0f} MB after (growth {rss_mb(pid) - before:+.0f} MB; "
          f"highest seen between requests {peak:.0f} MB); a good request after: {'ok' if ok else 'FAILED'}")


# -- phase 3: half-open connections ---------------------------------------------------------------

def hold_worker(port: int, count: int, seed: int, ready: mp.Queue, stop: mp.Event) -> None:
    raise_descriptor_limit()
    rng = random.Random(seed)
    held = [s for s in (half_open(port, rng) for _ in range(count)) if s is not None]
    ready.put(len(held))
    stop.wait(900)
    for sock in held:
        sock.close()


def settled_fds(pid: int, connections: int, limit: float = 60) -> int:
    """The server's descriptor count once it has accepted ``connections`` (or stopped accepting
    more for 2 s): connections still in the listen backlog are not held yet."""
    deadline, last, since = time.monotonic() + limit, -1, time.monotonic()
    while time.monotonic() < deadline:
        fds = open_fds(pid)
        if fds >= connections:
            return fds
        if fds != last:
            last, since = fds, time.monotonic()
        elif time.monotonic() - since > 2:
            return fds
        time.sleep(0.2)
    return open_fds(pid)


def phase_half_open(pid: int, port: int, hold: int, flood: int, read_timeout: float) -> None:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    rng = random.Random(11)
    per = 5000
    workers, opened = [], 0

    def open_more(total: int) -> int:
        nonlocal opened
        batch = []
        while opened + per * len(batch) < total:
            n = min(per, total - opened - per * len(batch))
            batch.append(ctx.Process(target=hold_worker, args=(port, n, len(workers) + len(batch), ready, stop)))
        for p in batch:
            p.start()
        got = sum(ready.get(timeout=600) for _ in batch)
        workers.extend(batch)
        opened += got
        return got

    try:
        start = time.perf_counter()
        open_more(hold)
        opened_in = time.perf_counter() - start
        fds = settled_fds(pid, opened)
        ok, elapsed = good_request(port, rng, timeout=10)
        print(f"half-open: {opened} connections opened in {opened_in:.1f} s, held by the server after "
              f"{time.perf_counter() - start:.1f} s ({fds} descriptors); a good request meanwhile: "
              f"{'ok' if ok else 'FAILED'} in {elapsed * 1000:.0f} ms")
        flood_start, peak = time.monotonic(), [0]
        sampling = threading.Event()

        def sample() -> None:  # the most descriptors the server held during the flood
            while not sampling.wait(0.2):
                peak[0] = max(peak[0], open_fds(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        open_more(flood)
        sampling.set()
        sampler.join()
        opened_at = time.monotonic()
        print(f"  flood: {opened} connections opened in all ({opened_at - flood_start:.1f} s); server holds "
              f"{open_fds(pid)} descriptors, at most {peak[0]} during the flood")
        served_at, failures = None, 0
        while time.monotonic() - opened_at < 3 * read_timeout:
            ok, _ = good_request(port, rng, timeout=5)
            if ok:
                served_at = time.monotonic()
                break
            failures += 1
            time.sleep(0.5)
        if served_at is None:
            print(f"  no good request served within {3 * read_timeout:.0f} s of the flood ({failures} failed)")
        else:
            print(f"  a good request served {served_at - opened_at:.1f} s after the flood was open "
                  f"({failures} failed before it); server holds {open_fds(pid)} descriptors")
        time.sleep(read_timeout + 2)
        print(f"  {read_timeout + 2:.0f} s later, with the attacker still holding its ends: server holds "
              f"{open_fds(pid)} descriptors; a good request: {'ok' if good_request(port, rng)[0] else 'FAILED'}")
    finally:
        stop.set()
        for p in workers:
            p.join(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--fuzz-share", type=float, default=0.6, help="share of fuzzed requests in the mix")
    parser.add_argument("--big", type=int, default=100)
    parser.add_argument("--big-mb", type=int, default=200)
    parser.add_argument("--hold", type=int, default=5000)
    parser.add_argument("--flood", type=int, default=20000)
    parser.add_argument("--read-timeout", type=float, default=30)
    parser.add_argument("--backend", default="ort-cpu")
    parser.add_argument("--phases", default="mix,memory,half-open")
    args = parser.parse_args()
    phases = set(args.phases.split(","))

    limit = raise_descriptor_limit()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "soak.onnx"
        write_model(model)
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-c", "from graphc.cli import main; main()", "serve", str(model),
                                 "--port", str(port), "--backend", args.backend, "--read-timeout", str(args.read_timeout)],
                                stdout=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline().strip()
            if not line.startswith("serving"):
                raise SystemExit(f"server did not start: {line!r}")
            print(f"{line}\n  descriptor limit {limit}; server RSS at start {rss_mb(proc.pid):.0f} MB")
            start_rss = rss_mb(proc.pid)
            if "mix" in phases:
                phase_mix(port, args.clients, args.seconds, args.fuzz_share)
                print(f"  server RSS {start_rss:.0f} MB at start, {rss_mb(proc.pid):.0f} MB after")
            if "memory" in phases:
                phase_memory(proc.pid, port, args.big, args.big_mb)
            if "half-open" in phases:
                phase_half_open(proc.pid, port, args.hold, args.flood, args.read_timeout)
            print(f"server RSS {start_rss:.0f} MB at start, {rss_mb(proc.pid):.0f} MB at the end; "
                  f"still running: {proc.poll() is None}")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
