"""Activation layers with ``torch.nn``'s names and arguments (LeakyReLU ... LogSoftmax). Those with
torch's ``inplace`` argument are ``InPlace`` layers."""

from __future__ import annotations

import warnings
from typing import Any

from graphc.dsl import ops, ops_layers
from graphc.dsl.batching import batch_rank
from graphc.dsl.ops_random import rrelu
from graphc.dsl.tensor import Tensor
from graphc.errors import CaptureError
from graphc.nn.draws import constant as _constant
from graphc.nn.module import Module, Parameter
from graphc.nn.signatures import implicit_dim, takes_device


class InPlace(Module):
    """A layer with torch's ``inplace`` argument: ``inplace=True`` writes the result into the input
    (``graphc.dsl.inplace``: a later read of it, or of its base through a view, sees the result) and
    returns it, as torch's. Its repr shows ``shown`` then ``inplace=True``, as torch's."""

    shown: tuple[str, ...] = ()

    def __init__(self, inplace: bool = False):
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return ", ".join([f"{a}={getattr(self, a)}" for a in self.shown] + ["inplace=True"] * bool(self.inplace))


class LeakyReLU(InPlace):
    shown = ("negative_slope",)

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False):
        super().__init__(inplace)
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.leaky_relu(x, self.negative_slope, self.inplace)


class ELU(InPlace):
    shown = ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.elu(x, self.alpha, self.inplace)


class SiLU(InPlace):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.silu(x, self.inplace)


class Mish(InPlace):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.mish(x, self.inplace)


class Hardswish(InPlace):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardswish(x, self.inplace)

    def extra_repr(self) -> str:
        return ""  # torch's shows no inplace


class Hardsigmoid(InPlace):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardsigmoid(x, self.inplace)

    def extra_repr(self) -> str:
        return ""  # torch's shows no inplace


class Softplus(Module):
    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


@takes_device
class PReLU(Module):
    """``weight [num_parameters]`` filled with ``init`` (0.25); one slope, or one per channel."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, dtype: Any = "float32"):  # noqa: A002
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(shape=(num_parameters,), init=_constant(init), dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"



class Hardtanh(InPlace):
    shown = ("min_val", "max_val")

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False,
                 min_value: float | None = None, max_value: float | None = None):
        """``min_value``/``max_value``: torch's deprecated names, which win over ``min_val``/``max_val``,
        with torch's FutureWarning."""
        super().__init__(inplace)
        for old, value in (("min_value", min_value), ("max_value", max_value)):
            if value is not None:
                warnings.warn(f"keyword argument `{old}` is deprecated and renamed to `{old[:7]}`", FutureWarning,
                              stacklevel=2)
        min_val = min_val if min_value is None else min_value
        max_val = max_val if max_value is None else max_value
        if not min_val < max_val:
            raise CaptureError(ops_layers.hardtanh_bounds_message("Hardtanh", min_val, max_val))
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardtanh(x, self.min_val, self.max_val, self.inplace)


class ReLU6(Hardtanh):
    shown = ()

    def __init__(self, inplace: bool = False):
        super().__init__(0.0, 6.0, inplace)


class SELU(InPlace):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.selu(x, self.inplace)


class CELU(InPlace):
    shown = ("alpha",)

    def __init__(self, alpha: float = 1.0, inplace: bool = False):
        super().__init__(inplace)
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.celu(x, self.alpha, self.inplace)


class GLU(Module):
    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.logsigmoid(x)


class Softsign(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softsign(x)


class Tanhshrink(Module):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.tanhshrink(x)


class _Shrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        self.lambd = lambd

    def extra_repr(self) -> str:
        return str(self.lambd)


class Softshrink(_Shrink):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softshrink(x, self.lambd)


class Hardshrink(_Shrink):
    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.hardshrink(x, self.lambd)


class Threshold(InPlace):
    shown = ("threshold", "value")

    def __init__(self, threshold: float, value: float, inplace: bool = False):
        super().__init__(inplace)
        self.threshold, self.value = threshold, value

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.threshold(x, self.threshold, self.value, self.inplace)


class AlongDim(Module):
    """A softmax layer along ``dim`` (Softmax, Softmin, LogSoftmax: ``name``, torch's function): ``dim=None`` is
    torch's deprecated implicit dim, with its warning (``implicit_dim``), shown as given, as torch's."""

    name = ""

    def __init__(self, dim: int | None = None):
        super().__init__()
        self.dim = dim

    def axis(self, x: Tensor) -> int:
        """The dim it runs along on ``x`` (the warning at the module's call: past ``forward`` and ``__call__``)."""
        return implicit_dim(self.name, x, self.dim, stacklevel=6)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmin(AlongDim):
    name = "softmin"

    def forward(self, x: Tensor) -> Tensor:
        return ops_layers.softmin(x, self.axis(x))


class LogSoftmax(AlongDim):
    name = "log_softmax"

    def forward(self, x: Tensor) -> Tensor:
        return ops.log_softmax(x, self.axis(x))


class RReLU(InPlace):
    """``F.rrelu(x, lower, upper, training=self.training)``: a slope drawn per element from
    U(lower, upper) in training mode, ``(lower + upper) / 2`` in eval mode."""

    shown = ("lower", "upper")

    def __init__(self, lower: float = 1.0 / 8, upper: float = 1.0 / 3, inplace: bool = False):
        super().__init__(inplace)
        self.lower, self.upper = lower, upper

    def forward(self, x: Tensor) -> Tensor:
        return rrelu(x, self.lower, self.upper, self.training, self.inplace)


class Softmax2d(Module):
    """Softmax over the channels of a ``(N, C, H, W)`` or ``(C, H, W)`` input (dim -3)."""

    def forward(self, x: Tensor) -> Tensor:
        x = ops.lift(x)
        batch_rank("Softmax2d", x, "C, H, W")
        return ops.softmax(x, -3)
