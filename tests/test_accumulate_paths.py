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


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_loss_scaling_is_torchs_grad_scaler_with_accumulation(backend):
    """torch's loop: ``scaler.scale(loss * rows / step_rows).backward()`` per micro-batch, then
    ``unscale_``, ``clip_grad_norm_``, ``scaler.step`` and ``scaler.update`` once. A micro-batch
    with an inf label (batches 3 and 7: the 2nd and 4th steps' second micro-batch) makes the
    accumulated gradient inf: the step is skipped and the scale backs off; growth_interval 1
    grows it after each good step. Each step's scale, skip count and params as torch's (1e-12)."""
    spec = gc.optim.Adam(2 ** -6, max_grad_norm=0.5)
    net = _ScalingNet("float64")
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                spec, loss_scale=gc.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=1))
    batches = _scaling_batches("float64")  # 10 batches of 6 rows: 5 steps of 2 micro-batches
    twin = _scaling_twin(net, "float64")
    opt = torch.optim.Adam(twin.parameters(), lr=spec.lr, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1)
    trainer = gc.Trainer(arts, backend=backend, accumulate=2)
    skipped = grown = 0
    for step in range(5):
        group = batches[2 * step:2 * step + 2]
        opt.zero_grad()
        for batch in group:
            out = twin.out(torch.tanh(twin.fc(torch.from_numpy(batch["x"]))))
            scaler.scale(torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"])) / 2).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped, grown = skipped + (scaler.get_scale() < scale), grown + (scaler.get_scale() > scale)
        trainer.step({name: np.concatenate([b[name] for b in group]) for name in ("x", "y")})
        assert (trainer.loss_scale, trainer.skipped_steps) == (scaler.get_scale(), skipped), step
        for name, value in twin.state_dict().items():
            np.testing.assert_allclose(trainer.state_dict()[name], value.numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=f"step {step} {name}")
    assert (skipped, grown) == (2, 3)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_param_read_by_any_micro_batch_steps_as_torchs(backend):
    """A param read only where the micro-batch's x sums above 0 (``gc.cond``): k=2 micro-batches
    of 4 rows read it in one, none or both; it steps (its flags ORed) where any did, with the
    sum of the reading micro-batches' gradients, and holds otherwise, as torch's loop, where
    its grad stays None on a step no micro-batch read it. The same as data-parallel workers'
    shards, so torch's loop is that test's."""
    from test_untaken_params import OPTIMIZERS
    from test_untaken_params_distributed import READS, ShardNet, _batches as _shard_batches, _torch_ddp

    kind, kw = OPTIMIZERS["adamw"]
    arts = gc.training.generate(gc.capture(ShardNet(), seed=3, x=gc.spec("float64", ("N", 3))),
                                gc.losses.mse("output", label="y"), getattr(gc.optim, kind)(**kw))
    batches = _shard_batches()
    want = _torch_ddp(arts.state, kind, kw, batches)
    trainer = gc.Trainer(arts, backend=backend, accumulate=2)
    for step, batch in enumerate(batches):
        trainer.step(batch)
        got = trainer.state_dict()
        for name, value in want[step].items():
            np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=f"step {step} {name}")
        assert int(got["a.weight.step"]) == sum(any(r) for r in READS[:step + 1]), step


class _DropNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(4, 6, dtype="float64")
        self.drop = gc.nn.Dropout(0.4)
        self.out = gc.nn.Linear(6, 3, dtype="float64")

    def forward(self, x):
        return self.out(self.drop(gc.relu(self.fc(x))))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_dropout_draws_each_micro_batchs_noise_in_turn(backend):
    """Each micro-batch draws its own noise from the Trainer's generator, in order
    (``rng.random((rows, 6), float32)``): the steps equal those given that noise in the batch,
    bit for bit, and torch's loop applying its masks (kept where noise >= 0.4, times 1 / 0.6)."""
    net, data = _DropNet(), _data(10)
    arts = _artifacts(net, _optimizers("sgd", True)[0])
    (noise,) = [s.name for s in gc.Trainer(arts, backend="numpy").noise_specs]
    drawn, given = gc.Trainer(arts, backend=backend, seed=7, accumulate=3), gc.Trainer(arts, backend=backend,
                                                                                        accumulate=3)
    rng = np.random.default_rng(7)
    fc, out = torch.nn.Linear(4, 6, dtype=torch.float64), torch.nn.Linear(6, 3, dtype=torch.float64)
    twin = torch.nn.ModuleDict({"fc": fc, "out": out})
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    for _ in range(3):
        parts = [rng.random((rows, 6), dtype=np.float32) for rows in (4, 3, 3)]  # 10 rows split 4, 3, 3
        loss = drawn.step(data)
        assert given.step({**data, noise: np.concatenate(parts)}) == loss
        opt.zero_grad()
        for part, rows in zip(parts, np.array_split(np.arange(10), 3)):
            x, y = torch.from_numpy(data["x"][rows]), torch.from_numpy(data["y"][rows])
            mask = torch.from_numpy((part >= 0.4) / 0.6)
            torch.nn.functional.cross_entropy(out(torch.relu(fc(x)) * mask), y).mul(len(rows) / 10).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05)
        opt.step()
    for name, value in twin.state_dict().items():
        np.testing.assert_array_equal(given.state_dict()[name], drawn.state_dict()[name], err_msg=name)
        np.testing.assert_allclose(drawn.state_dict()[name], value.numpy(), rtol=1e-12, atol=1e-12, err_msg=name)


class _HalfNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = gc.nn.Linear(8, 16, dtype="float16")

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_float16_gradients_are_summed_in_float32(backend):
    """float16 params, k=4 micro-batches of 4 rows, SGD lr 1: each param moves by the
    micro-batches' float16 gradients (the gradients graph's) times 1/4 summed in float64 and
    rounded to float16 once, bit for bit (float32 sums give the same here); summed in float16 (as
    before), 16 or 17 of the weight's 128 entries differ by a rounding."""
    net = _HalfNet()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float16", ("N", 8))), gc.losses.mse("output", label="y"),
                                gc.optim.SGD(1.0))
    data = {"x": RNG.standard_normal((16, 8)).astype(np.float16),
            "y": (RNG.standard_normal((16, 16)) * 3).astype(np.float16)}
    gradients = gc.Session(arts.gradients, backend="numpy")
    params = {name: arts.state[name] for name in ("fc.weight", "fc.bias")}
    parts = [gradients.run({"x": data["x"][lo:lo + 4], "y": data["y"][lo:lo + 4], **params}) for lo in range(0, 16, 4)]
    trainer = gc.Trainer(arts, backend=backend, accumulate=4)
    trainer.step(data)
    for name, value in params.items():
        summed = sum(p[f"{name}_grad"].astype(np.float64) / 4 for p in parts).astype(np.float16)
        np.testing.assert_array_equal(trainer.state_dict()[name], value - summed, err_msg=name)


def test_sums_and_gradients_are_written_into_the_same_buffers_every_step():
    """On onnxruntime the gradients graph writes each micro-batch's gradients into one set of
    OrtValues and the accumulate graph its sums into two sets in turn, from the first step on:
    after it no step allocates a gradient or sum buffer (the update writes params as before)."""
    net, data = _Net(batchnorm=False), _data(12)
    trainer = gc.Trainer(_artifacts(net, _optimizers("adamw", True)[0]), backend="ort-cpu", accumulate=3)
    trainer.step(data)
    held = [dict(trainer._grad_buffers), *map(dict, trainer._sum_sets)]
    assert all(len(h) == 4 for h in held)
    for _ in range(3):
        trainer.step(data)
        for before, now in zip(held, [trainer._grad_buffers, *trainer._sum_sets]):
            assert all(now[name] is handle for name, handle in before.items())


def test_left_out_micro_batch_is_named_as_a_skipped_batch():
    """A micro-batch of ignored labels (or of class weights summing to 0) is named by its epoch and
    loader batch in fit, as a batch fit skips with accumulate=1 is, with the same reason."""
    def arts(**options):
        return gc.training.generate(gc.capture(_Net(batchnorm=False), x=gc.spec("float64", ("N", 4))),
                                    gc.losses.cross_entropy("output", label="y", **options),
                                    _optimizers("sgd", False)[0])

    data = {"x": RNG.standard_normal((16, 4)), "y": np.array([0, 1, 0, 1] * 3 + [2] * 4)}  # 4 batches of 4
    loader = gc.data.DataLoader(data, batch_size=4, shuffle=False)
    for trainer, where, outcome in ((gc.Trainer(arts(ignore_index=2), backend="numpy"), "", "skipped"),
                                    (gc.Trainer(arts(ignore_index=2), backend="numpy", accumulate=2),
                                     r" \(micro-batch 2 of 2\)", "left out of the step")):
        with pytest.warns(UserWarning, match=rf"^epoch 1, batch 4 of 4{where}: every label in 'y' is the ignore "
                                             rf"index 2; {outcome}"):
            trainer.fit(loader, epochs=1, progress=False, quiet=True)
    with pytest.warns(UserWarning, match=r"^micro-batch 2 of 2: every label in 'y' is the ignore index 2; left out"):
        gc.Trainer(arts(ignore_index=2), backend="numpy", accumulate=2).step({n: a[np.r_[:4, 12:16]]
                                                                             for n, a in data.items()})
    weighted = gc.Trainer(arts(weight=[1.0, 1.0, 0.0]), backend="numpy", accumulate=2)
    with pytest.warns(UserWarning, match=r"^epoch 1, batch 4 of 4 \(micro-batch 2 of 2\): the class weights of its "
                                         r"labels in 'y' sum to 0 \(weight=\[1.0, 1.0, 0.0\]\); left out"):
        weighted.fit(loader, epochs=1, progress=False, quiet=True)


def test_each_micro_batch_is_weighed_once_a_step(monkeypatch):
    """step(batch), k=3, class-weighted cross-entropy: each micro-batch's weight (averaging.shard_weight)
    is computed once a step, by ``counting``, which also leaves out those weighing 0 (it was computed
    again for the step's shares: 6 calls); the loss is the whole batch's, as torch's."""
    from graphc.runtime import averaging

    classes, net = [1.0, 2.0, 0.5], _Net(batchnorm=False)
    twin, data = _twin(net), _data(12)
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 4))),
                                gc.losses.cross_entropy("output", label="y", weight=classes),
                                _optimizers("sgd", False)[0])
    trainer = gc.Trainer(arts, backend="numpy", accumulate=3)
    want = torch.nn.functional.cross_entropy(twin(torch.from_numpy(data["x"])), torch.from_numpy(data["y"]),
                                             weight=torch.tensor(classes, dtype=torch.float64))
    weigh, calls = averaging.shard_weight, []
    monkeypatch.setattr(averaging, "shard_weight", lambda *args: calls.append(args[2]) or weigh(*args))
    assert trainer.step(data) == pytest.approx(float(want), rel=1e-12)
    assert calls == [4, 4, 4]
