"""Window functions, stft and istft (graphc.dsl.ops_spectral) against torch: values on the numpy and
ort-cpu backends (float32 and float64, several n_fft/hop/win_length/window/center/pad_mode/
normalized/onesided combinations, symbolic batch and length), the stft -> istft round trip,
gradients against torch.autograd and float64 central differences, a log-mel frontend, and the
errors for bad arguments."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest

import graphc as gc

try:
    from torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_grads_match_central_differences, gc_grads, run_both

torch = pytest.importorskip("torch")

R = np.random.default_rng(5)
SIGNAL = R.standard_normal((3, 64))


def _window(M, name: str | None, length: int, dtype: str):
    """``M.<name>_window(length)`` in ``dtype`` (None: no window, torch's rectangle)."""
    if name is None:
        return None
    fn = getattr(M, f"{name}_window")
    return fn(length, dtype=getattr(torch, dtype)) if M is torch else fn(length, dtype=dtype)


def _stft(M, x, window=None, **kw):
    """``view_as_real(torch.stft(...))`` on torch, ``gc.stft(..., return_complex=False)`` on graphc."""
    if M is torch:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on the rectangular default window
            return torch.view_as_real(torch.stft(x, window=window, return_complex=True, **kw))
    return gc.stft(x, window=window, return_complex=False, **kw)


def _istft(M, spec, window=None, **kw):
    if M is torch:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on the rectangular window and on zero padding
            return torch.istft(torch.view_as_complex(spec), window=window, **kw)
    return gc.istft(spec, window=window, **kw)


# (id, window name, stft keywords); window length is win_length (default n_fft)
STFT_CASES = [
    ("defaults_rectangle", None, dict(n_fft=16)),
    ("hann_hop", "hann", dict(n_fft=16, hop_length=5)),
    ("short_window", "hamming", dict(n_fft=16, hop_length=3, win_length=10)),
    ("odd_n_fft_short_window", "blackman", dict(n_fft=15, win_length=8)),
    ("no_center", "hann", dict(n_fft=12, hop_length=4, center=False)),
    ("constant_pad", "bartlett", dict(n_fft=10, pad_mode="constant")),
    ("replicate_pad", "kaiser", dict(n_fft=10, hop_length=3, pad_mode="replicate")),
    ("circular_pad", "hann", dict(n_fft=8, hop_length=2, pad_mode="circular")),
    ("normalized", "hann", dict(n_fft=16, normalized=True)),
    ("two_sided", "hann", dict(n_fft=9, hop_length=2, onesided=False)),
    ("two_sided_normalized_no_center", "hamming", dict(n_fft=8, win_length=6, center=False, onesided=False,
                                                       normalized=True)),
    ("whole_signal_one_frame", None, dict(n_fft=64, center=False)),
]


def _stft_case(M, x, name, kw, dtype):
    return _stft(M, x, _window(M, name, kw.get("win_length", kw["n_fft"]), dtype), **kw)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", STFT_CASES, ids=[c[0] for c in STFT_CASES])
def test_stft_matches_torch(case, dtype):
    _, name, kw = case
    x = SIGNAL.astype(dtype)
    want = _stft_case(torch, torch.from_numpy(x), name, kw, dtype).numpy()
    model = gc.capture(lambda x: _stft_case(gc, x, name, kw, dtype), x=x)
    got = run_both(model, {"x": x})["output"]
    onnx.checker.check_model(model.proto, full_check=True)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 if dtype == "float32" else 1e-12)


def test_stft_of_one_signal_and_as_a_method():
    x = SIGNAL[0].astype(np.float32)
    want = _stft(torch, torch.from_numpy(x), torch.hann_window(16), n_fft=16, hop_length=4).numpy()
    model = gc.capture(lambda x: x.stft(16, 4, window=gc.hann_window(16), return_complex=False), x=x)
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_stft_with_symbolic_batch_and_length(dtype):
    """One graph for any batch and signal length: its frames are symbolic too."""
    model = gc.capture(lambda x: _stft(gc, x, gc.hann_window(16, dtype=dtype), n_fft=16, hop_length=4),
                       x=gc.spec(dtype, ("B", "L")))
    onnx.checker.check_model(model.proto, full_check=True)
    for batch, length in ((1, 40), (4, 77)):
        x = R.standard_normal((batch, length)).astype(dtype)
        window = torch.hann_window(16, dtype=getattr(torch, dtype))
        want = _stft(torch, torch.from_numpy(x), window, n_fft=16, hop_length=4).numpy()
        np.testing.assert_allclose(run_both(model, {"x": x})["output"], want, rtol=1e-5, atol=1e-5)


# (id, window name, stft keywords, istft-only keywords)
ISTFT_CASES = [
    ("hann", "hann", dict(n_fft=16, hop_length=4), {}),
    ("short_window", "hann", dict(n_fft=16, hop_length=3, win_length=12), {}),
    ("odd_normalized_length_short", "hamming", dict(n_fft=15, hop_length=5, normalized=True), dict(length=50)),
    ("length_longer", "hann", dict(n_fft=16, hop_length=4), dict(length=80)),
    ("rectangle_no_center", None, dict(n_fft=8, hop_length=8, center=False), {}),
    ("two_sided", "hann", dict(n_fft=12, hop_length=3, onesided=False), {}),
]


def _istft_case(M, spec, name, kw, extra, dtype):
    return _istft(M, spec, _window(M, name, kw.get("win_length", kw["n_fft"]), dtype), **kw, **extra)


def _spectrum(name, kw, dtype):
    """A spectrum torch's stft gives, perturbed (so it is not exactly one of a signal)."""
    x = torch.from_numpy(SIGNAL.astype(dtype))
    spec = _stft_case(torch, x, name, kw, dtype).numpy()
    return spec + 0.1 * R.standard_normal(spec.shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", ISTFT_CASES, ids=[c[0] for c in ISTFT_CASES])
def test_istft_matches_torch(case, dtype):
    _, name, kw, extra = case
    spec = _spectrum(name, kw, dtype)
    want = _istft_case(torch, torch.from_numpy(spec), name, kw, extra, dtype).numpy()
    model = gc.capture(lambda s: _istft_case(gc, s, name, kw, extra, dtype), s=spec)
    got = run_both(model, {"s": spec})["output"]
    onnx.checker.check_model(model.proto, full_check=True)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("length", [None, 60])
def test_istft_with_symbolic_batch_and_frames(length, dtype):
    kw = dict(n_fft=16, hop_length=4, length=length)
    model = gc.capture(lambda s: _istft(gc, s, gc.hann_window(16, dtype=dtype), **kw),
                       s=gc.spec(dtype, ("B", 9, "T", 2)))
    onnx.checker.check_model(model.proto, full_check=True)
    for batch, frames in ((1, 11), (3, 17)):
        spec = R.standard_normal((batch, 9, frames, 2)).astype(dtype)
        window = torch.hann_window(16, dtype=getattr(torch, dtype))
        want = _istft(torch, torch.from_numpy(spec), window, **kw).numpy()
        np.testing.assert_allclose(run_both(model, {"s": spec})["output"], want, rtol=1e-5, atol=1e-5)


def test_round_trip_recovers_the_signal():
    """istft(stft(x)) is x: Hann at a quarter hop, the length given back (on both backends)."""
    x = SIGNAL.astype(np.float32)

    def round_trip(x):
        spec = gc.stft(x, 32, 8, window=gc.hann_window(32), return_complex=False)
        return gc.istft(spec, 32, 8, window=gc.hann_window(32), length=x.shape[-1])

    np.testing.assert_allclose(run_both(gc.capture(round_trip, x=x), {"x": x})["output"], x, atol=2e-6)


@pytest.mark.parametrize("dtype, stft_op, istft_op", [("float32", "Conv", "ConvTranspose"),
                                                      ("float64", "Gather", "ScatterElements")])
def test_lowering_by_dtype(dtype, stft_op, istft_op):
    """float32 takes the measured-faster Conv / ConvTranspose; float64, which onnxruntime has no
    Conv kernels for, Gather and ScatterElements around a MatMul."""
    x = SIGNAL.astype(dtype)
    spec = gc.capture(lambda x: gc.stft(x, 16, return_complex=False), x=x)
    back = gc.capture(lambda s: gc.istft(s, 16), s=np.ones((3, 9, 17, 2), dtype))
    ops = {n.op_type for n in spec.proto.graph.node}, {n.op_type for n in back.proto.graph.node}
    assert stft_op in ops[0] and not {"Conv", "Gather"} - {stft_op} & ops[0]
    assert istft_op in ops[1] and not {"ConvTranspose", "ScatterElements"} - {istft_op} & ops[1]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_opset_17(dtype):
    """Both lowerings (float32's Conv, float64's Gather and ScatterElements) at opset 17."""
    x = SIGNAL.astype(dtype)

    def round_trip(x):
        spec = gc.stft(x, 16, 4, window=gc.hann_window(16, dtype=dtype), return_complex=False)
        return gc.istft(spec * spec, 16, 4, window=gc.hann_window(16, dtype=dtype))

    window = torch.hann_window(16, dtype=getattr(torch, dtype))
    spec = _stft(torch, torch.from_numpy(x), window, n_fft=16, hop_length=4)
    want = _istft(torch, spec * spec, window, n_fft=16, hop_length=4).numpy()
    model = gc.capture(round_trip, x=x, opset=17)
    onnx.checker.check_model(model.proto, full_check=True)
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], want, rtol=1e-5, atol=1e-4)


# -- gradients ------------------------------------------------------------------------------


def _torch_grads(fn, arrays, c):
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    (out * torch.from_numpy(c)).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("case", [STFT_CASES[2], STFT_CASES[4], STFT_CASES[6], STFT_CASES[9]],
                         ids=lambda c: c[0])
def test_stft_gradient_matches_torch(case):
    _, name, kw = case
    x = SIGNAL.astype(np.float32)
    want, (dx,) = _torch_grads(lambda x: _stft_case(torch, x, name, kw, "float32"), [x],
                               c := R.standard_normal(_stft_case(torch, torch.from_numpy(x), name, kw,
                                                                 "float32").shape).astype(np.float32))
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda _, x: _stft_case(gc, x, name, kw, "float32"), {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["x"], dx, rtol=1e-4, atol=1e-4, err_msg=backend)


def test_window_given_as_a_tensor_gets_torch_gradient():
    """A window that is a graph value (not known at capture) is multiplied into the basis in the
    graph, and gets torch's gradient in stft and istft alike."""
    x, w = SIGNAL.astype(np.float32), (0.5 + R.random(12)).astype(np.float32)
    kw = dict(n_fft=16, hop_length=4, win_length=12)
    c = R.standard_normal((3, 9, 17, 2)).astype(np.float32)
    want, (dx, dw) = _torch_grads(lambda x, w: _stft(torch, x, w, **kw), [x, w], c)
    got = gc_grads(lambda _, x, w: _stft(gc, x, w, **kw), {"x": x, "w": w}, {}, c)
    for k, v in (("out", want), ("x", dx), ("w", dw)):
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=2e-4, err_msg=k)
    spec = _spectrum(None, kw, "float32")
    c = R.standard_normal((3, 64)).astype(np.float32)
    want, (ds, dw) = _torch_grads(lambda s, w: _istft(torch, s, w, **kw), [spec, w], c)
    got = gc_grads(lambda _, s, w: _istft(gc, s, w, **kw), {"s": spec, "w": w}, {}, c, backend="ort-cpu")
    for k, v in (("out", want), ("s", ds), ("w", dw)):
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=2e-4, err_msg=k)


@pytest.mark.parametrize("case", [ISTFT_CASES[1], ISTFT_CASES[2], ISTFT_CASES[3], ISTFT_CASES[5]],
                         ids=lambda c: c[0])
def test_istft_gradient_matches_torch(case):
    _, name, kw, extra = case
    spec = _spectrum(name, kw, "float32")
    want_shape = _istft_case(torch, torch.from_numpy(spec), name, kw, extra, "float32").shape
    c = R.standard_normal(want_shape).astype(np.float32)
    want, (ds,) = _torch_grads(lambda s: _istft_case(torch, s, name, kw, extra, "float32"), [spec], c)
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda _, s: _istft_case(gc, s, name, kw, extra, "float32"), {"s": spec}, {}, c,
                       backend=backend)
        np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["s"], ds, rtol=1e-4, atol=1e-5, err_msg=backend)


def test_gradients_match_central_differences():
    """float64: stft (reflect-padded by Slices), istft, and the two chained."""
    kw = dict(n_fft=12, hop_length=3, win_length=10)
    x = SIGNAL[:2, :40]
    assert_grads_match_central_differences(lambda _, x: _stft(gc, x, gc.hann_window(10, dtype="float64"), **kw), x)
    spec = _spectrum("hann", kw, "float64")
    assert_grads_match_central_differences(
        lambda _, s: _istft(gc, s, gc.hann_window(10, dtype="float64"), **kw, length=30), spec)
    assert_grads_match_central_differences(
        lambda _, x: _istft(gc, _stft(gc, x, None, n_fft=8, pad_mode="replicate"), None, n_fft=8) ** 2, x)


# -- windows --------------------------------------------------------------------------------

WINDOWS = [("hann", {}), ("hamming", {}), ("hamming", dict(alpha=0.5, beta=0.4)), ("blackman", {}),
           ("bartlett", {}), ("kaiser", {}), ("kaiser", dict(beta=3.5))]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("length", [0, 1, 2, 7, 16])
@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"{w[0]}{'_' if w[1] else ''}{'_'.join(map(str, w[1]))}")
def test_windows_match_torch(window, length, periodic, dtype):
    name, kw = window
    want = getattr(torch, f"{name}_window")(length, periodic, **kw, dtype=getattr(torch, dtype)).numpy()
    model = gc.capture(lambda x: x + getattr(gc, f"{name}_window")(length, periodic, **kw, dtype=dtype),
                       x=np.zeros(length, dtype))
    got = run_both(model, {"x": np.zeros(length, dtype)})["output"]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-13, atol=1e-7)


# -- a log-mel frontend ---------------------------------------------------------------------


def _mel_filters(n_mels: int, n_fft: int, rate: int) -> np.ndarray:
    """Triangular filters on the HTK mel scale, ``[n_mels, n_fft // 2 + 1]`` (built in numpy)."""
    mel = np.linspace(0, 2595 * np.log10(1 + rate / 2 / 700), n_mels + 2)
    hertz = 700 * (10 ** (mel / 2595) - 1)
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    lower, centre, upper = hertz[:-2, None], hertz[1:-1, None], hertz[2:, None]
    return np.maximum(0, np.minimum((bins - lower) / (centre - lower), (upper - bins) / (upper - centre)))


def test_log_mel_frontend_matches_torch():
    """Whisper's path: |stft|^2 of a Hann window, a mel filterbank matrix, log10 of the clamped
    energies; graphc on both backends against torch doing the same ops, gradient included."""
    filters = _mel_filters(20, 64, 16000).astype(np.float32)
    x = R.standard_normal((2, 800)).astype(np.float32)

    def log_mel(M, x):
        spec = _stft(M, x, M.hann_window(64), n_fft=64, hop_length=16)
        power = (spec ** 2).sum(-1)  # [B, freq, frames]
        mel = M.matmul(M.from_numpy(filters) if M is torch else filters, power)
        return M.log10(M.clamp(mel, min=1e-10))

    c = R.standard_normal((2, 20, 51)).astype(np.float32)
    want, (dx,) = _torch_grads(lambda x: log_mel(torch, x), [x], c)
    model = gc.capture(lambda x: log_mel(gc, x), x=gc.spec("float32", ("B", 800)))
    np.testing.assert_allclose(run_both(model, {"x": x})["output"], want, rtol=1e-4, atol=1e-4)
    got = gc_grads(lambda _, x: log_mel(gc, x), {"x": x}, {}, c, backend="ort-cpu")
    np.testing.assert_allclose(got["x"], dx, rtol=1e-3, atol=1e-3)


# -- errors ---------------------------------------------------------------------------------

ERRORS = [
    ("n_fft_past_padded_length", lambda x: gc.stft(x, 200, window=None, center=False, return_complex=False),
     r"n_fft: expected at most the signal length 64, got 200"),
    ("reflect_pad_past_length", lambda x: gc.stft(x, 130, return_complex=False),
     r"pad_mode='reflect'.*longer than that, got 64 samples"),
    ("win_length_past_n_fft", lambda x: gc.stft(x, 16, win_length=20, return_complex=False),
     r"win_length: expected 0 < win_length <= n_fft=16, got 20"),
    ("window_length_mismatch", lambda x: gc.stft(x, 16, window=gc.hann_window(5), return_complex=False),
     r"window: expected a 1-D window of size win_length=16, got shape \(5,\)"),
    ("window_dtype", lambda x: gc.stft(x, 16, window=gc.hann_window(16, dtype="float64"), return_complex=False),
     r"window: expected the input's dtype float32, got float64"),
    ("hop_zero", lambda x: gc.stft(x, 16, hop_length=0, return_complex=False), r"hop_length: expected hop_length > 0"),
    ("hop_negative", lambda x: gc.stft(x, 16, hop_length=-2, return_complex=False), r"got -2"),
    ("n_fft_not_positive", lambda x: gc.stft(x, 0, return_complex=False), r"n_fft: expected a positive int"),
    ("pad_mode", lambda x: gc.stft(x, 16, pad_mode="zeros", return_complex=False), r"pad_mode: expected one of"),
    ("return_complex_omitted", lambda x: gc.stft(x, 16), r"requires the return_complex parameter"),
    ("rank_3", lambda x: gc.stft(gc.reshape(x, [3, 2, 32]), 16, return_complex=False),
     r"input: expected a float32 or float64 1-D \(L\) or 2-D \(B, L\) Tensor, got float32\[3,2,32\]"),
    ("int_input", lambda x: gc.stft(gc.cast(x, "int64"), 16, return_complex=False), r"got int64\[3,64\]"),
    ("istft_freq", lambda x: gc.istft(gc.reshape(x, [3, 8, 4, 2]), 16),
     r"input: expected \[\.\.\., 9, frames, 2\].*got float32\[3,8,4,2\]"),
    ("istft_two_sided_freq", lambda x: gc.istft(gc.reshape(x, [3, 8, 4, 2]), 16, onesided=False),
     r"input: expected \[\.\.\., 16, frames, 2\]"),
    ("istft_hop_past_window", lambda x: gc.istft(gc.reshape(x, [3, 4, 8, 2]), 6, hop_length=5, win_length=4),
     r"hop_length: expected 0 < hop_length <= win_length=4, got 5"),
    ("istft_envelope_zero", lambda x: gc.istft(gc.reshape(x, [3, 4, 8, 2]), 6, center=False,
                                               window=gc.hann_window(6)), r"window overlap add min"),
    ("istft_return_complex", lambda x: gc.istft(gc.reshape(x, [3, 4, 8, 2]), 6, return_complex=True),
     r"istft gives real signals only"),
    ("istft_length", lambda x: gc.istft(gc.reshape(x, [3, 4, 8, 2]), 6, length=-1), r"length: expected"),
    ("window_length", lambda x: x + gc.hann_window(-1), r"hann_window window_length"),
    ("window_dtype_int", lambda x: x + gc.kaiser_window(4, dtype="int64"), r"kaiser_window dtype"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_are_refused(case):
    _, fn, match = case
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=SIGNAL.astype(np.float32))
    assert "test_dsl_spectral.py:" in str(info.value)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_stft_returned_complex_is_torchs(backend):
    """``return_complex=True`` as the graph's output (a complex output since graphs take and give complex
    Tensors): the session gives numpy complex values equal to torch's."""
    x = SIGNAL.astype(np.float64)
    got = gc.Session(gc.capture(lambda x: gc.stft(x, 16, return_complex=True), x=x), backend=backend).run({"x": x})
    want = torch.stft(torch.from_numpy(x), 16, return_complex=True).numpy()
    assert got["output"].dtype == np.complex128
    np.testing.assert_allclose(got["output"], want, rtol=1e-12, atol=1e-12)


def test_torch_refuses_the_same_arguments():
    """The limits above are torch's (so the refusals are not graphc's own inventions)."""
    x = torch.from_numpy(SIGNAL.astype(np.float32))
    spec = torch.zeros(3, 4, 8, dtype=torch.complex64)
    for call in (lambda: torch.stft(x, 200, center=False, return_complex=True),
                 lambda: torch.stft(x, 130, return_complex=True),
                 lambda: torch.stft(x, 16, win_length=20, return_complex=True),
                 lambda: torch.stft(x, 16, window=torch.hann_window(5), return_complex=True),
                 lambda: torch.stft(x, 16, hop_length=0, return_complex=True),
                 lambda: torch.stft(x, 16),
                 lambda: torch.istft(spec, 6, hop_length=5, win_length=4),
                 lambda: torch.istft(spec, 6, center=False, window=torch.hann_window(6))):
        with pytest.raises(RuntimeError):
            call()
