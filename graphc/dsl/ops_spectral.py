"""torch's window functions, ``torch.stft`` and ``torch.istft`` in standard ONNX ops. ``stft``'s spectrum is a
complex Tensor (``return_complex=True``) or its real layout ``[..., freq, frames, 2]`` (``view_as_real``);
``istft`` takes the real layout.
In float32 ``stft`` is one strided Conv by the windowed cos/sin basis and ``istft`` one
ConvTranspose by the windowed inverse basis (the overlap-add for free) divided by the window's
squared envelope; in float64 the frames are gathered and the overlaps added by ScatterElements
around a MatMul. Existing kernels and gradient rules apply to all of them."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl.autocast import autocast_op
from graphc.dsl.builder import known_value, op_error, user_source
from graphc.dsl.devices import factory
from graphc.dsl.ops import concat, const_i64, constant, emit, lift, matmul, reshape, squeeze, transpose, unsqueeze
from graphc.dsl.ops_array import arange, dim_length, dim_positions, full_like, ir_tensor, pad
from graphc.dsl.ops_layers import conv1d, conv_transpose1d
from graphc.dsl.ops_views import index_add
from graphc.dsl.complex_ops import pair
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES, as_dtype

# Lowerings, measured on onnxruntime 1.31 CPU (1 thread, medians of 7 on a shared machine),
# float32, [4, 160000] samples, n_fft 400, hop 160, Hann (Whisper's frontend). stft forward: ONNX
# STFT (opset 17, then a Transpose to torch's layout; it has no gradient rule) 122 ms, frames by
# one Gather of [frames, n_fft] indices then one MatMul by the [n_fft, 2 freq] basis 11.1, one
# strided Conv by the [2 freq, 1, n_fft] basis 6.6; forward + gc.grad backward, Gather + MatMul
# 36.8, Conv 23.3. istft of that spectrum, forward and forward + backward: one ConvTranspose
# 22.1 and 45.9, MatMul then ScatterElements (add) 38.2 and 54.9. onnxruntime has no float64
# Conv or ConvTranspose, so float64 takes the Gather / ScatterElements forms.


# the dtypes that take the Conv / ConvTranspose lowering (onnxruntime has no float64 kernels)
_CONV_DTYPES = ("float32",)


# -- windows --------------------------------------------------------------------------------


def _window(fn: str, window_length: int, periodic: bool, dtype: Any, symmetric) -> Tensor:
    """``symmetric(m)`` (float64, ``m`` points) as torch builds its windows: one point more and the
    last dropped when ``periodic``; a window of one point is ``[1]``."""
    if not isinstance(window_length, (int, np.integer)) or window_length < 0:
        raise CaptureError(f"{fn} window_length: expected a non-negative int, got {window_length!r} "
                           f"(at {user_source()})")
    dt = as_dtype("float32" if dtype is None else dtype)
    if dt not in FLOAT_DTYPES:
        raise CaptureError(f"{fn} dtype: expected a floating-point dtype, got {dt} (at {user_source()})")
    n = int(window_length)
    values = np.ones(n) if n <= 1 else symmetric(n + 1)[:n] if periodic else symmetric(n)
    return constant(np.asarray(values, dt.numpy))


def _cosines(*coefficients: float):
    """``sum_k c_k cos(2 pi k i / (m - 1))`` over ``m`` points: the Hann, Hamming and Blackman family."""
    def symmetric(m: int) -> np.ndarray:
        phase = 2 * np.pi * np.arange(m) / (m - 1)
        return sum(c * np.cos(k * phase) for k, c in enumerate(coefficients))
    return symmetric


@factory
def hann_window(window_length: int, periodic: bool = True, *, dtype: Any = None) -> Tensor:
    """``torch.hann_window``: ``0.5 - 0.5 cos(2 pi n / N)``, a constant (float32 unless ``dtype``)."""
    return _window("hann_window", window_length, periodic, dtype, _cosines(0.5, -0.5))


@factory
def hamming_window(window_length: int, periodic: bool = True, alpha: float = 0.54, beta: float = 0.46, *,
                   dtype: Any = None) -> Tensor:
    """``torch.hamming_window``: ``alpha - beta cos(2 pi n / N)``, a constant."""
    return _window("hamming_window", window_length, periodic, dtype, _cosines(alpha, -beta))


@factory
def blackman_window(window_length: int, periodic: bool = True, *, dtype: Any = None) -> Tensor:
    """``torch.blackman_window``: ``0.42 - 0.5 cos(2 pi n / N) + 0.08 cos(4 pi n / N)``, a constant."""
    return _window("blackman_window", window_length, periodic, dtype, _cosines(0.42, -0.5, 0.08))


@factory
def bartlett_window(window_length: int, periodic: bool = True, *, dtype: Any = None) -> Tensor:
    """``torch.bartlett_window``: the triangle ``1 - |2 n / N - 1|``, a constant."""
    return _window("bartlett_window", window_length, periodic, dtype,
                   lambda m: 1 - np.abs(2 * np.arange(m) / (m - 1) - 1))


@factory
def kaiser_window(window_length: int, periodic: bool = True, beta: float = 12.0, *, dtype: Any = None) -> Tensor:
    """``torch.kaiser_window``: ``I0(beta sqrt(1 - (2 n / N - 1)^2)) / I0(beta)``, a constant."""
    return _window("kaiser_window", window_length, periodic, dtype, lambda m: np.kaiser(m, beta))


# -- arguments ------------------------------------------------------------------------------


def _lengths(fn: str, operand: Tensor, n_fft: Any, hop_length: Any, win_length: Any) -> tuple[int, int, int]:
    """``(n_fft, hop_length, win_length)`` with torch's defaults (``n_fft // 4``, ``n_fft``) and limits."""
    if not isinstance(n_fft, (int, np.integer)) or n_fft < 1:
        raise op_error(fn, [operand], f"n_fft: expected a positive int, got {n_fft!r}", user_source())
    hop = n_fft // 4 if hop_length is None else hop_length
    win = n_fft if win_length is None else win_length
    if not isinstance(win, (int, np.integer)) or not 0 < win <= n_fft:
        raise op_error(fn, [operand], f"win_length: expected 0 < win_length <= n_fft={n_fft}, got {win!r}",
                       user_source())
    most = win if fn == "istft" else None  # torch's istft also wants frames that overlap or touch
    if not isinstance(hop, (int, np.integer)) or hop < 1 or (most is not None and hop > most):
        limit = f"0 < hop_length <= win_length={most}" if most is not None else "hop_length > 0"
        raise op_error(fn, [operand], f"hop_length: expected {limit}, got {hop!r}", user_source())
    return int(n_fft), int(hop), int(win)


def _window_array(fn: str, operand: Tensor, window: Any, n_fft: int, win: int) -> Tensor | np.ndarray:
    """The window padded to ``n_fft`` (centred, as torch): a numpy array when known at capture (a
    constant, or None: all ones), else a Tensor of the operand's dtype."""
    if window is None:
        window = np.ones(win, operand.dtype.numpy)
    if not isinstance(window, Tensor):
        window = np.asarray(window)
    if window.ndim != 1 or window.shape[0] != win:
        raise op_error(fn, [operand, window] if isinstance(window, Tensor) else [operand],
                       f"window: expected a 1-D window of size win_length={win}, got shape {tuple(window.shape)}",
                       user_source())
    if isinstance(window, Tensor) and window.dtype != operand.dtype:
        raise op_error(fn, [operand, window], f"window: expected the input's dtype {operand.dtype}, got "
                       f"{window.dtype}", user_source())
    known = window if isinstance(window, np.ndarray) else known_value(window)
    left = (n_fft - win) // 2
    if known is not None:
        return np.pad(np.asarray(known, np.float64), (left, n_fft - win - left))
    return pad(window, (left, n_fft - win - left))


def _basis(window: Tensor | np.ndarray, n_fft: int, scale: np.ndarray, dtype: np.dtype) -> Tensor:
    """``[2 * freqs, 1, n_fft]``: row ``2 k`` is ``scale_k cos(2 pi k n / n_fft)``, row ``2 k + 1``
    ``-scale_k sin(...)`` (bin k's real and imaginary parts, the DFT's and the inverse's alike),
    times the window (folded in when it is known)."""
    angle = 2 * np.pi * np.outer(np.arange(len(scale)), np.arange(n_fft)) / n_fft
    rows = np.stack([np.cos(angle), -np.sin(angle)], 1) * scale[:, None, None]
    freqs = len(scale)
    if isinstance(window, np.ndarray):
        return constant((rows * window).reshape(2 * freqs, 1, n_fft).astype(dtype))
    return constant(rows.reshape(2 * freqs, 1, n_fft).astype(dtype)) * reshape(window, [1, 1, n_fft])


def _float_input(fn: str, x: Any, ranks: tuple[int, ...], layout: str) -> Tensor:
    x = lift(x)
    if x.dtype not in ("float32", "float64") or x.ndim not in ranks:
        raise op_error(fn, [x], f"input: expected a float32 or float64 {layout} Tensor, got {x.type_str()}",
                       user_source())
    return x


# -- stft -----------------------------------------------------------------------------------


def _centred(x: Tensor, half: int, mode: str) -> Tensor:
    """``x`` ``[B, L]`` padded by ``half`` at both ends in one of torch's ``F.pad`` modes."""
    length = x.shape[1]
    longest = {"reflect": length - 1, "circular": length}.get(mode) if isinstance(length, int) else None
    if longest is not None and half > longest:
        raise op_error("stft", [x], f"center pads {half} (n_fft // 2) with pad_mode={mode!r}, which needs a signal "
                       f"longer than that, got {length} samples", user_source())
    return pad(x, (half, half), mode=mode)


_PAD_MODES = ("reflect", "constant", "replicate", "circular")


@autocast_op()
def stft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,  # noqa: A002
         window: Any = None, center: bool = True, pad_mode: str = "reflect", normalized: bool = False,
         onesided: bool | None = None, return_complex: bool | None = None) -> Tensor:
    """``torch.stft`` of a real ``(L)`` or ``(B, L)`` signal: with ``return_complex=True`` a complex Tensor
    ``[..., freq, frames]``, with ``False`` its ``view_as_real`` layout ``[..., freq, frames, 2]``. ``L`` and ``B`` may be symbolic.
    Signature: ai.onnx@11::Conv (stride hop_length, the windowed DFT basis as kernel)"""
    if return_complex is None:
        raise CaptureError(f"stft requires the return_complex parameter be given for real inputs, as torch: pass "
                           f"return_complex=False for the real layout [..., freq, frames, 2] (at {user_source()})")
    x = _float_input("stft", input, (1, 2), "1-D (L) or 2-D (B, L)")
    n_fft, hop, win = _lengths("stft", x, n_fft, hop_length, win_length)
    if center and pad_mode not in _PAD_MODES:
        raise op_error("stft", [x], f"pad_mode: expected one of {list(_PAD_MODES)}, got {pad_mode!r}", user_source())
    window = _window_array("stft", x, window, n_fft, win)
    signal = x if x.ndim == 2 else unsqueeze(x, [0])
    if center and n_fft // 2:
        signal = _centred(signal, n_fft // 2, pad_mode)
    if isinstance(signal.shape[1], int) and signal.shape[1] < n_fft:
        raise op_error("stft", [x], f"n_fft: expected at most the {'padded ' if center else ''}signal length "
                       f"{signal.shape[1]}, got {n_fft}", user_source())
    freqs = n_fft // 2 + 1 if onesided is None or onesided else n_fft
    scale = np.full(freqs, n_fft ** -0.5 if normalized else 1.0)
    basis = _basis(window, n_fft, scale, x.dtype.numpy)  # [2 freqs, 1, n_fft]
    if x.dtype in _CONV_DTYPES:
        spectrum = conv1d(unsqueeze(signal, [1]), basis, stride=hop)  # [B, 2 freqs, frames]
    else:  # frames gathered, times the basis: [B, frames, 2 freqs]
        starts = arange(0, _count(signal, 1, 1 - n_fft), hop)
        frames = emit("Gather", [signal, unsqueeze(starts, [1]) + constant(np.arange(n_fft))], {"axis": 1})
        spectrum = transpose(matmul(frames, transpose(reshape(basis, [2 * freqs, n_fft]))), [0, 2, 1])
    out = transpose(reshape(spectrum, [signal.shape[0], freqs, 2, -1]), [0, 1, 3, 2])
    out = out if x.ndim == 2 else squeeze(out, [0])
    return ComplexTensor(pair=out) if return_complex else out


def _count(x: Tensor, dim: int, plus: int) -> Any:
    """``x``'s size along ``dim`` plus ``plus``: an int when static, else an int64 ``[1]`` Tensor."""
    size = x.shape[dim]
    return size + plus if isinstance(size, int) else dim_length(x, dim) + plus


# -- istft ----------------------------------------------------------------------------------


def _envelope_check(window: Tensor | np.ndarray, frames: Any, n_fft: int, hop: int, cut: slice,
                    operand: Tensor) -> None:
    """torch's refusal of a window whose squared overlap-add is (near) 0 in the kept samples, where
    the window and the frame count are known at capture."""
    if not isinstance(window, np.ndarray) or not isinstance(frames, int):
        return
    envelope = np.zeros(n_fft + hop * (frames - 1))
    for f in range(frames):
        envelope[f * hop:f * hop + n_fft] += window ** 2
    if envelope[cut].size and np.abs(envelope[cut]).min() < 1e-11:
        raise op_error("istft", [operand], "window overlap add min: the squared windows sum to 0 at some output "
                       "sample (torch refuses this too; use center=True or a window without zeros at its ends)",
                       user_source())


def _fit(y: Tensor, length: int) -> Tensor:
    """``y`` ``[B, n]`` cut or zero-padded at the end to ``length`` samples (as torch's ``length``)."""
    n = y.shape[1]
    if isinstance(n, int):
        return y[:, :length] if n >= length else pad(y, (0, length - n))
    return pad(y, (0, length))[:, :length]


def istft(input: Tensor, n_fft: int, hop_length: int | None = None, win_length: int | None = None,  # noqa: A002
          window: Any = None, center: bool = True, normalized: bool = False, onesided: bool | None = None,
          length: int | None = None, return_complex: bool = False) -> Tensor:
    """``torch.istft`` of a complex spectrum ``[..., freq, frames]`` or its real layout ``[..., freq, frames,
    2]`` (``view_as_real``; rank 3 or 4, batch and frames may be symbolic) to a real ``(L)`` or ``(B, L)``
    signal. Signature: ai.onnx@11::ConvTranspose (stride hop_length, the windowed inverse DFT basis)"""
    if return_complex:
        raise CaptureError(f"istft return_complex=True: graphc's istft gives real signals only; pass "
                           f"return_complex=False (at {user_source()})")
    x = _float_input("istft", pair(input) if isinstance(input, ComplexTensor) else input, (3, 4),
                     "[freq, frames, 2] or [B, freq, frames, 2]")
    n_fft, hop, win = _lengths("istft", x, n_fft, hop_length, win_length)
    spectrum = x if x.ndim == 4 else unsqueeze(x, [0])
    freqs, frames = spectrum.shape[1], spectrum.shape[2]
    onesided = freqs != n_fft if onesided is None else onesided
    want = n_fft // 2 + 1 if onesided else n_fft
    if spectrum.shape[3] != 2 or freqs != want:
        raise op_error("istft", [x], f"input: expected [..., {want}, frames, 2] (freq = n_fft{' // 2 + 1' * onesided}"
                       f" with onesided={onesided}, then real and imaginary parts), got {x.type_str()}", user_source())
    if length is not None and (not isinstance(length, (int, np.integer)) or length < 0):
        raise op_error("istft", [x], f"length: expected a non-negative int or None, got {length!r}", user_source())
    window = _window_array("istft", x, window, n_fft, win)
    half = n_fft // 2 + 1  # a real signal: irfft of the first half, as torch's with return_complex=False
    spectrum = spectrum[:, :half]
    start = n_fft // 2 if center else 0
    stop = -(n_fft // 2) if center and length is None and n_fft // 2 else None
    cut = slice(start, stop if length is None else start + length)  # torch's trim: center and length
    _envelope_check(window, frames, n_fft, hop, cut, x)
    # irfft: bins 0 and n_fft / 2 (even n_fft) once, the others twice (their mirror images)
    scale = np.where((np.arange(half) == 0) | (2 * np.arange(half) == n_fft), 1.0, 2.0)
    scale = scale / (np.sqrt(n_fft) if normalized else n_fft)
    dtype = x.dtype.numpy
    basis = _basis(window, n_fft, scale, dtype)
    columns = reshape(transpose(spectrum, [0, 1, 3, 2]), [spectrum.shape[0], 2 * half, -1])
    squared = window ** 2 if isinstance(window, np.ndarray) else window * window
    squared = constant(squared.astype(dtype)) if isinstance(squared, np.ndarray) else squared
    ones = full_like(columns[:1, :1], 1.0)  # [1, 1, frames]
    signal = _overlap_add(columns, basis, hop)
    envelope = _overlap_add(ones, reshape(squared, [1, 1, n_fft]), hop)
    y = signal[:, cut] / envelope[:, cut]
    y = _fit(y, length) if length is not None else y
    return y if x.ndim == 4 else squeeze(y, [0])


def _overlap_add(columns: Tensor, kernel: Tensor, hop: int) -> Tensor:
    """``[B, rows, frames]`` columns times the ``[rows, 1, n_fft]`` kernel, each frame's ``n_fft``
    samples added in at ``frame * hop``: ``[B, n_fft + hop * (frames - 1)]``."""
    if columns.dtype in _CONV_DTYPES:
        return squeeze(conv_transpose1d(columns, kernel, stride=hop), [1])
    n_fft = kernel.shape[2]
    frames = matmul(transpose(columns, [0, 2, 1]), reshape(kernel, [kernel.shape[0], n_fft]))  # [B, frames, n_fft]
    positions = unsqueeze(dim_positions(columns, 2) * hop, [1]) + constant(np.arange(n_fft))
    total = concat([dim_length(columns, 0), const_i64([n_fft - hop]) + _count(columns, 2, 0) * hop], 0)
    zeros = emit("ConstantOfShape", [total], {"value": ir_tensor(np.zeros(1, columns.dtype.numpy))})
    flat = emit("Reshape", [frames, const_i64([0, -1])])  # [B, frames * n_fft]
    return index_add(zeros, 1, reshape(positions, [-1]), flat)


__all__ = ["bartlett_window", "blackman_window", "hamming_window", "hann_window", "istft", "kaiser_window", "stft"]
