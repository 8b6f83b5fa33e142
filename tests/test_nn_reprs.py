"""gc.nn modules print as torch 2.13's (``repr``, ``extra_repr``, the child listing) for the same constructor
arguments: every gc.nn module with a torch.nn twin, a few argument sets each. The text is torch's, not
always its class: ``MultiheadAttention.out_proj`` is a ``Linear`` printed as torch's
``NonDynamicallyQuantizableLinear``; a ``ModuleList`` prints a run of equal entries as ``(0-1): 2 x ...``."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from graphc import nn

torch = pytest.importorskip("torch")
# torch's own notes on some constructors (nested tensors off, NLLLoss2d deprecated, zero-size lazy weights)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

CTORS = [
    # linear / bilinear / embeddings
    "Linear(3, 4)", "Linear(3, 4, bias=False)", "Bilinear(2, 3, 4)", "Bilinear(2, 3, 4, bias=False)", "Identity()",
    "Embedding(5, 3)",
    "Embedding(5, 3, padding_idx=0, max_norm=1.0, norm_type=3.0, scale_grad_by_freq=True, sparse=True)",
    "EmbeddingBag(5, 3)", "EmbeddingBag(5, 3, mode='sum', norm_type=3.0, padding_idx=1)",
    "EmbeddingBag(5, 3, max_norm=1.0, scale_grad_by_freq=True, mode='max')", "LazyLinear(4)",
    "LazyLinear(4, bias=False)",
    # norms
    "BatchNorm1d(3)", "BatchNorm2d(3, affine=False)", "BatchNorm3d(3, track_running_stats=False, momentum=None)",
    "SyncBatchNorm(3)", "LayerNorm(3)", "LayerNorm((2, 3), elementwise_affine=False)", "LayerNorm(3, bias=False)",
    "GroupNorm(1, 2)", "GroupNorm(2, 4, affine=False)", "InstanceNorm1d(3)", "InstanceNorm2d(3, affine=True)",
    "InstanceNorm3d(3, eps=1e-3, momentum=0.2, track_running_stats=True)", "RMSNorm(3)",
    "RMSNorm([2, 3], eps=1e-5, elementwise_affine=False)", "RMSNorm(3, eps=1e-6)", "LocalResponseNorm(2)",
    "LocalResponseNorm(3, alpha=0.001, beta=0.5, k=2.0)", "CrossMapLRN2d(3)", "LazyBatchNorm1d()",
    "LazyBatchNorm2d(affine=False)", "LazyBatchNorm3d(momentum=0.2)", "LazyInstanceNorm1d()",
    "LazyInstanceNorm2d(affine=True)", "LazyInstanceNorm3d(track_running_stats=True)",
    # convolutions
    "Conv1d(2, 3, 3)", "Conv2d(2, 4, 3, padding='same', groups=2, bias=False, dilation=2, padding_mode='reflect')",
    "Conv3d(2, 3, (1, 2, 3), stride=2, padding=1)", "ConvTranspose2d(2, 4, 3, stride=2, output_padding=1)",
    "ConvTranspose1d(2, 3, 3)", "ConvTranspose3d(2, 3, 2, groups=1, dilation=2, bias=False)", "LazyConv1d(3, 3)",
    "LazyConv2d(4, 3, stride=2, bias=False)", "LazyConv3d(3, 2, padding=1)", "LazyConvTranspose1d(3, 3)",
    "LazyConvTranspose2d(4, 3, stride=2, output_padding=1)", "LazyConvTranspose3d(3, 2)", "Fold((4, 5), 2)",
    "Fold(4, (2, 3), dilation=1, padding=1, stride=2)", "Unfold(2)", "Unfold((2, 3), padding=1, stride=2)",
    # recurrent
    "RNN(3, 4)", "RNN(3, 4, nonlinearity='relu', num_layers=2)", "GRU(3, 4, 2, batch_first=True)",
    "LSTM(3, 4, 2, bias=False, dropout=0.5, bidirectional=True)", "LSTM(3, 4, batch_first=True, dropout=0.2)",
    "LSTM(3, 4, 2, proj_size=2, bidirectional=True)",
    "RNNCell(3, 4)", "RNNCell(3, 4, nonlinearity='relu', bias=False)", "GRUCell(3, 4)", "LSTMCell(3, 4, bias=False)",
    # attention / transformers
    "MultiheadAttention(4, 2)", "MultiheadAttention(4, 2, dropout=0.1, bias=False, batch_first=True)",
    "MultiheadAttention(4, 2, 0.0, True, True, True, 3, 5)",
    "TransformerEncoderLayer(4, 2, dim_feedforward=8)",
    "TransformerEncoderLayer(4, 2, 8, dropout=0.0, activation='gelu', batch_first=True, norm_first=True, bias=False)",
    "TransformerDecoderLayer(4, 2, dim_feedforward=8)", "TransformerEncoderLayer(4, 2, 8, activation=nn.GELU())",
    "TransformerDecoderLayer(4, 2, 8, layer_norm_eps=1e-6, activation='gelu', norm_first=True)",
    "TransformerEncoder(nn.TransformerEncoderLayer(4, 2, 8), 2, enable_nested_tensor=False)",
    "TransformerEncoder(nn.TransformerEncoderLayer(4, 2, 8), 2, norm=nn.LayerNorm(4), enable_nested_tensor=False)",
    "TransformerDecoder(nn.TransformerDecoderLayer(4, 2, 8), 3)", "Transformer(4, 2, 1, 1, 8)",
    "Transformer(4, 2, 2, 1, 8, dropout=0.0, batch_first=True, norm_first=True)",
    # pools
    "MaxPool1d(2)", "MaxPool1d(3, stride=1, padding=1, dilation=2, return_indices=True, ceil_mode=True)",
    "MaxPool2d(2)", "MaxPool2d((2, 3), stride=(1, 2), padding=1, ceil_mode=True)", "MaxPool3d(2, 1)", "AvgPool1d(2)",
    "AvgPool1d(3, stride=1, padding=1, ceil_mode=True, count_include_pad=False)", "AvgPool2d(2)",
    "AvgPool2d((2, 3), stride=1, padding=1, divisor_override=2)", "AvgPool3d(2, count_include_pad=False)",
    "LPPool1d(2, 3)", "LPPool2d(1.5, 2, stride=1, ceil_mode=True)", "LPPool3d(2, (2, 2, 2))", "AdaptiveAvgPool1d(3)",
    "AdaptiveAvgPool2d((2, 3))", "AdaptiveAvgPool2d(4)", "AdaptiveAvgPool2d((None, 3))", "AdaptiveAvgPool3d(2)",
    "AdaptiveMaxPool1d(3)", "AdaptiveMaxPool2d((2, 3), return_indices=True)", "AdaptiveMaxPool3d(2)", "MaxUnpool1d(2)",
    "MaxUnpool2d(2, stride=1, padding=1)", "MaxUnpool3d((2, 2, 2))", "FractionalMaxPool2d(2, output_size=(3, 3))",
    "FractionalMaxPool2d(3, output_ratio=0.5, return_indices=True)", "FractionalMaxPool3d(2, output_size=3)",
    # padding
    "ZeroPad1d(2)", "ZeroPad2d((1, 2, 3, 4))", "ZeroPad3d(1)", "ConstantPad1d(2, 3.5)",
    "ConstantPad2d((1, 0, 2, 1), 0.0)", "ConstantPad3d(1, 2.0)", "ReflectionPad1d(2)", "ReflectionPad2d((1, 1, 2, 0))",
    "ReflectionPad3d(1)", "ReplicationPad1d((1, 2))", "ReplicationPad2d(1)", "ReplicationPad3d(2)", "CircularPad1d(1)",
    "CircularPad2d((1, 0, 1, 0))", "CircularPad3d(1)",
    # shape / upsampling
    "Flatten()", "Flatten(0, 2)", "Unflatten(1, (2, 3))", "Unflatten(-1, [2, 2])", "Upsample(scale_factor=2)",
    "Upsample(size=(4, 5), mode='bilinear', align_corners=True)", "Upsample(scale_factor=2.0, mode='nearest')",
    "Upsample(size=3, mode='linear')", "Upsample(scale_factor=(2, 3), mode='bicubic', align_corners=False)",
    "UpsamplingNearest2d(scale_factor=2)", "UpsamplingNearest2d(size=(3, 4))", "UpsamplingBilinear2d(scale_factor=2)",
    "PixelShuffle(2)", "PixelUnshuffle(3)", "ChannelShuffle(2)",
    # dropout
    "Dropout(0.2)", "Dropout(inplace=True)", "Dropout1d(0.3)", "Dropout2d()", "Dropout3d(0.1, inplace=True)",
    "AlphaDropout(0.2)", "FeatureAlphaDropout()",
    # activations
    "ReLU()", "ReLU(inplace=True)", "ReLU6()", "ReLU6(inplace=True)", "Sigmoid()", "Tanh()", "SiLU()",
    "SiLU(inplace=True)", "Mish()", "GELU()", "GELU(approximate='tanh')", "ELU()", "ELU(alpha=0.5, inplace=True)",
    "CELU(2.0)", "SELU()", "SELU(inplace=True)", "GLU()", "GLU(dim=1)", "Hardshrink()", "Hardshrink(0.3)",
    "Softshrink(0.2)", "Hardsigmoid()", "Hardswish(inplace=True)", "Hardtanh()", "Hardtanh(-2.0, 3.0, inplace=True)",
    "LeakyReLU()", "LeakyReLU(0.2, inplace=True)", "LogSigmoid()", "Softmax()", "Softmax(dim=1)", "Softmax(-1)",
    "Softmin(dim=0)", "Softmin()", "LogSoftmax(dim=2)", "LogSoftmax()", "Softmax2d()", "Softplus()",
    "Softplus(beta=2.0, threshold=10.0)", "Softplus(beta=0.5)", "Softsign()", "Tanhshrink()", "Threshold(0.1, 20.0)",
    "Threshold(0.5, 0.0, inplace=True)", "PReLU()", "PReLU(3)", "PReLU(2, init=0.1)", "RReLU()",
    "RReLU(0.1, 0.3, inplace=True)",
    # distances
    "CosineSimilarity()", "CosineSimilarity(dim=0, eps=1e-6)", "PairwiseDistance()",
    "PairwiseDistance(p=1.0, eps=1e-5, keepdim=True)",
    # losses
    "MSELoss()", "L1Loss(reduction='sum')", "CrossEntropyLoss(reduction='sum')",
    "CrossEntropyLoss(ignore_index=1, label_smoothing=0.1)", "BCELoss()", "BCEWithLogitsLoss()", "NLLLoss()",
    "NLLLoss2d()", "CTCLoss()", "CTCLoss(blank=1, zero_infinity=True)", "KLDivLoss()",
    "KLDivLoss(log_target=True, reduction='batchmean')", "HuberLoss(delta=2.0)", "SmoothL1Loss(beta=0.5)",
    "SoftMarginLoss()", "GaussianNLLLoss()", "GaussianNLLLoss(full=True, eps=1e-3)", "PoissonNLLLoss()",
    "PoissonNLLLoss(log_input=False, full=True)", "HingeEmbeddingLoss(margin=2.0)", "CosineEmbeddingLoss(0.5)",
    "MarginRankingLoss(0.1)", "MultiLabelMarginLoss()", "MultiLabelSoftMarginLoss()",
    "MultiMarginLoss(p=2, margin=0.5)", "TripletMarginLoss()", "TripletMarginLoss(margin=2.0, p=1.0, swap=True)",
    "TripletMarginWithDistanceLoss()", "TripletMarginWithDistanceLoss(margin=0.5, swap=True)",
    "TripletMarginWithDistanceLoss(distance_function=nn.PairwiseDistance())",
    "TripletMarginWithDistanceLoss(distance_function=nn.CosineSimilarity())", "LinearCrossEntropyLoss(4, 3)",
    # containers
    "Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))",
    "Sequential(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3), nn.ReLU())",
    "ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])", "ModuleList([nn.ReLU(), nn.Tanh(), nn.Tanh(), nn.ReLU()])",
    "ModuleList()", "ModuleDict({'a': nn.Linear(2, 3), 'b': nn.ReLU()})", "Sequential()",
    "ParameterList([P(2, 3), P(3, dtype='float64')])", "ParameterList([P(4)])", "ParameterList()",
    "ParameterDict({'a': P(2, 3), 'b': P(dtype='float64')})", "ParameterDict()",
    "AdaptiveLogSoftmaxWithLoss(8, 10, [4, 8])",
    "AdaptiveLogSoftmaxWithLoss(8, 10, [4], div_value=2.0, head_bias=True)",
]

# Parameters for ParameterList/ParameterDict: numpy arrays here, torch Parameters there
OURS = {"nn": nn, "P": lambda *shape, dtype="float32": nn.Parameter(np.zeros(shape), dtype=dtype)}
THEIRS = {"nn": torch.nn,
          "P": lambda *shape, dtype="float32": torch.nn.Parameter(torch.zeros(shape, dtype=getattr(torch, dtype)))}


@pytest.mark.parametrize("ctor", CTORS)
def test_repr_is_torchs(ctor):
    ours, theirs = eval(f"nn.{ctor}", OURS), eval(f"nn.{ctor}", THEIRS)  # noqa: S307 - the list above
    assert repr(ours) == repr(theirs)


def test_every_module_with_a_torch_twin_is_compared():
    """Each gc.nn Module class that torch.nn has is constructed above (the abstract bases aside)."""
    shown = {ctor.split("(")[0] for ctor in CTORS}
    twins = {name for name, cls in vars(nn).items() if inspect.isclass(cls) and issubclass(cls, nn.Module)
             and hasattr(torch.nn, name)}
    assert twins - shown == {"Module", "RNNBase", "RNNCellBase"}


def test_a_lazy_module_prints_as_the_module_it_became():
    """After the first call a lazy module is the module it stands for, printed as torch's."""
    import graphc as gc

    lazy = nn.LazyLinear(4)
    gc.capture(lazy, x=gc.spec("float32", (2, 3)))
    assert repr(lazy) == repr(torch.nn.Linear(3, 4)) == "Linear(in_features=3, out_features=4, bias=True)"
