"""A custom ``register_parametrization`` (a symmetric weight) past training: Trainer -> checkpoint ->
resume bit for bit, ``export_inference`` and ``graphc export`` (onnx.checker full_check; onnxruntime
equal to the capture of the trained module), and ``gc.deploy.triton``, numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from cli_util import run_cli
from graphc.nn.utils import parametrize as P
from test_parametrize import Symmetric
from trainer_models import straight_and_resumed

RNG = np.random.default_rng(0)


class Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(4, 4, dtype="float64")
        self.out = gc.nn.Linear(4, 2, dtype="float64")
        P.register_parametrization(self.fc, "weight", Symmetric())

    def forward(self, x):
        return self.out(gc.tanh(self.fc(x)))


def _run_file(path, x):
    onnx.checker.check_model(str(path), full_check=True)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_symmetric_weight_trains_resumes_exports_and_deploys(tmp_path, capsys, backend):
    spec = gc.spec("float64", ("N", 4))
    arts = gc.training.generate(gc.capture(Net(), seed=0, training=True, x=spec), gc.losses.mse("output", label="y"),
                                gc.optim.Adam(0.05))
    assert arts.manifest.trainable[0] == "fc.parametrizations.weight.original"
    batches = [{"x": RNG.normal(size=(5, 4)), "y": RNG.normal(size=(5, 2))} for _ in range(6)]
    straight, resumed = straight_and_resumed(arts, batches, 3, tmp_path / "ck", backend=backend)
    for name, value in straight.state_dict().items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name
    trained = Net()
    trained.load_state_dict({k: v for k, v in resumed.state_dict().items() if k in trained.state_dict()})
    np.testing.assert_array_equal(trained.fc.weight, trained.fc.weight.T)
    capture = gc.capture(trained, x=spec)
    x = RNG.normal(size=(7, 4))
    want = gc.Session(capture, backend="numpy").run({"x": x})["output"]
    resumed.export_inference(tmp_path / "api.onnx")
    resumed.save_checkpoint(tmp_path / "final")
    assert run_cli(capsys, "export", tmp_path / "final", "-o", tmp_path / "cli.onnx").code == 0
    repo = tmp_path / "repo"
    deployed = [gc.deploy.triton(tmp_path / "cli.onnx", repo, "exported", max_batch_size=8) / "1" / "model.onnx",
                gc.deploy.triton(capture, repo, "captured", max_batch_size=8) / "1" / "model.onnx"]
    for path in [tmp_path / "api.onnx", tmp_path / "cli.onnx", *deployed]:
        np.testing.assert_allclose(_run_file(path, x), want, rtol=1e-12, atol=1e-15, err_msg=path.name)
