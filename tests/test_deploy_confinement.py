"""gc.deploy.triton writes only inside the repository: no symlink followed, names checked in
full, a redeploy adds a version above the highest, and a failure leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import threading

import onnx
import pytest

import graphc as gc
from graphc.serving import deploy
from cli_util import one_line_error, run_cli
from serve_util import fixed_model, mixed_model, parse_pbtxt


def tree(folder) -> dict[str, bytes | None]:
    """Every path under ``folder`` (symlinks as their target text) with the bytes of files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                out[rel] = os.readlink(path).encode()
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    out[rel] = f.read()
            else:
                out[rel] = None
    return out


@pytest.fixture
def layout(tmp_path):
    """A repository and a folder beside it that must stay untouched."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("untouched")
    return repo, outside


def test_a_symlinked_model_folder_is_refused(layout, capsys, tmp_path):
    repo, outside = layout
    os.symlink("../outside", repo / "net")
    before = tree(outside)
    with pytest.raises(gc.GraphError, match="not a plain folder inside the repository"):
        gc.deploy.triton(mixed_model(), repo, "net")
    assert tree(outside) == before
    onnx.save(mixed_model(), str(tmp_path / "m.onnx"))
    err = one_line_error(run_cli(capsys, "deploy", "triton", tmp_path / "m.onnx", "--repo", repo, "--name", "net"))
    assert "symlink" in err
    assert tree(outside) == before and os.path.islink(repo / "net")


def test_a_dangling_symlink_or_a_file_where_the_folder_goes_is_refused(layout):
    repo, outside = layout
    os.symlink("../outside/new", repo / "net")
    (repo / "file").write_text("x")
    for name in ("net", "file"):
        with pytest.raises(gc.GraphError, match="refusing to write there"):
            gc.deploy.triton(mixed_model(), repo, name)
    assert not (outside / "new").exists() and (repo / "file").read_text() == "x"


def test_symlinks_inside_a_model_folder_are_never_written_through(layout):
    repo, outside = layout
    (repo / "net").mkdir()
    os.symlink("../../outside", repo / "net" / "1")  # a version folder pointing out
    os.symlink("../../outside/keep.txt", repo / "net" / "config.pbtxt")
    before = tree(outside)
    folder = gc.deploy.triton(mixed_model(), repo, "net")
    assert tree(outside) == before
    assert sorted(os.listdir(folder)) == ["1", "2", "config.pbtxt"]
    assert not os.path.islink(folder / "config.pbtxt") and (folder / "2" / "model.onnx").is_file()
    assert parse_pbtxt((folder / "config.pbtxt").read_text())["name"] == ["net"]


@pytest.mark.parametrize("name", ["net\n", "net\r", "a" * 129, "a" * 300, "a/b", "..", ".", ".hidden", "-x",
                                  "", "net\x00", "ne t", "név", "a\\b"])
def test_bad_names_are_refused_before_anything_is_written(layout, capsys, tmp_path, name):
    repo, _ = layout
    with pytest.raises(ValueError, match="plain folder name"):
        gc.deploy.triton(mixed_model(), repo, name)
    if "\x00" not in name:  # a NUL cannot pass through argv
        onnx.save(mixed_model(), str(tmp_path / "m.onnx"))
        err = one_line_error(run_cli(capsys, "deploy", "triton", tmp_path / "m.onnx", "--repo", repo, "--name", name))
        assert "plain folder name" in err and len(err) < 400
    assert os.listdir(repo) == []


def test_the_longest_name_is_accepted(layout):
    repo, _ = layout
    assert gc.deploy.triton(mixed_model(), repo, "a" * 128).name == "a" * 128


def test_redeploy_writes_above_the_highest_version(layout, capsys, tmp_path):
    repo, _ = layout
    gc.deploy.triton(mixed_model(), repo, "net")
    (repo / "net" / "2").mkdir()
    (repo / "net" / "2" / "model.onnx").write_bytes(b"old version 2")
    onnx.save(fixed_model(), str(tmp_path / "f.onnx"))
    result = run_cli(capsys, "deploy", "triton", tmp_path / "f.onnx", "--repo", repo, "--name", "net")
    assert result.code == 0, result.err
    assert "version 3" in result.out and "versions 1, 2 kept" in result.out
    assert (repo / "net" / "2" / "model.onnx").read_bytes() == b"old version 2"
    assert onnx.load(str(repo / "net" / "3" / "model.onnx")).graph.input[0].name == "x"
    assert gc.deploy.triton_versions(repo / "net") == [1, 2, 3]
    assert parse_pbtxt((repo / "net" / "config.pbtxt").read_text())["input"][0]["name"] == ["x"]


def test_a_failed_deploy_leaves_the_repository_as_it_was(layout, monkeypatch):
    repo, _ = layout

    def broken_save(self, path, **kwargs):
        path.write_bytes(b"half a model")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(gc.Model, "save", broken_save)
        with pytest.raises(gc.GraphError, match="No space left on device"):
            gc.deploy.triton(mixed_model(), repo, "net")
        assert os.listdir(repo) == []  # a new model: its folder goes too
    gc.deploy.triton(mixed_model(), repo, "net")
    before = tree(repo)
    with monkeypatch.context() as patch:
        patch.setattr(gc.Model, "save", broken_save)
        with pytest.raises(gc.GraphError):
            gc.deploy.triton(fixed_model(), repo, "net")
    assert tree(repo) == before  # a redeploy: version 1 and its config untouched, no temporaries
    (repo / "net" / "config.pbtxt").unlink()
    (repo / "net" / "config.pbtxt").mkdir()  # the config cannot be replaced: the new version goes
    with pytest.raises(gc.GraphError, match="cannot write model 'net'"):
        gc.deploy.triton(fixed_model(), repo, "net")
    assert sorted(os.listdir(repo / "net")) == ["1", "config.pbtxt"]


def test_a_failed_first_deploy_keeps_what_a_concurrent_deploy_wrote(layout, monkeypatch):
    repo, _ = layout
    save = gc.Model.save
    calls = []

    def save_then_fail(self, path, **kwargs):
        calls.append(path)
        if len(calls) > 1:
            return save(self, path, **kwargs)
        # while this deploy writes, another thread's deploy of the name completes
        other = threading.Thread(target=gc.deploy.triton, args=(fixed_model(), repo, "net"))
        other.start()
        other.join()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gc.Model, "save", save_then_fail)
    with pytest.raises(gc.GraphError, match="No space left on device"):
        gc.deploy.triton(mixed_model(), repo, "net")
    assert sorted(os.listdir(repo / "net")) == ["1", "config.pbtxt"]
    assert onnx.load(str(repo / "net" / "1" / "model.onnx")).graph.input[0].name == "x"


def race(repo, count: int = 6) -> list[object]:
    """``count`` threads deploying one new name at once; what each returned or raised."""
    barrier, results = threading.Barrier(count), []

    def deploy(model):
        barrier.wait()
        try:
            results.append(gc.deploy.triton(model, repo, "net"))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            results.append(exc)

    threads = [threading.Thread(target=deploy, args=(mixed_model() if i % 2 else fixed_model(),)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_concurrent_deploys_of_a_new_name_each_get_their_own_version(layout):
    repo, _ = layout
    assert race(repo) == [repo / "net"] * 6
    assert sorted(os.listdir(repo / "net")) == ["1", "2", "3", "4", "5", "6", "config.pbtxt"]
    for version in range(1, 7):
        assert onnx.load(str(repo / "net" / str(version) / "model.onnx")).graph.input[0].name == "x"


def test_without_the_lock_a_taken_version_number_is_skipped(layout, monkeypatch):
    # Windows has no flock, and other tools writing versions take none: the rename retries.
    repo, _ = layout
    monkeypatch.setattr(deploy, "_repository_lock", lambda root: contextlib.nullcontext())
    assert race(repo) == [repo / "net"] * 6
    assert gc.deploy.triton_versions(repo / "net") == [1, 2, 3, 4, 5, 6]
