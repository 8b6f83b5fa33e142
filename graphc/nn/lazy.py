"""Lazy modules (``LazyLinear``, ``LazyConv1d`` ..., ``LazyBatchNorm1d`` ..., ``LazyInstanceNorm1d``
...): torch's arguments without the input size, which the first capture reads from the input's
static feature (``Linear``) or channel dim. At that call the module becomes the module it stands
for (``LazyLinear`` a ``Linear``, as torch's ``cls_to_become``), its parameters named by its path
as any module's and drawn once with that module's init, from a stream spawned from the capture's
seeded generator, in use order; later captures keep them. Before it, the module has no
parameters: ``state_dict()`` is empty."""

from __future__ import annotations

from typing import Any

from graphc.dsl import ops
from graphc.dsl.batching import batch_rank
from graphc.dsl.builder import active, op_error, user_source
from graphc.nn.conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from graphc.nn.layers import BatchNorm1d, BatchNorm2d, BatchNorm3d, Linear
from graphc.nn.module import Module
from graphc.nn.norm import InstanceNorm1d, InstanceNorm2d, InstanceNorm3d
from graphc.nn.signatures import takes_device


class _Lazy(Module):
    """Keeps the constructor's arguments; the first call supplies the missing first one."""

    cls_to_become: type[Module]
    what = "channels (dim 1)"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__()
        object.__setattr__(self, "_lazy_args", (args, kwargs))

    def _size_dim(self, x: Any) -> int:
        return 1

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        builder = active()
        if builder is not None:
            self._materialize(builder, ops.lift(x))
        return Module.__call__(self, x, *args, **kwargs)

    def _materialize(self, builder: Any, x: Any) -> None:
        name = type(self).__name__
        dim = self._size_dim(x)
        size = None if x.shape is None or not -len(x.shape) <= dim < len(x.shape) else x.shape[dim]
        if not isinstance(size, int):
            raise op_error(name, [x], f"infers its input {self.what} from the first input, which needs a static "
                           f"size there", user_source())
        (args, kwargs), state, lazy = self._lazy_args, dict(self.__dict__), type(self)
        object.__setattr__(self, "__class__", self.cls_to_become)  # first: its __init__ calls super()
        try:
            self.__class__.__init__(self, size, *args, **kwargs)
        except Exception:
            object.__setattr__(self, "__class__", lazy)  # a constructor argument refused: still lazy
            self.__dict__.update(state)
            raise
        object.__setattr__(self, "training", state["training"])
        path = state.get("_path")
        if path is not None:
            object.__setattr__(self, "_path", path)
        rng = builder.rng.spawn(1)[0]  # a stream apart from the one init_parameters drew the others from
        for attr, p in self._parameters.items():
            if path is not None:
                p.qualname = f"{path}.{attr}" if path else attr
                if builder.rooted is not None:
                    builder.rooted.add(id(p))
            p.draw(rng)
            p.data = p.numpy()  # drawn once: later captures keep it, as a value the user set
        del self.__dict__["_lazy_args"]

    def extra_repr(self) -> str:
        """torch's: the module it becomes, its input size 0 until the first call."""
        args, kwargs = self._lazy_args
        return self.cls_to_become(0, *args, **kwargs).extra_repr()


class _LazyFeatures(_Lazy):
    what = "features (the last dim)"

    def _size_dim(self, x: Any) -> int:
        return -1


class LazyLinear(_LazyFeatures):
    """``LazyLinear(out_features, bias=True)``: a ``Linear`` with ``in_features`` from the input."""

    cls_to_become = Linear


class LazyConv1d(_Lazy):
    """``LazyConv1d(out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
    padding_mode="zeros")``; so are the other convolutions."""

    cls_to_become = Conv1d


class LazyConv2d(_Lazy):
    cls_to_become = Conv2d


class LazyConv3d(_Lazy):
    cls_to_become = Conv3d


class LazyConvTranspose1d(_Lazy):
    cls_to_become = ConvTranspose1d


class LazyConvTranspose2d(_Lazy):
    cls_to_become = ConvTranspose2d


class LazyConvTranspose3d(_Lazy):
    cls_to_become = ConvTranspose3d


class LazyBatchNorm1d(_Lazy):
    """``LazyBatchNorm1d(eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)``; so are the
    other batch and instance norms."""

    cls_to_become = BatchNorm1d


class LazyBatchNorm2d(_Lazy):
    cls_to_become = BatchNorm2d


class LazyBatchNorm3d(_Lazy):
    cls_to_become = BatchNorm3d


@takes_device
class _LazyInstanceNorm(_Lazy):
    """torch's defaults, which differ from the instance norms': ``affine=True,
    track_running_stats=True``."""

    def __init__(self, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, dtype: Any = "float32", *, bias: bool = True):
        super().__init__(eps, momentum, affine, track_running_stats, dtype, bias=bias)

    def _size_dim(self, x: Any) -> int:
        """dim 0 of an unbatched ``(C, *spatial)`` input."""
        return 0 if x.ndim == batch_rank(type(self).__name__, x, self.cls_to_become.layout) - 1 else 1


class LazyInstanceNorm1d(_LazyInstanceNorm):
    cls_to_become = InstanceNorm1d


class LazyInstanceNorm2d(_LazyInstanceNorm):
    cls_to_become = InstanceNorm2d


class LazyInstanceNorm3d(_LazyInstanceNorm):
    cls_to_become = InstanceNorm3d
