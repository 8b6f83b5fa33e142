"""A DCGAN-style discriminator with spectral normalization (Miyato et al.) on every layer: two
strided Conv2d and a Linear, LeakyReLU(0.2) between, one real/fake logit per image. Spectral norm
is taken with its ``u``/``v`` vectors as loaded (torch's eval mode; graphc refuses its training
mode, whose power iteration updates them in place each forward), so capture it after ``.eval()``;
its discriminator step trains ``weight_orig`` through ``sigma = u . (W v)``.

    graphc capture models/sn_discriminator.py:SNDiscriminator --input x:float32[N,1,16,16] -o d.onnx
"""

from __future__ import annotations

import graphc as gc
import graphc.nn.functional as F
from graphc import nn
from graphc.nn.utils import spectral_norm


class SNDiscriminator(nn.Module):
    def __init__(self, channels: int = 1, width: int = 8, size: int = 16, dtype: str = "float32"):
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(channels, width, 4, stride=2, padding=1, dtype=dtype))
        self.conv2 = spectral_norm(nn.Conv2d(width, 2 * width, 4, stride=2, padding=1, dtype=dtype))
        self.fc = spectral_norm(nn.Linear(2 * width * (size // 4) ** 2, 1, dtype=dtype))
        self.eval()

    def forward(self, x):
        h = F.leaky_relu(self.conv1(x), 0.2)
        h = F.leaky_relu(self.conv2(h), 0.2)
        return self.fc(h.flatten(1))


def example_inputs(batch: int | str = "N", size: int = 16) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, 1, size, size), name="x")}
