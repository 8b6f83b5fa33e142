"""Resuming with changed settings: torch's behaviour where graphc can give it, else a clear
refusal before any step (``graphc.runtime.resume_rules``)."""

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.runtime.checkpoint import CheckpointError
from trainer_models import blobs, interrupt_at


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return {"logits": self.fc2(gc.relu(self.fc1(x)))}


def artifacts(optimizer, frozen=(), scheduled=()):
    model = gc.capture(MLP(), seed=0, x=gc.spec("float32", ("N", 8)))
    return gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), optimizer, frozen=frozen,
                                scheduled=scheduled)


DATA = [blobs(16, seed=i) for i in range(6)]


def saved_after(arts, path, steps=3, backend="numpy", momentum=None):
    trainer = gc.Trainer(arts, backend=backend)
    if momentum is not None:  # as a scheduler sets it (scheduled=("momentum",))
        trainer.momentum = momentum
    for batch in DATA[:steps]:
        trainer.step(batch)
    trainer.save_checkpoint(path)
    return trainer


def torch_resumed(start, make_before, make_after, after_load=lambda opt: None):
    """torch's run: 3 steps with ``make_before``'s optimizer, its state_dict loaded into
    ``make_after``'s (then ``after_load``), 3 more steps; the final params."""
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    with torch.no_grad():
        for (name, p), key in zip(model.named_parameters(), ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]):
            p.copy_(torch.from_numpy(start[key]))

    def steps(opt, batches):
        for b in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(torch.from_numpy(b["x"])), torch.from_numpy(b["y"])).backward()
            opt.step()

    before = make_before(torch.optim, model.parameters())
    steps(before, DATA[:3])
    after = make_after(torch.optim, model.parameters())
    after.load_state_dict(before.state_dict())
    after_load(after)
    steps(after, DATA[3:])
    return {"fc1.weight": model[0].weight, "fc1.bias": model[0].bias, "fc2.weight": model[2].weight,
            "fc2.bias": model[2].bias}


def assert_params_equal(trainer, want):
    for name, value in want.items():
        np.testing.assert_allclose(trainer.params[name], value.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_changed_lr_resumes_with_the_checkpoints_as_torch_and_says_so(tmp_path, backend):
    start = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend=backend).params
    saved_after(artifacts(gc.optim.Adam(1e-2)), tmp_path / "ck", backend=backend)
    resumed = gc.Trainer(artifacts(gc.optim.Adam(1e-3)), backend=backend)
    with pytest.warns(UserWarning, match=r"generated with lr 0\.001, the checkpoint's run with 0\.01.*set trainer\.lr"):
        resumed.load_checkpoint(tmp_path / "ck")
    for batch in DATA[3:]:
        resumed.step(batch)
    assert_params_equal(resumed, torch_resumed(start, lambda o, p: o.Adam(p, 1e-2), lambda o, p: o.Adam(p, 1e-3)))


@pytest.mark.parametrize("change,words", [
    (dict(weight_decay=0.1), r"weight_decay 0\.0 \(now 0\.1\)"),
    (dict(betas=(0.5, 0.9)), r"betas \[0\.9, 0\.999\] \(now \[0\.5, 0\.9\]\)"),
    (dict(eps=1e-3), r"eps 1e-08 \(now 0\.001\)"),
])
def test_changed_optimizer_constants_are_refused_naming_them(tmp_path, change, words):
    """torch would resume with the checkpoint's (param_groups are restored); the graphs hold
    theirs, so graphc says so instead of training on them silently (it did before)."""
    saved_after(artifacts(gc.optim.Adam(1e-2)), tmp_path / "ck")
    resumed = gc.Trainer(artifacts(gc.optim.Adam(1e-2, **change)), backend="numpy")
    before = resumed.state_dict()
    with pytest.raises(CheckpointError, match=words + r".*changed_optimizer=True"):
        resumed.load_checkpoint(tmp_path / "ck")
    assert resumed.step_count == 0
    for name, value in before.items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_changed_optimizer_true_trains_as_torch_setting_param_groups_after_load(tmp_path, backend):
    start = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend=backend).params
    saved_after(artifacts(gc.optim.Adam(1e-2)), tmp_path / "ck", backend=backend)
    resumed = gc.Trainer(artifacts(gc.optim.Adam(1e-2, weight_decay=0.1, betas=(0.8, 0.99))), backend=backend)
    resumed.load_checkpoint(tmp_path / "ck", changed_optimizer=True)
    for batch in DATA[3:]:
        resumed.step(batch)

    def set_groups(opt):
        opt.param_groups[0].update(weight_decay=0.1, betas=(0.8, 0.99))

    want = torch_resumed(start, lambda o, p: o.Adam(p, 1e-2), lambda o, p: o.Adam(p, 1e-2), set_groups)
    assert_params_equal(resumed, want)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_changed_optimizer_from_adam_to_adamw_trains_as_torch_adamw_given_adams_state(tmp_path, backend):
    """torch's AdamW.load_state_dict takes Adam's param_groups too (weight_decay 0, coupled):
    graphc trains on with the AdamW graphs' constants, as those groups set to AdamW's."""
    start = gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend=backend).params
    saved_after(artifacts(gc.optim.Adam(1e-2)), tmp_path / "ck", backend=backend)
    resumed = gc.Trainer(artifacts(gc.optim.AdamW(1e-2, weight_decay=0.05)), backend=backend)
    resumed.load_checkpoint(tmp_path / "ck", changed_optimizer=True)
    for batch in DATA[3:]:
        resumed.step(batch)

    def adamw_groups(opt):
        opt.param_groups[0].update({k: v for k, v in opt.defaults.items() if k != "lr"})

    want = torch_resumed(start, lambda o, p: o.Adam(p, 1e-2), lambda o, p: o.AdamW(p, 1e-2, weight_decay=0.05),
                         adamw_groups)
    assert_params_equal(resumed, want)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("make,key,change,words", [
    (lambda **k: gc.optim.Adam(1e-2, **k), "betas", dict(betas=(0.8, 0.99), weight_decay=0.1),
     r"other constants than these training graphs hold: betas \[0\.999\] \(now \[0\.99\]\), weight_decay "
     r"0\.0 \(now 0\.1\)\."),
    (lambda **k: gc.optim.SGD(1e-2, **{"momentum": 0.9, **k}), "momentum", dict(momentum=0.5, weight_decay=0.1),
     r"other constants than these training graphs hold: weight_decay 0\.0 \(now 0\.1\)\."),
])
def test_changed_optimizer_keeps_a_scheduled_momentum_as_the_lr(tmp_path, backend, make, key, change, words):
    """With scheduled=("momentum",) the checkpoint carries beta1 (SGD's momentum) as it carries
    the lr: the run's 0.85 goes on, the graphs' other constants (beta2, weight decay) take over;
    the refusal without changed_optimizer names only those."""
    start = gc.Trainer(artifacts(make(), scheduled=("momentum",)), backend=backend).params
    saved_after(artifacts(make(), scheduled=("momentum",)), tmp_path / "ck", backend=backend, momentum=0.85)
    resumed = gc.Trainer(artifacts(make(**change), scheduled=("momentum",)), backend=backend)
    with pytest.raises(CheckpointError, match=words):
        resumed.load_checkpoint(tmp_path / "ck")
    resumed.load_checkpoint(tmp_path / "ck", changed_optimizer=True)
    assert resumed.momentum == pytest.approx(0.85)
    for batch in DATA[3:]:
        resumed.step(batch)

    def torch_make(o, p):
        opt = o.Adam(p, 1e-2) if key == "betas" else o.SGD(p, 1e-2, momentum=0.9)
        opt.param_groups[0][key] = (0.85, 0.999) if key == "betas" else 0.85
        return opt

    def set_groups(opt):
        opt.param_groups[0].update(weight_decay=0.1, **({"betas": (0.85, 0.99)} if key == "betas" else {}))

    assert_params_equal(resumed, torch_resumed(start, torch_make, torch_make, set_groups))


@pytest.mark.parametrize("before,after,words", [
    (gc.optim.Adam(1e-2), gc.optim.SGD(1e-2, momentum=0.9), "trained with adam, these training graphs train with sgd"),
    (gc.optim.Adam(1e-2), gc.optim.AdamW(1e-2), "trained with adam, these training graphs train with adamw"),
    (gc.optim.SGD(1e-2, momentum=0.9), gc.optim.SGD(1e-2), r"momentum 0\.9 \(now 0\.0\)"),
])
def test_another_optimizer_is_refused_naming_both(tmp_path, before, after, words):
    saved_after(artifacts(before), tmp_path / "ck")
    with pytest.raises(CheckpointError, match=words):
        gc.Trainer(artifacts(after), backend="numpy").load_checkpoint(tmp_path / "ck")


def test_changed_optimizer_to_one_of_other_state_says_it_does_not_fit(tmp_path):
    """Adam -> SGD: nothing carries over; it was 'has state ..., which these training graphs
    lack; it was saved from different training graphs', as for another model. It names the
    params-only resume, which takes the checkpoint's params with SGD's fresh state."""
    saved_after(artifacts(gc.optim.Adam(1e-2)), tmp_path / "ck")
    resumed = gc.Trainer(artifacts(gc.optim.SGD(1e-2, momentum=0.9)), backend="numpy")
    with pytest.raises(CheckpointError, match=r"the checkpoint's adam state \(exp_sum, exp_sum_sq\) does not fit the "
                       r"optimizer state these training graphs' sgd keeps \(momentum_buffer\).*or pass fresh_optimizer=True "
                       r"to take its params with a fresh optimizer") as refused:
        resumed.load_checkpoint(tmp_path / "ck", changed_optimizer=True)
    assert "different training graphs" not in str(refused.value) and resumed.step_count == 0


def test_a_batch_size_changed_mid_epoch_is_refused_before_any_step(tmp_path):
    """Before, 3 of 6 batches of 16 done, a loader of 32 went on at its batch 3 of 3: the
    epoch's other 48 samples were silently never trained on."""
    arts, data = artifacts(gc.optim.SGD(0.1, momentum=0.9)), blobs(96)
    first = gc.Trainer(arts, backend="numpy")
    interrupt_at(first, 9)  # killed at epoch 2's 4th step
    with pytest.raises(KeyboardInterrupt):
        first.fit(gc.data.DataLoader(data, batch_size=16, seed=3), 2, progress=False, quiet=True)
    first.save_checkpoint(tmp_path / "ck")
    resumed = gc.Trainer(tmp_path / "ck", backend="numpy")
    assert (resumed.epoch, resumed.batch_in_epoch) == (1, 3)
    with pytest.raises(ValueError, match=r"3 of epoch 2's batches of 16 samples \(48 of 96\).*batch_size 16 "
                                         r"\(now 32\).*fit\(loader, epochs=2\)"):
        resumed.fit(gc.data.DataLoader(data, batch_size=32, seed=3), 3, progress=False, quiet=True)
    assert resumed.step_count == 9
    finished = resumed.fit(gc.data.DataLoader(data, batch_size=16, seed=3), 2, progress=False, quiet=True)
    assert finished.epochs[0].samples == 96  # the epoch's record covers its batches before the save too
    with pytest.warns(UserWarning, match="batch_size 16 \\(now 32\\)"):  # at the epoch's end: the user's choice
        then = resumed.fit(gc.data.DataLoader(data, batch_size=32, seed=3), 3, progress=False, quiet=True)
    assert then.epochs[0].samples == 96 and then.epochs[0].steps == 3


@pytest.mark.parametrize("before,after,words", [
    ((), ["fc1.bias"], r"trained in the checkpoint's run, frozen here: fc1\.bias\).*frozen=\[\]"),
    (["fc1.*"], [], r"frozen in the checkpoint's run, trained here: fc1\.bias, fc1\.weight\).*"
                    r"frozen=\['fc1\.bias', 'fc1\.weight'\]"),
    (["fc1.bias"], ["fc2.bias"], r"trained in the checkpoint's run, frozen here: fc2\.bias; frozen in the "
                                 r"checkpoint's run, trained here: fc1\.bias\).*frozen=\['fc1\.bias'\]"),
])
def test_a_changed_frozen_set_is_refused_naming_the_moves_and_the_set_to_resume_with(tmp_path, before, after, words):
    """Before, the first differing tensor was named as if of another model ('has param
    'fc1.bias', which these training graphs lack'); the set it names resumes."""
    saved_after(artifacts(gc.optim.Adam(1e-2), frozen=before), tmp_path / "ck")
    resumed = gc.Trainer(artifacts(gc.optim.Adam(1e-2), frozen=after), backend="numpy")
    with pytest.raises(CheckpointError, match=r"the trainable/frozen set changed \(" + words + r" \(graphc grad "
                                              r"--freeze\), to resume"):
        resumed.load_checkpoint(tmp_path / "ck")
    assert resumed.step_count == 0
    again = gc.Trainer(artifacts(gc.optim.Adam(1e-2), frozen=before), backend="numpy")
    again.load_checkpoint(tmp_path / "ck")
    assert again.step_count == 3


def test_another_models_checkpoint_is_still_named_by_its_first_tensor(tmp_path):
    """A checkpoint whose params this model does not have is not taken for a frozen-set change."""
    class Wider(MLP):
        def __init__(self):
            super().__init__()
            self.fc3 = nn.Linear(3, 3)

        def forward(self, x):
            return {"logits": self.fc3(super().forward(x)["logits"])}

    model = gc.capture(Wider(), seed=0, x=gc.spec("float32", ("N", 8)))
    saved_after(gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.Adam(1e-2)),
                tmp_path / "ck")
    with pytest.raises(CheckpointError, match=r"has param 'fc3\.\w+', which these training graphs lack"):
        gc.Trainer(artifacts(gc.optim.Adam(1e-2)), backend="numpy").load_checkpoint(tmp_path / "ck")


def resumed_mid_epoch(path, data, **loader):
    """A Trainer resumed from a run killed after 3 batches of its first epoch over ``data``
    (batches of 16, seed 3, ``loader``'s other settings)."""
    first = gc.Trainer(artifacts(gc.optim.SGD(0.1, momentum=0.9)), backend="numpy")
    interrupt_at(first, 3)
    with pytest.raises(KeyboardInterrupt):
        first.fit(gc.data.DataLoader(data, batch_size=16, seed=3, **loader), 1, progress=False, quiet=True)
    first.save_checkpoint(path)
    resumed = gc.Trainer(path, backend="numpy")
    assert (resumed.epoch, resumed.batch_in_epoch, resumed.step_count) == (0, 3, 3)
    return resumed


def test_drop_last_changed_mid_epoch_is_refused_where_it_changes_the_batches(tmp_path):
    """100 samples in batches of 16: drop_last=True leaves out the last 4, which the run's
    loader served as a 7th batch; with 96 the batches are the same and it resumes."""
    resumed = resumed_mid_epoch(tmp_path / "ck", blobs(100))
    with pytest.raises(ValueError, match=r"3 of epoch 1's batches of 16 samples \(48 of 100\); a loader with "
                                         r"drop_last False \(now True\) would serve other batches"):
        resumed.fit(gc.data.DataLoader(blobs(100), batch_size=16, seed=3, drop_last=True), 1, progress=False, quiet=True)
    assert resumed.step_count == 3
    even = resumed_mid_epoch(tmp_path / "even", blobs(96))
    done = even.fit(gc.data.DataLoader(blobs(96), batch_size=16, seed=3, drop_last=True), 1, progress=False, quiet=True)
    assert done.epochs[0].samples == 96 and even.step_count == 6


def test_other_data_of_the_same_length_mid_epoch_is_refused_by_its_fingerprint(tmp_path):
    """The rest of the epoch would train on other values (it warned only); the same values in
    another array object resume."""
    data = blobs(96)
    resumed = resumed_mid_epoch(tmp_path / "ck", data)
    other = {"x": data["x"] + np.float32(1.0), "y": data["y"]}
    with pytest.raises(ValueError, match=r"a loader with other data \(arrays of the same length whose values "
                                         r"differ\) would serve other batches.*fit\(loader, epochs=1\)"):
        resumed.fit(gc.data.DataLoader(other, batch_size=16, seed=3), 1, progress=False, quiet=True)
    assert resumed.step_count == 3
    same = {k: v.copy() for k, v in data.items()}
    assert resumed.fit(gc.data.DataLoader(same, batch_size=16, seed=3), 1, progress=False, quiet=True).epochs
