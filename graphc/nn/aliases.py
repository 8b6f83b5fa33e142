"""torch.nn's remaining names for layers graphc has: ``SyncBatchNorm`` (BatchNorm whose gradients
graph sums its statistics over data-parallel shards), ``CrossMapLRN2d`` (the legacy cross-channel LRN, with its running-sum
window), ``NLLLoss2d`` (``NLLLoss``), and the recurrent base classes ``RNNBase`` and ``RNNCellBase``
(for ``isinstance`` checks; build ``RNN``/``LSTM``/``GRU`` and their cells)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import op_error, user_source
from graphc.dsl.ops_views import movedim
from graphc.dsl.tensor import Tensor
from graphc.nn.layers import BatchNormBase
from graphc.nn.loss import NLLLoss
from graphc.nn.module import Module
from graphc.nn.pooling import LocalResponseNorm
from graphc.nn.rnn import RNNBase
from graphc.nn.rnn_cells import RNNCellBase
from graphc.nn.signatures import takes_device


@takes_device
class SyncBatchNorm(BatchNormBase):
    """``torch.nn.SyncBatchNorm``: BatchNorm over ``(N, C, *)`` input (``process_group`` is accepted and
    unused). Its BatchNormalization node (without running statistics: its mean, centring and variance
    nodes) is marked ``SYNC_BATCHNORM_KEY``: the gradients graph computes its batch statistics, and
    their gradients, through exchanges between the workers (``passes/training/sync_batchnorm.py``),
    so shards run stage by stage with the marked values exchanged between (``graphc.runtime.staged``;
    ``gc.Trainer(..., workers=N)``'s workers) train as the whole batch, as torch's SyncBatchNorm under
    DDP. ``train_step`` (one process), eval and inference graphs are plain BatchNorm (torch syncs in
    training mode only: in eval, a layer without running statistics takes each worker's own batch)."""

    _ranks, _layout = (2, 3, 4, 5), "(N, C, *) (at least 2-D)"
    _sync = True

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group: Any = None, dtype: Any = "float32", *,
                 bias: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype, bias=bias)

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group: Any = None) -> Module:
        """``module`` with every BatchNorm layer in it (``module`` itself included) replaced by a
        ``SyncBatchNorm`` holding the same weight, bias and running-statistics objects and the same
        mode, as torch's; other modules are kept, their children replaced in place."""
        out = module
        if isinstance(module, BatchNormBase):
            params = module._parameters
            stat = params.get("running_mean") or params.get("weight")
            out = cls(module.num_features, module.eps, module.momentum, params.get("weight") is not None,
                      module.track_running_stats, process_group, stat.dtype if stat is not None else "float32",
                      bias=params.get("bias") is not None)
            for name, value in params.items():
                setattr(out, name, value)
            out.training = module.training
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


def cross_map_window(channels: int, size: int) -> np.ndarray:
    """``(channels, channels)`` 0/1: which channels' squares torch's legacy CrossMapLRN2d sums for each
    channel, by replaying its running sum (start with the first ``pre_pad``, then add the next and, past
    ``pre_pad``, drop the one ``pre_pad`` back: channel 0 is never dropped)."""
    pre_pad = int((size - 1) / 2 + 1)
    window = np.zeros((channels, channels), np.float64)
    window[0, :min(pre_pad, channels)] = 1
    for c in range(1, channels):
        window[c] = window[c - 1]
        if c < channels - pre_pad + 1:
            window[c, c + pre_pad - 1] += 1
        if c > pre_pad:
            window[c, c - pre_pad] -= 1
    return window


class CrossMapLRN2d(Module):
    """``torch.nn.CrossMapLRN2d(size, alpha=1e-4, beta=0.75, k=1)``: ``x / (k + alpha / size * s)^beta``
    with ``s`` torch's running sum of squares across channels (``cross_map_window``); 4-D input only."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input: Any) -> Tensor:
        x = ops.lift(input)
        if x.ndim != 4 or not isinstance(x.shape[1], int):
            raise op_error("CrossMapLRN2d", [x], f"expects a 4-D input (N, C, H, W) with static C, got "
                           f"{x.type_str()}", user_source())
        window = ops.constant(cross_map_window(x.shape[1], self.size).T.astype(x.dtype.numpy))
        sums = movedim(ops.matmul(movedim(x * x, 1, -1), window), -1, 1)
        scale = ops.scalar(self.k, x) + ops.scalar(self.alpha / self.size, x) * sums
        return x * ops.exp(ops.log(scale) * ops.scalar(-self.beta, x))

    extra_repr = LocalResponseNorm.extra_repr


class NLLLoss2d(NLLLoss):
    """``torch.nn.NLLLoss2d``: ``NLLLoss`` (which takes ``(N, C, H, W)`` input already)."""


__all__ = ["CrossMapLRN2d", "NLLLoss2d", "RNNBase", "RNNCellBase", "SyncBatchNorm", "cross_map_window"]
