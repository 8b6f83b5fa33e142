"""Shared pytest set-up."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _seed_module_rng(request):
    """Give a test module's ``RNG`` a fresh seed derived from the test's id, so each test draws
    the same numbers whatever ran before it on its pytest-xdist worker."""
    module = request.module
    if isinstance(getattr(module, "RNG", None), np.random.Generator):
        module.RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
