"""gc.nn.FakeQuantize with MovingAverageMinMaxObserver / MinMaxObserver (activations, per tensor) and
PerChannelMinMaxObserver (conv and Linear weights, per output channel) against torch.ao.quantization: a tiny
CNN and an MLP (Linear weights per output feature and per tensor) trained by a Trainer (SGD) and by torch's
loop, losses, parameters and every observer buffer compared each step, a checkpoint resume that keeps the
observer state exactly, the flags and eval mode."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
tq = pytest.importorskip("torch.ao.quantization")

try:
    from trainer_models import straight_and_resumed
except ImportError:  # tests/ collected as a package
    from tests.trainer_models import straight_and_resumed


def _pair(observer: str, qscheme: str, dtype: str):
    act = {"moving": (gc.nn.MovingAverageMinMaxObserver, tq.MovingAverageMinMaxObserver),
           "minmax": (gc.nn.MinMaxObserver, tq.MinMaxObserver)}[observer]
    lo, hi = (0, 255) if dtype == "quint8" else (-128, 127)
    tdt = {"quint8": torch.quint8, "qint8": torch.qint8}

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = gc.nn.Conv2d(2, 4, 3)
            self.wq = gc.nn.FakeQuantize(gc.nn.PerChannelMinMaxObserver, -128, 127, dtype="qint8",
                                         qscheme="per_channel_symmetric", num_channels=4)
            self.aq = gc.nn.FakeQuantize(act[0], lo, hi, dtype=dtype, qscheme=qscheme)
            self.fc = gc.nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            h = gc.nn.functional.conv2d(x, self.wq(self.conv.weight), self.conv.bias)
            return self.fc(gc.flatten(self.aq(gc.nn.functional.relu(h)), 1))

    class TNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, 3)
            self.wq = tq.FakeQuantize(tq.PerChannelMinMaxObserver, -128, 127, dtype=torch.qint8,
                                      qscheme=torch.per_channel_symmetric)
            self.aq = tq.FakeQuantize(act[1], lo, hi, dtype=tdt[dtype], qscheme=getattr(torch, qscheme))
            self.fc = torch.nn.Linear(4 * 4 * 4, 3)

        def forward(self, x):
            h = torch.nn.functional.conv2d(x, self.wq(self.conv.weight), self.conv.bias)
            return self.fc(torch.flatten(self.aq(torch.relu(h)), 1))

    return _twinned(Net(), TNet(), {"wq": "conv"})


def _twinned(net, twin, per_channel):
    """``(net, twin)`` with graphc's initial state loaded into torch's twin; ``per_channel`` maps each of
    the twin's per-channel FakeQuantize to the layer whose weight it quantizes: torch's per-channel
    buffers take their shape at the first call, then are reset to the unobserved state."""
    for fq, layer in per_channel.items():
        fake = getattr(twin, fq)
        fake(getattr(twin, layer).weight.detach())
        observer = fake.activation_post_process
        observer.min_val.fill_(float("inf")), observer.max_val.fill_(float("-inf"))
        fake.scale.fill_(1.0), fake.zero_point.zero_()
    state = net.state_dict()
    assert set(state) == set(twin.state_dict()), "torch's state_dict keys"
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return net, twin


def _mlp_pair():
    """An MLP: Linear, ReLU, Linear; the first weight fake-quantized per output feature, the second per
    tensor (qint8 symmetric), the hidden activation per tensor (quint8, moving average)."""

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = gc.nn.Linear(12, 16), gc.nn.Linear(16, 3)
            self.w1q = gc.nn.FakeQuantize(gc.nn.PerChannelMinMaxObserver, -128, 127, dtype="qint8",
                                          qscheme="per_channel_symmetric", num_channels=16)
            self.w2q = gc.nn.FakeQuantize(gc.nn.MinMaxObserver, -128, 127, dtype="qint8",
                                          qscheme="per_tensor_symmetric")
            self.aq = gc.nn.FakeQuantize(gc.nn.MovingAverageMinMaxObserver, 0, 255, dtype="quint8")

        def forward(self, x):
            h = self.aq(gc.nn.functional.relu(gc.nn.functional.linear(x, self.w1q(self.fc1.weight), self.fc1.bias)))
            return gc.nn.functional.linear(h, self.w2q(self.fc2.weight), self.fc2.bias)

    class TNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(12, 16), torch.nn.Linear(16, 3)
            self.w1q = tq.FakeQuantize(tq.PerChannelMinMaxObserver, -128, 127, dtype=torch.qint8,
                                       qscheme=torch.per_channel_symmetric)
            self.w2q = tq.FakeQuantize(tq.MinMaxObserver, -128, 127, dtype=torch.qint8,
                                       qscheme=torch.per_tensor_symmetric)
            self.aq = tq.FakeQuantize(tq.MovingAverageMinMaxObserver, 0, 255, dtype=torch.quint8)

        def forward(self, x):
            h = self.aq(torch.relu(torch.nn.functional.linear(x, self.w1q(self.fc1.weight), self.fc1.bias)))
            return torch.nn.functional.linear(h, self.w2q(self.fc2.weight), self.fc2.bias)

    return _twinned(Net(), TNet(), {"w1q": "fc1"})


def _batches(n, shape=(2, 6, 6)):
    rng = np.random.default_rng(3)
    return [{"x": rng.standard_normal((5, *shape)).astype(np.float32),
             "y": rng.standard_normal((5, 3)).astype(np.float32)} for _ in range(n)]


def _artifacts(net, shape=(2, 6, 6)):
    model = gc.capture(net, training=True, x=gc.spec("float32", ("N", *shape)))
    return gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.05))


@pytest.mark.parametrize("observer, qscheme, dtype", [("moving", "per_tensor_affine", "quint8"),
                                                      ("minmax", "per_tensor_symmetric", "qint8"),
                                                      ("minmax", "per_tensor_symmetric", "quint8")])
def test_qat_cnn_trains_like_torch(observer, qscheme, dtype):
    _trains_like_torch(*_pair(observer, qscheme, dtype), (2, 6, 6))


def test_qat_mlp_trains_like_torch():
    _trains_like_torch(*_mlp_pair(), (12,))


def _trains_like_torch(net, twin, shape):
    trainer = gc.Trainer(_artifacts(net, shape), backend="ort-cpu")
    opt = torch.optim.SGD(twin.parameters(), lr=0.05)
    for step, batch in enumerate(_batches(4, shape)):
        loss = trainer.step(batch)
        opt.zero_grad()
        want = torch.nn.functional.mse_loss(twin(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        want.backward()
        opt.step()
        np.testing.assert_allclose(float(np.asarray(loss["loss"] if isinstance(loss, dict) else loss)),
                                   want.item(), rtol=1e-5, err_msg=f"step {step}")
        got = {**net.state_dict(), **trainer.state_dict()}  # the flags and eps are constants of the graphs
        for k, v in twin.state_dict().items():
            np.testing.assert_allclose(got[k], v.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}: {k}")
            assert got[k].dtype == v.numpy().dtype, k
        # each step from the same state: float32 drift of 1e-7 between onnxruntime's conv and torch's, carried
        # over steps, rounded a value to the other quantization level in one run of the suite in five (step 3)
        twin.load_state_dict({k: torch.from_numpy(np.array(got[k])) for k in twin.state_dict()})


def test_a_resume_keeps_the_observer_state_exactly(tmp_path):
    net, _ = _pair("moving", "per_tensor_affine", "quint8")
    straight, resumed = straight_and_resumed(_artifacts(net), _batches(4), 2, tmp_path / "ckpt")
    want, got = straight.state_dict(), resumed.state_dict()
    assert np.isfinite(want["aq.activation_post_process.min_val"])
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
