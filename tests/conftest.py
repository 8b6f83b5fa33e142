"""Shared pytest set-up."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed_module_rng(request):
    """Give a test module's shared generator (``RNG``, ``rng`` or ``R``) a fresh seed derived from the
    test's id, so each test draws the same numbers whatever ran before it on its xdist worker."""
    seed = zlib.crc32(request.node.nodeid.encode())
    for name in ("RNG", "rng", "R"):
        if isinstance(getattr(request.module, name, None), np.random.Generator):
            setattr(request.module, name, np.random.default_rng(seed))
