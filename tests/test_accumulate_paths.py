"""Gradient accumulation's other paths against torch 2.13 loops in float64: the per-step
gradient norm (``clip_grad_norm_``'s return), k recorded in checkpoints (another k refused on a
resume), loss scaling (GradScaler with accumulation), a param read only under a branch (stepped
where any micro-batch read it), Dropout's masks drawn per micro-batch, float16 gradients summed
in float32, and the sums written into the same buffers every step."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from test_accumulate import BATCH, _artifacts, _data, _Net, _optimizers, _torch_fit, _twin
from test_loss_scaling import _batches as _scaling_batches, _Net as _ScalingNet, _twin as _scaling_twin

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_step_grad_norms_are_torchs_clip_grad_norm(backend):
    """With max_grad_norm, each optimizer step's norm of the accumulated gradient before
    clipping: 2 epochs of 6 loader batches, k=4 (steps of 4 and 2 batches)."""
    net, data = _Net(), _data()
    optimizer, make_opt = _optimizers("adamw", True)
    norms: list[float] = []
    want = _torch_fit(_twin(net), make_opt, data, 4, 2, True, norms=norms)
    trainer = gc.Trainer(_artifacts(net, optimizer), backend=backend, accumulate=4)
    history = trainer.fit(gc.data.DataLoader(data, batch_size=BATCH, shuffle=False), epochs=2, progress=False,
                          quiet=True)
    assert len(norms) == 4
    np.testing.assert_allclose(history.step_grad_norms, norms, rtol=1e-12)
    for name, value in want.items():
        if not name.endswith("num_batches_tracked"):
            np.testing.assert_allclose(trainer.state_dict()[name], value, rtol=1e-12, atol=1e-12, err_msg=name)


def _trained_checkpoint(tmp_path, k: int):
    """A checkpoint after 1 epoch (6 loader batches) of accumulate=k, and the artifacts."""
    arts = _artifacts(_Net(), _optimizers("sgd", False)[0])
    trainer = gc.Trainer(arts, backend="numpy", accumulate=k)
    trainer.fit(gc.data.DataLoader(_data(), batch_size=BATCH, seed=1), epochs=1, progress=False, quiet=True,
                checkpoint=tmp_path / "ck")
    return arts, tmp_path / "ck"


def test_checkpoint_records_k_and_refuses_another_on_resume(tmp_path):
    from graphc.runtime import checkpoint as ckpt
    from graphc.runtime.resume_rules import AccumulateChanged

    arts, path = _trained_checkpoint(tmp_path, 2)
    assert ckpt.read_meta(path).accumulate == 2
    for now in (1, 3):
        with pytest.raises(AccumulateChanged, match=rf"once per 2 micro-batches \(accumulate=2\), this one would once "
                           rf"per {now} \(accumulate={now}\).*Resume with accumulate=2 .*fresh_optimizer=True"):
            gc.Trainer(path, backend="numpy", accumulate=now)
        with pytest.raises(AccumulateChanged):
            gc.Trainer(arts, backend="numpy", accumulate=now).load_checkpoint(path)
    assert gc.Trainer(path, backend="numpy", accumulate=2).step_count == 3
    fresh = gc.Trainer(arts, backend="numpy", accumulate=3)
    fresh.load_checkpoint(path, fresh_optimizer=True)  # its params into a new run
    assert fresh.step_count == 0
    np.testing.assert_array_equal(fresh.params["out.weight"], gc.Trainer(path, backend="numpy", accumulate=2)
                                  .params["out.weight"])


def test_a_checkpoint_from_before_k_was_kept_resumes_as_k_1(tmp_path):
    """A header without ``accumulate`` (its digest then covers no such field) is a k=1 run's."""
    from graphc.runtime import checkpoint as ckpt
    from graphc.runtime.resume_rules import AccumulateChanged

    _, path = _trained_checkpoint(tmp_path, 1)
    tensors, meta = ckpt.load(path)
    assert meta.accumulate == 1
    ckpt.save(path, tensors, meta.model_copy(update={"accumulate": None}))
    assert "accumulate" not in ckpt.read_meta(path).model_dump(exclude_none=True)
    assert gc.Trainer(path, backend="numpy").step_count == 6
    with pytest.raises(AccumulateChanged, match=r"once per 1 micro-batch \(accumulate=1\)"):
        gc.Trainer(path, backend="numpy", accumulate=2)


def test_cli_resume_with_another_accumulate_is_refused_in_its_words(tmp_path, capsys):
    """Given --resume or the checkpoint as ARTIFACTS: one line, the CLI's options named."""
    from cli_util import one_line_error, run_cli

    arts, path = _trained_checkpoint(tmp_path, 2)
    arts.save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", **_data())
    common = ["train", "--data", str(tmp_path / "data.npz"), "--epochs", "2", "--batch-size", str(BATCH),
              "--backend", "numpy", "--no-progress"]
    for args in ([str(tmp_path / "arts"), "--checkpoint", str(path), "--resume"], [str(path)]):
        text = one_line_error(run_cli(capsys, *common, *args, "--accumulate", "3"))
        assert "(accumulate=2), this one would once per 3" in text and "Resume with --accumulate 2" in text, text
        assert "--resume --fresh-optimizer" in text and "with --accumulate 3" in text, text
