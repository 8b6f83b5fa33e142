"""`gc.nn`: modules and layers with PyTorch's names, layouts and default initialisation."""

from graphc.nn import init
from graphc.nn.attention import MultiheadAttention
from graphc.nn.layers import (
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    LayerNorm,
    Linear,
    MaxPool2d,
    ReLU,
    Sigmoid,
    Softmax,
    Tanh,
)
from graphc.nn.containers import Identity, ModuleDict, ModuleList, ParameterList, Sequential
from graphc.nn.module import Module, Parameter

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv2d", "Dropout", "Embedding",
    "Flatten", "GELU", "Identity", "LayerNorm", "Linear", "MaxPool2d", "Module", "ModuleDict", "ModuleList",
    "MultiheadAttention", "Parameter", "ParameterList",
    "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh", "init",
]
