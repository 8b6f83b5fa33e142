"""scripts/gpu_check.sh's plumbing and scripts/gpu_probe.py's checks, on the CPU.

The GPU machine runs them once per lent session; here the probe's CPU form (ort-cpu against
numpy) runs every check for real, and ``--dry-run`` shows a part stopped at its cap, a part
skipped for want of what it needs, and the summary printed last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CHECKS = ["train_float32", "autocast_float16_loss_scaled", "autocast_bfloat16", "loss_scale_skipped_step_bits",
          "where_negzero", "cancel_loop", "convert_float16", "convert_bfloat16", "kept_bindings"]


def check_script(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=240, cwd=ROOT,
                          env={**os.environ, "GPU_CHECK_PYTHON": sys.executable, **env})


def test_script_parses_and_refuses_an_unknown_option():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    done = check_script("--gpu")
    assert done.returncode == 2 and "usage: bash scripts/gpu_check.sh [--dry-run | --wheels]" in done.stderr


def test_probe_cpu_form_passes_every_check(tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_probe.py"), "--cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(out.read_text())
    assert (got["target"], got["reference"]) == ("ort-cpu", "numpy")
    results = {r["check"]: r for r in got["results"]}
    assert list(results) == CHECKS and all(r["status"] == "PASS" for r in results.values()), done.stdout
    assert results["loss_scale_skipped_step_bits"]["negzero_kept"] > 0  # planted -0.0s came through the skip
    # onnxruntime's CPU Where loses -0.0 (what backends/selects.py rewrites); graphc's Session keeps it
    assert results["where_negzero"]["kernel_keeps_negzero"] is False
    assert results["where_negzero"]["session_keeps_negzero"] is True
    assert results["cancel_loop"]["stopped_after_cancel_s"] < 1.0
    assert results["kept_bindings"]["same_bindings"] is True


def test_dry_run_caps_skips_and_prints_the_summary_last(tmp_path):
    done = check_script("--dry-run", OUT=str(tmp_path), GPU_CHECK_CAP_TESTS="1")
    assert done.returncode == 0, done.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert done.stdout.rstrip().endswith(summary.rstrip())
    lines = summary.splitlines()
    assert "SKIP install: --dry-run uses" in summary
    assert "ok   probe:" in summary and sum(line.startswith("  PASS ") for line in lines) == len(CHECKS)
    assert "TIMEOUT tests: stopped at its cap of 1s" in summary
    for part in ("bench", "graph"):
        assert f"SKIP {part}: needs ort-cuda (usable: 0) and torch CUDA (usable: 0)" in summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.txt", "probe.json", "probe.txt", "summary.txt",
                                                          "tests.txt"]


def test_dry_run_skips_parts_past_the_budget(tmp_path):
    """12 s of budget, 10 kept for the summary: no part starts."""
    done = check_script("--dry-run", OUT=str(tmp_path), GPU_CHECK_BUDGET="12")
    summary = (tmp_path / "summary.txt").read_text()
    assert done.returncode == 0
    for part in ("probe", "tests"):
        assert f"SKIP {part}: " in summary and "s of the 12s budget left" in summary
