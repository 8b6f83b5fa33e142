"""The local Ray cluster the data-parallel test modules share (one per module)."""

from __future__ import annotations

import os
import sys

import pytest

import graphc as gc
from graphc.runtime.distributed.cluster import LOCAL_ENV, connect


@pytest.fixture(scope="module")
def ray_cluster():
    """The local cluster ``gc.distributed`` starts when given no address (``connect``)."""
    saved = {k: os.environ.get(k) for k in LOCAL_ENV}
    for attempt in range(3):  # Ray gives its raylet 30 s to start: a loaded machine can miss that
        try:
            ray = connect(None, "the tests")
            break
        except gc.GraphcError:
            sys.modules["ray"].shutdown()
            if attempt == 2:
                raise
    try:
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
