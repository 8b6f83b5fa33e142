"""Complex Tensors and ``gc.fft`` against torch 2.13 in float64/complex128, on the numpy backend and ort-cpu:
every transform's values (norm modes, ``n``/``s`` crops and zero pads), the complex arithmetic, an FNet mixing
layer's values and gradients, a Fourier neural operator's 2-D spectral conv (values, the gradient of a real loss
w.r.t. its complex weights as torch's ``.grad`` in (real, imag), 3 AdamW Trainer steps), and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl.tensor import ComplexTensor

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]


def _as_real(t):
    """torch's or graphc's result as a real array (a complex one as its view_as_real pair)."""
    if isinstance(t, ComplexTensor):
        return gc.view_as_real(t)
    if isinstance(t, torch.Tensor):
        return torch.view_as_real(t.resolve_conj()).numpy() if t.is_complex() else t.numpy()
    return t


def _run(fn, backend, **arrays):
    model = gc.capture(lambda **kw: _as_real(fn(gc, **kw)), **{k: gc.spec("float64", v.shape) for k, v in arrays.items()})
    return next(iter(gc.Session(model, backend=backend).run(arrays).values()))


def _expected(fn, **arrays):
    return _as_real(fn(torch, **{k: torch.from_numpy(v) for k, v in arrays.items()}))


TRANSFORMS = {
    "fft": lambda m, a, b: m.fft.fft(a, dim=1),
    "fft_complex_n_pad_ortho": lambda m, a, b: m.fft.fft(m.complex(a, b), n=11, dim=0, norm="ortho"),
    "ifft_crop_forward": lambda m, a, b: m.fft.ifft(m.complex(a, b), n=5, norm="forward"),
    "rfft_crop": lambda m, a, b: m.fft.rfft(a, n=7),
    "rfft_pad_ortho": lambda m, a, b: m.fft.rfft(a, n=13, dim=0, norm="ortho"),
    "irfft": lambda m, a, b: m.fft.irfft(m.complex(a, b)),
    "irfft_n_odd_ortho": lambda m, a, b: m.fft.irfft(m.complex(a, b), n=9, dim=1, norm="ortho"),
    "irfft_n_pad": lambda m, a, b: m.fft.irfft(m.complex(a, b), n=20),
    "fft2_dims": lambda m, a, b: m.fft.fft2(m.complex(a, b), dim=(0, 2)),
    "ifft2": lambda m, a, b: m.fft.ifft2(m.complex(a, b), norm="ortho"),
    "rfft2_s_ortho": lambda m, a, b: m.fft.rfft2(a, s=(5, 9), norm="ortho"),
    "irfft2_s": lambda m, a, b: m.fft.irfft2(m.complex(a, b), s=(6, 10)),
    "fftn_s": lambda m, a, b: m.fft.fftn(a, s=(4, 10)),
    "ifftn": lambda m, a, b: m.fft.ifftn(m.complex(a, b), norm="ortho"),
    "rfftn": lambda m, a, b: m.fft.rfftn(a, norm="forward"),
    "irfftn_forward": lambda m, a, b: m.fft.irfftn(m.complex(a, b), norm="forward"),
    "irfftn_s_dims": lambda m, a, b: m.fft.irfftn(m.complex(a, b), s=(4, 7), dim=(0, 1)),
    "hfft": lambda m, a, b: m.fft.hfft(m.complex(a, b)),
    "hfft_n_odd_ortho": lambda m, a, b: m.fft.hfft(m.complex(a, b), n=9, dim=1, norm="ortho"),
    "hfft_n_pad_forward_real": lambda m, a, b: m.fft.hfft(a, n=20, dim=0, norm="forward"),
    "ihfft": lambda m, a, b: m.fft.ihfft(a),
    "ihfft_crop_ortho": lambda m, a, b: m.fft.ihfft(a, n=5, dim=1, norm="ortho"),
    "ihfft_pad_forward": lambda m, a, b: m.fft.ihfft(a, n=13, norm="forward"),
    "hfft2_s_ortho": lambda m, a, b: m.fft.hfft2(m.complex(a, b), s=(5, 9), norm="ortho"),
    "ihfft2_dims": lambda m, a, b: m.fft.ihfft2(a, s=(4, 7), dim=(0, 2)),
    "hfftn_forward": lambda m, a, b: m.fft.hfftn(m.complex(a, b), norm="forward"),
    "hfftn_s_dims": lambda m, a, b: m.fft.hfftn(m.complex(a, b), s=(4, 7), dim=(0, 1)),
    "ihfftn_ortho": lambda m, a, b: m.fft.ihfftn(a, norm="ortho"),
    "ihfftn_s": lambda m, a, b: m.fft.ihfftn(a, s=(5, 3, 9)),
    "fftshift": lambda m, a, b: m.fft.fftshift(m.complex(a, b), dim=(1, 2)),
    "ifftshift": lambda m, a, b: m.fft.ifftshift(a),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_each_transform_matches_torch(name, backend):
    a, b = RNG.standard_normal((3, 6, 8)), RNG.standard_normal((3, 6, 8))
    got, want = _run(TRANSFORMS[name], backend, a=a, b=b), _expected(TRANSFORMS[name], a=a, b=b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(want).max()))


def test_fftfreq_and_rfftfreq_match_torch():
    for n, d in [(7, 0.3), (8, 1.0)]:
        np.testing.assert_allclose(gc.fft.fftfreq(n, d, dtype=gc.float64).numpy(),
                                   torch.fft.fftfreq(n, d, dtype=torch.float64).numpy(), rtol=1e-15)
        np.testing.assert_allclose(gc.fft.rfftfreq(n, d).numpy(), torch.fft.rfftfreq(n, d).numpy(), rtol=1e-6)
        assert gc.fft.rfftfreq(n, d).numpy().dtype == np.float32


ARITHMETIC = {
    "mul_div_real": lambda m, a, b: (m.complex(a, b) * m.complex(b, a) + 2.5 * m.complex(a, b) - a) / m.complex(b, a),
    "div_by_real": lambda m, a, b: m.complex(a, b) / (b * b + 1) - m.complex(b, a) * 1j,
    "exp_conj": lambda m, a, b: m.exp(m.complex(a, b) * 0.3).conj(),
    "abs_angle": lambda m, a, b: m.complex(a, b).abs() + m.complex(b, a).angle() * 2,
    "polar": lambda m, a, b: m.polar(m.exp(a), b),
    "sum_mean": lambda m, a, b: m.complex(a, b).sum(1, keepdim=True) + m.complex(b, a).mean(dim=(0, 2), keepdim=True),
    "real_imag": lambda m, a, b: m.complex(a, b).real * m.complex(b, a).imag,
    "einsum": lambda m, a, b: m.einsum("ijk,ljk->il", m.complex(a, b), m.complex(b, a * a)),
    "matmul": lambda m, a, b: m.complex(a, b) @ m.complex(b, a * a).transpose(1, 2),
    "index_permute": lambda m, a, b: m.complex(a, b)[1:, ::2, None].permute(0, 3, 2, 1).reshape(2, 10),
    "view_as_complex": lambda m, a, b: m.view_as_complex(m.stack([a, b], -1)) * m.view_as_complex(
        m.stack([b, a], -1))[..., 1:2],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(ARITHMETIC))
def test_complex_arithmetic_matches_torch(name, backend):
    a, b = RNG.standard_normal((3, 4, 5)), RNG.standard_normal((3, 4, 5))
    got, want = _run(ARITHMETIC[name], backend, a=a, b=b), _expected(ARITHMETIC[name], a=a, b=b)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_casts_of_real_tensors_to_complex_dtypes_match_torch(backend):
    """``x.to(complex)``, ``astype``, ``type`` and ``gc.cast``: a complex Tensor of a zero imaginary part, as torch's
    (an infinite real part keeps a zero imaginary one)."""
    def fn(m, a, b):
        z = a.to(m.complex128) + (b * 3).type(m.cdouble)
        return z * m.complex(b, a) + (a.to(m.complex64).abs() * 2).to(m.complex128)

    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    got, want = _run(fn, backend, a=a, b=b), _expected(fn, a=a, b=b)
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7)
    a[0, 0] = np.inf
    cast = lambda m, a, b: m.cast(a, m.complex128) if m is gc else a.to(m.complex128)  # noqa: E731
    np.testing.assert_array_equal(_run(cast, backend, a=a, b=b), _expected(cast, a=a, b=b))


def test_writes_into_complex_zeros_match_torch():
    def fn(m, a, b):
        out = m.zeros(3, 4, 5, dtype=m.cdouble)
        out[:, :2, 1:] = m.complex(a, b)[:, 1:3, :4]
        out[..., 0] = a[:, :, 0]
        return out
    a, b = RNG.standard_normal((3, 4, 5)), RNG.standard_normal((3, 4, 5))
    for backend in BACKENDS:
        np.testing.assert_array_equal(_run(fn, backend, a=a, b=b), _expected(fn, a=a, b=b))


# -- FNet's mixing layer ---------------------------------------------------------------------------------------


class _FNetMix(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = gc.nn.Linear(6, 6, dtype=gc.float64)

    def forward(self, x):
        mixed = gc.fft.fft(gc.fft.fft(self.proj(x), dim=-1), dim=-2).real
        return (mixed * gc.tanh(x)).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fnet_mixing_values_and_gradients_match_torch(backend):
    net = _FNetMix()
    x = RNG.standard_normal((2, 5, 6))
    model = gc.capture(net, x=gc.spec("float64", x.shape))
    grads = gc.Session(gc.grad(model, "output"), backend=backend).run({"x": x})
    proj = torch.nn.Linear(6, 6, dtype=torch.float64)
    proj.load_state_dict({k[len("proj."):]: torch.from_numpy(v) for k, v in net.state_dict().items()})
    xt = torch.from_numpy(x)
    loss = (torch.fft.fft(torch.fft.fft(proj(xt), dim=-1), dim=-2).real * torch.tanh(xt)).sum()
    loss.backward()
    np.testing.assert_allclose(grads["output"], loss.item(), rtol=1e-12)
    np.testing.assert_allclose(grads["proj.weight_grad"], proj.weight.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["proj.bias_grad"], proj.bias.grad.numpy(), rtol=1e-10, atol=1e-12)


# -- a Fourier neural operator's spectral conv ----------------------------------------------------------------

M1, M2, CIN, COUT, H, W = 3, 3, 2, 3, 8, 8


def _weights():
    return [RNG.random((CIN, COUT, M1, M2)) + 1j * RNG.random((CIN, COUT, M1, M2)) for _ in range(2)]


def _spectral_conv(m, x, w1, w2):
    """FNO's SpectralConv2d forward, written once for torch and graphc."""
    x_ft = m.fft.rfft2(x)
    out_ft = m.zeros(x.shape[0], COUT, H, W // 2 + 1, dtype=m.cdouble)
    out_ft[:, :, :M1, :M2] = m.einsum("bixy,ioxy->boxy", x_ft[:, :, :M1, :M2], w1)
    out_ft[:, :, -M1:, :M2] = m.einsum("bixy,ioxy->boxy", x_ft[:, :, -M1:, :M2], w2)
    return m.fft.irfft2(out_ft, s=(H, W))


class _SpectralConv(gc.nn.Module):
    def __init__(self, w1, w2):
        super().__init__()
        self.weights1 = gc.nn.Parameter(w1, dtype=gc.complex128)
        self.weights2 = gc.nn.Parameter(w2, dtype=gc.complex128)

    def forward(self, x):
        return _spectral_conv(gc, x, self.weights1, self.weights2)


class _TorchSpectralConv(torch.nn.Module):
    def __init__(self, w1, w2):
        super().__init__()
        self.weights1 = torch.nn.Parameter(torch.from_numpy(w1))
        self.weights2 = torch.nn.Parameter(torch.from_numpy(w2))

    def forward(self, x):
        return _spectral_conv(torch, x, self.weights1, self.weights2)


def _pair(t):
    return torch.view_as_real(t.detach()).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fno_spectral_conv_values_and_complex_weight_gradients_match_torch(backend):
    w1, w2 = _weights()
    net, twin = _SpectralConv(w1, w2), _TorchSpectralConv(w1, w2)
    assert net.weights1.shape == (CIN, COUT, M1, M2, 2) and net.weights1.dtype == gc.float64
    x, target = RNG.standard_normal((2, CIN, H, W)), RNG.standard_normal((2, COUT, H, W))
    model = gc.capture(net, x=gc.spec("float64", x.shape))
    out = gc.Session(model, backend=backend).run({"x": x})["output"]
    want = twin(torch.from_numpy(x))
    np.testing.assert_allclose(out, want.detach().numpy(), rtol=1e-12, atol=1e-12)
    grads = gc.Session(gc.grad(model, gc.losses.mse("output", label="y")), backend=backend).run(
        {"x": x, "y": target})
    torch.nn.functional.mse_loss(want, torch.from_numpy(target)).backward()
    for name in ("weights1", "weights2"):
        np.testing.assert_allclose(grads[f"{name}_grad"], _pair(getattr(twin, name).grad), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fno_trainer_steps_with_adamw_match_torch(backend):
    w1, w2 = _weights()
    net, twin = _SpectralConv(w1, w2), _TorchSpectralConv(w1, w2)
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", CIN, H, W))),
                                gc.losses.mse("output", label="y"), gc.optim.AdamW(0.05, weight_decay=0.1))
    trainer = gc.Trainer(arts, backend=backend)
    opt = torch.optim.AdamW(twin.parameters(), lr=0.05, weight_decay=0.1)
    for _ in range(3):
        x, y = RNG.standard_normal((4, CIN, H, W)), RNG.standard_normal((4, COUT, H, W))
        loss = trainer.step({"x": x, "y": y})
        opt.zero_grad()
        want = torch.nn.functional.mse_loss(twin(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        opt.step()
        assert loss == pytest.approx(want.item(), rel=1e-12)
    state = trainer.state_dict()
    for name in ("weights1", "weights2"):
        np.testing.assert_allclose(state[name], _pair(getattr(twin, name)), rtol=1e-12, atol=1e-13)


def test_complex_parameter_loads_torch_s_complex_state():
    w1, w2 = _weights()
    net = _SpectralConv(*_weights())
    net.load_state_dict({"weights1": w1, "weights2": w2})
    np.testing.assert_array_equal(net.state_dict()["weights1"], np.stack([w1.real, w1.imag], -1))


def test_stft_return_complex_is_a_complex_tensor():
    x = RNG.standard_normal((2, 64))
    fn = lambda m, x: m.stft(x, 16, hop_length=4, window=m.hann_window(16, dtype=m.float64),  # noqa: E731
                             return_complex=True).abs()
    for backend in BACKENDS:
        np.testing.assert_allclose(_run(fn, backend, x=x), _expected(fn, x=x), rtol=1e-10, atol=1e-12)


# -- refusals ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn,match", [
    (lambda a, b: gc.relu(gc.complex(a, b)).real, "relu does not take complex Tensors"),
    (lambda a, b: gc.complex(a, b).erf(), "erf does not take complex Tensors"),
    (lambda a, b: gc.complex(a, b) < 2, "__lt__ does not take complex Tensors"),
    (lambda a, b: gc.view_as_real(gc.fft.rfft(gc.complex(a, b))), "rfft expects a real input"),
    (lambda a, b: gc.view_as_real(gc.fft.ihfft2(gc.complex(a, b))), "ihfft2 expects a real input"),
    (lambda a, b: gc.view_as_real(gc.fft.fft(a, norm="half")), "norm must be one of"),
    (lambda a, b: gc.view_as_real(gc.fft.fft(a, dim=0)), "size of dim 0 must be known"),
    (lambda a, b: gc.fft.fftshift(a), r"fft.fftshift: the size of dim 0 must be known .* got 'N'"),
    (lambda a, b: gc.fft.ifftshift(gc.complex(a, b), dim=(1, -2)).real, r"fft.ifftshift: the size of dim 0 must be"),
    (lambda a, b: gc.view_as_real(gc.fft.rfft2(a, s=(4,))), "s has 1 entries for 2 dims"),
    (lambda a, b: gc.view_as_real(gc.complex(a, b.astype(gc.float32))), "same dtype"),
    (lambda a, b: a + gc.full((4,), 1.0, dtype=gc.complex128).real, "full makes a complex128"),
    (lambda a, b: a + gc.ones_like(a, dtype=gc.complex64).real, "ones_like makes a complex64"),
    (lambda a, b: gc.eye(4, dtype=gc.complex128).abs(), "eye makes a complex128"),
    (lambda a, b: a + gc.normal(0.0, 1.0, (4,), dtype=gc.complex128).real,
     "got complex128 .graphc draws complex samples in rand, randn and their _like forms only"),
])
def test_unsupported_complex_uses_are_capture_errors_naming_the_op(fn, match):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(fn, a=gc.spec("float64", ("N", 4)), b=gc.spec("float64", ("N", 4)))


def test_istft_takes_stft_s_complex_tensor():
    x = RNG.standard_normal((2, 64))
    fn = lambda m, x: m.istft(m.stft(x, 16, hop_length=4, window=m.hann_window(16, dtype=m.float64),  # noqa: E731
                                     return_complex=True), 16, hop_length=4, window=m.hann_window(16, dtype=m.float64))
    for backend in BACKENDS:
        np.testing.assert_allclose(_run(fn, backend, x=x), _expected(fn, x=x), rtol=1e-10, atol=1e-12)
