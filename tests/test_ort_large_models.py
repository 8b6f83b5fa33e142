"""onnxruntime opens a model over protobuf's 2 GiB limit from a file with external data
(scripts/load_large.py measures a real 2.1 GiB model; here the limit is lowered)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.backends import onnxruntime as ort_backend, ort_serialize
from onnx_graphs import model, node, vi


def _gather_model() -> onnx.ModelProto:
    """y = Gather(w, idx) + bias: w 2 MiB (moved out), bias small (stays inline)."""
    return model([node("Gather", ["w", "idx"], ["g"], "gather"), node("Add", ["g", "bias"], ["y"], "add")],
                 [vi("idx", onnx.TensorProto.INT64, [3])], [vi("y", shape=[3])],
                 {"w": np.arange(1 << 19, dtype=np.float32), "bias": np.float32(0.5)})


def test_a_model_over_the_limit_runs_from_a_file_and_is_left_unchanged(monkeypatch):
    proto = _gather_model()
    before = proto.SerializeToString()
    saved = []
    real_save = ort_serialize.save_with_external_data
    monkeypatch.setattr(ort_serialize, "PROTOBUF_LIMIT", 1 << 20)
    monkeypatch.setattr(ort_serialize, "save_with_external_data",
                        lambda m, path: saved.append(sorted(p.name for p in path.parent.iterdir())) or real_save(m, path))
    executable = ort_backend.CpuBackend().prepare(proto)
    assert saved, "the model was not written to a file"
    assert proto.SerializeToString() == before
    idx = np.array([0, 12345, (1 << 19) - 1], np.int64)
    np.testing.assert_array_equal(executable.run({"idx": idx})["y"], idx.astype(np.float32) + 0.5)


@pytest.mark.parametrize("limit", [1 << 20, 1 << 30])
def test_sessions_from_a_path_with_external_data_match_numpy(tmp_path, monkeypatch, limit):
    monkeypatch.setattr(ort_serialize, "PROTOBUF_LIMIT", limit)
    path = gc.load(_gather_model()).save(tmp_path / "m.onnx", external_data=True)
    feeds = {"idx": np.array([7, 3, 1 << 18], np.int64)}
    want = gc.Session(path, backend="numpy").run(feeds)["y"]
    np.testing.assert_array_equal(gc.Session(path, backend="ort-cpu").run(feeds)["y"], want)
