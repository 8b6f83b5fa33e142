"""`graphc demo` end to end: >= 95% test accuracy on digits, export, parity, files written."""

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx

GRAPHC = str(Path(sys.executable).parent / "graphc")


def test_demo_reaches_95_percent_and_writes_everything(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run([GRAPHC, "demo", "--out", str(out)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stdout + r.stderr
    accuracy = float(re.search(r"test accuracy ([\d.]+)%", r.stdout).group(1))
    assert accuracy >= 95.0
    assert "parity numpy vs ort-cpu: OK" in r.stdout and "demo passed" in r.stdout
    model = onnx.load(str(out / "inference.onnx"))
    onnx.checker.check_model(model)
    assert (out / "artifacts" / "manifest.json").is_file()
    assert (out / "checkpoint" / "checkpoint.safetensors").is_file()
    assert f"everything is in {out.resolve()}" in r.stdout  # says where everything went
