"""``gc.nn.utils``: torch.nn.utils's helpers for writing models, under its names: ``rnn`` (padding
and packing), weight and spectral norm (hook and ``parametrizations`` forms), parameter vectors,
conv/linear + BatchNorm fusion, ``parametrize`` (torch's general parametrizations), ``skip_init``; the ``clip_grad`` functions refuse, naming why."""

from graphc.nn.utils import parametrizations, parametrize, rnn
from graphc.nn.utils.clip_grad import (clip_grad_norm, clip_grad_norm_, clip_grad_value_, clip_grads_with_norm_,
                                       get_total_norm)
from graphc.nn.utils.convert_parameters import parameters_to_vector, vector_to_parameters
from graphc.nn.utils.fusion import fuse_conv_bn_eval, fuse_conv_bn_weights, fuse_linear_bn_eval, fuse_linear_bn_weights
from graphc.nn.utils.init import skip_init
from graphc.nn.utils.norms import remove_spectral_norm, remove_weight_norm, spectral_norm, weight_norm

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_", "fuse_conv_bn_eval",
           "fuse_conv_bn_weights", "fuse_linear_bn_eval", "fuse_linear_bn_weights", "get_total_norm",
           "parameters_to_vector", "parametrizations", "parametrize", "remove_spectral_norm", "remove_weight_norm", "rnn",
           "skip_init", "spectral_norm", "vector_to_parameters", "weight_norm"]
