"""torch's devices in a graph that has none (a gc.Session's backend places it): ``gc.device``, ``x.device``, and
the factory keywords (``device=``, ``requires_grad=``, ``layout=``, ``pin_memory=``) checked and dropped; torch's ``out=`` refused (``refuse_out``)."""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any

from graphc.dsl.builder import user_source
from graphc.errors import CaptureError

_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|hip|meta)(:\d+)?")


class device(str):  # noqa: N801 - torch's name
    """``torch.device``: ``gc.device("cuda:0")``, ``gc.device("cuda", 1)``; a str (``"cuda:1"``) with ``.type``
    and ``.index``. ``x.device`` is ``gc.device("cpu")``: the graph runs where its session's backend puts it."""

    def __new__(cls, type: str, index: int | None = None) -> "device":  # noqa: A002 - torch's name
        text = str(type) if index is None else f"{type}:{index}"
        if not _DEVICE.fullmatch(text):
            raise ValueError(f"gc.device: expected cpu, cuda, mps, xpu, hip or meta with an optional ':N', "
                             f"got {text!r}")
        return super().__new__(cls, text)

    @property
    def type(self) -> str:
        return self.split(":")[0]

    @property
    def index(self) -> int | None:
        return int(self.split(":")[1]) if ":" in self else None


def is_device(arg: Any) -> bool:
    """A device as torch takes it: ``"cpu"``, ``"cuda:1"``, a ``gc.device`` or a ``torch.device``."""
    return bool(_DEVICE.fullmatch(str(arg))) or (type(arg).__name__ == "device" and
                                                 bool(_DEVICE.fullmatch(str(getattr(arg, "type", "")))))


def check_device(where: str, device: Any) -> None:
    """Refuse a ``device`` that is neither None nor a device (``is_device``), naming ``where``; a device is
    dropped: a capture has none, and ``"cuda"`` runs on the GPU when the session's backend is ``"ort-cuda"``."""
    if device is not None and not is_device(device):
        raise CaptureError(f"{where}(device={device!r}): expected a device (cpu, cuda[:N], mps, xpu, hip, meta) "
                           f"at {user_source()}")


def refuse_out(where: str, out: Any) -> None:
    """A CaptureError for torch's ``out=`` (given, not None): a graph's values are never written into a
    tensor given beforehand; use the returned one."""
    if out is not None:
        raise CaptureError(f"{where}(out=...): graphc does not write into a given tensor; use the returned one "
                           f"(at {user_source()})")


def factory(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking torch's factory keywords too: ``device`` (a device, dropped), ``requires_grad=False``,
    ``layout`` (strided), ``pin_memory``; a CaptureError naming the keyword for any other value."""
    @functools.wraps(fn)
    def made(*args: Any, device: Any = None, requires_grad: bool = False, layout: Any = None,
             pin_memory: bool = False, **kwargs: Any) -> Any:
        check_device(fn.__name__, device)
        if requires_grad:
            raise CaptureError(f"{fn.__name__}(requires_grad=True) at {user_source()}: a graph trains its "
                               f"gc.nn.Parameters; make the tensor one (nn.Parameter(gc.{fn.__name__}(...))) in "
                               f"__init__")
        if layout is not None and str(layout).removeprefix("torch.") != "strided":
            raise CaptureError(f"{fn.__name__}(layout={layout!r}): only torch.strided (dense) at {user_source()}")
        return fn(*args, **kwargs)

    own = inspect.signature(made, follow_wrapped=False).parameters.values()  # made's keyword-only ones, as written
    made.__signature__ = with_keywords(  # type: ignore[attr-defined]
        inspect.signature(fn), {p.name: p.default for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY})
    return made


def with_keywords(sig: inspect.Signature, defaults: dict[str, Any]) -> inspect.Signature:
    """``sig`` with the keyword-only parameters ``defaults`` (name -> default) it lacks, before its ``**kwargs``:
    the signature of a wrapper that takes them."""
    params = list(sig.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
             for name, default in defaults.items() if name not in sig.parameters]
    return sig.replace(parameters=[*params[:at], *extra, *params[at:]])


__all__ = ["check_device", "device", "factory", "is_device", "refuse_out", "with_keywords"]
