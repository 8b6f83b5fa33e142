"""A keyword-spotting style classifier on raw waveforms: a log-mel spectrogram frontend
(``gc.stft`` with a Hann window, the power spectrum, a triangular mel filterbank held as a numpy
constant, log) and a small Conv1d stack with weight normalization, average pooling over time and
a linear head.

    graphc capture models/audio_cnn.py:AudioCNN --input wave:float32[N,L] -o audio_cnn.onnx
"""

from __future__ import annotations

import numpy as np

import graphc as gc
import graphc.nn.functional as F
from graphc import nn
from graphc.nn.utils.parametrizations import weight_norm


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int) -> np.ndarray:
    """``[n_mels, n_freqs]`` triangular filters evenly spaced on the HTK mel scale from 0 Hz to
    Nyquist, each peaking at 1 (torchaudio's ``melscale_fbanks(..., norm=None)``, transposed)."""
    def mel(hz):
        return 2595.0 * np.log10(1.0 + hz / 700.0)

    freqs = np.linspace(0, sample_rate / 2, n_freqs)
    points = 700.0 * (10 ** (np.linspace(0, mel(sample_rate / 2), n_mels + 2) / 2595.0) - 1.0)
    lower, centre, upper = points[:-2, None], points[1:-1, None], points[2:, None]
    return np.maximum(0.0, np.minimum((freqs - lower) / (centre - lower), (upper - freqs) / (upper - centre)))


class AudioCNN(nn.Module):
    def __init__(self, classes: int = 3, sample_rate: int = 8000, n_fft: int = 64, hop: int = 16, n_mels: int = 16,
                 channels: int = 8, dtype: str = "float32"):
        super().__init__()
        self.n_fft, self.hop, self.dtype = n_fft, hop, dtype
        self.mel = mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate).astype(dtype)
        self.conv1 = weight_norm(nn.Conv1d(n_mels, channels, 3, padding=1, dtype=dtype))
        self.conv2 = weight_norm(nn.Conv1d(channels, channels, 3, padding=1, dtype=dtype))
        self.head = nn.Linear(channels, classes, dtype=dtype)

    def features(self, wave):
        """``[N, n_mels, frames]`` log-mel energies of ``wave`` ``[N, L]``."""
        window = gc.hann_window(self.n_fft, dtype=self.dtype)
        spec = gc.stft(wave, self.n_fft, self.hop, window=window, return_complex=False)  # [N, freq, frames, 2]
        power = (spec * spec).sum(-1)
        return gc.log(gc.matmul(self.mel, power) + 1e-6)

    def forward(self, wave):
        h = F.relu(self.conv1(self.features(wave)))
        h = F.avg_pool1d(h, 2)
        h = F.relu(self.conv2(h))
        return self.head(h.mean(-1))


def example_inputs(batch: int | str = "N", length: int | str = "L") -> dict[str, gc.TensorSpec]:
    return {"wave": gc.spec("float32", (batch, length), name="wave")}
