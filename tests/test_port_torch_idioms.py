"""What a PyTorch model file does besides its layers, ported by swapping ``torch`` for ``gc``: GPT-style
``self.apply(init_weights)`` with ``nn.init.*_``, ``model.double()`` / ``model.to(device)``, a loss
divided by ``x.shape[0]`` under a symbolic batch; and the errors for what does not port (symbolic sizes as
slice bounds and factory sizes: tests/test_symbolic_sizes.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
from graphc import nn

RNG = np.random.default_rng(0)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(300, 64)
        self.fc = nn.Linear(64, 256)
        self.head = nn.Linear(256, 300, bias=False)
        self.apply(self._init)

    def _init(self, m):  # nanoGPT's _init_weights
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        return self.head(gc.relu(self.fc(self.emb(idx))))


def test_apply_with_in_place_inits_draws_them_at_capture():
    net = _Net()
    order = []
    net.apply(lambda m: order.append(type(m).__name__))
    assert order == ["Embedding", "Linear", "Linear", "_Net"]  # children first, as torch's
    gc.capture(net, idx=gc.spec("int64", ("N", 4)), seed=3)
    sd = net.state_dict()
    for key in ("emb.weight", "fc.weight", "head.weight"):
        assert abs(sd[key].std() - 0.02) < 0.001 and abs(sd[key].mean()) < 0.001, key
    assert not sd["fc.bias"].any()
    again = _Net()
    gc.capture(again, idx=gc.spec("int64", ("N", 4)), seed=3)
    np.testing.assert_array_equal(again.state_dict()["fc.weight"], sd["fc.weight"])  # seeded


def test_in_place_inits_follow_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cases = [("uniform_", (-0.3, 0.7)), ("normal_", (0.5, 0.1)), ("trunc_normal_", (0.0, 1.0, -0.5, 1.0)),
             ("xavier_uniform_", (2.0,)), ("xavier_normal_", (0.5,)), ("kaiming_uniform_", (0.1, "fan_out", "relu")),
             ("kaiming_normal_", (0.0, "fan_in", "tanh")), ("orthogonal_", (1.5,)), ("constant_", (0.25,)),
             ("ones_", ()), ("zeros_", ()), ("eye_", ())]
    for name, args in cases:
        shape = (96, 160) if name == "eye_" else (96, 40, 2, 2)
        t = getattr(torch.nn.init, name)(torch.empty(shape, dtype=torch.float64), *args).numpy()
        p = nn.Parameter(shape=shape, dtype="float64")
        assert getattr(nn.init, name)(p, *args) is p
        p.draw(np.random.default_rng(1))
        g = p.numpy()
        assert g.shape == t.shape and g.dtype == np.float64
        np.testing.assert_allclose([g.mean(), g.std()], [t.mean(), t.std()], atol=0.03 * max(t.std(), 0.01) + 1e-12,
                                   rtol=0.03, err_msg=name)
        if name in ("uniform_", "trunc_normal_"):
            assert args[-2] <= g.min() and g.max() <= args[-1], name
    flat = nn.init.orthogonal_(nn.Parameter(shape=(6, 4, 3)))
    flat.draw(RNG)
    rows = flat.numpy().reshape(6, 12)
    np.testing.assert_allclose(rows @ rows.T, np.eye(6), atol=1e-6)
    assert nn.init.calculate_gain("leaky_relu", 0.2) == torch.nn.init.calculate_gain("leaky_relu", 0.2)
    assert nn.init.calculate_gain("selu") == torch.nn.init.calculate_gain("selu")


def test_in_place_init_overwrites_loaded_values_and_refuses_what_it_cannot_do():
    lin = nn.Linear(3, 2)
    lin.load_state_dict({"weight": np.ones((2, 3)), "bias": np.ones(2)})
    nn.init.zeros_(lin.bias)
    lin.init_parameters(0)
    assert not lin.state_dict()["bias"].any()  # torch's zeros_ overwrites what was loaded
    with pytest.raises(TypeError, match="takes a gc.nn.Parameter.*ndarray"):
        nn.init.normal_(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="generator= is not taken"):
        nn.init.normal_(lin.weight, generator=object())
    with pytest.raises(ValueError, match="Mode 'fan' not supported"):
        nn.init.kaiming_normal_(lin.weight, mode="fan")
    with pytest.raises(ValueError, match="rank >= 2"):
        nn.init.xavier_uniform_(lin.bias)


class _BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(gc.relu(self.bn(self.conv(x))).mean((2, 3)))


def _torch_bnnet(torch):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.fc = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))
    return Net()


@pytest.mark.parametrize("convert", ["double", "to_dtype", "to_device_dtype"])
def test_double_model_matches_torch(convert):
    torch = pytest.importorskip("torch")
    tnet = _torch_bnnet(torch).double()
    tnet.bn.running_mean.uniform_(-1, 1)
    tnet.bn.running_var.uniform_(0.5, 2)
    net = _BNNet()
    out = {"double": lambda: net.double(), "to_dtype": lambda: net.to(torch.float64),
           "to_device_dtype": lambda: net.to("cpu", torch.double)}[convert]()
    assert out is net
    net.load_state_dict({k: v.numpy() for k, v in tnet.state_dict().items()})
    sd = net.state_dict()
    assert sd["conv.weight"].dtype == np.float64 and sd["bn.num_batches_tracked"].dtype == np.int64
    np.testing.assert_array_equal(sd["bn.running_mean"], tnet.bn.running_mean.numpy())  # not rounded to float32
    x = RNG.standard_normal((2, 3, 6, 6))
    model = gc.capture(net, x=gc.spec("float64", ("N", 3, 6, 6)))
    want = tnet.eval()(torch.tensor(x)).detach().numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"x": x})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13, err_msg=backend)


def test_to_keeps_the_module_on_a_device_and_refuses_integer_dtypes():
    net = _BNNet().float()
    assert net.to("cuda:0") is net and net.state_dict()["conv.weight"].dtype == np.float32
    net.load_state_dict({k: v.astype(np.float64) for k, v in net.state_dict().items()})  # rounded, as torch's copy_
    assert net.state_dict()["conv.weight"].dtype == np.float32
    assert net.half().state_dict()["fc.bias"].dtype == np.float16
    with pytest.raises(TypeError, match="floating point dtype.*got int64"):
        net.to(gc.int64)
    with pytest.raises(TypeError, match="float65"):
        net.to("float65")


class _MeanBySize(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        out = self.fc(x)
        return {"out": out, "loss": (out * out).sum() / x.shape[0]}  # torch's int batch size


def test_a_dim_name_in_arithmetic_is_its_size_at_run_time():
    torch = pytest.importorskip("torch")
    net = _MeanBySize().double()
    model = gc.capture(net, x=gc.spec("float64", ("N", 4)))
    grads = gc.grad(model, "loss")
    tfc = torch.nn.Linear(4, 3).double()
    tfc.load_state_dict({k[3:]: torch.tensor(v) for k, v in net.state_dict().items()})
    for n in (2, 5):
        x = RNG.standard_normal((n, 4))
        out = tfc(torch.tensor(x))
        want = (out * out).sum() / x.shape[0]
        want.backward()
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(grads, backend=backend).run({"x": x})
            np.testing.assert_allclose(got["loss"], want.item(), rtol=1e-13, err_msg=backend)
            np.testing.assert_allclose(got["fc.weight_grad"], tfc.weight.grad.numpy(), rtol=1e-12, err_msg=backend)
        tfc.zero_grad()


def test_what_does_not_port_says_what_to_do():
    with pytest.raises(gc.CaptureError, match=r"not a dim name of the captured inputs \['N'\]"):
        gc.capture(lambda x: x / "M", x=gc.spec("float32", ("N", 4)))
    with pytest.raises(gc.CaptureError, match=r"T <= 32: the dim 'T' is symbolic.*drop the check"):
        gc.capture(lambda x: x if x.shape[1] <= 32 else None, x=gc.spec("float32", ("N", "T")))  # nanoGPT's assert
    assert np.asarray(gc.zeros(1, 16, 32)).shape == (1, 16, 32)  # outside a capture: a value (test_port_family_idioms)
    assert math.isclose(nn.init.calculate_gain("tanh"), 5 / 3)
