"""Inference export: trained params folded in, optimized, symbolic batch, equal to eval outputs."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from graphc.compile.export import UntrainedWeightsWarning, export_inference
from trainer_models import blobs, bn_artifacts


def ort_run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def trained():
    trainer = gc.Trainer(bn_artifacts(), backend="ort-cpu")
    trainer.fit(gc.data.DataLoader(blobs(128), batch_size=32), 3, progress=False)
    return trainer


@pytest.mark.parametrize("opset", [None, 17])
def test_export_equals_eval_outputs_at_any_batch(trained, tmp_path, opset):
    path = trained.export_inference(tmp_path / "model.onnx", opset=opset)
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert all(node.domain in ("", "ai.onnx") for node in proto.graph.node)
    assert not proto.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")  # batch stays symbolic
    assert [i.name for i in proto.graph.input] == ["x"]  # params are initializers, not inputs
    if opset is not None:
        assert {o.domain: o.version for o in proto.opset_import}.get("", 0) == opset
    assert not any(n.op_type in ("Dropout", "Identity") for n in proto.graph.node)
    for n in (1, 7, 40):
        batch = blobs(n, seed=n)
        expected = trained.predict(batch)["logits"]
        np.testing.assert_allclose(ort_run(path, batch["x"]), expected, rtol=1e-4, atol=1e-5)
    trained_w = trained.params["fc2.weight"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert any(v.shape == trained_w.shape and np.array_equal(v, trained_w) for v in inits.values())


def test_export_from_artifact_dir_and_checkpoint(trained, tmp_path):
    arts = trained.artifacts
    arts.save(tmp_path / "arts")
    batch = blobs(9, seed=3)
    initial = gc.Trainer(arts, backend="numpy").predict(batch)["logits"]
    with pytest.warns(UntrainedWeightsWarning, match="holds the initial, untrained weights"):
        export_inference(tmp_path / "arts", tmp_path / "initial.onnx")
    np.testing.assert_allclose(ort_run(tmp_path / "initial.onnx", batch["x"]), initial, rtol=1e-4, atol=1e-5)

    trained.save_checkpoint(tmp_path / "ck")
    export_inference(tmp_path / "ck", tmp_path / "from_ck.onnx")
    np.testing.assert_allclose(ort_run(tmp_path / "from_ck.onnx", batch["x"]), trained.predict(batch)["logits"],
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(FileNotFoundError, match="nothing: no such artifact directory or checkpoint"):
        export_inference(tmp_path / "nothing", tmp_path / "x.onnx")


TORCH_CNN = Path(__file__).parent / "data" / "torch_cnn_bn.onnx"


@pytest.mark.skipif(not TORCH_CNN.is_file(), reason="tests/data/torch_cnn_bn.onnx is absent")
def test_export_folds_trained_batchnorm_into_the_conv(tmp_path):
    arts = gc.training.generate(gc.load(TORCH_CNN), gc.losses.cross_entropy("y", label="label"), gc.optim.Adam(1e-2))
    trainer = gc.Trainer(arts, backend="ort-cpu")
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((16, 1, 12, 12)).astype(np.float32),
             "label": rng.integers(0, 4, 16).astype(np.int64)}
    for _ in range(5):
        trainer.step(batch)  # moves the BatchNorm running statistics
    path = trainer.export_inference(tmp_path / "cnn.onnx")
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "BatchNormalization" not in ops and "Conv" in ops
    np.testing.assert_allclose(ort_run(path, batch["x"]), trainer.predict(batch)["y"], rtol=1e-4, atol=1e-5)
