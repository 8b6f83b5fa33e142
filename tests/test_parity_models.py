"""numpy backend vs onnxruntime on every models/ example, at several batch sizes."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.models import EXAMPLES

BATCHES = (1, 3, 8)


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def captured(request):
    factory, example_inputs = EXAMPLES[request.param]
    module = factory()
    return request.param, module, gc.capture(module, **example_inputs())


def _feeds(model, module, batch, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in model.inputs:
        shape = tuple(batch if isinstance(d, str) or d is None else d for d in spec.shape)
        if spec.dtype == "int64":  # token ids: anything the embedding table covers
            vocab = module.tok.weight.shape[0] if hasattr(module, "tok") else 2
            feeds[spec.name] = rng.integers(0, vocab, size=shape)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    return feeds


@pytest.mark.parametrize("batch", BATCHES)
def test_numpy_matches_onnxruntime(captured, batch):
    name, module, model = captured
    assert model.inputs[0].shape[0] == "N", f"{name}: batch dim should stay symbolic"
    report = gc.parity.compare(model, _feeds(model, module, batch, seed=batch), backends=("numpy", "ort-cpu"))
    assert report.ok, f"{name} at batch {batch}:\n{report}"
    for output in report.outputs.values():
        assert output.shape[0] == batch
