"""``gc.nn.utils``: torch.nn.utils's helpers for writing models: ``rnn`` (padding and packing),
weight and spectral norm (hook and ``parametrizations`` forms)."""

from graphc.nn.utils import parametrizations, rnn
from graphc.nn.utils.norms import remove_spectral_norm, remove_weight_norm, spectral_norm, weight_norm

__all__ = ["parametrizations", "remove_spectral_norm", "remove_weight_norm", "rnn", "spectral_norm", "weight_norm"]
