"""torch's ``manual_seed`` and ``initial_seed``: one process-wide seed, 0 until set, from which graphc draws what
is random outside an explicit seed. ``gc.manual_seed(s)`` restarts the calling thread's draws outside a capture
(``gc.randn`` in a module's ``__init__``) from ``s``, seeds those of threads that start drawing later, and is the
seed of ``gc.capture`` and ``Module.init_parameters`` when they are given none, so a script that sets it makes the
same model and values each run. The builder layer: the Builder reads it."""

from __future__ import annotations

import operator

import numpy as np

from graphc.errors import CaptureError

_SEED = [0]


def manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``: see the module's docstring. Refused inside a capture, whose draws come from
    ``gc.capture``'s ``seed``."""
    from graphc.dsl import builder  # the same layer: builder reads this module's seed

    try:
        value = operator.index(seed)
    except TypeError:
        raise TypeError(f"gc.manual_seed: seed must be an int, got {type(seed).__name__} {seed!r}") from None
    if builder.active() is not None:
        raise CaptureError("gc.manual_seed inside a capture: the capture's random nodes are seeded from "
                           "gc.capture(..., seed=); call gc.manual_seed before the capture")
    if not 0 <= value < 2**64:
        raise ValueError(f"gc.manual_seed: seed must be in [0, 2**64), got {value}")
    _SEED[0] = value
    outside = builder.current()
    outside.rng, outside.node_seeds = streams(value)


def initial_seed() -> int:
    """``torch.initial_seed()``: the seed last given to ``gc.manual_seed``, 0 before any."""
    return _SEED[0]


def streams(seed: int) -> tuple[np.random.Generator, np.random.SeedSequence]:
    """A Builder's two streams from ``seed``: the generator parameters are drawn from, and the sequence random nodes'
    ``seed`` attributes are drawn from (``ops_random.node_seed``)."""
    return np.random.default_rng(seed), np.random.SeedSequence(seed)


__all__ = ["initial_seed", "manual_seed"]
