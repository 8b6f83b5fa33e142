"""Trainer checkpoints: resuming reproduces the uninterrupted run's losses bit for bit."""

import sys

import numpy as np
import pytest

import graphc as gc
from graphc.runtime import checkpoint as ckpt
from graphc.runtime.checkpoint import CheckpointError
from graphc.errors import MissingDependency
from graphc.passes.training.adam_moments import FIRST, MAX_SECOND, SECOND
from trainer_models import blobs, bn_artifacts, interrupt_at


def batches(n=12, size=16):
    return [blobs(size, seed=i) for i in range(n)]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_step_level_resume_is_bit_exact(tmp_path, backend):
    arts = bn_artifacts(gc.optim.Adam(1e-2))  # Adam: optimizer state + step count matter
    data = batches()
    straight = gc.Trainer(arts, backend=backend)
    expected = [straight.step(b) for b in data]

    first = gc.Trainer(arts, backend=backend)
    got = [first.step(b) for b in data[:5]]
    first.save_checkpoint(tmp_path / "ck")
    del first
    second = gc.Trainer(arts, backend=backend)
    second.load_checkpoint(tmp_path / "ck")
    assert second.step_count == 5
    got += [second.step(b) for b in data[5:]]
    assert got == expected  # exact float equality, not a tolerance
    for name, value in straight.state_dict().items():
        assert second.state_dict()[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("averaged", [(FIRST, SECOND, MAX_SECOND), (SECOND, MAX_SECOND)], ids=["format 3", "format 5"])
def test_a_checkpoint_with_the_moments_as_averages_resumes(tmp_path, averaged):
    """Checkpoints of artifacts before format 6 hold Adam's second moment as PyTorch's
    ``exp_avg_sq`` (and amsgrad's ``max_exp_avg_sq``), before format 4 the first too
    (``exp_avg``); the Trainer of today's graphs takes each as its sum, the average over
    ``1 - beta``."""
    spec = gc.optim.Adam(1e-2, betas=(0.8, 0.99), amsgrad=True)
    arts, data = bn_artifacts(spec), batches()
    straight = gc.Trainer(arts, backend="ort-cpu")
    expected = [straight.step(b) for b in data]
    first = gc.Trainer(arts, backend="ort-cpu")
    got = [first.step(b) for b in data[:5]]
    tensors, meta = ckpt.load(first.save_checkpoint(tmp_path / "now"))
    renames = {f".{total}": (f".{average}", np.float32(1 - spec.betas[beta])) for total, average, beta in averaged}
    sums = {n: v for n, v in tensors.items() if n.endswith(tuple(renames))}
    assert len(sums) == 6 * len(averaged)  # 6 params
    roles = dict(meta.roles)
    for name, value in sums.items():  # written as an earlier format's Trainer wrote them
        suffix = next(s for s in renames if name.endswith(s))
        old = name.removesuffix(suffix) + renames[suffix][0]
        tensors[old], roles[old] = value * renames[suffix][1], roles.pop(name)
        del tensors[name]
    ckpt.save(tmp_path / "before", tensors, meta.model_copy(update={"roles": roles}))
    second = gc.Trainer(arts, backend="ort-cpu")
    second.load_checkpoint(tmp_path / "before")
    for name, value in sums.items():  # rounded once, by the conversion
        np.testing.assert_allclose(second.state_dict()[name], value, rtol=1e-6, err_msg=name)
    got += [second.step(b) for b in data[5:]]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    second.save_checkpoint(tmp_path / "before")  # its own checkpoint, as today's graphs name it
    assert set(ckpt.load(tmp_path / "before")[0]) == set(ckpt.load(tmp_path / "now")[0])


def test_fit_resume_mid_epoch_replays_the_same_batches(tmp_path):
    arts = bn_artifacts(gc.optim.SGD(0.05, momentum=0.9))
    data = blobs(100)
    make_loader = lambda: gc.data.DataLoader(data, batch_size=16, seed=3)  # noqa: E731
    expected = gc.Trainer(arts, backend="ort-cpu").fit(make_loader(), 3, progress=False).step_losses

    interrupted = gc.Trainer(arts, backend="ort-cpu")
    # the 10th step of the run never happens: "killed" mid-epoch 2
    calls = interrupt_at(interrupted, 9)
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(make_loader(), 3, progress=False, checkpoint=tmp_path / "ck")  # saves after epoch 1
    assert (interrupted.epoch, interrupted.batch_in_epoch) == (1, 2)
    interrupted.save_checkpoint(tmp_path / "ck")  # what an interrupt handler does

    resumed = gc.Trainer(tmp_path / "ck", backend="ort-cpu")  # a checkpoint dir holds its graphs
    assert (resumed.epoch, resumed.batch_in_epoch, resumed.step_count) == (1, 2, 9)
    rest = resumed.fit(make_loader(), 3, progress=False).step_losses
    assert calls + rest == expected


def test_checkpoint_from_other_graphs_or_corrupted_is_refused(tmp_path):
    trainer = gc.Trainer(bn_artifacts(gc.optim.Adam(1e-2)), backend="ort-cpu")
    trainer.step(blobs(16))
    path = trainer.save_checkpoint(tmp_path / "adam.safetensors")
    other = gc.Trainer(bn_artifacts(gc.optim.SGD(0.1)), backend="ort-cpu")
    other.save_checkpoint(tmp_path / "sgd.safetensors")
    with pytest.raises(CheckpointError, match="trained with sgd, these training graphs train with adam"):
        gc.Trainer(bn_artifacts(gc.optim.Adam(1e-2)), backend="ort-cpu").load_checkpoint(tmp_path / "sgd.safetensors")
    # more than the graphs carry: the extra tensors were dropped and the rest resumed
    with pytest.raises(CheckpointError, match=r"adam state \(exp_sum, exp_sum_sq\) does not fit the optimizer state "
                       r"these training graphs' sgd keeps \(none\)"):
        other.load_checkpoint(path, changed_optimizer=True)  # past the kinds: the state
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x55
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted"):
        other.load_checkpoint(path)


def test_checkpoint_holds_rng_and_loop_position(tmp_path):
    trainer = gc.Trainer(bn_artifacts(), backend="numpy", seed=5)
    trainer.rng.random(3)
    trainer.fit(gc.data.DataLoader(blobs(40), batch_size=16), 1, progress=False)
    trainer.save_checkpoint(tmp_path / "ck")
    expected = trainer.rng.random(4)
    restored = gc.Trainer(bn_artifacts(), backend="numpy", seed=99)
    restored.load_checkpoint(tmp_path / "ck")
    np.testing.assert_array_equal(restored.rng.random(4), expected)
    assert (restored.step_count, restored.epoch, restored.batch_in_epoch) == (3, 1, 0)
    assert (tmp_path / "ck" / "artifacts" / "manifest.json").is_file()


def test_trainer_from_a_checkpoint_file_finds_the_recorded_artifacts(tmp_path):
    bn_artifacts().save(tmp_path / "arts")
    trainer = gc.Trainer(tmp_path / "arts", backend="ort-cpu")
    trainer.step(blobs(16))
    trainer.save_checkpoint(tmp_path / "one.safetensors")
    resumed = gc.Trainer(tmp_path / "one.safetensors", backend="ort-cpu")
    assert resumed.step_count == 1 and resumed.artifacts_path == (tmp_path / "arts").resolve()
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value)


def test_a_checkpoint_file_of_in_memory_artifacts_says_how_to_load_it(tmp_path):
    """A checkpoint file saved from artifacts held in memory records no artifacts folder: gc.Trainer
    given it said "no training artifacts here (no manifest.json)", as for any folder. It says what
    the file is and how to load it; so it does when the folder it records is gone."""
    arts = bn_artifacts()
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.step(blobs(16))
    trainer.save_checkpoint(tmp_path / "one.safetensors")
    with pytest.raises(FileNotFoundError, match=r"one\.safetensors is a checkpoint that records no training "
                                                r"artifacts \(saved from artifacts held in memory\); load it into a "
                                                r"Trainer of its artifacts: trainer = gc\.Trainer\(artifacts\); "
                                                r"trainer\.load_checkpoint\('.*one\.safetensors'\)"):
        gc.Trainer(tmp_path / "one.safetensors", backend="numpy")
    resumed = gc.Trainer(arts, backend="numpy")
    resumed.load_checkpoint(tmp_path / "one.safetensors")
    assert resumed.step_count == 1
    arts.save(tmp_path / "arts")
    gc.Trainer(tmp_path / "arts", backend="numpy").save_checkpoint(tmp_path / "two.safetensors")
    (tmp_path / "arts" / "manifest.json").rename(tmp_path / "arts" / "moved.json")
    with pytest.raises(FileNotFoundError, match=r"two\.safetensors is a checkpoint of the training artifacts in "
                                                r".*arts, which hold none now \(no manifest\.json\); load it into"):
        gc.Trainer(tmp_path / "two.safetensors", backend="numpy")


def test_an_unwritable_checkpoint_or_plot_fails_before_the_first_step(tmp_path, monkeypatch):
    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    loader = gc.data.DataLoader(blobs(32), batch_size=16)
    (tmp_path / "ck" / "checkpoint.safetensors").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="checkpoint.safetensors is a directory, not a checkpoint file"):
        trainer.fit(loader, 1, progress=False, checkpoint=tmp_path / "ck")
    with pytest.raises(CheckpointError, match="is a directory"):
        trainer.save_checkpoint(tmp_path / "ck")
    assert not (tmp_path / "ck" / "artifacts").exists()  # nothing written beside the bad target
    with pytest.raises(ValueError, match="matplotlib writes no 'bmpx' images"):
        trainer.fit(loader, 1, progress=False, plot=tmp_path / "loss.bmpx")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backend_bases", None)
    with pytest.raises(MissingDependency, match="needs matplotlib"):
        trainer.fit(loader, 1, progress=False, plot=tmp_path / "loss.png")
    assert trainer.step_count == 0


@pytest.mark.parametrize("fail_at", [1, 4])
def test_a_save_failing_for_want_of_space_names_the_step_lost_and_the_checkpoint_kept(tmp_path, monkeypatch, fail_at):
    """A full disk mid-run (the ``fail_at``-th file written fails with ENOSPC: the first save's
    graphs, or the second checkpoint) was one bare "[Errno 28] No space left on device", naming
    neither the checkpoint nor what it still held. The error, still an OSError of that errno, now
    names both; the checkpoint kept resumes as the run was at its step, bit for bit."""
    import errno

    from graphc import fileio

    data, written = blobs(48), []

    def full(path, *args, **kwargs):
        written.append(path)
        if len(written) == fail_at:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, *args, **kwargs)

    real = fileio.write_synced
    monkeypatch.setattr(fileio, "write_synced", full)
    monkeypatch.setattr("graphc.compile.training.write_synced", full, raising=False)
    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    with pytest.raises(OSError) as caught:
        trainer.fit(gc.data.DataLoader(data, batch_size=16, seed=1), 2, progress=False, checkpoint=tmp_path / "ck",
                    checkpoint_every=1)
    monkeypatch.undo()
    target = tmp_path / "ck" / "checkpoint.safetensors"
    assert caught.value.errno == errno.ENOSPC
    if fail_at == 1:  # the graphs beside the first checkpoint: nothing there, no folder left behind
        assert str(caught.value).endswith("no checkpoint was written there") and not (tmp_path / "ck").exists()
        return
    assert f"cannot save the checkpoint of step 2 to {target} (No space left on device); the checkpoint there, of " \
           "step 1, is as it was and resumes" in str(caught.value)
    resumed = gc.Trainer(tmp_path / "ck", backend="numpy")
    assert resumed.step_count == 1
    resumed.fit(gc.data.DataLoader(data, batch_size=16, seed=1), 2, progress=False)
    whole = gc.Trainer(bn_artifacts(), backend="numpy")
    whole.fit(gc.data.DataLoader(data, batch_size=16, seed=1), 2, progress=False)
    for name, value in whole.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


def test_a_save_failing_on_a_disk_that_fails_the_read_back_too_keeps_the_saves_error(tmp_path, monkeypatch):
    """An I/O error saving, then another reading what the path holds (to say what was kept), raised the read's bare
    "[Errno 5]" from inside the handler; the save's error names the step and that the path could not be read."""
    import errno

    from graphc import fileio
    from graphc.runtime import checkpoint as ckpt

    data = blobs(48)
    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    trainer.fit(gc.data.DataLoader(data, batch_size=16, seed=1), 1, progress=False, checkpoint=tmp_path / "ck")

    failed, real = [], ckpt.read_header

    def failing(*args, **kwargs):
        failed.append(args)
        raise OSError(errno.EIO, "Input/output error")

    def read(*args, **kwargs):  # the reads before the save (whose checkpoint is it?) pass
        return failing(*args) if failed else real(*args, **kwargs)

    monkeypatch.setattr(fileio, "write_synced", failing)
    monkeypatch.setattr("graphc.compile.training.write_synced", failing, raising=False)
    monkeypatch.setattr(ckpt, "read_header", read)
    with pytest.raises(OSError) as caught:
        trainer.save_checkpoint(tmp_path / "ck")
    assert caught.value.errno == errno.EIO
    assert str(caught.value).endswith("cannot save the checkpoint of step 3 to "
                                      f"{tmp_path / 'ck' / 'checkpoint.safetensors'} (Input/output error); what is "
                                      "there could not be read back (Input/output error)"), str(caught.value)


def test_resuming_with_other_data_of_the_same_length_is_named(tmp_path):
    """README: a resume whose --data differs from its run's is an error; data of the same
    length had passed (the loader's record held its settings and length only)."""
    data = blobs(48)
    trainer = gc.Trainer(bn_artifacts(), backend="numpy")
    trainer.fit(gc.data.DataLoader(data, batch_size=16, seed=1), 1, progress=False, checkpoint=tmp_path / "ck")
    resumed = gc.Trainer(tmp_path / "ck", backend="numpy")
    same = {k: v.copy() for k, v in data.items()}
    assert resumed.loader_mismatch(gc.data.DataLoader(same, batch_size=16, seed=1)) is None
    other = {k: v[::-1].copy() for k, v in data.items()}
    problem = resumed.loader_mismatch(gc.data.DataLoader(other, batch_size=16, seed=1))
    assert problem == "the checkpoint's run used a loader with other data (arrays of the same length whose values differ)"
