"""`gc.nn`: modules and layers with PyTorch's names, layouts and default initialisation."""

from graphc.dsl import methods, methods_torch  # noqa: F401  (gc.Tensor's operators: torch code in __init__ uses them)
from graphc.nn import functional, init, utils
from graphc.nn.activation import (CELU, ELU, GLU, SELU, Hardshrink, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU,
                                  LogSigmoid, LogSoftmax, Mish, PReLU, ReLU6, RReLU, SiLU, Softmax2d, Softmin,
                                  Softplus, Softshrink, Softsign, Tanhshrink, Threshold)
from graphc.nn.adaptive import AdaptiveLogSoftmaxWithLoss
from graphc.nn.attention import MultiheadAttention
from graphc.nn.layers import (
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    BatchNorm3d,
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
    Unflatten,
)
from graphc.nn.containers import Identity, ModuleDict, ModuleList, ParameterList, Sequential
from graphc.nn.containers import ParameterDict
from graphc.nn.fake_quantize import (FakeQuantize, MinMaxObserver, MovingAverageMinMaxObserver,
                                     PerChannelMinMaxObserver)
from graphc.nn.distance import Bilinear, CosineSimilarity, PairwiseDistance
from graphc.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from graphc.nn.dropout import AlphaDropout, Dropout1d, Dropout2d, Dropout3d, FeatureAlphaDropout
from graphc.nn.fold import Fold, Unfold
from graphc.nn.lazy import (LazyBatchNorm1d, LazyBatchNorm2d, LazyBatchNorm3d, LazyConv1d, LazyConv2d, LazyConv3d,
                             LazyConvTranspose1d, LazyConvTranspose2d, LazyConvTranspose3d, LazyInstanceNorm1d,
                             LazyInstanceNorm2d, LazyInstanceNorm3d, LazyLinear)
from graphc.nn.loss import (BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss, CrossEntropyLoss, GaussianNLLLoss,
                            HingeEmbeddingLoss, HuberLoss, KLDivLoss, L1Loss, MarginRankingLoss, MSELoss,
                            MultiLabelMarginLoss, MultiLabelSoftMarginLoss, MultiMarginLoss, NLLLoss, PoissonNLLLoss,
                            SmoothL1Loss, SoftMarginLoss, TripletMarginLoss, TripletMarginWithDistanceLoss)
from graphc.nn.loss import CTCLoss, LinearCrossEntropyLoss
from graphc.dsl.losses_linear import LinearCrossEntropyOptions
from graphc.nn.buffer import Buffer, DataParallel
from graphc.nn.module import Module, Parameter
from graphc.nn.norm import GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, RMSNorm
from graphc.nn.padding import (CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d,
                               ReflectionPad1d, ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d,
                               ReplicationPad3d, ZeroPad1d, ZeroPad2d, ZeroPad3d)
from graphc.nn.pooling import (AdaptiveAvgPool1d, AdaptiveAvgPool3d, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
                               AdaptiveMaxPool3d, AvgPool1d, AvgPool3d, LocalResponseNorm, LPPool1d, LPPool2d, LPPool3d,
                               MaxPool1d, MaxPool3d, MaxUnpool1d, MaxUnpool2d, MaxUnpool3d)
from graphc.nn.rnn import GRU, LSTM, RNN
from graphc.nn.rnn_cells import GRUCell, LSTMCell, RNNCell
from graphc.nn.transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                                   TransformerEncoderLayer)
from graphc.nn.sparse import EmbeddingBag
from graphc.nn.aliases import CrossMapLRN2d, NLLLoss2d, RNNBase, RNNCellBase, SyncBatchNorm
from graphc.nn.fractional import FractionalMaxPool2d, FractionalMaxPool3d
from graphc.nn.upsampling import (ChannelShuffle, PixelShuffle, PixelUnshuffle, Upsample, UpsamplingBilinear2d,
                                  UpsamplingNearest2d)

__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm1d", "BatchNorm2d", "Conv2d", "Dropout", "Embedding",
    "Flatten", "GELU", "Identity", "LayerNorm", "Linear", "MaxPool2d", "Module", "ModuleDict", "ModuleList",
    "MultiheadAttention", "Parameter", "ParameterList", "Buffer", "DataParallel",
    "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh", "init", "utils",
    # quantization-aware training
    "FakeQuantize", "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    # issue 12's layers
    "AdaptiveAvgPool1d", "AvgPool1d", "Conv1d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ELU", "GRU",
    "GroupNorm", "Hardsigmoid", "Hardswish", "InstanceNorm2d", "LSTM", "LeakyReLU", "MaxPool1d", "Mish", "PReLU",
    "PixelShuffle", "RMSNorm", "RNN", "SiLU", "Softplus", "TransformerDecoder", "TransformerDecoderLayer",
    "TransformerEncoder", "TransformerEncoderLayer",
    "Upsample", "functional",
    # padding
    "CircularPad1d", "CircularPad2d", "CircularPad3d", "ConstantPad1d", "ConstantPad2d", "ConstantPad3d",
    "ReflectionPad1d", "ReflectionPad2d", "ReflectionPad3d", "ReplicationPad1d", "ReplicationPad2d", "ReplicationPad3d",
    "ZeroPad1d", "ZeroPad2d", "ZeroPad3d",
    "Fold", "Unfold",
    # the rest of torch's common activations
    "CELU", "GLU", "Hardshrink", "Hardtanh", "LogSigmoid", "LogSoftmax", "ReLU6", "SELU", "Softmin", "Softshrink",
    "Softsign", "Tanhshrink", "Threshold",
    # the other dims' norms
    "BatchNorm3d", "InstanceNorm1d", "InstanceNorm3d",
    # losses
    "BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss", "NLLLoss",
    "SmoothL1Loss",
    # the other losses
    "CosineEmbeddingLoss", "GaussianNLLLoss", "HingeEmbeddingLoss", "MarginRankingLoss", "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss", "MultiMarginLoss", "PoissonNLLLoss", "SoftMarginLoss", "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
    # recurrent cells
    "GRUCell", "LSTMCell", "RNNCell",
    "Transformer",
    # bilinear maps and distances
    "Bilinear", "CosineSimilarity", "PairwiseDistance",
    "EmbeddingBag",
    "RReLU",
    # lazy modules
    "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyConv1d", "LazyConv2d", "LazyConv3d",
    "LazyConvTranspose1d", "LazyConvTranspose2d", "LazyConvTranspose3d", "LazyInstanceNorm1d", "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LazyLinear",
    # pooling, conv and shape layers
    "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d", "AvgPool3d", "ConvTranspose3d",
    "LocalResponseNorm", "LPPool1d", "LPPool2d", "LPPool3d", "MaxPool3d", "MaxUnpool1d", "MaxUnpool2d", "MaxUnpool3d",
    "ChannelShuffle", "PixelUnshuffle", "Softmax2d", "Unflatten", "UpsamplingBilinear2d", "UpsamplingNearest2d",
    "AlphaDropout", "Dropout1d", "Dropout2d", "Dropout3d", "FeatureAlphaDropout",
    "CTCLoss",
    "ParameterDict",
    "AdaptiveLogSoftmaxWithLoss",
    # the torch coverage sweep
    "CrossMapLRN2d", "FractionalMaxPool2d", "FractionalMaxPool3d", "NLLLoss2d", "RNNBase", "RNNCellBase",
    "SyncBatchNorm",
    "LinearCrossEntropyLoss", "LinearCrossEntropyOptions",
]
