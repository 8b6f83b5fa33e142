"""Denormal floats flushed to zero by the sessions that ask for it (the Trainer's, by default), in
onnxruntime's threads and in the calling thread while it runs, and nowhere else: the caller's own
arithmetic keeps IEEE denormals before, between and after runs, whichever session came first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.backends import denormals

TINY = np.float32(1e-39)  # below float32's smallest normal, 1.18e-38
needs_mode = pytest.mark.skipif(not denormals.supported(), reason="this platform's float mode is not switchable here")


def _times_one(n: int = 1 << 20) -> gc.Model:
    """y = x * 1 over n values, enough for onnxruntime to split it between its threads."""
    graph = helper.make_graph([helper.make_node("Mul", ["x", "one"], ["y"])], "times_one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
                              initializer=[helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def _survives() -> bool:
    """Whether this thread's own float32 arithmetic keeps a denormal (read as bits: a comparison
    would count it as zero too)."""
    return bool((np.full(4, TINY) * np.float32(1.0)).view(np.uint32).all())


@needs_mode
def test_flushing_is_scoped_to_the_block():
    assert _survives()
    with denormals.flushing(True):
        assert not _survives()
        with denormals.flushing(False):  # keeps the mode it finds, restores it after
            assert not _survives()
        assert not _survives()
    assert _survives()


@needs_mode
@pytest.mark.parametrize("threads", [1, 2])
def test_session_flushes_only_when_asked(threads):
    x = np.full(1 << 20, TINY)
    kept = gc.Session(_times_one(), backend="ort-cpu", threads=threads).run({"x": x})["y"]
    flushed = gc.Session(_times_one(), backend="ort-cpu", threads=threads, flush_denormals=True).run({"x": x})["y"]
    assert (kept.view(np.uint32) == TINY.view(np.uint32)).all() and not flushed.view(np.uint32).any()
    assert _survives()


@needs_mode
def test_a_flushing_first_session_leaves_the_process_mode_alone():
    """onnxruntime sets the building thread's mode from the first session of a process, for good:
    graphc builds it with the mode kept and restored, so the caller's numpy still sees denormals."""
    script = textwrap.dedent("""
        import numpy as np, graphc as gc
        from tests.test_denormals import TINY, _survives, _times_one
        session = gc.Session(_times_one(), backend="ort-cpu", threads=2, flush_denormals=True)
        assert _survives(), "building the session switched this thread's mode"
        assert not session.run({"x": np.full(1 << 20, TINY)})["y"].view(np.uint32).any()
        assert _survives(), "running the session left this thread's mode switched"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.stdout.strip() == "ok", result.stderr


def test_the_trainer_flushes_by_default_and_can_keep_them(tmp_path):
    from graphc.runtime.trainer import TRAINING_OPTIONS

    assert TRAINING_OPTIONS == {"flush_denormals": True}
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["logits"])], "linear",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])],
                              initializer=[helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.1] * 12)])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    assert gc.Trainer(arts, backend="ort-cpu")._train._flush
    assert not gc.Trainer(arts, backend="ort-cpu", flush_denormals=False)._train._flush
