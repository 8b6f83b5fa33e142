"""Signal kernels: DFT, STFT, Hann/Hamming/Blackman windows, MelWeightMatrix.

Complex tensors are ONNX-style: a trailing axis of 2 (real, imaginary); a trailing axis of 1 is
a real signal.
"""

from __future__ import annotations

import numpy as np
from onnx.helper import tensor_dtype_to_np_dtype

from graphc.backends.numpy.kernels import kernel, scalar


def _complex(x):
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0].astype(np.complex128)


def _pack(z, dtype):
    return np.stack([z.real, z.imag], axis=-1).astype(dtype)


def _dft(x, n, axis, inverse, onesided):
    """``axis`` counts over the full input rank (the trailing real/imag axis included)."""
    z = _complex(x)
    axis = axis % x.ndim
    if inverse and onesided:  # a half spectrum back to a real signal
        n = int(scalar(n, 2 * (z.shape[axis] - 1)))
        return (np.fft.irfft(z, n, axis=axis)[..., None].astype(x.dtype),)
    n = int(scalar(n, z.shape[axis]))
    out = np.fft.ifft(z, n, axis=axis) if inverse else np.fft.fft(z, n, axis=axis)
    if onesided:
        out = np.take(out, range(n // 2 + 1), axis=axis)
    return (_pack(out, x.dtype),)


@kernel("DFT", since=17)
def dft_v17(x, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(x, dft_length, axis, inverse, onesided)


@kernel("DFT", since=20)
def dft(x, dft_length=None, axis=None, *, inverse=0, onesided=0):
    axis = int(scalar(axis, -2))
    return _dft(x, dft_length, axis, inverse, onesided)


@kernel("STFT", since=17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    step = int(scalar(frame_step))
    length = int(scalar(frame_length, window.shape[0] if window is not None else 0))
    z = _complex(signal)  # (batch, samples)
    n_frames = 1 + (z.shape[1] - length) // step
    idx = np.arange(n_frames)[:, None] * step + np.arange(length)[None, :]
    frames = z[:, idx]  # (batch, frames, length)
    if window is not None:
        frames = frames * window
    out = np.fft.fft(frames, length, axis=-1)
    if onesided:
        out = out[..., : length // 2 + 1]
    return (_pack(out, signal.dtype),)


def _window(size, periodic, dtype, coefficients):
    size = int(scalar(size))
    denom = size if periodic else size - 1
    n = np.arange(size)
    w = sum(c * np.cos(2 * np.pi * k * n / denom) for k, c in enumerate(coefficients))
    return (w.astype(tensor_dtype_to_np_dtype(dtype)),)


@kernel("HannWindow", since=17)
def hann_window(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, [0.5, -0.5])


@kernel("HammingWindow", since=17)
def hamming_window(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, [25 / 46, -21 / 46])


@kernel("BlackmanWindow", since=17)
def blackman_window(size, *, output_datatype=1, periodic=1):
    return _window(size, periodic, output_datatype, [0.42, -0.5, 0.08])


@kernel("MelWeightMatrix", since=17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                      output_datatype=1):
    """Triangular filters between mel-spaced points (the formula of onnx's reference)."""
    n_mel, n_dft, rate = (int(scalar(v)) for v in (num_mel_bins, dft_length, sample_rate))
    lo, hi = (float(scalar(v)) for v in (lower_edge_hertz, upper_edge_hertz))
    to_mel = lambda f: 2595 * np.log1p(f / 700) / np.log(10)  # noqa: E731
    points = np.arange(n_mel + 2) * (to_mel(hi) - to_mel(lo)) / (n_mel + 2) + to_mel(lo)
    hertz = 700 * np.expm1(points / 2595 * np.log(10))
    bins = (((n_dft + 1) * hertz) // rate).astype(int)
    j = np.arange(n_dft // 2 + 1)[:, None]
    left, centre, right = bins[:-2][None, :], bins[1:-1][None, :], bins[2:][None, :]
    rising = np.where(centre > left, (j - left) / np.maximum(centre - left, 1), (j == centre) * 1.0)
    falling = (right - j) / np.maximum(right - centre, 1)
    out = np.where((j >= left) & (j <= centre), rising, 0.0)
    out = np.where((j >= centre) & (j < right) & (right > centre), falling, out)
    return (out.astype(tensor_dtype_to_np_dtype(output_datatype)),)
