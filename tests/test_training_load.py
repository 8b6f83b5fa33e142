"""gc.training.load: graph files confined to the artifact directory, bad manifests named clearly."""

import json
import os
import shutil

import numpy as np
import pytest

import graphc as gc
from graphc.errors import ArtifactsError, GraphcError
from trainer_models import bn_artifacts


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return bn_artifacts().save(tmp_path_factory.mktemp("arts") / "arts")


@pytest.fixture
def arts(saved, tmp_path):
    """A private copy of the artifacts, in ``tmp_path/run/arts``, and a valid model outside it."""
    copy = shutil.copytree(saved, tmp_path / "run" / "arts")
    (tmp_path / "x").mkdir()
    shutil.copy(saved / "inference.onnx", tmp_path / "x" / "evil.onnx")
    return copy


def edit_manifest(directory, edit):
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_artifacts_error_is_a_graphc_error():
    assert issubclass(ArtifactsError, GraphcError) and issubclass(ArtifactsError, ValueError)


@pytest.mark.parametrize("graph", ["train_step", "inference"])
def test_a_graph_path_that_climbs_out_is_refused_before_any_graph_is_read(arts, graph, monkeypatch):
    edit_manifest(arts, lambda m: m["graphs"][graph].update(file="../../x/evil.onnx"))
    read = []
    monkeypatch.setattr("graphc.model.load", lambda path: read.append(path))
    with pytest.raises(ArtifactsError, match=rf"the {graph} graph file '\.\./\.\./x/evil\.onnx' resolves to "
                                             r".*x/evil\.onnx, outside the artifact directory"):
        gc.training.load(arts)
    assert read == []


def test_an_absolute_graph_path_is_refused_by_load_and_by_the_trainer(arts):
    evil = arts.parent.parent / "x" / "evil.onnx"
    edit_manifest(arts, lambda m: m["graphs"]["eval"].update(file=str(evil)))
    for load in (gc.training.load, lambda d: gc.Trainer(d, backend="numpy")):
        with pytest.raises(ArtifactsError, match=f"the eval graph file '{evil}' resolves to {evil}, outside"):
            load(arts)


def test_a_symlink_is_followed_as_the_os_would(arts, saved):
    evil = arts.parent.parent / "x" / "evil.onnx"
    (arts / "eval.onnx").unlink()
    os.symlink(evil, arts / "eval.onnx")
    with pytest.raises(ArtifactsError, match=f"'eval.onnx' resolves to {evil}, outside"):
        gc.training.load(arts)
    (arts / "eval.onnx").unlink()
    os.symlink("train_step.onnx", arts / "eval.onnx")  # inside, but not the eval graph: refused by name
    with pytest.raises(ArtifactsError, match=r"train_step.onnx does not match .*manifest.json: the graph has "
                                             r"input\(s\) \['lr', .*\] that the manifest does not list"):
        gc.training.load(arts).eval
    (arts / "eval.onnx").unlink()
    (arts / "kept").mkdir()
    os.symlink("kept/eval.onnx", arts / "eval.onnx")  # a link that stays inside is fine
    shutil.copy(saved / "eval.onnx", arts / "kept" / "eval.onnx")
    assert [s.name for s in gc.training.load(arts).eval.outputs] == ["loss", "logits"]


@pytest.mark.parametrize("name", ["state.safetensors", "manifest.json"])
@pytest.mark.parametrize("link", ["symlink", "hard link"])
def test_the_state_and_manifest_must_be_the_folders_own_files(arts, name, link):
    """Graph files were confined to the folder; the state and the manifest were read wherever a
    link led (a Trainer took its params from the file outside)."""
    outside = arts.parent.parent / "x" / name
    shutil.move(arts / name, outside)
    (os.symlink if link == "symlink" else os.link)(outside, arts / name)
    expected = f"resolves to {outside}, outside the artifact directory" if link == "symlink" else "has 2 hard links"
    for load in (gc.training.load, lambda d: gc.Trainer(d, backend="numpy")):
        with pytest.raises(ArtifactsError, match=expected):
            load(arts)


def test_a_hard_linked_graph_file_is_refused(arts):
    os.link(arts.parent.parent / "x" / "evil.onnx", arts / "other.onnx")
    edit_manifest(arts, lambda m: m["graphs"]["inference"].update(file="other.onnx"))
    with pytest.raises(ArtifactsError, match="the inference graph file 'other.onnx' in the artifact directory .* "
                                             "has 2 hard links"):
        gc.training.load(arts)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.update({"step": t["step"].astype("float32")}), r"holds state 'step' as float32\[\], the training "
                                                                 r"graphs expect int64\[\]"),
    (lambda t: t.update({"lr": np.full(2, 0.1, "float32")}), r"holds hyper 'lr' as float32\[2\]"),
    (lambda t: t.update({k: v.astype("float64") for k, v in t.items() if k.endswith("weight")}),
     r"holds param '\S+weight' as float64"),
])
def test_a_state_file_that_does_not_fit_the_graphs_is_refused_at_open(arts, edit, message):
    """It trained in its own dtype (float64 params on numpy; a checkpoint no Trainer could load
    followed) or failed at the first step without naming the file."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(arts / "state.safetensors")
    edit(tensors)
    save_file(tensors, arts / "state.safetensors")
    for backend in ("numpy", "ort-cpu"):
        with pytest.raises(ArtifactsError, match=f"state.safetensors {message}"):
            gc.Trainer(arts, backend=backend)


def _drop_first_param_feed(m):
    out = next(k for k, v in m["feeds"].items() if v == m["trainable"][0])
    del m["feeds"][out]


@pytest.mark.parametrize("edit, message", [
    (_drop_first_param_feed, r"feeds gives the train_step param '\S+' 0 next values, not 1"),
    (lambda m: m["feeds"].update({next(iter(m["feeds"])): "nope"}),
     r"feeds maps '\S+' to 'nope', but train_step has no such"),
    (lambda m: m["trainable"].append("ghost"), r"trainable lists \['ghost'\] beyond train_step's params"),
    (lambda m: m["state"].remove(m["trainable"][0]), r"state lacks \['\S+'\] of what train_step carries"),
    (lambda m: m["layout"][0]["shapes"][0].reverse(), r"layout '\S+' holds '\S+' as \[\d+, \d+\], not a param"),
])
def test_a_manifest_that_contradicts_its_train_step_is_refused(arts, edit, message):
    """Edited by hand: without its feed a param never trained, silently; the others were accepted."""
    edit_manifest(arts, edit)
    for load in (gc.training.load, lambda d: gc.Trainer(d, backend="numpy")):
        with pytest.raises(ArtifactsError, match=f"manifest.json: the manifest contradicts itself: {message}"):
            load(arts)


def test_a_symlinked_artifact_directory_still_loads(arts):
    os.symlink(arts, arts.parent / "link")
    assert gc.training.load(arts.parent / "link").manifest.trainable


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a valid graphc training manifest: Invalid JSON"),
    ("[]", "not a valid graphc training manifest: Input should be an object"),
    ('{"format": "graphc.training/1", "opset": "seventeen"}', r"valid integer.* at opset \(and \d+ more error"),
])
def test_a_corrupt_manifest_is_one_clear_error(arts, content, message):
    (arts / "manifest.json").write_text(content)
    with pytest.raises(ArtifactsError, match=message) as info:
        gc.training.load(arts)
    assert str(arts / "manifest.json") in str(info.value) and "\n" not in str(info.value)


def test_missing_manifest_graphs_and_state_are_named(arts):
    edit_manifest(arts, lambda m: m["graphs"].pop("gradients"))
    with pytest.raises(ArtifactsError, match="lists no gradients graph"):
        gc.training.load(arts)
    (arts / "manifest.json").unlink()
    with pytest.raises(ArtifactsError, match="manifest.json: cannot read the manifest"):
        gc.training.load(arts)


def test_a_corrupt_state_file_is_named(arts):
    (arts / "state.safetensors").write_bytes(b"garbage")
    with pytest.raises(ArtifactsError, match=r"state\.safetensors: cannot read the initial state"):
        gc.training.load(arts)


def test_a_truncated_state_is_named_when_first_read(arts):
    """load reads the state's header only; tensors cut short fail where they are read (the
    Trainer reads them once its session holds the graph), naming the file and the tensor."""
    path = arts / "state.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    loaded = gc.training.load(arts)
    with pytest.raises(ArtifactsError, match=r"state\.safetensors: cannot read the initial state \(tensor '.+'"):
        loaded.state  # noqa: B018
    with pytest.raises(ArtifactsError, match=r"state\.safetensors: cannot read the initial state"):
        gc.Trainer(arts, backend="numpy")


def test_graphs_are_read_on_first_use_so_a_trainer_reads_only_train_step(arts):
    """Training reads train_step alone: the other graphs (each with its own copy of the
    weights) stay on disk until something asks for them."""
    from trainer_models import blobs

    (arts / "gradients.onnx").write_bytes(b"not an onnx model")
    (arts / "inference.onnx").write_bytes(b"not an onnx model")
    trainer = gc.Trainer(arts, backend="numpy")
    losses = [trainer.step(blobs(16, seed=i)) for i in range(3)]
    assert losses[-1] < losses[0]
    with pytest.raises(gc.ModelLoadError):
        trainer.artifacts.gradients  # noqa: B018 - the first use reads (and here fails)
    (arts / "eval.onnx").unlink()
    with pytest.raises(ArtifactsError, match="eval graph file 'eval.onnx' is missing"):
        gc.training.load(arts)
