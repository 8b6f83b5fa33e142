"""What a killed save leaves is cleaned up, a run killed at a save's commit point resumes as the
uninterrupted one, a checkpoint of another model is never overwritten,
artifact graphs that do not match their manifest are refused, and the fused update's flat
buffers and the checkpoint file keep every tensor bit for bit."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphc as gc
from graphc.runtime import checkpoint as ckpt
from graphc.fileio import atomic_write, remove_stale_temps, scratch_dir
from cli_util import one_line_error, run_cli
from trainer_models import blobs, bn_artifacts, drop_bn_artifacts, imported_mlp

# Runs ``graphc`` code that SIGKILLs itself in the middle of writing: right after onnx_ir (or
# graphc's synced write) has written its first file into the temp.
KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import onnx_ir
    import graphc as gc
    from graphc import fileio

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    real = {"ir": onnx_ir.save, "synced": fileio.write_synced}
    def after(key):
        def write(*args, **kwargs):
            real[key](*args, **kwargs)
            killed()
        return write

    what, source, target = sys.argv[1:]
    if what == "artifacts":
        onnx_ir.save = after("ir")
        gc.training.load(source).save(target)
    else:
        fileio.write_synced = after("synced")
        trainer = gc.Trainer(source, backend="numpy")
        trainer.step({"x": __import__("numpy").ones((4, 8), "float32"), "y": __import__("numpy").zeros(4, "int64")})
        trainer.save_checkpoint(target)
""")


def kill_while_writing(tmp_path, what, source, target):
    script = tmp_path / "killed_writer.py"
    script.write_text(KILLED_WRITER)
    r = subprocess.run([sys.executable, script, what, source, target], capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return bn_artifacts().save(tmp_path_factory.mktemp("arts") / "arts")


def temps(folder):
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_a_killed_artifacts_save_leaves_a_named_temp_that_the_next_save_or_load_removes(tmp_path, saved):
    out = tmp_path / "out"
    kill_while_writing(tmp_path, "artifacts", saved, out)
    stale = temps(out)
    # every file is written into one temp folder first, named after the manifest, renamed in last
    assert len(stale) == 1 and stale[0].startswith(".manifest.json.tmp-")
    assert [p.name for p in (out / stale[0]).glob("*/train_step.onnx")] == ["train_step.onnx"]
    assert list(out.iterdir()) == [out / stale[0]]
    gc.training.load(saved).save(out)  # the next save removes it
    assert temps(out) == []
    kill_while_writing(tmp_path, "artifacts", saved, out)  # killed re-saving over complete artifacts
    stale = temps(out)
    assert len(stale) == 1
    # Not graphc's temps, or not stale: a living writer's (our parent's pid), another name's
    # pattern, a user's file that merely looks alike; and a stale temp in another folder.
    alive = f".manifest.json.tmp-1-{os.getppid()}"
    keep = [alive, ".manifest.json.tmp-x-1", "manifest.json.tmp-1-999999", ".manifest.json.tmp-1-0"]
    for name in keep:
        (out / name).mkdir()
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(out / stale[0], tmp_path / "elsewhere" / stale[0])
    gc.training.load(out)  # loading removes it too
    assert temps(out) == sorted(keep)
    assert temps(tmp_path / "elsewhere") == stale
    assert gc.training.load(out).train_step.inputs == gc.training.load(saved).train_step.inputs


def test_a_killed_checkpoint_save_keeps_the_previous_one_and_its_temp_is_removed(tmp_path, saved):
    ck = tmp_path / "ck"
    trainer = gc.Trainer(saved, backend="numpy")
    trainer.save_checkpoint(ck)  # step 0, artifacts/ beside it
    kill_while_writing(tmp_path, "checkpoint", ck, ck)  # a run resumed from it, killed saving step 1
    stale = temps(ck)
    assert len(stale) == 1 and stale[0].startswith(".checkpoint.safetensors.tmp-")
    assert ckpt.read_meta(ck).step == 0
    ckpt.load(ck)  # loading removes it too
    assert temps(ck) == []
    # killed while a fresh checkpoint folder gets its artifacts/: a temp folder, no half artifacts/
    kill_while_writing(tmp_path, "checkpoint", saved, tmp_path / "fresh")
    stale = temps(tmp_path / "fresh")
    assert len(stale) == 1 and stale[0].startswith(".artifacts.tmp-") and not (tmp_path / "fresh" / "artifacts").exists()
    trainer.save_checkpoint(tmp_path / "fresh")
    assert temps(tmp_path / "fresh") == [] and (tmp_path / "fresh" / "artifacts" / "manifest.json").is_file()


# Trains 3 epochs of 7 steps with a checkpoint every 4 steps, TensorBoard and a log, and SIGKILLs
# itself at the commit point of step 8's save: right before or right after the checkpoint file's
# rename over step 7's (epoch 1's end; step 4's before it).
KILLED_AT_COMMIT = textwrap.dedent("""
    import os, signal, sys
    import graphc as gc
    from graphc import fileio
    sys.path.insert(0, sys.argv[4])
    from test_checkpoint_safety import fit

    when, arts, root = sys.argv[1], sys.argv[2], sys.argv[3]
    real, renames = os.replace, []

    def replace(src, dst):
        renames.append(dst) if str(dst).endswith("checkpoint.safetensors") else None
        commit = len(renames) == 3  # step 8's: after step 4's and epoch 1's
        if commit and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)
        if commit:
            os.kill(os.getpid(), signal.SIGKILL)

    fileio.os.replace = replace
    fit(gc.Trainer(arts, backend=sys.argv[5], seed=4, tensorboard=root + "/tb"), root, checkpoint=root + "/ck",
        checkpoint_every=4)
""")


def fit(trainer, root, **kwargs):
    """3 epochs of 7 steps (100 rows, the last batch 4), shuffled, with an eval set, a log and Dropout."""
    return trainer.fit(gc.data.DataLoader(blobs(100), batch_size=16, seed=3), 3, progress=False, quiet=True,
                       eval_loader=gc.data.DataLoader(blobs(40, seed=1), 64, shuffle=False),
                       log=f"{root}/log.jsonl", **kwargs)


def board_and_log(root):
    """The TensorBoard scalars as TensorBoard shows ``root/tb`` (tag -> (step, value)), and the log's
    rows less their times."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(root / "tb"))
    acc.Reload()
    rows = [json.loads(line) for line in (root / "log.jsonl").read_text().splitlines()]
    return ({tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]},
            [{k: v for k, v in row.items() if k not in ("seconds", "samples_per_s")} for row in rows])


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_run_killed_at_a_saves_commit_point_resumes_as_the_uninterrupted_one(tmp_path, backend, when):
    """Killed right before step 8's checkpoint replaces step 7's (epoch 1's end), the run resumes
    from step 7, after it from step 8; either way the params, optimizer state and BatchNorm statistics equal the
    uninterrupted run's bit for bit, and its log and TensorBoard scalars (those written past the
    checkpoint, then again, shown once) are the uninterrupted run's."""
    pytest.importorskip("tensorboard", reason="tensorboard is a dev extra")
    arts = drop_bn_artifacts(gc.optim.AdamW(1e-2, weight_decay=0.1)).save(tmp_path / "arts")
    straight = gc.Trainer(arts, backend=backend, seed=4, tensorboard=tmp_path / "straight" / "tb")
    fit(straight, tmp_path / "straight")
    script = tmp_path / "killed_at_commit.py"
    script.write_text(KILLED_AT_COMMIT)
    run = tmp_path / "run"
    r = subprocess.run([sys.executable, script, when, arts, run, os.path.dirname(__file__), backend],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    # TensorBoard reads a folder's event files in name order, named by the second they were made in:
    # the resumed run's must come after the killed one's (a run that lived under a second: a test's)
    made = max(int(p.name.split(".")[3]) for p in (run / "tb").glob("events.*"))
    time.sleep(max(0.0, made + 1 - time.time()))
    resumed = gc.Trainer(run / "ck", backend=backend, tensorboard=run / "tb")
    assert resumed.step_count == (7 if when == "before" else 8) and temps(run / "ck") == []
    fit(resumed, run, checkpoint=run / "ck")
    for name, value in straight.state_dict().items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name
    del straight, resumed  # their TensorBoard writers closed
    want, got = board_and_log(tmp_path / "straight"), board_and_log(run)
    assert [step for step, _ in got[0]["train/loss"]] == list(range(1, 22))
    assert got == want


def test_a_checkpoint_folder_whose_file_or_artifacts_lead_outside_is_refused(tmp_path, saved):
    trainer = gc.Trainer(saved, backend="numpy")
    ck = tmp_path / "ck"
    trainer.save_checkpoint(ck)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(ck / ckpt.FILE_NAME, outside / ckpt.FILE_NAME)
    os.symlink(outside / ckpt.FILE_NAME, ck / ckpt.FILE_NAME)
    for read in (ckpt.load, ckpt.read_meta, trainer.load_checkpoint, lambda p: gc.Trainer(p, backend="numpy")):
        with pytest.raises(ckpt.CheckpointError, match="'checkpoint.safetensors' resolves to .*outside/checkpoint.safetensors, outside the "
                                                       "checkpoint folder"):
            read(ck)
    (ck / ckpt.FILE_NAME).unlink()
    shutil.move(outside / ckpt.FILE_NAME, ck / ckpt.FILE_NAME)
    shutil.move(ck / ckpt.ARTIFACTS_DIR, outside / ckpt.ARTIFACTS_DIR)
    os.symlink(outside / ckpt.ARTIFACTS_DIR, ck / ckpt.ARTIFACTS_DIR)
    with pytest.raises(ckpt.CheckpointError, match="'artifacts' resolves to .*, outside the checkpoint folder"):
        gc.Trainer(ck, backend="numpy")


def test_remove_stale_temps_needs_the_exact_pattern(tmp_path):
    target = tmp_path / "m.onnx"
    names = [".m.onnx.tmp-3-999999999", ".m.onnx.tmp-3-999999999.bak", ".m.onnxx.tmp-3-999999999", ".m.onnx.tmp--999999999"]
    for name in names:
        (tmp_path / name).write_text("")
    remove_stale_temps(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


def test_a_failed_write_into_a_scratch_folder_names_the_target(tmp_path):
    # the error named the temp folder (.arts.tmp-<tid>-<pid>/sub/f), which the user never asked for
    with pytest.raises(FileNotFoundError) as err, scratch_dir(tmp_path / "arts") as scratch:
        open(scratch / "sub" / "f", "wb")
    assert err.value.filename == str(tmp_path / "arts" / "sub" / "f") and ".tmp-" not in str(err.value)
    assert type(err.value.__cause__) is FileNotFoundError and os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be created")
@pytest.mark.parametrize("write", [lambda p: atomic_write(p, b"x"), lambda p: scratch_dir(p).__enter__()],
                         ids=["atomic_write", "scratch_dir"])
def test_a_target_that_cannot_be_created_is_named_not_its_temp(write):
    with pytest.raises(FileNotFoundError) as err:
        write("/proc/graphc-out")
    assert err.value.filename == "/proc/graphc-out" and ".tmp-" not in str(err.value)


def mlp_artifacts():
    return gc.training.generate(gc.load(imported_mlp()), gc.losses.cross_entropy("logits", label="y"), gc.optim.Adam(0.01))


def test_training_into_another_models_checkpoint_is_refused_before_the_first_step(tmp_path, capsys):
    theirs = gc.Trainer(mlp_artifacts(), backend="numpy")
    theirs.save_checkpoint(tmp_path / "ck")
    before = (tmp_path / "ck" / ckpt.FILE_NAME).read_bytes()
    ours = gc.Trainer(bn_artifacts(), backend="numpy")
    loader = gc.data.DataLoader(blobs(32), batch_size=16)
    with pytest.raises(ckpt.CheckpointError, match=r"ck belongs to other training graphs \(another model\?\): "
                                                   r".*checkpoint.safetensors has no param 'fc1.weight'"):
        ours.fit(loader, 1, progress=False, checkpoint=tmp_path / "ck")
    with pytest.raises(ckpt.CheckpointError, match="belongs to other training graphs"):
        ours.save_checkpoint(tmp_path / "ck")
    assert ours.step_count == 0 and (tmp_path / "ck" / ckpt.FILE_NAME).read_bytes() == before
    # a folder holding only the other model's training graphs is theirs too
    (tmp_path / "ck" / ckpt.FILE_NAME).unlink()
    with pytest.raises(ckpt.CheckpointError, match=r"artifacts/manifest.json has no param 'fc1.weight'"):
        ours.save_checkpoint(tmp_path / "ck")
    # the same training graphs, a checkpoint from another run: overwritten as before (the API's choice)
    gc.Trainer(bn_artifacts(), backend="numpy").save_checkpoint(tmp_path / "mine.safetensors")
    ours.fit(loader, 1, progress=False, checkpoint=tmp_path / "mine.safetensors")
    assert ckpt.read_meta(tmp_path / "mine.safetensors").step == 2

    bn_artifacts().save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", **blobs(32))
    args = ["train", tmp_path / "arts", "--data", tmp_path / "data.npz", "--epochs", 1, "--batch-size", 16,
            "--backend", "numpy", "--no-progress", "--checkpoint", tmp_path / "ck"]
    assert "artifacts/manifest.json has no param 'fc1.weight'" in one_line_error(run_cli(capsys, *args))
    theirs.save_checkpoint(tmp_path / "ck")
    for extra in ([], ["--resume"]):  # named before anything is loaded, not "pass --resume"
        err = one_line_error(run_cli(capsys, *args, *extra))
        assert "belongs to other training graphs" in err and "checkpoint.safetensors has no param 'fc1.weight'" in err
    assert (tmp_path / "ck" / ckpt.FILE_NAME).read_bytes() == before


def test_a_checkpoint_is_never_written_into_an_artifacts_folder(tmp_path, capsys):
    """fit(checkpoint=<the artifacts folder itself>) wrote checkpoint.safetensors and a second
    copy of the graphs (artifacts/) into it, and gc.Trainer(folder), reading the artifacts there,
    silently started again from step 0. A checkpoint file may not go into a folder of training
    artifacts (one holding manifest.json): refused before the first step, by the Trainer and by
    `graphc train`; a sub-folder of it is a checkpoint folder like any other."""
    arts = bn_artifacts().save(tmp_path / "arts")
    listing = sorted(p.name for p in arts.iterdir())
    trainer = gc.Trainer(arts, backend="numpy")
    loader = gc.data.DataLoader(blobs(32), batch_size=16)
    for target in (arts, arts / ckpt.FILE_NAME, arts / "one.safetensors"):
        with pytest.raises(ckpt.CheckpointError, match=rf"{target.name}: a checkpoint is not written into a folder of "
                                                       r"training artifacts \(.*arts holds manifest\.json\), where "
                                                       r"gc\.Trainer\(folder\) would start from the artifacts"):
            trainer.fit(loader, 1, progress=False, checkpoint=target)
        with pytest.raises(ckpt.CheckpointError, match="a checkpoint is not written into a folder of training"):
            trainer.save_checkpoint(target)
    assert trainer.step_count == 0 and sorted(p.name for p in arts.iterdir()) == listing
    trainer.fit(loader, 1, progress=False, checkpoint=arts / "ck")
    assert gc.Trainer(arts / "ck", backend="numpy").step_count == 2
    np.savez(tmp_path / "data.npz", **blobs(32))
    err = one_line_error(run_cli(capsys, "train", arts, "--data", tmp_path / "data.npz", "--epochs", 1, "--batch-size",
                                 16, "--backend", "numpy", "--no-progress", "--checkpoint", arts))
    assert "a checkpoint is not written into a folder of training artifacts" in err


def test_an_artifacts_folder_with_another_models_train_step_is_refused(tmp_path, saved, capsys):
    arts = shutil.copytree(saved, tmp_path / "arts")
    mlp_artifacts().save(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "train_step.onnx", arts / "train_step.onnx")
    np.savez(tmp_path / "data.npz", **blobs(32))
    r = run_cli(capsys, "train", arts, "--data", tmp_path / "data.npz", "--epochs", 1, "--batch-size", 16,
                "--backend", "ort-cpu", "--no-progress")
    assert "ArtifactsError" in one_line_error(r) and "train_step.onnx does not match" in r.err
    assert "the graph has no input 'fc1.weight'" in r.err
    # same names, another shape: x as [N, 5]
    model = onnx.load(saved / "eval.onnx")
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 5
    onnx.save(model, arts / "eval.onnx")
    with pytest.raises(gc.errors.ArtifactsError, match=r"eval.onnx does not match .*: input 'x' is float32\['N', 5\] in "
                                                       r"the graph, float32\['N', 8\] in the manifest"):
        gc.training.load(arts).eval


@pytest.fixture(scope="module")
def fused():
    arts = bn_artifacts(gc.optim.Adam(1e-2, weight_decay=0.1))
    assert arts.manifest.layout  # the fused update: optimizer state in flat buffers
    return arts.manifest


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_pack_unpack_and_checkpoints_keep_every_bit(fused, tmp_path_factory, seed):
    """Random bit patterns (NaN payloads, -0.0, subnormals included) per carried tensor."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, entry in fused.carried().items():
        dtype = np.dtype(gc.model.dtypes.to_numpy(entry.dtype))
        shape = tuple(entry.shape)
        raw = rng.integers(0, 256, size=int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, dtype=np.uint8)
        tensors[name] = raw.view(dtype).reshape(shape)
    packed = fused.pack(tensors)
    assert set(packed) == {e.name for e in fused.graphs["train_step"].inputs if e.role in ("param", "state", "hyper")}
    back = fused.unpack(packed)
    assert sorted(back) == sorted(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape
        assert back[name].tobytes() == value.tobytes(), name
    path = tmp_path_factory.mktemp("bits") / "c.safetensors"
    ckpt.save(path, back, ckpt.CheckpointMeta(step=1))
    loaded, _ = ckpt.load(path)
    assert all(loaded[n].tobytes() == v.tobytes() and loaded[n].dtype == v.dtype for n, v in tensors.items())
