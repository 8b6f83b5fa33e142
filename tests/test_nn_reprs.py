"""gc.nn modules print as torch.nn's (``repr``, ``extra_repr``) for the same constructor arguments: the
layers' flags torch shows (Linear's ``bias``, the norms' ``affine``/``bias``/``track_running_stats``, a
convolution's tuples and non-default arguments, a recurrent layer's non-default arguments) and the losses'
bare ``Name()``."""

from __future__ import annotations

import pytest

from graphc import nn

torch = pytest.importorskip("torch")

CTORS = [
    "Linear(3, 4)", "Linear(3, 4, bias=False)", "Bilinear(2, 3, 4)",
    "BatchNorm1d(3)", "BatchNorm2d(3, affine=False)", "BatchNorm3d(3, track_running_stats=False, momentum=None)",
    "SyncBatchNorm(3)", "LayerNorm(3)", "LayerNorm((2, 3), elementwise_affine=False)", "LayerNorm(3, bias=False)",
    "GroupNorm(1, 2)", "GroupNorm(2, 4, affine=False)",
    "Conv1d(2, 3, 3)", "Conv2d(2, 4, 3, padding='same', groups=2, bias=False, dilation=2, padding_mode='reflect')",
    "Conv3d(2, 3, (1, 2, 3), stride=2, padding=1)", "ConvTranspose2d(2, 4, 3, stride=2, output_padding=1)",
    "ConvTranspose1d(2, 3, 3)",
    "RNN(3, 4)", "GRU(3, 4, 2, batch_first=True)", "LSTM(3, 4, 2, bias=False, dropout=0.5, bidirectional=True)",
    "Embedding(5, 3)", "Dropout(0.2)",
    "MSELoss()", "CrossEntropyLoss(reduction='sum')", "BCEWithLogitsLoss()", "NLLLoss()", "CTCLoss()",
    "TripletMarginLoss()", "KLDivLoss()",
]


@pytest.mark.parametrize("ctor", CTORS)
def test_repr_is_torchs(ctor):
    ours, theirs = eval(f"nn.{ctor}", {"nn": nn}), eval(f"torch.nn.{ctor}", {"torch": torch})  # noqa: S307 - listed
    assert repr(ours) == repr(theirs)
