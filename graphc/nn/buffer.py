"""``gc.nn.Buffer`` (torch 2.x's ``nn.Buffer``) and ``gc.nn.DataParallel``, which graphc refuses."""

from __future__ import annotations

from typing import Any

__all__ = ["Buffer", "DataParallel"]


class Buffer:
    """torch's ``nn.Buffer(data, persistent=True)``: assigned as a Module attribute
    (``self.x = gc.nn.Buffer(gc.zeros(3))``) it registers ``data`` as the buffer ``x``, as
    ``register_buffer("x", data, persistent)`` does (its dtype rule and checks)."""

    def __init__(self, data: Any = None, *, persistent: bool = True) -> None:
        self.data, self.persistent = data, bool(persistent)

    def __repr__(self) -> str:
        return f"Buffer({self.data!r}, persistent={self.persistent})"


def DataParallel(module: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N802 - torch's class name
    """Refused: torch's ``nn.DataParallel`` splits each batch over devices around the module; graphc
    trains data-parallel in the Trainer, on the captured graphs, not by wrapping the module (a
    wrapper would run nothing in parallel and rename every state_dict key ``module.*``)."""
    raise NotImplementedError("gc.nn.DataParallel: graphc trains data-parallel at the Trainer, not by wrapping "
                              "the module: capture the module itself and train with gc.Trainer(artifacts, "
                              "workers=N) (Ray workers, gradients averaged as torch's DistributedDataParallel)")
