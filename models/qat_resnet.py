"""A small ResNet for quantization-aware training (3xHxW): every conv's weight fake-quantized per output
channel (qint8, symmetric), the input and every activation per tensor (quint8, moving-average observer), the
residual add's inputs and output too, so the inference export is a QDQ model onnxruntime runs with int8
kernels (QLinearConv, QLinearAdd, QLinearGlobalAveragePool, QGemm). No BatchNorm: QAT recipes fold it into the
conv first. ``QLinear`` is the Linear layer of the same recipe."""

from __future__ import annotations

import graphc as gc
from graphc import nn


def weight_quant(channels: int | None) -> nn.FakeQuantize:
    """qint8 symmetric, per output channel (axis 0), or per tensor when ``channels`` is None."""
    if channels is None:
        return nn.FakeQuantize(nn.MinMaxObserver, -128, 127, dtype="qint8", qscheme="per_tensor_symmetric")
    return nn.FakeQuantize(nn.PerChannelMinMaxObserver, -128, 127, dtype="qint8", qscheme="per_channel_symmetric",
                           num_channels=channels)


def act_quant() -> nn.FakeQuantize:
    return nn.FakeQuantize(nn.MovingAverageMinMaxObserver, 0, 255, dtype="quint8")


class QConv(nn.Module):
    """Conv2d (3x3, or 1x1 without padding) on a fake-quantized weight, ReLU if ``relu``, output fake-quantized."""

    def __init__(self, in_channels: int, channels: int, kernel: int = 3, stride: int = 1, relu: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, kernel, stride=stride, padding=kernel // 2)
        self.wq, self.aq, self.relu = weight_quant(channels), act_quant(), relu

    def forward(self, x):
        c = self.conv
        y = gc.nn.functional.conv2d(x, self.wq(c.weight), c.bias, stride=c.stride, padding=c.padding)
        return self.aq(gc.relu(y) if self.relu else y)


class QLinear(nn.Module):
    """Linear on a fake-quantized weight (per output feature, per tensor if not ``per_channel``), ReLU if
    ``relu``, output fake-quantized if ``out_quant`` (a classifier head's logits stay float)."""

    def __init__(self, in_features: int, out_features: int, relu: bool = False, per_channel: bool = True,
                 out_quant: bool = True):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.wq = weight_quant(out_features if per_channel else None)
        self.aq, self.relu = act_quant() if out_quant else None, relu

    def forward(self, x):
        y = gc.nn.functional.linear(x, self.wq(self.fc.weight), self.fc.bias)
        y = gc.relu(y) if self.relu else y
        return self.aq(y) if self.aq is not None else y


class QBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = QConv(in_channels, channels, stride=stride)
        self.conv2 = QConv(channels, channels, relu=False)
        self.down = QConv(in_channels, channels, 1, stride, relu=False) if stride != 1 or in_channels != channels \
            else None
        self.out_q = act_quant()

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        return self.out_q(gc.relu(self.conv2(self.conv1(x)) + identity))


class QATResNet(nn.Module):
    def __init__(self, in_channels: int = 3, classes: int = 10, widths: tuple[int, ...] = (16, 32, 64)):
        super().__init__()
        self.in_q = act_quant()
        self.stem = QConv(in_channels, widths[0])
        blocks, channels = [], widths[0]
        for i, width in enumerate(widths):
            blocks.append(QBlock(channels, width, 2 if i else 1))
            channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool, self.pool_q = nn.AdaptiveAvgPool2d(1), act_quant()
        self.fc = nn.Linear(channels, classes)
        self.fc_wq = weight_quant(classes)

    def forward(self, x):
        x = self.blocks(self.stem(self.in_q(x)))
        pooled = self.pool_q(gc.flatten(self.pool(x), 1))
        return gc.nn.functional.linear(pooled, self.fc_wq(self.fc.weight), self.fc.bias)


def example_inputs(batch: int | str = "N", size: int = 32) -> dict[str, gc.TensorSpec]:
    return {"x": gc.spec("float32", (batch, 3, size, size), name="x")}
