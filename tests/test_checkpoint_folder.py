"""A checkpoint folder keeps the training graphs its tensors belong to: a save from other graphs
(a changed-optimizer resume on regenerated artifacts) replaces ``artifacts/`` with the checkpoint
as one step, and a failure or a kill at any point leaves a consistent pair
(``graphc.runtime.checkpoint_folder``)."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
from graphc.compile.training import read_manifest
from graphc.runtime import checkpoint as ckpt
from test_resume_changes import DATA, artifacts

ADAM, ADAMW = gc.optim.Adam(1e-2), gc.optim.AdamW(1e-2, weight_decay=0.1)


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def adam_checkpoint(path):
    """``path``: a checkpoint folder of 3 Adam steps, and a Trainer on AdamW graphs resumed from
    it with changed_optimizer and stepped once more (its next save replaces the graphs)."""
    first = gc.Trainer(artifacts(ADAM), backend="numpy")
    for batch in DATA[:3]:
        first.step(batch)
    first.save_checkpoint(path)
    resumed = gc.Trainer(artifacts(ADAMW), backend="numpy")
    resumed.load_checkpoint(path, changed_optimizer=True)
    resumed.step(DATA[3])
    return resumed


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_changed_optimizer_save_replaces_the_graphs_and_the_folder_resumes_exactly(tmp_path, backend):
    ck = tmp_path / "ck"
    first = gc.Trainer(artifacts(ADAM), backend=backend)
    for batch in DATA[:3]:
        first.step(batch)
    first.save_checkpoint(ck)
    resumed = gc.Trainer(artifacts(ADAMW), backend=backend)
    resumed.load_checkpoint(ck, changed_optimizer=True)
    resumed.step(DATA[3])
    resumed.save_checkpoint(ck)
    manifest = read_manifest(ck / "artifacts")
    assert manifest.optimizer == resumed.manifest.optimizer and manifest.optimizer["kind"] == "adamw"
    assert ckpt.read_meta(ck).graphs == manifest.digest() == resumed.manifest.digest()
    assert sorted(p.name for p in ck.iterdir()) == ["artifacts", "checkpoint.safetensors"]  # no temp left

    again = gc.Trainer(ck, backend=backend)  # refused before: "trained with adamw, these graphs train with adam"
    assert again.resumed_from == ck and again.step_count == 4
    for batch in DATA[4:]:
        resumed.step(batch)
        again.step(batch)
    for name, value in resumed.state_dict().items():
        assert again.state_dict()[name].tobytes() == value.tobytes(), name


def test_a_save_from_the_same_graphs_leaves_them_as_they_are(tmp_path):
    trainer = gc.Trainer(artifacts(ADAM), backend="numpy")
    trainer.step(DATA[0])
    trainer.save_checkpoint(tmp_path / "ck")
    graph = tmp_path / "ck" / "artifacts" / "train_step.onnx"
    before = graph.stat()
    trainer.step(DATA[1])
    trainer.save_checkpoint(tmp_path / "ck")
    assert (graph.stat().st_ino, graph.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("where", ["graphs", "checkpoint"])
def test_a_save_failing_mid_write_leaves_the_old_pair(tmp_path, monkeypatch, where):
    """A full disk while the new graphs are written, or while the checkpoint is: the folder holds
    the old checkpoint beside the old graphs, byte for byte, and no temp."""
    from graphc import fileio
    from graphc.compile import training

    ck = tmp_path / "ck"
    resumed = adam_checkpoint(ck)
    before = folder_bytes(ck)
    module, real = (training, training.write_synced) if where == "graphs" else (fileio, fileio.write_synced)

    def full_disk(path, data, *args):
        if path.name.startswith(".checkpoint.safetensors") or path.name == training.STATE_FILE:
            raise OSError(28, "No space left on device")
        return real(path, data, *args)

    monkeypatch.setattr(module, "write_synced", full_disk)
    with pytest.raises(OSError, match="No space left"):
        resumed.save_checkpoint(ck)
    assert folder_bytes(ck) == before and sorted(p.name for p in ck.iterdir()) == ["artifacts",
                                                                                  "checkpoint.safetensors"]
    assert gc.Trainer(ck, backend="numpy").step_count == 3  # the old pair resumes
    monkeypatch.setattr(module, "write_synced", real)
    resumed.save_checkpoint(ck)
    assert gc.Trainer(ck, backend="numpy").step_count == 4


KILLED = """
import os, sys
sys.path.insert(0, {tests!r})
import graphc as gc
from graphc.runtime import checkpoint, checkpoint_folder
from test_checkpoint_folder import adam_checkpoint
resumed = adam_checkpoint({ck!r})
if {committed}:  # killed once the checkpoint is written, before the graphs are renamed into place
    checkpoint_folder._put_in_place = lambda staged, final: os._exit(9)
else:  # killed once the new graphs are written, before the checkpoint is
    checkpoint.save = lambda *args: os._exit(9)
resumed.save_checkpoint({ck!r})
"""


@pytest.mark.parametrize("committed", [False, True], ids=["before-commit", "after-commit"])
def test_a_save_killed_mid_way_leaves_a_consistent_pair(tmp_path, committed):
    """SIGKILL-like exits in a real process: before the checkpoint is replaced, the new graphs'
    temp folder is dropped (the old pair resumes); after, they are put in place by the next
    look at the folder (the new pair resumes), where the old graphs would sit beside the new
    checkpoint and refuse it."""
    ck = tmp_path / "ck"
    script = KILLED.format(tests=str(Path(__file__).parent), ck=str(ck), committed=committed)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 9, done.stderr
    assert any(p.name.startswith(".artifacts.tmp-") for p in ck.iterdir())  # the killed writer's temp folder
    assert read_manifest(ck / "artifacts").optimizer["kind"] == "adam"
    trainer = gc.Trainer(ck, backend="numpy")
    assert trainer.step_count == (4 if committed else 3)
    assert trainer.manifest.optimizer["kind"] == ("adamw" if committed else "adam")
    assert sorted(p.name for p in ck.iterdir()) == ["artifacts", "checkpoint.safetensors"]
    trainer.step(DATA[4])  # and trains on
    assert np.isfinite(trainer.params["fc1.weight"]).all()


def test_old_graphs_a_killed_save_left_aside_are_removed(tmp_path):
    """A save killed after renaming the new graphs into place, before removing the old ones it
    had moved aside: the next look at the folder removes them, where they stayed for good (only a
    killed save's staged graphs made it look for them)."""
    trainer = gc.Trainer(artifacts(ADAM), backend="numpy")
    trainer.step(DATA[0])
    ck = tmp_path / "ck"
    trainer.save_checkpoint(ck)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    aside = ck / f".artifacts.old.tmp-1-{int(gone.stdout)}"  # the killed writer's pid: not running
    shutil.copytree(ck / "artifacts", aside)  # the graphs in place, the old ones still aside
    assert gc.Trainer(ck, backend="numpy").step_count == 1
    assert sorted(p.name for p in ck.iterdir()) == ["artifacts", "checkpoint.safetensors"]
