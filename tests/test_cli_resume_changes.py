"""`graphc train --resume` on artifacts regenerated with another optimizer: refused naming
`--changed-optimizer`, and with it the same run as ``load_checkpoint(changed_optimizer=True)``."""

import shutil

import numpy as np
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli, workspace
from graphc.compile.training import read_manifest
from graphc.runtime.checkpoint import resolve


def regenerated(root, name, optimizer, frozen=()):
    """The workspace's model (its run: Adam, nothing frozen) regenerated into ``root/name``."""
    arts = gc.training.generate(gc.load(root / "mlp.onnx"), gc.losses.cross_entropy("logits", label="y"),
                                optimizer, frozen=frozen)
    arts.save(root / name)
    return root / name


def train(capsys, root, arts, epochs, *more):
    return run_cli(capsys, "train", arts, "--data", root / "data.npz", "--epochs", epochs, "--batch-size", 16,
                   "--backend", "numpy", "--no-progress", "--checkpoint", root / "ck", *more)


def test_a_resume_on_another_optimizers_artifacts_names_the_flag_and_the_flag_resumes_as_python(tmp_path, capsys):
    root = workspace(tmp_path)
    assert train(capsys, root, root / "arts", 1).code == 0
    saved = resolve(root / "ck").read_bytes()
    adamw = regenerated(root, "adamw", gc.optim.AdamW(0.01, weight_decay=0.1))
    err = one_line_error(train(capsys, root, adamw, 2, "--resume"))
    assert "trained with adam, these training graphs train with adamw" in err and "--changed-optimizer" in err
    assert "changed_optimizer=True" not in err  # Python's spelling: no use on the command line
    assert resolve(root / "ck").read_bytes() == saved  # refused before any step

    done = train(capsys, root, adamw, 2, "--resume", "--changed-optimizer")
    assert done.code == 0, done.err
    assert "resumed from" in done.out and "after epoch 1 (step 4)" in done.out

    resolve(tmp_path / "py").parent.mkdir()
    resolve(tmp_path / "py").write_bytes(saved)
    python = gc.Trainer(adamw, backend="numpy")
    python.load_checkpoint(tmp_path / "py", changed_optimizer=True)
    data = dict(np.load(root / "data.npz"))
    python.fit(gc.data.DataLoader(data, batch_size=16, seed=0), 2, progress=False, quiet=True)
    cli = gc.Trainer(adamw, backend="numpy")
    cli.load_checkpoint(root / "ck")
    assert cli.step_count == python.step_count == 8
    for name, value in python.params.items():
        np.testing.assert_array_equal(cli.params[name], value, err_msg=name)

    # the folder now holds the AdamW graphs its state belongs to: it resumes as ARTIFACTS itself
    assert read_manifest(root / "ck" / "artifacts").optimizer == python.manifest.optimizer
    more = train(capsys, root, root / "ck", 3, "--resume")
    assert more.code == 0, more.err
    python.fit(gc.data.DataLoader(data, batch_size=16, seed=0), 3, progress=False, quiet=True)
    done = gc.Trainer(root / "ck", backend="numpy")
    assert done.step_count == python.step_count == 12
    for name, value in python.state_dict().items():
        assert done.state_dict()[name].tobytes() == value.tobytes(), name


def test_changed_optimizer_without_resume_is_refused(tmp_path, capsys):
    root = workspace(tmp_path)
    err = one_line_error(train(capsys, root, root / "arts", 1, "--changed-optimizer"))
    assert "--changed-optimizer applies to a --resume run" in err
    assert not resolve(root / "ck").exists()


@pytest.mark.parametrize("name,optimizer,frozen,words", [
    ("sgd", gc.optim.SGD(0.01, momentum=0.9), (), "trained with adam, these training graphs train with sgd; "
     "resume with artifacts generated with the checkpoint's optimizer"),
    ("frozen", gc.optim.Adam(0.01), ["enc.bias"], "the trainable/frozen set changed (trained in the checkpoint's "
     "run, frozen here: enc.bias). torch would go on"),
])
def test_a_resume_on_other_state_names_the_change_not_another_model(tmp_path, capsys, name, optimizer, frozen, words):
    """Their tensors differ, which the checkpoint-path check took for another model's checkpoint
    ('belongs to other training graphs (another model?)') before the resume rules could name it."""
    root = workspace(tmp_path)
    assert train(capsys, root, root / "arts", 1).code == 0
    err = one_line_error(train(capsys, root, regenerated(root, name, optimizer, frozen), 2, "--resume"))
    assert words in err and "another model" not in err


def test_adam_to_sgd_with_changed_optimizer_says_the_state_does_not_fit(tmp_path, capsys):
    """It called them another model's ('belongs to other training graphs (another model?)')."""
    root = workspace(tmp_path)
    assert train(capsys, root, root / "arts", 1).code == 0
    saved = resolve(root / "ck").read_bytes()
    sgd = regenerated(root, "sgd", gc.optim.SGD(0.01, momentum=0.9))
    err = one_line_error(train(capsys, root, sgd, 2, "--resume", "--changed-optimizer"))
    assert ("the checkpoint's adam state (exp_sum, exp_sum_sq) does not fit the optimizer state these training "
            "graphs' sgd keeps (momentum_buffer)") in err, err
    assert "or pass --fresh-optimizer to take its params with a fresh optimizer" in err
    assert "another model" not in err
    assert resolve(root / "ck").read_bytes() == saved


def test_a_changed_lr_warning_gives_the_cli_way(tmp_path, capsys):
    """It said 'set trainer.lr after loading', which a command line cannot."""
    root = workspace(tmp_path)
    assert train(capsys, root, root / "arts", 1).code == 0
    lower = regenerated(root, "lower", gc.optim.Adam(0.001))
    done = train(capsys, root, lower, 2, "--resume")
    assert done.code == 0, done.err
    warning = [line for line in done.err.splitlines() if "generated with lr 0.001" in line]
    assert len(warning) == 1 and "the run resumes with the checkpoint's lr" in warning[0], done.err
    assert "graphc train has no lr option" in warning[0] and "trainer.lr = 0.001" in warning[0]
    assert "set trainer.lr after loading" not in done.err


def test_the_lr_note_prints_a_warning_raised_before_an_error(capsys):
    """It printed what it caught only when the body returned: a load_checkpoint that warned and
    then raised lost the warning."""
    import warnings

    from graphc.cli.train_cmds import _lr_note
    from graphc.runtime.resume_rules import LrChanged

    class Graphs:
        class manifest:
            optimizer = {"lr": 0.001}

    with pytest.raises(RuntimeError, match="after the warning"):
        with _lr_note(Graphs()):
            warnings.warn(LrChanged(lambda how: f"lr changed; {how}"))
            raise RuntimeError("after the warning")
    err = capsys.readouterr().err
    assert "lr changed; graphc train has no lr option" in err and "trainer.lr = 0.001" in err, err


def test_fresh_optimizer_takes_the_params_into_a_new_run_as_python_and_replaces_the_checkpoint(tmp_path, capsys):
    """Adam -> SGD, enc.bias frozen in the first run and trained now: a full resume is refused
    naming --fresh-optimizer; with it the run is Python's params-only resume, bit for bit,
    and the folder then holds the SGD run (its graphs beside)."""
    root = workspace(tmp_path)
    adam = regenerated(root, "adam", gc.optim.Adam(0.01), frozen=["enc.bias"])
    assert train(capsys, root, adam, 1).code == 0
    saved = resolve(root / "ck").read_bytes()
    shutil.copytree(root / "ck", tmp_path / "py")  # the checkpoint and its graphs, for Python's run
    sgd = regenerated(root, "sgd", gc.optim.SGD(0.01, momentum=0.9))
    err = one_line_error(train(capsys, root, sgd, 1, "--resume"))
    assert "trained with adam, these training graphs train with sgd" in err, err
    assert "or --fresh-optimizer to take its params with a fresh optimizer" in err, err
    assert "fresh_optimizer=True" not in err and resolve(root / "ck").read_bytes() == saved
    assert "--fresh-optimizer applies to a --resume run" in one_line_error(train(capsys, root, sgd, 1,
                                                                                 "--fresh-optimizer"))
    assert "give one of them" in one_line_error(train(capsys, root, sgd, 1, "--resume", "--fresh-optimizer",
                                                      "--changed-optimizer"))

    done = train(capsys, root, sgd, 2, "--resume", "--fresh-optimizer")
    assert done.code == 0, done.err
    assert "a new run with a fresh optimizer (step 0)" in done.out and "resumed from" not in done.out

    python = gc.Trainer(sgd, backend="numpy")
    python.load_checkpoint(tmp_path / "py", fresh_optimizer=True)
    python.fit(gc.data.DataLoader(dict(np.load(root / "data.npz")), batch_size=16, seed=0), 2, progress=False,
               quiet=True)
    cli = gc.Trainer(root / "ck", backend="numpy")
    assert cli.manifest.optimizer == python.manifest.optimizer and cli.step_count == python.step_count == 8
    for name, value in python.state_dict().items():
        assert cli.state_dict()[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("resume", [True, False, "fresh"])
def test_the_checkpoint_check_reads_its_header_once(tmp_path, capsys, monkeypatch, resume):
    """``check_checkpoint`` read the header of the checkpoint it checks up to 5 times (the resume check's meta
    twice and its tensor table, the writable check, the owner check); each now takes the one read. With
    --fresh-optimizer the params check reads no more than that header (it loaded every tensor)."""
    from graphc.cli.train_cmds import check_checkpoint
    from graphc.runtime import checkpoint

    root = workspace(tmp_path)
    assert train(capsys, root, root / "arts", 1).code == 0
    reads = []
    read = checkpoint._read_header
    monkeypatch.setattr(checkpoint, "_read_header", lambda target: reads.append(target) or read(target))
    if resume:
        check_checkpoint(root / "ck", True, root / "arts", fresh_optimizer=resume == "fresh")
    else:
        with pytest.raises(checkpoint.CheckpointError, match=r"already holds a checkpoint \(step 4, epoch 1\)"):
            check_checkpoint(root / "ck", False, root / "arts")
    assert reads == [resolve(root / "ck")]
