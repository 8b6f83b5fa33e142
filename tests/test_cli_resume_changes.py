"""`graphc train --resume` on artifacts regenerated with another optimizer: refused naming
`--changed-optimizer`, and with it the same run as ``load_checkpoint(changed_optimizer=True)``."""

import numpy as np
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli, workspace
from graphc.runtime.checkpoint import resolve


def adamw_artifacts(root):
    """The workspace's model regenerated with AdamW and weight decay 0.1 (its run was Adam's)."""
    arts = gc.training.generate(gc.load(root / "mlp.onnx"), gc.losses.cross_entropy("logits", label="y"),
                                gc.optim.AdamW(0.01, weight_decay=0.1))
    arts.save(root / "adamw")
    return root / "adamw"


def train(capsys, root, arts, epochs, *more):
    return run_cli(capsys, "train", arts, "--data", root / "data.npz", "--epochs", epochs, "--batch-size", 16,
                   "--backend", "numpy", "--no-progress", "--checkpoint", root / "ck", *more)


def test_a_resume_on_another_optimizers_artifacts_names_the_flag_and_the_flag_resumes_as_python(tmp_path, capsys):
    root = workspace(tmp_path)
    assert train(capsys, root, root / "arts", 1).code == 0
    saved = resolve(root / "ck").read_bytes()
    adamw = adamw_artifacts(root)
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


def test_changed_optimizer_without_resume_is_refused(tmp_path, capsys):
    root = workspace(tmp_path)
    err = one_line_error(train(capsys, root, root / "arts", 1, "--changed-optimizer"))
    assert "--changed-optimizer applies to a --resume run" in err
    assert not resolve(root / "ck").exists()
