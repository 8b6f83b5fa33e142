"""``torch.nn.init`` on a graphc Parameter (or its ``.data``): torch fills the tensor now; graphc keeps the
initialiser and draws it when the module is initialised (``gc.capture``'s seed, ``init_parameters``), so
``module.apply(init_weights)`` ports as is. The recipes themselves: ``graphc.nn.draws``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.nn import draws
from graphc.nn.draws import Init, fan_in_out, ones, zeros
from graphc.nn.param_data import ParamData, PendingData
from graphc.nn.parameter import Parameter

__all__ = ["calculate_gain", "constant", "constant_", "dirac", "dirac_", "eye", "eye_", "kaiming_normal",
           "kaiming_normal_", "kaiming_uniform", "kaiming_uniform_", "normal", "normal_", "ones", "ones_",
           "orthogonal", "orthogonal_", "sparse", "sparse_", "trunc_normal_", "uniform", "uniform_", "xavier_normal",
           "xavier_normal_", "xavier_uniform", "xavier_uniform_", "zeros", "zeros_"]

_GAINS = {"linear": 1.0, "conv1d": 1.0, "conv2d": 1.0, "conv3d": 1.0, "conv_transpose1d": 1.0,
          "conv_transpose2d": 1.0, "conv_transpose3d": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0),
          "selu": 3.0 / 4}


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """``torch.nn.init.calculate_gain``: the gain recommended for ``nonlinearity``."""
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        if isinstance(slope, bool) or not isinstance(slope, (int, float)):
            raise ValueError(f"negative_slope {slope!r} is not a valid number")
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity not in _GAINS:
        raise ValueError(f"Unsupported nonlinearity {nonlinearity!r}: one of {sorted([*_GAINS, 'leaky_relu'])}")
    return _GAINS[nonlinearity]


def _fill(tensor: Any, init: Init, fn: str, generator: Any = None) -> Any:
    handle = tensor.data if isinstance(tensor, Parameter) else tensor  # a Parameter, or its .data (or a slice)
    if not isinstance(handle, (ParamData, PendingData)):
        raise TypeError(f"nn.init.{fn} takes a gc.nn.Parameter or its .data (a module's weight, read outside a "
                        f"capture), got {type(tensor).__name__}")
    if generator is not None:
        raise ValueError(f"nn.init.{fn}: generator= is not taken; graphc draws from gc.capture's seed "
                         f"(or init_parameters(seed))")
    handle._redraw(init)
    return tensor


def _fan(shape: Sequence[int], mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode!r} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = fan_in_out(shape)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Any, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Any:
    return _fill(tensor, draws.between(a, b), "uniform_", generator)


def normal_(tensor: Any, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Any:
    return _fill(tensor, draws.normal(mean, std), "normal_", generator)


def trunc_normal_(tensor: Any, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Any = None) -> Any:
    """N(mean, std) redrawn where it falls outside [a, b] (torch's bounds are values, not stds)."""
    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        out = rng.normal(mean, std, size=shape)
        outside = (out < a) | (out > b)
        while outside.any():
            out[outside] = rng.normal(mean, std, size=int(outside.sum()))
            outside = (out < a) | (out > b)
        return out.astype(dtype)

    return _fill(tensor, draw, "trunc_normal_", generator)


def constant_(tensor: Any, val: float) -> Any:
    return _fill(tensor, draws.constant(val), "constant_")


def zeros_(tensor: Any) -> Any:
    return _fill(tensor, zeros, "zeros_")


def ones_(tensor: Any) -> Any:
    return _fill(tensor, ones, "ones_")


def eye_(tensor: Any) -> Any:
    if len(tensor.shape) != 2:
        raise ValueError(f"nn.init.eye_ takes a 2-D tensor, got shape {tensor.shape}")
    return _fill(tensor, lambda rng, shape, dtype: np.eye(*shape, dtype=dtype), "eye_")


def xavier_uniform_(tensor: Any, gain: float = 1.0, generator: Any = None) -> Any:
    fan_in_out(tensor.shape)  # a rank below 2 fails here, as torch's
    return _fill(tensor, draws.xavier_uniform(gain), "xavier_uniform_", generator)


def xavier_normal_(tensor: Any, gain: float = 1.0, generator: Any = None) -> Any:
    fan_in, fan_out = fan_in_out(tensor.shape)
    return _fill(tensor, draws.normal(0.0, gain * math.sqrt(2.0 / (fan_in + fan_out))), "xavier_normal_", generator)


def _kaiming_std(tensor: Any, a: float, mode: str, nonlinearity: str) -> float:
    fan = _fan(tensor.shape, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan) if fan else 0.0


def kaiming_uniform_(tensor: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Any:
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return _fill(tensor, draws.uniform(bound), "kaiming_uniform_", generator)


def kaiming_normal_(tensor: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Any:
    return _fill(tensor, draws.normal(0.0, _kaiming_std(tensor, a, mode, nonlinearity)), "kaiming_normal_", generator)


def orthogonal_(tensor: Any, gain: float = 1.0, generator: Any = None) -> Any:
    """torch's: the Q of a normal matrix's QR ([rows, numel / rows]), its columns' signs by R's diagonal."""
    if len(tensor.shape) < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")

    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        rows = shape[0]
        cols = math.prod(shape) // rows if rows else 0
        flat = rng.normal(size=(rows, cols))
        q, r = np.linalg.qr(flat.T if rows < cols else flat)
        q *= np.sign(np.diag(r))
        return (gain * (q.T if rows < cols else q)).reshape(shape).astype(dtype)

    return _fill(tensor, draw, "orthogonal_", generator)


def dirac_(tensor: Any, groups: int = 1) -> Any:
    """torch's: zeros with a 1 at the spatial centre (``size // 2``) of ``[g * out_per_group + d, d]`` for each
    group ``g`` and ``d < min(out_per_group, in_channels)``, so a convolution with it passes its input through."""
    shape = tuple(tensor.shape)
    if len(shape) not in (3, 4, 5):
        raise ValueError(f"nn.init.dirac_ takes a 3-, 4- or 5-D tensor (a convolution's weight), got shape {shape}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or shape[0] % groups:
        raise ValueError(f"nn.init.dirac_: dim 0 ({shape[0]}) must be divisible by groups, got groups={groups!r}")
    per_group = shape[0] // groups

    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        out = np.zeros(shape, dtype=dtype)
        centre = tuple(s // 2 for s in shape[2:])
        for g in range(groups):
            for d in range(min(per_group, shape[1])):
                out[(g * per_group + d, d, *centre)] = 1
        return out

    return _fill(tensor, draw, "dirac_")


def sparse_(tensor: Any, sparsity: float, std: float = 0.01, generator: Any = None) -> Any:
    """torch's: N(0, std) with ``ceil(sparsity * rows)`` entries of each column, at random rows, zero."""
    shape = tuple(tensor.shape)
    if len(shape) != 2:
        raise ValueError(f"nn.init.sparse_ takes a 2-D tensor, got shape {shape}")
    if not 0 <= sparsity <= 1:
        raise ValueError(f"nn.init.sparse_: sparsity must be in [0, 1], got {sparsity!r}")
    zeros_per_column = math.ceil(sparsity * shape[0])

    def draw(rng: np.random.Generator, shape: tuple, dtype: Any) -> np.ndarray:
        out = rng.normal(0.0, std, size=shape)
        for col in range(shape[1]):
            out[rng.permutation(shape[0])[:zeros_per_column], col] = 0
        return out.astype(dtype)

    return _fill(tensor, draw, "sparse_", generator)


def _deprecated(name: str) -> Any:
    """torch's old name without the underscore (``nn.init.xavier_uniform(w)``): warns as torch does and fills."""
    fill = globals()[f"{name}_"]

    def alias(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(f"`nn.init.{name}` is now deprecated in favor of `nn.init.{name}_`.", FutureWarning, stacklevel=2)
        return fill(*args, **kwargs)

    alias.__name__, alias.__doc__ = name, f"torch's deprecated ``nn.init.{name}``: ``{name}_``, with a FutureWarning."
    return alias


(uniform, normal, constant, eye, dirac, xavier_uniform, xavier_normal, kaiming_uniform, kaiming_normal, orthogonal,
 sparse) = map(_deprecated, ("uniform", "normal", "constant", "eye", "dirac", "xavier_uniform", "xavier_normal",
                             "kaiming_uniform", "kaiming_normal", "orthogonal", "sparse"))
