"""Fuzzed model files (truncation, bit flips, random external-data keys and values on tensors in
the graph, Constants, If branches, functions and sparse initializers) give gc.load either a model
that works or gc.ModelLoadError, the CLI one line and exit 2, and never open a file outside the
model's folder. scripts/fuzz_load.py runs the same at scale (4,000 files)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings, strategies as st
import pytest

import graphc as gc
from cli_util import run_cli
from model_fuzz import OpenAudit, mutate, sentinel_ids, write_seed

KINDS = ("rich", "two_layer_net")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    paths = {kind: write_seed(base / kind, kind) for kind in KINDS}
    watch = set().union(*(sentinel_ids(base / kind) for kind in KINDS))
    return {kind: (path, path.read_bytes()) for kind, path in paths.items()}, watch


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1), via_cli=st.booleans())
def test_fuzzed_models_load_or_fail_cleanly_and_stay_in_their_folder(seeds, capsys, kind, seed, via_cli):
    files, watch = seeds
    path, original = files[kind]
    path.write_bytes(mutate(original, random.Random(seed), path.parent.parent))
    audit = OpenAudit.get()
    audit.watch, audit.hits = watch, []
    try:
        if via_cli:
            result = run_cli(capsys, "inspect", path)
            assert result.code in (0, 2), result.err
            if result.code == 2:
                assert len(result.err.strip().splitlines()) == 1 and "ModelLoadError" in result.err, result.err
        else:
            try:
                model = gc.load(path)
            except gc.ModelLoadError as exc:
                assert str(path) in str(exc)
            else:  # what loads can be written and described again
                model.proto.SerializeToString()
                model.summary()
    finally:
        audit.watch = set()
    assert audit.hits == []
