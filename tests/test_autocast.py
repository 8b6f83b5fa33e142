"""``gc.autocast`` on whole models against torch 2.13's ``torch.autocast("cpu", dtype=torch.bfloat16)``:
a small CNN and a transformer block trained 3 SGD steps from the same init (losses and float32
params to bfloat16's precision, numpy and ort-cpu), ``gc.grad`` through an autocast region
(float32 gradients of float32 params), the block's forms (decorator, nesting, ``enabled=False``),
its errors, and captures without autocast unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(0)


def _cnn(M):
    nn = M.nn
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 3))


def _block(M):
    nn = M.nn
    return nn.Sequential(nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True),
                         nn.Flatten(), nn.Linear(40, 3))


# model -> (its builder, input shape)
MODELS = {"cnn": (_cnn, (6, 2, 4, 4)), "transformer": (_block, (6, 5, 8))}


class _WithLoss(gc.nn.Module):
    def __init__(self, net, loss=gc.nn.functional.cross_entropy):
        super().__init__()
        self.net, self.loss = net, loss

    def forward(self, x, y):
        return self.loss(self.net(x), y)


def _torch_twin(build, state):
    net = build(torch)
    net.load_state_dict({k[len("net."):]: torch.from_numpy(np.array(v)) for k, v in state.items()})
    return net


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_three_sgd_steps_match_torch_autocast(name, backend):
    build, shape = MODELS[name]
    net = _WithLoss(build(gc)).train()
    with gc.autocast("cpu"):
        model = gc.capture(net, x=gc.spec("float32", ("N", *shape[1:])), y=gc.spec("int64", ("N",)))
    assert {n.op_type for n in model.ir.graph} >= {"Cast"}
    state = net.state_dict()
    twin = _torch_twin(build, state).train()
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    trainer = gc.Trainer(gc.training.generate(model, "output", gc.optim.SGD(0.1)), backend=backend)
    for step in range(3):
        x, y = RNG.standard_normal(shape).astype(np.float32), RNG.integers(0, 3, shape[0])
        loss = trainer.step({"x": x, "y": y})
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
        assert want.dtype == torch.float32
        want.backward()
        opt.step()
        np.testing.assert_allclose(loss, want.item(), rtol=2e-2, err_msg=f"{name} step {step}")
        params = trainer.params
        for key, p in twin.named_parameters():
            got = params[f"net.{key}"]
            assert got.dtype == np.float32, key
            np.testing.assert_allclose(got, p.detach().numpy(), rtol=2e-2, atol=1e-2, err_msg=f"step {step} {key}")



@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_mixed_precision_training_with_grad_scaler_matches_torch(backend):
    """The CNN under ``gc.autocast("cpu")`` trained 5 SGD steps with ``loss_scale=gc.amp.GradScaler``
    against torch's ``autocast`` + ``torch.amp.GradScaler("cpu")`` loop from the same init: batch 2 holds
    an inf (a NaN loss: both skip the step and halve the scale), growth_interval 2 grows it twice. The
    scale sequence is torch's exactly; losses and float32 params agree to 5e-5 (measured: 1e-7; the same
    capture without autocast is 3e-4 off)."""
    build, shape = MODELS["cnn"]
    net = _WithLoss(build(gc)).train()
    with gc.autocast("cpu"):
        model = gc.capture(net, x=gc.spec("float32", ("N", *shape[1:])), y=gc.spec("int64", ("N",)))
    args = {"init_scale": 2.0 ** 16, "growth_interval": 2}
    trainer = gc.Trainer(gc.training.generate(model, "output", gc.optim.SGD(0.1), loss_scale=gc.amp.GradScaler(**args)),
                         backend=backend)
    twin = _torch_twin(build, net.state_dict()).train()
    opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", **args)
    scales = []
    for step in range(5):
        x, y = RNG.standard_normal(shape).astype(np.float32), RNG.integers(0, 3, shape[0])
        if step == 2:
            x[0, 0, 0, 0] = np.inf
        loss = trainer.step({"x": x, "y": y})
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            want = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x)), torch.from_numpy(y))
        scaler.scale(want).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        assert trainer.loss_scale == scales[-1], f"step {step}: scale {trainer.loss_scale}, torch {scales[-1]}"
        if np.isfinite(want.item()):
            np.testing.assert_allclose(loss, want.item(), rtol=5e-5, err_msg=f"step {step}")
        else:
            assert not np.isfinite(loss), step
        params = trainer.params
        for key, p in twin.named_parameters():
            np.testing.assert_allclose(params[f"net.{key}"], p.detach().numpy(), rtol=5e-5, atol=5e-5,
                                       err_msg=f"step {step} {key}")
    assert scales == [2.0 ** 16, 2.0 ** 17, 2.0 ** 16, 2.0 ** 16, 2.0 ** 17]

def test_grad_through_an_autocast_region_is_torchs():
    """``gc.grad`` of an MLP's loss: the float32 params' gradients are float32 and torch.autograd's
    under torch.autocast, to bfloat16's precision."""
    x, t = RNG.standard_normal((5, 6)).astype(np.float32), RNG.standard_normal((5, 2)).astype(np.float32)
    net = _WithLoss(gc.nn.Sequential(gc.nn.Linear(6, 8), gc.nn.GELU(), gc.nn.Linear(8, 2)), gc.nn.functional.mse_loss)

    state = net.state_dict()
    with gc.autocast("cpu"):
        model = gc.capture(net, x=gc.spec("float32", (5, 6)), y=gc.spec("float32", (5, 2)))
    tnet = _torch_twin(lambda M: M.nn.Sequential(M.nn.Linear(6, 8), M.nn.GELU(), M.nn.Linear(8, 2)), state)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = torch.nn.functional.mse_loss(tnet(torch.from_numpy(x)), torch.from_numpy(t))
    want.backward()
    grads = gc.grad(model, "output", wrt=list(state))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"x": x, "y": t})
        np.testing.assert_allclose(got["output"], want.item(), rtol=2e-2)
        for key, p in tnet.named_parameters():
            grad = got[f"net.{key}_grad"]
            assert grad.dtype == np.float32, key
            scale = float(np.abs(p.grad.numpy()).max())
            np.testing.assert_allclose(grad, p.grad.numpy(), rtol=3e-2, atol=3e-2 * scale, err_msg=f"{backend} {key}")


def _dtype_of(fn, **specs):
    model = gc.capture(fn, **specs)
    return [str(gc.model.dtypes.as_dtype(int(o.dtype))) for o in model.ir.graph.outputs]


def test_decorator_nesting_and_opting_out():
    x = gc.spec("float32", (2, 2))

    @gc.autocast("cpu")
    def lowered(x):
        return gc.matmul(x, x)

    def nested(x):
        with gc.autocast("cpu"):
            with gc.autocast("cpu", enabled=False):
                inner = gc.matmul(x, x)
            assert gc.is_autocast_enabled()
            return inner, gc.matmul(x, x)

    def cuda_half(x):
        with gc.autocast("cuda"):
            return gc.matmul(x, x), gc.softmax(gc.matmul(x, x), -1)

    assert _dtype_of(lowered, x=x) == ["bfloat16"]
    assert _dtype_of(nested, x=x) == ["float32", "bfloat16"]
    assert _dtype_of(cuda_half, x=x) == ["float16", "float32"]  # softmax is in CUDA's float32 list
    assert not gc.is_autocast_enabled()


@pytest.mark.parametrize("args, message", [
    (("xpu",), "device_type must be one of cpu, cuda, got 'xpu'"),
    (("cpu", "float64"), "CPU autocast supports the dtypes bfloat16, float16; got float64"),
    (("cuda", "float32"), "CUDA autocast supports the dtypes float16, bfloat16; got float32"),
    (("cpu", "complex7"), "dtype 'complex7' is not a dtype"),
])
def test_bad_device_or_dtype_is_a_clear_value_error(args, message):
    with pytest.raises(ValueError, match=message):
        gc.autocast(*args)


def test_torch_dtypes_are_taken():
    assert gc.autocast("cpu", torch.float16).state.dtype == "float16"


def test_capture_without_autocast_is_unchanged():
    """A model captured outside any autocast block, or in a disabled one, is the same bytes: the
    wrappers emit nothing unless a block is on."""
    net = _cnn(gc)

    def captured() -> bytes:  # one line of source stamped on both
        return gc.capture(net, x=gc.spec("float32", ("N", 2, 4, 4))).proto.SerializeToString()

    plain = captured()
    with gc.autocast("cpu", enabled=False):
        assert captured() == plain
