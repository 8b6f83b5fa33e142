"""scripts/promotion_sweep.py runs (so it cannot rot): on a 3-op subset against torch it prints its counts by
cause, graphc agreeing with torch on every mix both compute; an unknown op is refused by name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "promotion_sweep.py"


def _sweep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_a_3_op_sweep_counts_by_cause(tmp_path):
    out = tmp_path / "disagreements.txt"
    run = _sweep("--ops", "+,.pow,masked_fill", "--out", str(out))
    assert run.returncode == 0, run.stderr
    counts = {line[:16].strip(): int(line[16:]) for line in run.stdout.splitlines()}
    assert list(counts) == ["graphc refuses", "torch refuses", "dtype mismatch", "value mismatch", "match",
                            "API contract"]
    # 160 operand mixes x 3 ops; each mix both refuse is not counted
    assert 0 < counts["match"] <= 480 and counts["dtype mismatch"] == counts["value mismatch"] == 0, counts
    assert out.read_text().count("\n") == counts["graphc refuses"] + counts["torch refuses"]


def test_an_unknown_op_is_refused_by_name():
    run = _sweep("--ops", "+,nosuchop")
    assert run.returncode == 2 and "unknown ops ['nosuchop']" in run.stderr
