"""`graphc export`: never the artifacts' untrained weights without saying so; only what it can export."""

import os
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli, workspace
from trainer_models import blobs

X = blobs(16, seed=5)["x"]


def predict(path):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return workspace(tmp_path_factory.mktemp("cli_export"))


@pytest.fixture
def ws(shared, tmp_path, capsys, monkeypatch):
    """A workspace whose ``ck`` was trained (`graphc train --checkpoint`) from its ``arts``; the
    current directory is its parent."""
    root = Path(shutil.copytree(shared, tmp_path / "ws"))
    result = run_cli(capsys, "train", root / "arts", "--data", root / "data.npz", "--epochs", "2", "--batch-size",
                     "16", "--backend", "numpy", "--no-progress", "--checkpoint", root / "ck")
    assert result.code == 0, result.err
    monkeypatch.chdir(tmp_path)
    return root


def test_untrained_artifacts_are_refused_naming_the_checkpoint_trained_from_them(capsys, ws):
    for source in (ws / "arts", ws / "ck" / "artifacts"):
        err = one_line_error(run_cli(capsys, "export", source, "-o", ws / "m.onnx"))
        assert f"{source} holds the initial, untrained weights, and checkpoint {ws / 'ck'} was trained from" in err
        assert f"graphc export {ws / 'ck'} -o" in err and "--allow-untrained" in err
        assert not (ws / "m.onnx").exists()

    assert run_cli(capsys, "export", ws / "ck", "-o", ws / "trained.onnx").code == 0
    result = run_cli(capsys, "export", ws / "arts", "-o", ws / "initial.onnx", "--allow-untrained")
    assert result.code == 0 and result.err == ""
    initial = gc.Session(gc.training.load(ws / "arts").inference, backend="numpy").run({"x": X})["logits"]
    np.testing.assert_allclose(predict(ws / "initial.onnx"), initial, rtol=1e-4, atol=1e-5)
    assert np.abs(predict(ws / "trained.onnx") - initial).max() > 0.1  # the checkpoint's weights differ


def test_the_newest_of_several_checkpoints_is_named(capsys, ws):
    shutil.copytree(ws / "ck", ws / "ck2")  # its header records the same artifacts
    stat = (ws / "ck" / "checkpoint.safetensors").stat()
    os.utime(ws / "ck2" / "checkpoint.safetensors", (stat.st_atime, stat.st_mtime + 10))
    err = one_line_error(run_cli(capsys, "export", ws / "arts", "-o", ws / "m.onnx"))
    assert f"checkpoint {ws / 'ck2'} (the newest of 2) was trained" in err


def test_without_a_checkpoint_nearby_the_export_warns_plainly(capsys, ws, tmp_path, monkeypatch):
    away = tmp_path / "away"
    away.mkdir()
    shutil.move(ws / "ck", away / "ck")  # still records ws/arts, but lies neither beside it nor in the cwd
    result = run_cli(capsys, "export", ws / "arts", "-o", ws / "m.onnx")
    assert result.code == 0 and (ws / "m.onnx").is_file()
    assert result.err.startswith("warning:") and len(result.err.strip().splitlines()) == 1
    assert "holds the initial, untrained weights" in result.err and "the exported model has untrained weights" in result.err
    monkeypatch.chdir(away)  # the current directory is searched too
    assert f"checkpoint {away / 'ck'} was trained" in one_line_error(run_cli(capsys, "export", ws / "arts", "-o", ws / "m.onnx"))


def test_artifacts_saved_with_trained_state_export_without_a_word(capsys, ws):
    arts = gc.training.load(ws / "arts")
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.step(blobs(16))
    arts.state = trainer.state_dict()  # step 1: no longer the initial state
    arts.save(ws / "arts")
    result = run_cli(capsys, "export", ws / "arts", "-o", ws / "m.onnx")
    assert result.code == 0 and result.err == ""


def test_the_library_refuses_and_warns_as_the_command_does(ws, tmp_path):
    from graphc.compile.export import ExportError, UntrainedWeightsWarning, export_inference

    with pytest.raises(ExportError, match="was trained from these artifacts"):
        export_inference(ws / "arts", tmp_path / "m.onnx")
    shutil.rmtree(ws / "ck")
    with pytest.warns(UntrainedWeightsWarning, match="untrained weights"):
        export_inference(ws / "arts", tmp_path / "m.onnx")


def test_sources_that_are_not_artifacts_or_checkpoints(capsys, ws):
    err = one_line_error(run_cli(capsys, "export", ws / "mlp.onnx", "-o", ws / "m.onnx"))
    assert "mlp.onnx is an ONNX model, not training artifacts or a checkpoint" in err and "utf-8" not in err
    err = one_line_error(run_cli(capsys, "export", ws / "arts" / "state.safetensors", "-o", ws / "m.onnx"))
    assert "a safetensors file without graphc checkpoint metadata, not a checkpoint" in err
    err = one_line_error(run_cli(capsys, "export", ws / "data.npz", "-o", ws / "m.onnx"))
    assert "data.npz: not a readable graphc checkpoint (not a safetensors file" in err
    # a path that is not there was "neither an artifact directory (no manifest.json) nor a checkpoint"
    err = one_line_error(run_cli(capsys, "export", ws / "gone", "-o", ws / "m.onnx"))
    assert f"FileNotFoundError: {ws / 'gone'}: no such artifact directory or checkpoint" in err
    (ws / "arts" / "manifest.json").write_text("{")
    err = one_line_error(run_cli(capsys, "export", ws / "arts", "-o", ws / "m.onnx"))
    assert "manifest.json: not a valid graphc training manifest: Invalid JSON" in err


class _BnMlp(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.bn, self.out = gc.nn.Linear(8, 8), gc.nn.BatchNorm1d(8), gc.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.bn(gc.tanh(self.fc(x))))


def test_averaged_exports_the_swa_weights_as_the_trainer_does(capsys, ws, tmp_path):
    """``--averaged`` (there was no such option: the SWA/EMA copy could be exported only from Python):
    a checkpoint of 4 SGD steps under EMA exports the file ``Trainer.export_inference(averaged=True)``
    writes, whose outputs onnxruntime gives equal, and not the trained weights'; artifacts that keep
    no averaged copy are one line naming averaged=, exit 2, no file."""
    net = _BnMlp()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float32", ("N", 8))),
                                gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.5),
                                averaged=gc.optim.swa_utils.AveragedModel(
                                    net, use_buffers=True, multi_avg_fn=gc.optim.swa_utils.get_ema_multi_avg_fn(0.5)))
    trainer = gc.Trainer(arts, backend="numpy")
    for seed in range(4):
        trainer.step(blobs(16, seed=seed))
    trainer.save_checkpoint(tmp_path / "swa_ck")
    result = run_cli(capsys, "export", tmp_path / "swa_ck", "-o", tmp_path / "cli.onnx", "--averaged")
    assert result.code == 0, result.err
    want = predict(trainer.export_inference(tmp_path / "python.onnx", averaged=True))
    np.testing.assert_array_equal(predict(tmp_path / "cli.onnx"), want)
    assert run_cli(capsys, "export", tmp_path / "swa_ck", "-o", tmp_path / "trained.onnx").code == 0
    assert np.abs(predict(tmp_path / "trained.onnx") - want).max() > 1e-3  # the averaged weights differ

    err = one_line_error(run_cli(capsys, "export", ws / "ck", "-o", ws / "m.onnx", "--averaged"))
    assert "these training artifacts keep no averaged weights" in err and "averaged=" in err
    assert not (ws / "m.onnx").exists()
