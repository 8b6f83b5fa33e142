"""The local Ray cluster the data-parallel test modules share (one per module)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings

import numpy as np
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


def workers_step_as_torch(arts, backend, batches, want, twin, names, want_eval=()):
    """Two workers step ``batches`` with no DataParallelWarning (each model keeps its rows apart),
    their losses ``want`` and then torch's ``twin``'s params ``names`` (1e-12); the first batches'
    eval losses ``want_eval``."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", gc.DataParallelWarning)
        trainer = gc.Trainer(arts, workers=2, num_cpus=0.5, timeout_s=120, backend=backend)
    try:
        np.testing.assert_allclose([trainer.step(b) for b in batches], want, rtol=1e-12, atol=1e-15)
        got, expected = trainer.state_dict(), twin.state_dict()
        for name in names:
            np.testing.assert_allclose(got[name], expected[name].numpy(), rtol=1e-12, atol=1e-15, err_msg=name)
        evaluated = [trainer.evaluate(b)["loss"] for b in batches[:len(want_eval)]]
        np.testing.assert_allclose(evaluated, want_eval, rtol=1e-12)
    finally:
        trainer.shutdown()


@contextlib.contextmanager
def unhandled_errors():
    """The errors Ray logs as never read ("Unhandled error", with the worker's traceback) while
    the block runs and for 1 s after, as their objects are freed."""
    import ray._private.worker as ray_worker  # Ray's hook, "visible for testing"

    seen: list = []
    original, ray_worker._unhandled_error_handler = ray_worker._unhandled_error_handler, seen.append
    try:
        yield seen
        import gc as collector

        collector.collect()
        time.sleep(1.0)
    finally:
        ray_worker._unhandled_error_handler = original
