"""Peak memory of `graphc serve` under many large requests at once.

    python scripts/bench_serve_flood.py [--clients 32] [--mb 41] [-- SERVE OPTIONS...]

Serves a model that sums a float32 vector (tests/serve_util.py's ``sum_model``) with ``graphc serve``
on numpy in its own process, then sends ``--clients`` requests of ``--mb`` MB (binary tensor data) at
once, one raw socket each, every body written whole before its reply is read. Prints the server's
peak RSS above the idle server (sampled every 10 ms), the replies' statuses and the wall time.
Options after ``--`` go to ``graphc serve`` (e.g. ``-- --max-inflight-bytes 268435456``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from serve_util import flood, serve_process, sum_model, sum_request  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--mb", type=float, default=41)
    parser.add_argument("serve", nargs="*", help="graphc serve options (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(sum_model(), str(Path(tmp) / "sum.onnx"))
        with serve_process(str(Path(tmp) / "sum.onnx"), "--backend", "numpy", *args.serve) as (proc, port):
            started = time.perf_counter()
            idle, peak, replies = flood(port, proc.pid, args.clients, sum_request(args.mb))
            wall = time.perf_counter() - started
    statuses = collections.Counter(reply[9:12].decode() for reply in replies)
    print(json.dumps({"clients": args.clients, "mb": args.mb, "serve": args.serve, "idle_mb": round(idle),
                      "peak_above_idle_mb": round(peak - idle), "statuses": dict(statuses), "wall_s": round(wall, 2)}))


if __name__ == "__main__":
    main()
