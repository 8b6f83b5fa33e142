"""``gc.nn.utils.skip_init``."""

from __future__ import annotations

from typing import Any

from graphc.nn.module import Module

__all__ = ["skip_init"]


def skip_init(module_cls: type[Module], *args: Any, **kwargs: Any) -> Module:
    """``torch.nn.utils.skip_init``: the module, its parameters not drawn. A graphc module draws
    them only when initialised (``init_parameters``, or the capture), so this is the constructor:
    set them (``load_state_dict``, ``p.data = ...``) before capturing, or the capture draws them."""
    return module_cls(*args, **kwargs)
