"""Batch norm without running statistics, as torch's: ``F.batch_norm(x, None, None, training=True)``
and ``BatchNorm*d(track_running_stats=False)`` normalise by the batch's own statistics in training
and eval mode alike, train step for step as torch's, and export to inference graphs that keep doing
so; bad calls fail as torch's do."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.errors import GraphcError
try:
    from torch_grad_util import assert_step_matches_torch, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch, run_both

R = np.random.default_rng(5)


@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4), (2, 3, 2, 3, 3)])
def test_functional_batch_norm_without_running_stats_matches_torch(shape):
    torch = pytest.importorskip("torch")
    x = (R.standard_normal(shape) * 3 + 2).astype(np.float32)
    w, b = R.standard_normal(3).astype(np.float32), R.standard_normal(3).astype(np.float32)
    model = gc.capture(lambda x, w, b: gc.batch_norm(x, None, None, w, b, training=True, eps=1e-3), x=x, w=w, b=b)
    onnx.checker.check_model(model.proto, full_check=True)
    assert "BatchNormalization" not in {n.op_type for n in model.ir.graph}  # no node the mode passes would switch
    got = run_both(model, {"x": x, "w": w, "b": b})["output"]
    want = torch.nn.functional.batch_norm(torch.from_numpy(x), None, None, torch.from_numpy(w), torch.from_numpy(b),
                                          training=True, eps=1e-3)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)


def test_bad_calls_fail_as_torchs():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(GraphcError, match="running_mean must be defined in evaluation mode"):
        gc.capture(lambda x: gc.batch_norm(x, None, None, training=False), x=x)
    with pytest.raises(GraphcError, match="running_mean and running_var or neither, got only running_mean"):
        gc.capture(lambda x: gc.batch_norm(x, np.zeros(3, np.float32), None, training=True), x=x)
    with pytest.raises(GraphcError, match="more than 1 value per channel"):
        gc.capture(lambda x: gc.batch_norm(x, None, None, training=True), x=np.ones((1, 3), np.float32))
    with pytest.raises(GraphcError, match="input channels and num_features"):
        gc.capture(nn.BatchNorm1d(4, track_running_stats=False), x=x)


def test_untracked_module_has_torchs_state_and_uses_batch_statistics_in_eval():
    torch = pytest.importorskip("torch")
    bn = nn.BatchNorm2d(3, track_running_stats=False)
    assert bn.running_mean is None and bn.num_batches_tracked is None
    assert list(bn.state_dict()) == list(torch.nn.BatchNorm2d(3, track_running_stats=False).state_dict())
    x = R.standard_normal((2, 3, 4, 4)).astype(np.float32)
    want = torch.nn.BatchNorm2d(3, track_running_stats=False).eval()(torch.from_numpy(x)).detach().numpy()
    got = run_both(gc.capture(bn.eval(), x=gc.spec("float32", ("N", 3, 4, 4))), {"x": x})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class _Net(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, dtype=dtype)
        self.bn = nn.BatchNorm2d(3, track_running_stats=False, dtype=dtype)
        self.fc = nn.Linear(3, 1, dtype=dtype)

    def forward(self, x):
        return self.fc(gc.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.mark.parametrize("backend,dtype,rtol", [("numpy", "float64", 1e-10), ("ort-cpu", "float32", 2e-4)])
def test_untracked_batch_norm_trains_like_torch_and_exports_batch_statistics(tmp_path, backend, dtype, rtol):
    """Three SGD steps against torch.optim on the same module (float64 on numpy; ort-cpu has no
    float64 Conv), then the exported inference graph normalises by its batch as torch's eval()."""
    torch = pytest.importorskip("torch")
    net = _Net(dtype)
    net.init_parameters(seed=3)
    arts = gc.training.generate(gc.capture(net, x=gc.spec(dtype, ("N", 2, 6, 6))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=0.5))
    assert arts.manifest.trainable == ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    rng = np.random.default_rng(2)
    batches = [{k: v.astype(dtype) for k, v in {"x": rng.standard_normal((4, 2, 6, 6)) * 2 + 1,
                                                "y": rng.standard_normal((4, 1))}.items()} for _ in range(3)]
    trainer = gc.Trainer(arts, backend=backend)
    kw = {"dtype": getattr(torch, dtype)}
    tnet = torch.nn.ModuleDict({"conv": torch.nn.Conv2d(2, 3, 3, **kw), "fc": torch.nn.Linear(3, 1, **kw),
                                "bn": torch.nn.BatchNorm2d(3, track_running_stats=False, **kw)})
    tnet.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})

    def forward(x):
        return tnet.fc(torch.relu(tnet.bn(tnet.conv(x))).mean((2, 3)))

    opt = torch.optim.SGD(tnet.parameters(), lr=0.125, momentum=0.5)
    for step, batch in enumerate(batches):
        assert_step_matches_torch(trainer, batch, opt, lambda b=batch: torch.nn.functional.mse_loss(
            forward(torch.from_numpy(b["x"])), torch.from_numpy(b["y"])), tnet, step, rtol=rtol, state_rtol=rtol,
            state_atol=rtol)
    x = rng.standard_normal((3, 2, 6, 6)).astype(dtype)
    got = gc.Session(gc.load(trainer.export_inference(tmp_path / "m.onnx")), backend=backend).run({"x": x})["output"]
    tnet.eval()
    with torch.no_grad():
        want = forward(torch.from_numpy(x))
    np.testing.assert_allclose(got, want.numpy(), rtol=rtol)
