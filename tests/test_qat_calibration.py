"""A QAT model whose observers never saw data (``gc.nn`` modules start in eval mode: ``gc.capture`` without
``training=True`` never runs them) keeps every scale at 1.0 and zero point 0; its export and deploy are refused
(``UncalibratedError``; ``graphc export``/``graphc deploy triton`` exit 2) unless ``allow_uncalibrated`` /
``--allow-uncalibrated``, and the capture itself warns once (``UncalibratedWarning``). A calibrated model exports
the same file as before."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.compile.export import UncalibratedError
from graphc.errors import UncalibratedWarning
from graphc.model.quantizers import FAKE_QUANTIZERS_KEY
from graphc.models.qat_resnet import QATResNet, QLinear, act_quant
from cli_util import one_line_error, run_cli

RNG = np.random.default_rng(0)
QUANTIZERS = "0, 1.wq, 1.aq and 1 more"  # the MLP's four: input, first weight and output, head weight


def _mlp():
    return nn.Sequential(act_quant(), QLinear(12, 16, relu=True), QLinear(16, 5, per_channel=False, out_quant=False))


def _capture(net, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = gc.capture(net, x=gc.spec("float32", ("N", 12)), **kwargs)
    return model, [w for w in caught if issubclass(w.category, UncalibratedWarning)]


def _trainer(model, steps=1):
    trainer = gc.Trainer(gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.01)),
                         backend="numpy")
    for _ in range(steps):
        trainer.step({"x": RNG.standard_normal((8, 12)).astype(np.float32),
                      "y": RNG.standard_normal((8, 5)).astype(np.float32)})
    return trainer


def test_an_eval_mode_capture_before_any_observation_warns_once_naming_the_modules():
    _, caught = _capture(_mlp())
    assert len(caught) == 1
    message = str(caught[0].message)
    assert message.startswith(f"4 gc.nn.FakeQuantize modules ({QUANTIZERS}) captured in eval mode before their "
                              "observer saw data")
    assert "scale 1.0 and zero point 0" in message and "training=True" in message and "\n" not in message
    assert caught[0].filename == __file__  # points at the gc.capture call
    for quiet in (_capture(_mlp(), training=True)[1],  # the observers run in training
                  _capture(_hand_set(_mlp()))[1]):  # observers disabled: the scales are the user's
        assert quiet == []


def _hand_set(net):
    for m in net.modules():
        if isinstance(m, nn.FakeQuantize):
            m.disable_observer()
            m.scale.data = np.full(m.scale.shape, 0.05, np.float32)
    return net


def test_the_export_of_a_trained_eval_mode_capture_is_refused_naming_the_quantizers(tmp_path):
    trainer = _trainer(_capture(_mlp())[0])
    with pytest.raises(UncalibratedError, match=rf"^4 fake quantizations were never calibrated \({QUANTIZERS}\): "
                       r"the observers never saw data .*scale and zero point they were built with \(1\.0 and 0 .*"
                       r"capture with training=True.*allow_uncalibrated=True; --allow-uncalibrated\)$"):
        trainer.export_inference(tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    path = trainer.export_inference(tmp_path / "m.onnx", allow_uncalibrated=True)
    onnx.checker.check_model(str(path), full_check=True)
    assert _activation_scales(path) == [1.0, 1.0]  # what it was: the input and hidden layer at scale 1


def _activation_scales(path):
    """The scale of each QuantizeLinear (the activations': the weights are int8 constants)."""
    model = onnx.load(path)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    return [float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"]


def test_a_training_capture_is_refused_until_its_observers_saw_a_batch(tmp_path):
    model = _capture(_mlp(), training=True)[0]
    with pytest.raises(UncalibratedError, match=QUANTIZERS):
        _trainer(model, steps=0).export_inference(tmp_path / "m.onnx")
    _trainer(model).export_inference(tmp_path / "m.onnx")


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_hand_set_scales_export_with_the_flag(tmp_path, backend):
    trainer = _trainer(_capture(_hand_set(_mlp()))[0])
    with pytest.raises(UncalibratedError, match=QUANTIZERS):
        trainer.export_inference(tmp_path / "m.onnx")
    path = trainer.export_inference(tmp_path / "m.onnx", allow_uncalibrated=True)
    assert _activation_scales(path) == [np.float32(0.05)] * 2
    x = RNG.standard_normal((16, 12)).astype(np.float32)
    got = gc.Session(path, backend=backend).run({"x": x})["output"]
    want = trainer.predict({"x": x})["output"]
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()  # one-step flips, as any QAT export


def test_a_calibrated_model_exports_the_same_file_as_before(tmp_path):
    """The record is capture's, never the file's: the export equals the one of artifacts without it (a capture
    before it existed)."""
    trainer = _trainer(_capture(_mlp(), training=True)[0], steps=2)
    new = trainer.export_inference(tmp_path / "new.onnx").read_bytes()
    assert FAKE_QUANTIZERS_KEY in trainer.artifacts.inference.ir.metadata_props
    del trainer.artifacts.inference.ir.metadata_props[FAKE_QUANTIZERS_KEY]
    assert new == trainer.export_inference(tmp_path / "old.onnx").read_bytes()
    # and an eval-mode capture of the trained state (loaded before capturing) is calibrated too
    net = _mlp()
    net.load_state_dict(trainer.state_dict(), strict=False)
    model, caught = _capture(net)
    assert caught == []
    _trainer(model, steps=0).export_inference(tmp_path / "eval.onnx")


def test_the_qat_resnet_captured_in_eval_mode_is_refused_at_deploy(tmp_path):
    model = _capture_resnet(training=False)
    with pytest.raises(UncalibratedError, match=r"^17 fake quantizations .* \(in_q, stem\.wq, stem\.aq and 14 more\)"):
        gc.deploy.triton(model, tmp_path / "repo", "qat")
    assert not (tmp_path / "repo" / "qat").exists()
    folder = gc.deploy.triton(model, tmp_path / "repo", "qat", allow_uncalibrated=True)
    onnx.checker.check_model(str(folder / "1" / "model.onnx"), full_check=True)


def _capture_resnet(training):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedWarning)
        return gc.capture(QATResNet(widths=(4, 8)), training=training, x=gc.spec("float32", ("N", 3, 16, 16)))


def test_graphc_export_and_deploy_refuse_it_with_one_line_unless_allowed(capsys, tmp_path):
    trainer = _trainer(_capture(_mlp())[0])
    trainer.save_checkpoint(tmp_path / "ck")
    err = one_line_error(run_cli(capsys, "export", tmp_path / "ck", "-o", tmp_path / "m.onnx"))
    assert f"UncalibratedError: 4 fake quantizations were never calibrated ({QUANTIZERS})" in err
    assert "--allow-uncalibrated" in err and not (tmp_path / "m.onnx").exists()
    result = run_cli(capsys, "export", tmp_path / "ck", "-o", tmp_path / "m.onnx", "--allow-uncalibrated")
    assert result.code == 0 and (tmp_path / "m.onnx").exists(), result.err

    _capture(_mlp())[0].save(tmp_path / "raw.onnx")
    deploy = ["deploy", "triton", tmp_path / "raw.onnx", "--repo", tmp_path / "repo", "--name", "mlp"]
    err = one_line_error(run_cli(capsys, *deploy))
    assert f"never calibrated ({QUANTIZERS})" in err and not (tmp_path / "repo" / "mlp").exists()
    assert run_cli(capsys, *deploy, "--allow-uncalibrated").code == 0
    # the export written with the flag is what it is: deploying it asks nothing more
    exported = ["deploy", "triton", tmp_path / "m.onnx", "--repo", tmp_path / "repo", "--name", "m"]
    assert run_cli(capsys, *exported).code == 0
