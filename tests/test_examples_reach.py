"""The example models that use the DSL's newer reach (``models/vae.py``, ``models/packed_lstm.py``,
``models/audio_cnn.py``, ``models/flow.py``, ``models/sn_discriminator.py``) trained against the same models written
in torch: the torch twin loads the captured model's initial weights, and each AdamW step's loss and every
parameter must agree (float64; ort-cpu for several steps, numpy for one); the exported inference
model passes the full ONNX checker and gives torch's eval output on both backends."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.models import audio_cnn, flow, packed_lstm, sn_discriminator, vae

try:
    from torch_grad_util import assert_step_matches_torch, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch, run_both

torch = pytest.importorskip("torch")
F = torch.nn.functional
LR = 2.0 ** -7  # exact in float32, the lr input of float32 models


def _trains_like_torch(model: gc.Model, loss, twin, torch_loss, batches: list[dict], tmp_path,
                       tol: tuple[float, float, float] = (1e-10, 1e-9, 1e-12),
                       skip: tuple[str, ...] = ()) -> tuple[gc.Model, gc.Trainer]:
    """AdamW steps of ``model`` (its training artifacts) against ``twin`` (torch, holding the
    model's initial weights): on numpy the first batch, on ort-cpu every batch; ``torch_loss(twin,
    batch)`` is the torch loss; ``tol``: the loss's rtol, the params' rtol and atol; ``skip``: state
    entries not compared (buffers the steps do not change). Returns the
    inference model ``export_inference`` wrote after the ort-cpu steps, checked by the full ONNX
    checker, and the ort-cpu trainer."""
    arts = gc.training.generate(model, loss, gc.optim.AdamW(LR))
    start = {k: v.clone() for k, v in twin.state_dict().items()}
    for backend, steps in (("numpy", batches[:1]), ("ort-cpu", batches)):
        twin.load_state_dict(start)
        opt = torch.optim.AdamW(twin.parameters(), lr=LR)
        trainer = gc.Trainer(arts, backend=backend)
        for i, batch in enumerate(steps):
            assert_step_matches_torch(trainer, batch, opt, lambda b=batch: torch_loss(twin, b), twin, i, tol[0],
                                      tol[1], skip, tol[2])
    exported = gc.load(trainer.export_inference(tmp_path / "inference.onnx"))
    onnx.checker.check_model(exported.proto, full_check=True)
    twin.eval()
    return exported, trainer


def _t(a: np.ndarray):
    return torch.from_numpy(np.asarray(a))


# --- VAE -------------------------------------------------------------------------------------

class TorchVAE(torch.nn.Module):
    """models/vae.py in torch."""

    def __init__(self, features=64, hidden=32, latent=8):
        super().__init__()
        L = torch.nn.Linear
        self.enc, self.mu, self.s = L(features, hidden), L(hidden, latent), L(hidden, latent)
        self.dec1, self.dec2 = L(latent, hidden), L(hidden, features)

    def posterior(self, x):
        h = F.relu(self.enc(x))
        return torch.distributions.Normal(self.mu(h), F.softplus(self.s(h)))

    def forward(self, x, eps):
        q = self.posterior(x)
        z = q.loc + q.scale * eps
        logits = self.dec2(F.relu(self.dec1(z)))
        reconstruction = torch.distributions.Bernoulli(logits=logits).log_prob(x).sum(-1)
        kl = torch.distributions.kl_divergence(q, torch.distributions.Normal(0.0, 1.0)).sum(-1)
        return (kl - reconstruction).mean(), logits


def _vae(seed: int = 0, **inputs):
    """The VAE captured (float64, its params drawn from ``seed``) and its torch twin."""
    model = gc.capture(vae.VAE(dtype="float64"), seed=seed, x=gc.spec("float64", ("N", 64)), **inputs)
    twin = TorchVAE().double()
    twin.load_state_dict({k: _t(v) for k, v in model.params.items()})
    return model, twin


def _pixels(rng, n: int) -> np.ndarray:
    return (rng.random((n, 64)) < np.linspace(0.1, 0.9, 64)).astype(np.float64)


def test_vae_trains_like_torch(tmp_path):
    """The negative ELBO with the draw ``eps`` fed: four AdamW steps, then the exported model's
    loss and logits against torch's eval ones."""
    model, twin = _vae(eps=gc.spec("float64", ("N", 8)))
    rng = np.random.default_rng(1)
    batches = [{"x": _pixels(rng, 6), "eps": rng.standard_normal((6, 8))} for _ in range(4)]
    exported, _ = _trains_like_torch(model, "loss", twin, lambda m, b: m(_t(b["x"]), _t(b["eps"]))[0], batches,
                                  tmp_path)
    test = {"x": _pixels(rng, 5), "eps": rng.standard_normal((5, 8))}
    got = run_both(exported, test)
    with torch.no_grad():
        loss, logits = twin(_t(test["x"]), _t(test["eps"]))
    np.testing.assert_allclose(got["loss"], loss.numpy(), rtol=1e-10)
    np.testing.assert_allclose(got["logits"], logits.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_vae_rsample_gradients_are_torch_given_the_draw(backend):
    """Without ``eps``, ``rsample()`` draws in the graph: given the draw it made (recovered from ``z``
    and torch's posterior), the loss and every parameter gradient are torch's."""
    model, twin = _vae(seed=3)
    grads = gc.grad(model, "loss")
    x = _pixels(np.random.default_rng(2), 7)
    got = gc.Session(grads, backend=backend).run({"x": x})
    q = twin.posterior(_t(x))
    eps = ((_t(got["z"]) - q.loc) / q.scale).detach()
    assert 0.3 < float(eps.std()) < 3 and float(eps.abs().max()) < 10  # a standard-normal draw, not one fixed value
    loss, _ = twin(_t(x), eps)
    loss.backward()
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-9)
    for k, p in twin.named_parameters():
        np.testing.assert_allclose(got[f"{k}_grad"], p.grad.numpy(), rtol=1e-7, atol=1e-10, err_msg=k)


# --- packed-sequence LSTM classifier -----------------------------------------------------------

class TorchPackedLSTM(torch.nn.Module):
    """models/packed_lstm.py in torch."""

    def __init__(self, vocab=50, embed=16, hidden=16, classes=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embed, padding_idx=0)
        self.rnn = torch.nn.LSTM(embed, hidden, 2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(2 * hidden, classes)

    def forward(self, tokens, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                                         enforce_sorted=False)
        _, (h_n, _) = self.rnn(packed)
        return self.head(torch.cat([h_n[-2], h_n[-1]], 1))


def _sentences(rng, n: int, steps: int = 12) -> dict:
    """Token batches padded with 0 (and garbage past some lengths, which must not count), their
    lengths unsorted, and labels."""
    lengths = rng.integers(1, steps + 1, n)
    tokens = rng.integers(1, 50, (n, steps))
    tokens[(np.arange(steps) >= lengths[:, None]) & (rng.random((n, steps)) < 0.7)] = 0
    return {"tokens": tokens, "lengths": lengths, "y": rng.integers(0, 4, n)}


def test_packed_lstm_trains_like_torch(tmp_path):
    """float32 (onnxruntime's LSTM has no float64): four AdamW steps of cross-entropy, then the
    exported classifier on a batch of other lengths, with a symbolic batch."""
    model = gc.capture(packed_lstm.PackedLSTMClassifier(), **packed_lstm.example_inputs())
    twin = TorchPackedLSTM()
    twin.load_state_dict({k: _t(v) for k, v in model.params.items()})
    rng = np.random.default_rng(5)
    batches = [_sentences(rng, 6) for _ in range(4)]

    def torch_loss(m, b):
        return F.cross_entropy(m(_t(b["tokens"]), _t(b["lengths"])), _t(b["y"]))

    # the states' rtol: one element of 2048 read 1.27e-4 off torch on another machine's float32 kernels
    exported, _ = _trains_like_torch(model, gc.losses.cross_entropy("output", label="y"), twin, torch_loss, batches,
                                  tmp_path, tol=(1e-5, 3e-4, 1e-6))
    test = _sentences(rng, 9)
    got = run_both(exported, {"tokens": test["tokens"], "lengths": test["lengths"]})["output"]
    with torch.no_grad():
        want = twin(_t(test["tokens"]), _t(test["lengths"])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# --- audio frontend classifier -------------------------------------------------------------------

class TorchAudioCNN(torch.nn.Module):
    """models/audio_cnn.py in torch, on the same mel filterbank."""

    def __init__(self, mel: np.ndarray, classes=3, channels=8):
        super().__init__()
        wn = torch.nn.utils.parametrizations.weight_norm
        self.mel = _t(mel)
        self.conv1 = wn(torch.nn.Conv1d(mel.shape[0], channels, 3, padding=1))
        self.conv2 = wn(torch.nn.Conv1d(channels, channels, 3, padding=1))
        self.head = torch.nn.Linear(channels, classes)

    def forward(self, wave):
        spec = torch.stft(wave, 64, 16, window=torch.hann_window(64), return_complex=True)
        h = F.relu(self.conv1(torch.log(self.mel @ spec.abs() ** 2 + 1e-6)))
        h = F.relu(self.conv2(F.avg_pool1d(h, 2)))
        return self.head(h.mean(-1))


def _tones(rng, n: int, length: int) -> dict:
    """A tone per example whose pitch is its class, in noise."""
    y = rng.integers(0, 3, n)
    t = np.arange(length) / 8000
    wave = np.sin(2 * np.pi * (500 + 1000 * y[:, None]) * t + rng.uniform(0, 6, (n, 1)))
    return {"wave": (wave + 0.3 * rng.standard_normal((n, length))).astype(np.float32), "y": y}


def test_audio_cnn_trains_like_torch(tmp_path):
    """float32 (onnxruntime's Conv has no float64): four AdamW steps of cross-entropy on
    400-sample waveforms (a static length, as the example captures them), then the
    exported classifier."""
    net = audio_cnn.AudioCNN()
    model = gc.capture(net, **audio_cnn.example_inputs(length=400))
    twin = TorchAudioCNN(net.mel)
    assert sorted(twin.state_dict()) == sorted(model.params)
    twin.load_state_dict({k: _t(v) for k, v in model.params.items()})
    rng = np.random.default_rng(7)
    batches = [_tones(rng, 6, 400) for _ in range(4)]
    exported, _ = _trains_like_torch(model, gc.losses.cross_entropy("output", label="y"), twin,
                                  lambda m, b: F.cross_entropy(m(_t(b["wave"])), _t(b["y"])), batches, tmp_path,
                                  tol=(1e-5, 1e-4, 1e-6))
    test = _tones(rng, 5, 400)
    got = run_both(exported, {"wave": test["wave"]})["output"]
    with torch.no_grad():
        want = twin(_t(test["wave"])).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# --- normalizing flow ----------------------------------------------------------------------------

class TorchInvertibleLinear(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(dim, dim, dtype=torch.float64))

    def forward(self, x):
        return x @ self.weight.T, torch.linalg.slogdet(self.weight).logabsdet

    def inverse(self, y):
        return y @ torch.linalg.inv(self.weight).T


class TorchCoupling(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.half = dim // 2
        self.net = torch.nn.Sequential(torch.nn.Linear(self.half, hidden), torch.nn.Tanh(),
                                       torch.nn.Linear(hidden, 2 * (dim - self.half))).double()

    def forward(self, x):
        s, t = self.net(x[:, :self.half]).chunk(2, -1)
        return torch.cat([x[:, :self.half], x[:, self.half:] * torch.tanh(s).exp() + t], -1), torch.tanh(s).sum(-1)

    def inverse(self, y):
        s, t = self.net(y[:, :self.half]).chunk(2, -1)
        return torch.cat([y[:, :self.half], (y[:, self.half:] - t) * (-torch.tanh(s)).exp()], -1)


class TorchFlow(torch.nn.Module):
    """models/flow.py in torch."""

    def __init__(self, dim=6, hidden=16, blocks=2):
        super().__init__()
        self.linears = torch.nn.ModuleList([TorchInvertibleLinear(dim) for _ in range(blocks)])
        self.couplings = torch.nn.ModuleList([TorchCoupling(dim, hidden) for _ in range(blocks)])

    def forward(self, x):
        logdet = 0
        for linear, coupling in zip(self.linears, self.couplings):
            x, a = linear(x)
            x, b = coupling(x)
            logdet = logdet + a + b
        return torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(-1) + logdet

    def inverse(self, z):
        for linear, coupling in zip(reversed(self.linears), reversed(self.couplings)):
            z = linear.inverse(coupling.inverse(z))
        return z


def _moons(rng, n: int) -> np.ndarray:
    """Curved data in 6 dims, mixed by a fixed rotation."""
    a = rng.standard_normal((n, 3))
    mix = np.linalg.qr(np.random.default_rng(0).standard_normal((6, 6)))[0]
    return np.concatenate([a, np.sin(2 * a) + 0.1 * rng.standard_normal((n, 3))], 1) @ mix


def test_flow_trains_like_torch(tmp_path):
    """float64: four AdamW steps of the negative log-likelihood (slogdet's gradient, the cofactor
    matrix, through the linear maps), the exported log-likelihoods, and the trained flow's
    ``inverse`` (``gc.linalg.inv``) against torch's."""
    net = flow.Flow(dtype="float64")
    model = gc.capture(net, x=gc.spec("float64", ("N", 6)))
    twin = TorchFlow()
    twin.load_state_dict({k: _t(v) for k, v in model.params.items()})
    rng = np.random.default_rng(9)
    batches = [{"x": _moons(rng, 8)} for _ in range(4)]
    exported, trainer = _trains_like_torch(model, "loss", twin, lambda m, b: -m(_t(b["x"])).mean(), batches, tmp_path)
    x = _moons(rng, 5)
    with torch.no_grad():
        want = twin(_t(x)).numpy()
    np.testing.assert_allclose(run_both(exported, {"x": x})["log_prob"], want, rtol=1e-10)
    net.load_state_dict({k: v for k, v in trainer.state_dict().items() if k in model.params})
    inverse = gc.capture(lambda z: net.inverse(z), z=gc.spec("float64", ("N", 6)))
    onnx.checker.check_model(inverse.proto, full_check=True)
    z = rng.standard_normal((5, 6))
    with torch.no_grad():
        np.testing.assert_allclose(run_both(inverse, {"z": z})["output"], twin.inverse(_t(z)).numpy(), rtol=1e-9)


# --- spectral-norm discriminator -----------------------------------------------------------------

class TorchSNDiscriminator(torch.nn.Module):
    """models/sn_discriminator.py in torch (eval mode: u and v stay as loaded)."""

    def __init__(self, width=8, size=16):
        super().__init__()
        sn = torch.nn.utils.spectral_norm
        self.conv1 = sn(torch.nn.Conv2d(1, width, 4, stride=2, padding=1))
        self.conv2 = sn(torch.nn.Conv2d(width, 2 * width, 4, stride=2, padding=1))
        self.fc = sn(torch.nn.Linear(2 * width * (size // 4) ** 2, 1))

    def forward(self, x):
        h = F.leaky_relu(self.conv2(F.leaky_relu(self.conv1(x), 0.2)), 0.2)
        return self.fc(h.flatten(1))


def _real_and_fake(rng, n: int) -> dict:
    """Smooth blobs (label 1) and noise (label 0), half each."""
    grid = np.linspace(-1, 1, 16)
    cy, cx = rng.uniform(-0.5, 0.5, (2, n, 1, 1))
    real = np.exp(-((grid[None, :, None] - cy) ** 2 + (grid[None, None, :] - cx) ** 2) * 4)
    fake = rng.uniform(0, 1, (n, 16, 16))
    x = np.concatenate([real, fake])[:, None].astype(np.float32)
    return {"x": x, "y": np.repeat([[1.0], [0.0]], n, 0).astype(np.float32)}


def test_sn_discriminator_trains_like_torch(tmp_path):
    """float32 (onnxruntime's Conv has no float64): four AdamW steps of the discriminator's
    logistic loss through spectral norm's ``sigma`` (u, v fixed, as torch's eval mode), then the
    exported model."""
    model = gc.capture(sn_discriminator.SNDiscriminator(), **sn_discriminator.example_inputs())
    twin = TorchSNDiscriminator().eval()
    assert sorted(twin.state_dict()) == sorted(model.params)
    twin.load_state_dict({k: _t(v) for k, v in model.params.items()})
    rng = np.random.default_rng(11)
    batches = [_real_and_fake(rng, 4) for _ in range(4)]
    buffers = tuple(k for k in model.params if k.endswith(("_u", "_v")))
    exported, trainer = _trains_like_torch(model, gc.losses.bce_with_logits("output", label="y"), twin,
                                           lambda m, b: F.binary_cross_entropy_with_logits(m(_t(b["x"])), _t(b["y"])),
                                           batches, tmp_path, tol=(1e-5, 1e-4, 1e-6), skip=buffers)
    assert not set(buffers) & set(trainer.manifest.trainable)
    test = _real_and_fake(rng, 3)
    with torch.no_grad():
        want = twin(_t(test["x"])).numpy()
    np.testing.assert_allclose(run_both(exported, {"x": test["x"]})["output"], want, rtol=1e-4, atol=1e-5)
