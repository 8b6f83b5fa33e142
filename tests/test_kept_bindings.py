"""The Trainer's train steps on onnxruntime bind their carried buffers once
(``run_bound(keep=True)``, ``backends/iobinding.py``): two IOBindings, one per set of the ping-pong buffers, run again and
again, and forgotten when the Trainer's state is replaced.

Oracle: the same Trainer with every step bound anew (bit-equal losses and state), through a
changed lr, a checkpoint saved and loaded back into the same Trainer, and more steps."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from backend_params import ORT
from trainer_models import BNNet, blobs, bn_artifacts


def rebinding(trainer: gc.Trainer) -> gc.Trainer:
    """``trainer`` with its train_step bound anew each step (no binding kept)."""
    run_bound = trainer._train.run_bound
    trainer._train.run_bound = lambda *args, **kwargs: run_bound(*args, **{**kwargs, "keep": False})
    return trainer


def kept(trainer: gc.Trainer) -> list:
    """The trainer's kept IOBinding objects (held here, so none is freed and its id reused)."""
    return [binding for binding, _ in trainer._train._bindings.kept.values()]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(any(x is y for y in b) for x in a)


@pytest.mark.parametrize("backend", ORT)
@pytest.mark.parametrize("fused", [True, False])
def test_steps_bind_once_and_match_binding_anew(fused, backend, tmp_path):
    model = gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.Adam(1e-2), fused=fused)
    trainer, reference = gc.Trainer(arts, backend=backend), rebinding(gc.Trainer(arts, backend=backend))
    batches = [blobs(16, seed=seed) for seed in range(12)]
    # one binding where every output is written in place, else one per set of ping-pong buffers
    sets = 1 if trainer._in_place == set(trainer._feeds) else 2
    assert sets == (1 if fused else 2)  # unfused, fc2.weight's input gradient may run after its update

    def steps(seeds):
        for seed in seeds:
            assert trainer.step(batches[seed]) == reference.step(batches[seed]), seed

    steps(range(3))  # the first step writes into new buffers; from the second every set is bound
    assert len(trainer._train._bindings.kept) == sets and not reference._train._bindings.kept
    bound = kept(trainer)
    steps(range(3, 6))
    assert same(kept(trainer), bound)  # the same bindings, run again
    trainer.lr = reference.lr = 3e-3  # written into the bound lr buffer
    steps(range(6, 8))
    assert same(kept(trainer), bound)
    trainer.save_checkpoint(tmp_path / "ckpt")
    steps(range(8, 10))
    for t in (trainer, reference):
        t.load_checkpoint(tmp_path / "ckpt")  # new handles: the kept bindings go with the old ones
    assert not trainer._train._bindings.kept
    steps(range(8, 12))
    assert not any(x is y for x in kept(trainer) for y in bound) and len(trainer._train._bindings.kept) == sets
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(value, reference.state_dict()[name], err_msg=name)


def test_a_binding_is_kept_only_where_every_device_output_has_a_buffer():
    """An output onnxruntime allocates would be written over by the next run of a kept binding;
    so would the host outputs, which are bound anew each run."""
    trainer = gc.Trainer(bn_artifacts(gc.optim.SGD(0.1, momentum=0.9)), backend="ort-cpu")
    exe = trainer._train

    def feeds(seed):
        return {**trainer._batch_feeds(blobs(16, seed=seed), trainer.batch_specs), **trainer._state}

    exe.run_bound(feeds(0), ["loss"], trainer._device_outputs, into={}, keep=True)
    assert not exe._bindings.kept
    into = {out: exe.empty_like(trainer._state[name]) for out, name in trainer._feeds.items()}
    first, device = exe.run_bound(feeds(0), ["loss"], trainer._device_outputs, into=into, keep=True)
    assert len(exe._bindings.kept) == 1 and all(device[out] is into[out] for out in into)
    loss = float(first["loss"])
    again, _ = exe.run_bound(feeds(1), ["loss"], trainer._device_outputs, into=into, keep=True)
    assert len(exe._bindings.kept) == 1 and float(again["loss"]) != loss
    assert float(first["loss"]) == loss  # the first run's array is not written over
