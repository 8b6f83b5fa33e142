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


@pytest.fixture
def torch_float64():
    """torch with float64 as its default dtype, which torch.optim keeps per-param scalar state in
    (``step``, NAdam's ``mu_product``): with float32, the default, a float64 NAdam's ``mu_product``
    is rounded to float32 each step and its params move ~1e-10 off the float64 formula."""
    torch = pytest.importorskip("torch")
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield torch
    torch.set_default_dtype(default)
