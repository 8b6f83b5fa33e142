"""Loss scaling (``generate(loss_scale=gc.amp.GradScaler(...))``) against torch's
``scaler.scale(loss).backward(); scaler.unscale_(opt); [clip]; scaler.step(opt); scaler.update()``
step for step: the scale sequence, the params and optimizer state, skipped steps bit for bit,
checkpoint resume, float16 params, the CLI flag and the errors."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
STEPS = 10
SPECS = {
    "sgd-momentum": gc.optim.SGD(0.125, momentum=0.5, nesterov=True, weight_decay=0.0625),
    "adamw": gc.optim.AdamW(2 ** -6, weight_decay=0.125),
    "adam-clipped": gc.optim.Adam(2 ** -6, max_grad_norm=0.5),
}


class _Net(gc.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4, dtype=dtype)
        self.out = gc.nn.Linear(4, 2, dtype=dtype)

    def forward(self, x):
        return self.out(gc.tanh(self.fc(x)))


def _twin(net: _Net, dtype: str):
    twin = torch.nn.ModuleDict({"fc": torch.nn.Linear(3, 4, dtype=getattr(torch, dtype)),
                                "out": torch.nn.Linear(4, 2, dtype=getattr(torch, dtype))})
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})
    return twin


def _batches(dtype: str, overflow=(3, 7)) -> list[dict]:
    """STEPS batches; those at ``overflow`` have an infinite label entry (an inf gradient)."""
    out = []
    for k in range(STEPS):
        y = (RNG.standard_normal((6, 2)) * 0.5).astype(dtype)
        if k in overflow:
            y[0, 0] = np.inf
        out.append({"x": RNG.standard_normal((6, 3)).astype(dtype), "y": y})
    return out


class _Fp16Scaler(torch.amp.GradScaler):
    """torch's GradScaler, allowed to unscale float16 gradients (its public ``unscale_`` refuses
    them; the kernels, ``_amp_foreach_non_finite_check_and_unscale_``, take them)."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)


def _torch_run(spec, twin, batches, scaler_args, dtype):
    """torch's GradScaler loop; per step (loss, scale after update, params, optimizer state)."""
    kwargs = {k: v for k, v in spec.model_dump().items() if k in ("momentum", "nesterov", "weight_decay", "betas", "eps")}
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
    opt = cls(twin.parameters(), lr=spec.lr, foreach=False, **kwargs)
    scaler = (_Fp16Scaler if dtype == "float16" else torch.amp.GradScaler)("cpu", **scaler_args)
    out = []
    for batch in batches:
        opt.zero_grad()
        hidden = torch.tanh(twin.fc(torch.from_numpy(batch["x"])))
        loss = torch.nn.functional.mse_loss(twin.out(hidden), torch.from_numpy(batch["y"]))
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        if spec.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(twin.parameters(), spec.max_grad_norm)
        scaler.step(opt)
        scaler.update()
        state = {k: v.detach().numpy().copy() for k, v in twin.state_dict().items()}
        # torch's slot -> ours, and the factor between: the second moment of these params kept as its sum
        slots = {"momentum_buffer": ("momentum_buffer", 1.0),
                 **({"exp_avg_sq": ("exp_sum_sq", 1.0 / (1.0 - spec.betas[1]))} if spec.kind != "sgd" else {})}
        for (name, p) in twin.named_parameters():
            for slot, (ours, factor) in slots.items():
                if slot in opt.state.get(p, {}):
                    state[f"{name}.{ours}"] = opt.state[p][slot].numpy() * factor
        out.append((loss.item(), scaler.get_scale(), state))
    return out


def _generate(spec, dtype, scaler, fused=True):
    net = _Net(dtype)
    model = gc.capture(net, x=gc.spec(dtype, ("N", 3)))
    return net, gc.training.generate(model, gc.losses.mse("output", label="y"), spec, fused=fused, loss_scale=scaler)


def _check_against_torch(spec, dtype, backend, fused, scaler_args, tol, batches=None):
    net, arts = _generate(spec, dtype, gc.amp.GradScaler(**scaler_args), fused)
    batches = batches or _batches(dtype)
    want = _torch_run(spec, _twin(net, dtype), batches, scaler_args, dtype)
    trainer = gc.Trainer(arts, backend=backend)
    before, skipped, grown = trainer.state_dict(), 0, 0
    for k, (batch, (loss, scale, state)) in enumerate(zip(batches, want)):
        got_loss = trainer.step(batch)
        now = trainer.state_dict()
        assert trainer.loss_scale == scale, f"step {k}: scale {trainer.loss_scale}, torch {scale}"
        if np.isfinite(loss):
            np.testing.assert_allclose(got_loss, loss, rtol=tol, err_msg=f"step {k}")
        previous = before["loss_scale"]
        if scale < previous:  # a skipped step: every param and every optimizer state bit for bit as before
            skipped += 1
            for name, value in before.items():
                if name not in ("loss_scale", "loss_scale.growth_tracker", "loss_scale.skipped_steps", "lr"):
                    np.testing.assert_array_equal(now[name], value, err_msg=f"step {k} {name}")
            assert now["loss_scale.growth_tracker"] == 0
        assert trainer.skipped_steps == now["loss_scale.skipped_steps"] == skipped, f"step {k}"
        grown += scale > previous
        for name, value in state.items():
            np.testing.assert_allclose(now[name].astype(np.float64), value.astype(np.float64), rtol=tol, atol=tol,
                                       err_msg=f"step {k} {name}")
        before = now
    return skipped, grown


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-6)])
def test_matches_torch_grad_scaler(kind, dtype, tol, backend):
    """Overflowing batches and an init_scale of 2**126 (float32: the first scaled gradients
    overflow) skip steps and back off; growth_interval 3 grows the scale after 3 good steps."""
    args = {"init_scale": 2.0 ** 126 if dtype == "float32" else 2.0 ** 10, "growth_interval": 3}
    skipped, grown = _check_against_torch(SPECS[kind], dtype, backend, True, args, tol)
    assert skipped >= 2 and grown >= 1, (skipped, grown)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_per_param_update_matches_torch(backend):
    args = {"init_scale": 2.0 ** 12, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 2}
    skipped, grown = _check_against_torch(SPECS["adamw"], "float64", backend, False, args, 1e-12)
    assert skipped >= 2 and grown >= 1


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_float16_params_match_torch(backend):
    """float16 params and loss: the seed 2**16 is inf in float16 (torch's too), so the first step
    is skipped; the scale sequence equals torch's, the params agree to float16 rounding."""
    args = {"growth_interval": 2}
    batches = _batches("float16", overflow=(5,))
    skipped, grown = _check_against_torch(SPECS["sgd-momentum"], "float16", backend, True, args, 2e-2, batches)
    assert skipped >= 2 and grown >= 1


def test_checkpoint_resume_bit_identical(tmp_path):
    _, arts = _generate(SPECS["adamw"], "float32", gc.amp.GradScaler(init_scale=2.0 ** 126, growth_interval=2))
    batches = _batches("float32")
    straight = gc.Trainer(arts, backend="ort-cpu")
    first = gc.Trainer(arts, backend="ort-cpu")
    for batch in batches:
        straight.step(batch)
    for batch in batches[:5]:
        first.step(batch)
    first.save_checkpoint(tmp_path / "ckpt")
    resumed = gc.Trainer(arts, backend="ort-cpu")
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.loss_scale == first.loss_scale
    for batch in batches[5:]:
        resumed.step(batch)
    got, want = resumed.state_dict(), straight.state_dict()
    assert set(got) == set(want) and {"loss_scale", "loss_scale.growth_tracker"} <= set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert got["loss_scale.growth_tracker"].dtype == np.int32


def test_saved_artifacts_check_and_reload(tmp_path):
    """The files pass onnx's full check; the scale and tracker are in state.safetensors; a
    static scale keeps its value and still skips a non-finite step; an update graph without
    scaling is the same as before (the seed, unscale and skip nodes appear only with it)."""
    _, arts = _generate(SPECS["sgd-momentum"], "float32", 512.0)
    arts.save(tmp_path / "a")
    for name in ("train_step", "gradients"):
        onnx.checker.check_model(str(tmp_path / "a" / f"{name}.onnx"), full_check=True)
    loaded = gc.training.load(tmp_path / "a")
    assert loaded.manifest.loss_scale == {"kind": "static", "init_scale": 512.0}
    trainer = gc.Trainer(loaded, backend="ort-cpu")
    batches = _batches("float32", overflow=(1,))
    trainer.step(batches[0])
    before = trainer.state_dict()
    trainer.step(batches[1])
    after = trainer.state_dict()
    assert trainer.loss_scale == 512.0 and "loss_scale.growth_tracker" not in after
    for name, value in before.items():
        if name != "loss_scale.skipped_steps":
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert (before["loss_scale.skipped_steps"], trainer.skipped_steps) == (0, 1)
    plain = _generate(SPECS["sgd-momentum"], "float32", None)[1]
    assert not any(n.op_type == "IsNaN" for n in plain.train_step.proto.graph.node)
    assert plain.manifest.loss_scale is None and "loss_scale" not in plain.state
    disabled = _generate(SPECS["sgd-momentum"], "float32", gc.amp.GradScaler(enabled=False))[1]
    assert disabled.train_step.proto.SerializeToString() == plain.train_step.proto.SerializeToString()


def test_finite_check_is_one_reduction_per_flat_buffer():
    """found_inf reads each flat gradient buffer once (one ReduceSum each: 2 buffers, float32 and
    float64), per param without the fused layout; one IsNaN of their sum."""
    net = _Net("float32")
    net.out = gc.nn.Linear(4, 2, dtype="float64")
    net.forward = lambda x: net.out(gc.cast(gc.tanh(net.fc(x)), "float64"))
    model = gc.capture(net, x=gc.spec("float32", ("N", 3)))
    def ops(fused, scaler):
        arts = gc.training.generate(model, gc.losses.mse("output", label="y"), SPECS["adamw"], fused=fused,
                                    loss_scale=scaler)
        return [n.op_type for n in arts.train_step.proto.graph.node]

    for fused, reductions in ((True, 2), (False, 4)):
        plain, scaled = ops(fused, None), ops(fused, gc.amp.GradScaler())
        assert scaled.count("ReduceSum") - plain.count("ReduceSum") == reductions
        assert scaled.count("IsNaN") - plain.count("IsNaN") == 1


def test_gradients_graph_unscaled():
    """The gradients graph (the scaled backward, unscaled before its outputs) gives the plain
    gradients: equal to those of artifacts without scaling (scale 2**10, exact in float64)."""
    from graphc.runtime.session import Session

    net = _Net("float64")
    model = gc.capture(net, x=gc.spec("float64", ("N", 3)))
    loss = gc.losses.mse("output", label="y")
    batch = _batches("float64", overflow=())[0]
    grads = [Session(gc.training.generate(model, loss, SPECS["adamw"], loss_scale=s).gradients, backend="numpy")
             .run(batch) for s in (None, gc.amp.GradScaler(init_scale=2.0 ** 10))]
    assert set(grads[0]) == set(grads[1])
    for name in grads[0]:
        np.testing.assert_array_equal(grads[1][name], grads[0][name], err_msg=name)


@pytest.mark.parametrize("value,error,match", [
    ("big", TypeError, "loss_scale must be a gc.amp.GradScaler or a float"),
    (-2.0, ValueError, "static scale must be a positive finite float32"),
    (1e39, ValueError, "static scale must be a positive finite float32"),
])
def test_bad_loss_scale(value, error, match):
    with pytest.raises(error, match=match):
        _generate(SPECS["adamw"], "float32", value)


@pytest.mark.parametrize("kwargs,field", [({"growth_factor": 1.0}, "growth_factor"),
                                          ({"backoff_factor": 1.5}, "backoff_factor"),
                                          ({"growth_interval": 0}, "growth_interval"),
                                          ({"init_scale": 1e40}, "init_scale")])
def test_bad_grad_scaler(kwargs, field):
    with pytest.raises(ValueError, match=field):
        gc.amp.GradScaler(**kwargs)


def test_grad_scaler_defaults_are_torchs():
    ours, theirs = gc.amp.GradScaler(), torch.amp.GradScaler("cpu")
    assert (ours.init_scale, ours.growth_factor, ours.backoff_factor, ours.growth_interval) == (
        theirs.get_scale(), theirs.get_growth_factor(), theirs.get_backoff_factor(), theirs.get_growth_interval())


def test_cli_loss_scale(tmp_path):
    net = _Net("float32")
    path = tmp_path / "m.onnx"
    gc.capture(net, x=gc.spec("float32", ("N", 3))).save(path)
    cli = [str(Path(sys.executable).parent / "graphc"), "grad", str(path), "--loss", "mse:output:y", "--optimizer", "adamw"]
    done = subprocess.run([*cli, "--loss-scale", "dynamic", "-o", str(tmp_path / "a")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "loss scale dynamic from 65536" in done.stdout
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["loss_scale"]["kind"] == "dynamic" and manifest["loss_scale"]["growth_interval"] == 2000
    bad = subprocess.run([*cli, "--loss-scale", "lots", "-o", str(tmp_path / "b")], capture_output=True, text=True)
    assert bad.returncode != 0 and "--loss-scale must be dynamic or a number" in bad.stderr


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_fit_records_the_scale_and_skipped_steps(backend, tmp_path, capsys):
    """Each epoch's record (History, the CSV log, TensorBoard, the epoch line) holds the scale at
    its end and how many of its steps were skipped; a skipped step's inf loss stops nothing and
    counts in no mean. A run without loss scaling records None and prints nothing of it."""
    _, arts = _generate(SPECS["adamw"], "float32", gc.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2))
    batches = _batches("float32", overflow=(1, 2))[:5]  # each epoch: 2 of its 5 steps skipped
    data = {n: np.concatenate([b[n] for b in batches]) for n in ("x", "y")}
    board = {"tensorboard": tmp_path / "tb"} if importlib.util.find_spec("tensorboard") else {}
    trainer = gc.Trainer(arts, backend=backend, **board)
    history = trainer.fit(gc.data.DataLoader(data, batch_size=6, shuffle=False), 2, progress=False,
                          log=tmp_path / "log.csv")
    # 1024, skip 512, skip 256, 256, grown 512 | 512, skip 256, skip 128, 128, grown 256
    got = [(e.loss_scale, e.skipped_steps) for e in history.epochs]
    assert got == [(512.0, 2), (256.0, 2)] and trainer.skipped_steps == 4 and trainer.loss_scale == 256.0
    assert all(np.isfinite(e.loss) and e.steps == 3 for e in history.epochs)
    assert int(np.isinf(history.step_losses).sum()) == 4
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch")]
    assert "  loss scale 512 (2 steps skipped)  " in lines[0] and "  loss scale 256 (2 steps skipped)  " in lines[1]
    rows = list(csv.DictReader((tmp_path / "log.csv").open()))
    assert [(float(r["loss_scale"]), int(r["skipped_steps"])) for r in rows] == got
    if board:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp_path / "tb"))
        acc.Reload()
        assert [e.value for e in acc.Scalars("train/skipped_steps")] == [2, 2]
        assert [e.value for e in acc.Scalars("train/loss_scale")] == [512, 256]
        # every step's loss at its step, a skipped step's inf too (an epoch's first 2 were missing: its
        # steps were cut to the 3 its mean counts)
        losses = acc.Scalars("train/loss")
        assert [e.step for e in losses] == list(range(1, 11))
        np.testing.assert_array_equal([e.value for e in losses], np.float32(history.step_losses))
    plain = gc.Trainer(_generate(SPECS["adamw"], "float32", None)[1], backend=backend)
    record = plain.fit(gc.data.DataLoader(batches[0], batch_size=6), 1, progress=False).epochs[0]
    assert (record.loss_scale, record.skipped_steps, plain.skipped_steps) == (None, None, None)
    assert "loss scale" not in capsys.readouterr().out


def test_an_interrupted_epoch_resumed_counts_all_its_skipped_steps(tmp_path, monkeypatch):
    """Ctrl-C after batch 3 of 5 (batch 1 skipped before it, batch 4 after): the checkpoint keeps
    the epoch's count so far, and the resumed epoch's record says 2."""
    from graphc.runtime.trainer import TrainingInterrupted

    _, arts = _generate(SPECS["adamw"], "float32", gc.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2))
    batches = _batches("float32", overflow=(1, 4))[:5]
    loader = gc.data.DataLoader({n: np.concatenate([b[n] for b in batches]) for n in ("x", "y")}, batch_size=6,
                                shuffle=False)
    monkeypatch.setenv("GRAPHC_TEST_SIGNAL_AT_STEP", "INT:3")
    with pytest.raises(TrainingInterrupted):
        gc.Trainer(arts, backend="ort-cpu").fit(loader, 1, progress=False, quiet=True, checkpoint=tmp_path / "ck")
    monkeypatch.delenv("GRAPHC_TEST_SIGNAL_AT_STEP")
    resumed = gc.Trainer(tmp_path / "ck", backend="ort-cpu")
    assert resumed.batch_in_epoch == 3 and resumed.skipped_steps == 1
    record = resumed.fit(loader, 1, progress=False, quiet=True).epochs[0]
    assert (record.skipped_steps, record.steps, resumed.skipped_steps) == (2, 3, 2)


def test_optimizer_state_is_written_in_place():
    """The Where that keeps the state on a skipped step (scalar condition, the old state a branch)
    writes into the state's own buffer: every carried output of AdamW in place on ort-cpu (the
    params too: each update waits for found_inf, so for every gradient), one buffer each."""
    _, arts = _generate(SPECS["adamw"], "float32", gc.amp.GradScaler())
    trainer = gc.Trainer(arts, backend="ort-cpu")
    assert trainer._in_place == set(trainer._feeds) and len(trainer._feeds) == 10



def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


@pytest.mark.parametrize("backend,flush", [("numpy", False), ("ort-cpu", False), ("ort-cpu", True)])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind,dtype", [(k, "float32") for k in SPECS] + [("adamw", "float64"),
                                                                          ("sgd-momentum", "float16")])
def test_skipped_step_keeps_every_bit(kind, dtype, fused, backend, flush):
    """A skipped step leaves every param and optimizer state entry bit for bit as it was, -0.0,
    inf, NaN and (without ``flush_denormals``, the Trainer's default, under which a subnormal counts
    as zero) subnormals included, as torch's skipped ``optimizer.step()`` does (onnxruntime's CPU
    Where returned a -0.0 kept from its X as +0.0: ``backends/selects.py``)."""
    _, arts = _generate(SPECS[kind], dtype, gc.amp.GradScaler(init_scale=2.0 ** 10), fused)
    specials = np.array([-0.0, -np.inf, np.nan, 0.0, *([] if flush else [np.finfo(dtype).smallest_subnormal])], dtype)
    planted = []
    for name, value in list(arts.state.items()):
        if value.ndim and value.dtype.kind == "f":
            value = RNG.standard_normal(value.shape).astype(dtype)
            value.flat[::2] = np.resize(specials, value.flat[::2].size)
            arts.state[name] = value
            planted.append(name)
    assert len(planted) == 4 * (1 + {"sgd-momentum": 1}.get(kind, 2))  # 4 params and their slots
    trainer = gc.Trainer(arts, backend=backend, **({} if backend == "numpy" else {"flush_denormals": flush}))
    before = trainer.state_dict()
    overflow = {"x": RNG.standard_normal((6, 3)).astype(dtype), "y": np.full((6, 2), np.inf, dtype)}
    trainer.step(overflow)
    assert trainer.skipped_steps == 1
    after = trainer.state_dict()
    for name, value in before.items():
        if name not in ("loss_scale", "loss_scale.growth_tracker", "loss_scale.skipped_steps"):
            np.testing.assert_array_equal(_bits(after[name]), _bits(value), err_msg=name)
