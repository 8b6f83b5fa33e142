"""scripts/profile_step.py's ``--fastest`` accounting: each node charged its fastest run."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")  # profile_step imports bench_zoo, which builds torch models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import profile_step  # noqa: E402


def _event(name: str, ts: int, dur: int) -> dict:
    return {"name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": "Add"}}


def test_fastest_run_of_each_node():
    # three runs; "a" runs once a run (preempted in the first), "b" twice a run (a loop body)
    events = [_event("a", 0, 900), _event("b", 1, 10), _event("b", 2, 30),
              _event("a", 100, 50), _event("b", 101, 20), _event("b", 102, 25),
              _event("a", 200, 70), _event("b", 201, 5), _event("b", 202, 400)]
    fastest = {e["name"]: e["dur"] for e in profile_step.fastest_runs(events, 3)}
    assert fastest == {"a_kernel_time": 50, "b_kernel_time": 40}  # b: runs of 40, 45, 405
    table = profile_step.charge(profile_step.fastest_runs(events, 3), {"a": "Relu", "b": "Relu"})
    assert table == {("Relu", "forward"): {"Add": 90}}
