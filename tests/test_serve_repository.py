"""Which models a server holds: single files, repository folders, versions, and no reads
outside the repository."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.serving.kserve.repository import load_models
from serve_util import fixed_model, mixed_feeds, mixed_model


def test_repository_serves_every_model_at_its_highest_version(tmp_path):
    gc.deploy.triton(mixed_model(), tmp_path, "a")
    gc.deploy.triton(fixed_model(), tmp_path, "b")
    (tmp_path / "a" / "3").mkdir()
    onnx.save(fixed_model(), str(tmp_path / "a" / "3" / "model.onnx"))
    (tmp_path / "a" / "10").mkdir()  # no model file: skipped
    (tmp_path / "notes").mkdir()     # not a model folder: ignored
    models = load_models(tmp_path, backend="numpy")
    assert sorted(models) == ["a", "b"]
    assert models["a"].version == "3" and models["a"].metadata["versions"] == ["3"]
    assert [i["name"] for i in models["a"].metadata["inputs"]] == ["x"]
    assert sorted(load_models(tmp_path, name="b")) == ["b"]
    assert sorted(load_models(tmp_path / "a")) == ["a"]  # one model's folder
    with pytest.raises(gc.ModelLoadError, match="has no model 'c'; it has a, b"):
        load_models(tmp_path, name="c")


def test_default_model_filename_from_config(tmp_path):
    folder = gc.deploy.triton(mixed_model(), tmp_path, "m")
    os.replace(folder / "1" / "model.onnx", folder / "1" / "net.onnx")
    with pytest.raises(gc.ModelLoadError, match="no numeric version folder holds 'model.onnx'"):
        load_models(tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + 'default_model_filename: "net.onnx"\n')
    model = load_models(tmp_path)["m"]
    feeds = mixed_feeds(2)
    from graphc.serving.kserve.protocol import DecodedRequest

    out = model.infer(DecodedRequest(None, feeds, (None, False)))
    np.testing.assert_array_equal(out["s"], feeds["idx"] + 1)
    config.write_text('default_model_filename: "../../outside.onnx"\n')
    with pytest.raises(gc.ModelLoadError, match="must be a plain file name"):
        load_models(tmp_path)


def test_symlinks_out_of_the_repository_are_refused(tmp_path):
    outside = tmp_path / "outside.onnx"
    onnx.save(mixed_model(), str(outside))
    repo = tmp_path / "repo"
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.onnx").symlink_to(outside)
    with pytest.raises(gc.ModelLoadError, match="outside the repository"):
        load_models(repo)
    (repo / "m" / "1" / "model.onnx").unlink()
    (repo / "m" / "1").rmdir()
    (tmp_path / "elsewhere").mkdir()
    onnx.save(mixed_model(), str(tmp_path / "elsewhere" / "model.onnx"))
    (repo / "m" / "1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(gc.ModelLoadError, match="outside the repository"):
        load_models(repo)


def test_empty_folder_and_missing_path(tmp_path):
    with pytest.raises(gc.ModelLoadError, match="no models found"):
        load_models(tmp_path)
    with pytest.raises(gc.ModelLoadError, match="no such model file or repository folder"):
        load_models(tmp_path / "missing.onnx")


def test_models_and_protos_are_served_under_their_graph_name_or_name():
    assert sorted(load_models(mixed_model())) == ["mixed"]
    assert sorted(load_models(gc.load(mixed_model()), name="other")) == ["other"]
