"""`graphc run --workers N` on the local Ray cluster it starts: stderr holds none of Ray's own
start-up log lines (``2026-... INFO worker.py:2038 -- Started a local Ray instance.``, the
WARNING that token authentication is on). A fresh process: a cluster already joined logs nothing."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_graphs import linear_relu

RNG = np.random.default_rng(0)
GRAPHC = Path(sys.executable).parent / "graphc"
# Ray's log format: date time<TAB>LEVEL file.py:LINE -- message
RAY_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(DEBUG|INFO|WARNING)\s+\S+:\d+ -- ", re.M)


def test_the_lines_ray_logged_are_recognised():
    logged = ("2026-11-30 23:38:18,363\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled "
              "for this Ray cluster.\n2026-11-30 23:38:22,015\tINFO worker.py:2038 -- Started a local Ray instance.\n")
    assert len(RAY_LOG_LINE.findall(logged)) == 2


def test_run_with_workers_prints_no_ray_start_up_logs(tmp_path):
    # Not importorskip: importing Ray in this process before graphc sets cluster.LOCAL_ENV fixes Ray's
    # import-time constants for every later test of this worker (a cluster not on loopback only).
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed")
    if not GRAPHC.exists():
        pytest.skip(f"console script not installed at {GRAPHC}")
    onnx.save(linear_relu(), tmp_path / "net.onnx")
    x, b = RNG.standard_normal((64, 3)).astype(np.float32), RNG.standard_normal((64, 2)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "b.npy", b)
    done = subprocess.run([str(GRAPHC), "run", "net.onnx", "-b", "numpy", "-i", "x=x.npy", "-i", "b=b.npy",
                           "--workers", "2", "--batch-size", "16", "-o", "y.npz"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not RAY_LOG_LINE.findall(done.stderr), done.stderr
    with np.load(tmp_path / "y.npz") as saved:
        w = np.arange(6, dtype=np.float32).reshape(3, 2) / 6
        np.testing.assert_allclose(saved["y"], np.maximum(x @ w + b, 0), rtol=1e-6, atol=1e-7)
