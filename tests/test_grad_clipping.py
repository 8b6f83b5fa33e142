"""Gradient clipping in the training graphs (optimizer specs' ``max_grad_norm``, ``grad_norm_type``,
``clip_grad_value``) against torch's ``backward(); clip_grad_value_(); clip_grad_norm_(); opt.step()``
step for step, through save/load and a checkpoint resume, and from ``graphc grad``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

try:
    from torch_grad_util import assert_step_matches_torch
    from trainer_models import straight_and_resumed
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch
    from tests.trainer_models import straight_and_resumed

STEPS = 5
# rates exact in float32 (the lr input of float32 params; float64 params take a float64 lr)
SPECS = {
    "sgd-nesterov": gc.optim.SGD(0.125, momentum=0.5, nesterov=True, weight_decay=0.0625, max_grad_norm=1.0),
    "adam": gc.optim.Adam(2 ** -6, weight_decay=0.03125, max_grad_norm=1.0),
    "adamw-no-decay": gc.optim.AdamW(2 ** -6, weight_decay=0.125, no_decay="*.bias", max_grad_norm=1.0),
    "sgd-inf-norm": gc.optim.SGD(0.125, momentum=0.5, max_grad_norm=1.0, grad_norm_type="inf"),
    "sgd-1-norm": gc.optim.SGD(0.125, max_grad_norm=2.0, grad_norm_type=1.0),
    "adam-value": gc.optim.Adam(2 ** -6, clip_grad_value=0.25),
    "sgd-value-then-norm": gc.optim.SGD(0.125, momentum=0.5, clip_grad_value=0.5, max_grad_norm=1.0),
}


class _Net(gc.nn.Module):
    def __init__(self, dtypes=("float64", "float64")):
        super().__init__()
        self.fc = gc.nn.Linear(3, 4, dtype=dtypes[0])
        self.out = gc.nn.Linear(4, 2, dtype=dtypes[1])
        self.dtypes = dtypes

    def forward(self, x):
        return self.out(gc.cast(gc.tanh(self.fc(x)), self.dtypes[1]))


def _twin(net: _Net):
    twin = torch.nn.ModuleDict({"fc": torch.nn.Linear(3, 4, dtype=getattr(torch, net.dtypes[0])),
                                "out": torch.nn.Linear(4, 2, dtype=getattr(torch, net.dtypes[1]))})
    twin.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in net.state_dict().items()})
    return twin


def _torch_loss(twin, batch):
    hidden = torch.tanh(twin.fc(torch.from_numpy(batch["x"]))).to(twin.out.weight.dtype)
    return torch.nn.functional.mse_loss(twin.out(hidden), torch.from_numpy(batch["y"]))


def _batches(dtype="float64", n=STEPS):
    """Small and large gradients in turn: the clipping acts on some steps and not on others."""
    rng = np.random.default_rng(4)
    scales = [0.05, 4.0, 0.1, 3.0, 0.02, 5.0][:n]
    return [{"x": (rng.standard_normal((6, 3)) * s).astype(dtype), "y": rng.standard_normal((6, 2)) * s}
            for s in scales]


def _torch_optimizer(spec, twin, frozen=()):
    """torch.optim's twin of ``spec`` (no_decay as a param group of weight decay 0), on the params
    not ``frozen``; returns it and those params."""
    named = [(n, p) for n, p in twin.named_parameters() if n not in frozen]
    for n, p in twin.named_parameters():
        p.requires_grad_(n not in frozen)
    kwargs = {k: v for k, v in spec.model_dump().items()
              if k in ("momentum", "nesterov", "weight_decay", "betas", "eps")}
    quiet = [p for n, p in named if any(fnmatchcase(n, pat) for pat in spec.no_decay)]
    groups = [{"params": [p for _, p in named if all(p is not q for q in quiet)]}]
    if quiet:
        groups.append({"params": quiet, "weight_decay": 0.0})
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[spec.kind]
    return cls(groups, lr=spec.lr, foreach=False, **kwargs), [p for _, p in named]


class _ClippingOptimizer:
    """``opt`` with torch's clipping between backward and step, as ``spec`` asks: records the
    pre-clip total norms and largest gradient entries, to check both branches were taken."""

    def __init__(self, opt, params, spec):
        self.opt, self.params, self.spec = opt, params, spec
        self.norms, self.largest = [], []

    def zero_grad(self):
        self.opt.zero_grad()

    def step(self):
        self.largest.append(max(float(p.grad.abs().max()) for p in self.params))
        if self.spec.clip_grad_value is not None:
            torch.nn.utils.clip_grad_value_(self.params, self.spec.clip_grad_value)
        if self.spec.max_grad_norm is not None:
            norm_type = float(self.spec.grad_norm_type)
            self.norms.append(float(torch.nn.utils.clip_grad_norm_(self.params, self.spec.max_grad_norm, norm_type)))
        self.opt.step()


def _assert_matches_torch(spec, backend, fused=True, frozen=(), dtypes=("float64", "float64"), rtol=1e-10):
    net = _Net(dtypes)
    arts = gc.training.generate(gc.capture(net, x=gc.spec(dtypes[0], ("N", 3))), gc.losses.mse("output", label="y"),
                                spec, frozen=frozen, fused=fused)
    twin = _twin(net)
    opt = _ClippingOptimizer(*_torch_optimizer(spec, twin, frozen), spec)
    trainer = gc.Trainer(arts, backend=backend)
    for step, batch in enumerate(_batches(dtypes[0])):
        batch["y"] = batch["y"].astype(dtypes[1])
        assert_step_matches_torch(trainer, batch, opt, lambda: _torch_loss(twin, batch), twin, step, rtol=rtol,
                                  state_rtol=rtol, skip=frozen)  # a frozen param is no train_step state
    return opt


@pytest.mark.parametrize(("name", "backend", "fused", "frozen"), [
    ("sgd-nesterov", "numpy", True, ()),
    ("sgd-nesterov", "ort-cpu", False, ()),
    ("adam", "ort-cpu", True, ("fc.bias",)),
    ("adamw-no-decay", "numpy", True, ("out.weight",)),
    ("adamw-no-decay", "ort-cpu", False, ()),
    ("sgd-inf-norm", "ort-cpu", True, ()),
    ("sgd-1-norm", "numpy", True, ()),
    ("adam-value", "ort-cpu", True, ()),
    ("sgd-value-then-norm", "numpy", True, ("fc.bias",)),
])
def test_steps_match_torch_clipping(name, backend, fused, frozen):
    spec = SPECS[name]
    opt = _assert_matches_torch(spec, backend, fused, frozen)
    if spec.max_grad_norm is not None:  # clipped on some steps, left alone on others
        assert min(opt.norms) < spec.max_grad_norm < max(opt.norms), opt.norms
    if spec.clip_grad_value is not None:
        assert min(opt.largest) < spec.clip_grad_value < max(opt.largest), opt.largest


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_params_of_two_dtypes_share_one_norm(backend):
    """A float32 and a float64 flat buffer: one total norm over both (float64, as torch stacks them)."""
    spec = gc.optim.AdamW(2 ** -6, max_grad_norm=1.0)
    opt = _assert_matches_torch(spec, backend, dtypes=("float32", "float64"), rtol=2e-6)
    assert min(opt.norms) < spec.max_grad_norm < max(opt.norms), opt.norms


def test_float16_params_clip_on_both_backends_as_torch():
    """A float16 flat buffer: its norm summed in float32 (Cast, ReduceSumSquare), Clip and the
    scaling in float16; ort-cpu runs every node, and both backends step as torch's fused Adam."""
    spec = gc.optim.Adam(2 ** -6, max_grad_norm=0.5, clip_grad_value=0.5)
    model = gc.capture(gc.nn.Linear(3, 2, dtype="float16"), x=gc.spec("float16", ("N", 3)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), spec)
    batches = [{k: v.astype(np.float16) for k, v in b.items()} for b in _batches("float32", 4)]
    linear = torch.nn.Linear(3, 2).half()
    start = gc.Trainer(arts, backend="numpy").params
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(start["weight"])), linear.bias.copy_(torch.from_numpy(start["bias"]))
    opt = torch.optim.Adam(linear.parameters(), spec.lr, fused=True)
    norms = []
    for batch in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(linear(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])).backward()
        torch.nn.utils.clip_grad_value_(linear.parameters(), 0.5)
        norms.append(float(torch.nn.utils.clip_grad_norm_(linear.parameters(), 0.5)))
        opt.step()
    assert min(norms) < 0.5 < max(norms), norms
    for backend in ("numpy", "ort-cpu"):
        trainer = gc.Trainer(arts, backend=backend)
        for batch in batches:
            trainer.step(batch)
        for name, param in (("weight", linear.weight), ("bias", linear.bias)):
            assert trainer.params[name].dtype == np.float16
            np.testing.assert_allclose(trainer.params[name].astype(np.float32), param.detach().float().numpy(),
                                       rtol=2.0 ** -9, atol=2.0 ** -12, err_msg=f"{backend} {name}")


def test_norm_is_one_reduction_per_flat_buffer():
    """The total norm reads the update's flat gradient buffers: one ReduceSumSquare each, not one
    per param; no clipping, no such node."""
    net = _Net(("float32", "float64"))
    model = gc.capture(net, x=gc.spec("float32", ("N", 3)))
    loss = gc.losses.mse("output", label="y")

    def ops(spec, **options):
        arts = gc.training.generate(model, loss, spec, **options)
        types = [n.op_type for n in arts.train_step.proto.graph.node]
        return types, arts.manifest

    types, manifest = ops(gc.optim.SGD(0.1, max_grad_norm=1.0))
    assert len(manifest.layout) == 2 and types.count("ReduceSumSquare") == 2
    types, _ = ops(gc.optim.SGD(0.1, max_grad_norm=1.0), fused=False)
    assert types.count("ReduceSumSquare") == 4  # one per param without the fused layout
    types, _ = ops(gc.optim.SGD(0.1))
    assert "ReduceSumSquare" not in types and "Clip" not in types


class _Sqrt(gc.nn.Module):
    """``y = x * w + sqrt(s)``: an ``s`` entry at 0 has an infinite gradient and a finite loss."""

    def __init__(self):
        super().__init__()
        self.w = gc.nn.Parameter(np.array([0.5, -1.0, 2.0]), dtype="float64")
        self.s = gc.nn.Parameter(np.array([0.0, 1.0, 4.0]), dtype="float64")

    def forward(self, x):
        return x * self.w + gc.sqrt(self.s)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("norm_type", [2.0, "inf"])
@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_nonfinite_norm_propagates_as_torch(backend, norm_type, poison):
    """error_if_nonfinite=False: a NaN gradient makes the norm NaN and every gradient NaN; an
    infinite one makes the norm inf, the other gradients 0 and the infinite entry NaN (inf * 0)."""
    module = _Sqrt()
    spec = gc.optim.SGD(0.125, max_grad_norm=1.0, grad_norm_type=norm_type)
    arts = gc.training.generate(gc.capture(module, x=gc.spec("float64", ("N", 3))),
                                gc.losses.mse("output", label="y"), spec)
    x = np.array([[1.0, 2.0, 3.0], [0.5, -1.0, 1.5]])
    if poison == "nan":
        x[1, 2] = np.nan  # the loss is NaN too; Trainer.step still steps (fit would stop)
    batch = {"x": x, "y": np.ones((2, 3))}
    w, s = (torch.nn.Parameter(torch.from_numpy(np.asarray(v).copy())) for v in (module.w.data, module.s.data))
    torch.nn.functional.mse_loss(torch.from_numpy(x) * w + torch.sqrt(s), torch.from_numpy(batch["y"])).backward()
    norm = torch.nn.utils.clip_grad_norm_([w, s], 1.0, float(norm_type))
    assert (np.isnan if poison == "nan" else np.isposinf)(norm.item())
    torch.optim.SGD([w, s], lr=0.125).step()
    trainer = gc.Trainer(arts, backend=backend)
    trainer.step(batch)
    for name, want in (("w", w), ("s", s)):
        np.testing.assert_array_equal(trainer.params[name], want.detach().numpy(), err_msg=name)


def test_spec_round_trips_through_save_load_and_checkpoint_resume(tmp_path):
    spec = gc.optim.AdamW(2 ** -6, max_grad_norm=1.0, grad_norm_type="inf", clip_grad_value=0.5)
    net = _Net()
    gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                         spec).save(tmp_path / "arts")
    manifest = json.loads((tmp_path / "arts" / "manifest.json").read_text())
    assert manifest["optimizer"]["grad_norm_type"] == "inf"  # JSON has no infinity
    arts = gc.training.load(tmp_path / "arts")
    assert gc.optim.from_dict(arts.manifest.optimizer) == spec
    whole, resumed = straight_and_resumed(arts, _batches(), 2, tmp_path / "ckpt",
                                          resumed_arts=gc.training.load(tmp_path / "arts"))
    for name, value in whole.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_update_graph_clips_as_train_step(backend):
    """``update_model`` (what data-parallel replicas apply to the averaged gradients) clips them as
    train_step does: the gradients graph's outputs through it give train_step's next params."""
    spec = SPECS["sgd-value-then-norm"]
    arts = gc.training.generate(gc.capture(_Net(), x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                spec)
    batch = _batches()[1]  # large gradients: both clippings act
    trainer = gc.Trainer(arts, backend=backend)
    trainer.step(batch)
    grads = gc.Session(arts.gradients, backend=backend).run(batch)
    update = gc.training.update_model(arts.manifest)
    feeds = {**arts.manifest.pack(arts.state), **grads}
    out = gc.Session(update, backend=backend).run({s.name: feeds[s.name] for s in update.inputs})
    for p in arts.manifest.trainable:
        np.testing.assert_allclose(out[f"{p}.next"], trainer.params[p], rtol=1e-12, err_msg=p)
    plain = gc.training.generate(gc.capture(_Net(), x=gc.spec("float64", ("N", 3))),
                                 gc.losses.mse("output", label="y"), gc.optim.SGD(0.125, momentum=0.5))
    unclipped = gc.Session(gc.training.update_model(plain.manifest), backend=backend).run(
        {s.name: feeds[s.name] for s in update.inputs})
    assert not np.allclose(unclipped["out.weight.next"], trainer.params["out.weight"])


def test_fit_records_each_steps_norm_as_torch_returns_it(tmp_path):
    """train_step's ``grad_norm`` output (role grad_norm; not in the update graph that data-parallel
    replicas carry) reaches History.step_grad_norms and TensorBoard's train/grad_norm."""
    pytest.importorskip("tensorboard", reason="tensorboard is a dev extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = SPECS["sgd-nesterov"]
    net = _Net()
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                spec)
    assert [(e.name, e.dtype, e.shape) for e in arts.manifest.graphs["train_step"].outputs
            if e.role == "grad_norm"] == [("grad_norm", "float64", [])]
    assert "grad_norm" not in {o.name for o in gc.training.update_model(arts.manifest).outputs}
    batches = _batches()
    loader = gc.data.DataLoader({k: np.concatenate([b[k] for b in batches]) for k in ("x", "y")}, batch_size=6,
                                shuffle=False)
    history = gc.Trainer(arts, backend="ort-cpu", tensorboard=tmp_path / "tb").fit(loader, 1, progress=False,
                                                                                  quiet=True)
    twin = _twin(net)
    opt = _ClippingOptimizer(*_torch_optimizer(spec, twin), spec)
    for batch in batches:
        opt.zero_grad()
        _torch_loss(twin, batch).backward()
        opt.step()
    np.testing.assert_allclose(history.step_grad_norms, opt.norms, rtol=1e-10)
    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    logged = board.Scalars("train/grad_norm")
    assert [e.step for e in logged] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([e.value for e in logged], opt.norms, rtol=1e-6)  # stored as float32
    plain = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 3))), gc.losses.mse("output", label="y"),
                                 gc.optim.SGD(0.125, clip_grad_value=0.5))
    assert "grad_norm" not in {e.role for e in plain.manifest.graphs["train_step"].outputs}
    assert gc.Trainer(plain, backend="numpy").fit(loader, 1, progress=False, quiet=True).step_grad_norms == []


def test_grad_norm_is_a_reserved_name_only_with_max_grad_norm():
    proto = gc.capture(gc.nn.Linear(3, 2), x=gc.spec("float32", ("N", 3))).proto
    proto.graph.output[0].name = proto.graph.node[-1].output[0] = "grad_norm"
    model, loss = gc.load(proto), gc.losses.mse("grad_norm", label="y")
    with pytest.raises(gc.GraphError, match="output 'grad_norm' .*the gradients' total norm"):
        gc.training.generate(model, loss, gc.optim.SGD(0.1, max_grad_norm=1.0))
    gc.training.generate(model, loss, gc.optim.SGD(0.1, clip_grad_value=1.0))


def test_old_specs_without_the_fields_read_as_no_clipping():
    old = {"kind": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0, "no_decay": []}
    spec = gc.optim.from_dict(old)
    assert spec.max_grad_norm is None and spec.clip_grad_value is None and spec.grad_norm_type == 2.0
    assert spec.model_dump(mode="json") == old  # and a spec without clipping writes the JSON it did before


@pytest.mark.parametrize(("options", "match"), [
    ({"max_grad_norm": 0.0}, "max_grad_norm\n.*greater than 0"),
    ({"max_grad_norm": -1.0}, "max_grad_norm\n.*greater than 0"),
    ({"max_grad_norm": float("inf")}, "max_grad_norm\n.*finite number"),
    ({"max_grad_norm": float("nan")}, "max_grad_norm\n.*finite number"),
    ({"clip_grad_value": 0.0}, "clip_grad_value\n.*greater than 0"),
    ({"clip_grad_value": float("inf")}, "clip_grad_value\n.*finite number"),
    ({"max_grad_norm": 1.0, "grad_norm_type": 3.0}, "grad_norm_type\n.*2.0, 1.0 or 'inf'"),
    ({"max_grad_norm": 1.0, "grad_norm_type": "max"}, "grad_norm_type\n.*2.0, 1.0 or 'inf'"),
    ({"grad_norm_type": "inf"}, "give max_grad_norm too"),
])
def test_validation_names_the_field(options, match):
    for cls in (gc.optim.SGD, gc.optim.Adam, gc.optim.AdamW):
        with pytest.raises(ValueError, match=match):
            cls(0.1, **options)


GRAPHC = str(Path(sys.executable).parent / "graphc")


def _graphc(*args):
    return subprocess.run([GRAPHC, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def test_cli_grad_flags(tmp_path):
    onnx.save(gc.capture(_Net(), x=gc.spec("float64", ("N", 3))).proto, tmp_path / "net.onnx")
    r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:output:y", "--optimizer", "adamw", "--max-grad-norm",
                "0.5", "--grad-norm-type", "inf", "--clip-grad-value", "0.25", "-o", tmp_path / "arts")
    assert r.returncode == 0, r.stderr
    assert "clip_grad_value=0.25 max_grad_norm=0.5 (inf-norm)" in r.stdout
    optimizer = gc.training.read_manifest(tmp_path / "arts").optimizer
    assert gc.optim.from_dict(optimizer) == gc.optim.AdamW(max_grad_norm=0.5, grad_norm_type="inf",
                                                           clip_grad_value=0.25)
    r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:output:y", "--max-grad-norm", "0", "-o", tmp_path / "x")
    assert r.returncode == 2 and "--max-grad-norm: Input should be greater than 0 (got 0.0)" in r.stderr
    r = _graphc("grad", tmp_path / "net.onnx", "--loss", "mse:output:y", "--max-grad-norm", "1",
                "--grad-norm-type", "two", "-o", tmp_path / "x")
    assert r.returncode == 2 and "--grad-norm-type must be 2, 1 or inf, got 'two'" in r.stderr
