"""The optimizer and loss options torch users reach for: SGD ``dampening``, Adam/AdamW
``amsgrad``, ``maximize`` (each kind) and the cross-entropy loss spec's class ``weight``, vs
torch.optim and torch.nn.functional.cross_entropy over 25 steps, on numpy and ort-cpu."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import graphc as gc
from graphc.passes.training import flat, optimizers, update_graphs
from test_optim import SHAPE, run_steps, step_both, torch_state, torch_steps
from trainer_models import straight_and_resumed

STEPS = 25
SPECS = [
    gc.optim.SGD(0.05, momentum=0.9, dampening=0.3),
    gc.optim.SGD(0.05, momentum=0.8, dampening=0.5, weight_decay=0.01, maximize=True),
    gc.optim.SGD(0.1, weight_decay=0.1, maximize=True),
    gc.optim.SGD(0.05, momentum=0.9, nesterov=True, maximize=True),
    gc.optim.Adam(0.01, amsgrad=True),
    gc.optim.Adam(0.01, betas=(0.8, 0.99), weight_decay=0.05, amsgrad=True, maximize=True),
    gc.optim.Adam(0.01, maximize=True),
    gc.optim.AdamW(0.02, weight_decay=0.1, amsgrad=True),
    gc.optim.AdamW(0.02, amsgrad=True, maximize=True),
]
IDS = [f"{s.kind}-{i}" for i, s in enumerate(SPECS)]


def _grads(seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Gradients whose size shrinks and jumps back, so that amsgrad's running maximum of the second
    moment differs from the moment itself."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=SHAPE), [rng.normal(size=SHAPE) * (3.0 if t % 7 == 0 else 1.0 / (1 + t))
                                    for t in range(STEPS)]


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_update_matches_torch_optim(spec, backend, dtype):
    torch = pytest.importorskip("torch")
    p0, grads = _grads(IDS.index(f"{spec.kind}-{SPECS.index(spec)}"))
    got = run_steps(spec, backend, grads, p0, dtype=dtype)
    want = torch_steps(torch, spec, p0, grads, dtype)
    rtol, atol = (1e-12, 1e-14) if dtype == np.float64 else (2e-5, 1e-6)
    for t, ((p_graph, state_graph), (p_torch, state_torch)) in enumerate(zip(got, want), start=1):
        np.testing.assert_allclose(p_graph, p_torch, rtol=rtol, atol=atol, err_msg=f"step {t}")
        assert set(state_graph) == set(state_torch)
        for slot, value in state_graph.items():
            np.testing.assert_allclose(value, state_torch[slot], rtol=rtol, atol=atol, err_msg=f"step {t} {slot}")


@pytest.mark.parametrize("spec", [s for s in SPECS if s.kind != "sgd"], ids=[i for i in IDS if "adam" in i])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_mixed_dtypes_in_one_update_match_torch(spec, backend):
    """float16, float32 and float64 params in one fused update (a flat group each): the float16
    group keeps the second moment as torch's average (``exp_avg_sq``, stepped in float32 as torch's
    fused Adam), the others as its sum (``exp_sum_sq``, torch's over ``1 - b2``); each param and
    state matches torch.optim's."""
    torch = pytest.importorskip("torch")
    types = {np.float16: ir.DataType.FLOAT16, np.float32: ir.DataType.FLOAT, np.float64: ir.DataType.DOUBLE}
    params = [ir.Value(name=f"w{i}", type=ir.TensorType(t), shape=ir.Shape(SHAPE))
              for i, t in enumerate(types.values())]
    groups = [flat.Group(f"params.{i}", t, [f"w{i}"], [SHAPE], True) for i, t in enumerate(types.values())]
    proto = ir.to_proto(update_graphs.update_graph(21, spec.model_dump(), params, groups))
    onnx.checker.check_model(proto, full_check=True)
    session = gc.Session(gc.load(proto), backend=backend)
    p0, grads = _grads(5)
    feeds = {name: np.zeros(int(np.prod(SHAPE)), dtype) for i, dtype in enumerate(types)
             for name in (f"params.{i}.{s}" for s in optimizers.state_slots(spec.model_dump(), types[dtype]))}
    feeds.update({f"w{i}": p0.astype(dtype) for i, dtype in enumerate(types)}, step=np.array(0, np.int64),
                 lr=np.array(spec.lr))
    assert sorted(n.rpartition(".")[2] for n in feeds if n.startswith("params.0.")) == sorted(
        ["exp_sum", "exp_avg_sq", *(["max_exp_avg_sq"] if spec.amsgrad else [])])
    want = {dtype: torch_steps(torch, spec, p0, grads, dtype, fused=dtype == np.float16) for dtype in types}
    for t, g in enumerate(grads):
        out = session.run({**feeds, **{f"w{i}_grad": g.astype(dtype) for i, dtype in enumerate(types)}})
        feeds = {name.removesuffix(".next"): value for name, value in out.items()}
        for i, dtype in enumerate(types):
            p_torch, state_torch = want[dtype][t]
            # float16: within 2 ulps, or one of the largest param's (an element passing 0; the first moment's sum
            # rounds unlike torch's average, as ``test_optim``'s half test finds over fewer steps)
            rtol, atol = {np.float16: (2.0 ** -9, 2.0 ** -10 * np.abs(p_torch).max()), np.float32: (2e-5, 1e-6),
                          np.float64: (1e-12, 1e-14)}[dtype]
            np.testing.assert_allclose(feeds[f"w{i}"].astype(np.float64), p_torch.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=f"{dtype.__name__} step {t + 1}")
            state = torch_state(spec, {n.rpartition(".")[2]: v.reshape(SHAPE) for n, v in feeds.items()
                                       if n.startswith(f"params.{i}.")})
            assert set(state) == set(state_torch)
            for slot, value in state.items():
                want_state = state_torch[slot].astype(np.float64)
                if dtype == np.float16:  # stored in float16, the first moment as its sum (rounded unlike torch's)
                    rtol, atol = 2.0 ** -9, 2.0 ** -9 * np.abs(want_state).max()
                np.testing.assert_allclose(value.astype(np.float64), want_state, rtol=rtol, atol=atol,
                                           err_msg=f"{dtype.__name__} step {t + 1} {slot}")


def test_defaults_dump_as_before_and_bad_options_are_named():
    assert gc.optim.SGD(0.1, momentum=0.9).model_dump() == {
        "kind": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0, "no_decay": ()}
    assert set(gc.optim.AdamW(0.1).model_dump()) == {"kind", "lr", "betas", "eps", "weight_decay", "no_decay"}
    for spec in SPECS:
        assert gc.optim.from_dict(spec.model_dump(mode="json")) == spec
    assert gc.optim.Adam(amsgrad=True).state_slots == ("exp_sum", "exp_sum_sq", "max_exp_sum_sq")
    for half in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):  # their second moment stays PyTorch's average
        assert optimizers.state_slots(gc.optim.AdamW(amsgrad=True).model_dump(), half) == (
            "exp_sum", "exp_avg_sq", "max_exp_avg_sq")
    assert gc.optim.SGD(0.1, momentum=0.9, dampening=0.5).state_slots == ("momentum_buffer",)
    with pytest.raises(ValueError, match="dampening 0"):
        gc.optim.SGD(0.1, momentum=0.9, nesterov=True, dampening=0.1)
    with pytest.raises(ValueError, match="amsgrad"):
        gc.optim.SGD(0.1, amsgrad=True)  # torch's SGD has none


class _MLP(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = gc.nn.Linear(5, 7, dtype="float64")
        self.fc2 = gc.nn.Linear(7, 4, dtype="float64")

    def forward(self, x):
        return {"logits": self.fc2(gc.tanh(self.fc1(x)))}


WEIGHT = [1.0, 2.5, 0.5, 0.0]
LOSSES = [{"weight": WEIGHT}, {"weight": WEIGHT, "ignore_index": 1, "label_smoothing": 0.2},
          {"weight": WEIGHT, "reduction": "sum", "label_smoothing": 0.1}]


def _batches(n: int = 20, rows: int = 6):
    rng = np.random.default_rng(7)
    return [{"x": rng.normal(size=(rows, 5)), "y": rng.integers(0, 4, size=rows)} for _ in range(n)]


def _arts(loss: dict, spec):
    model = gc.capture(_MLP(), seed=0, x=gc.spec("float64", ("N", 5)))
    return gc.training.generate(model, gc.losses.cross_entropy("logits", label="y", **loss), spec)


@pytest.mark.parametrize("loss", LOSSES, ids=["weight", "weight-ignore-smoothing", "weight-sum"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_weighted_cross_entropy_trains_as_torch(loss, backend):
    """The Trainer (fused update, float64) against torch over 20 steps: each step's loss and the
    params after it, with the new optimizer options on."""
    torch = pytest.importorskip("torch")
    spec = gc.optim.Adam(0.05, amsgrad=True, weight_decay=0.01)
    arts = _arts(loss, spec)
    assert arts.manifest.loss["options"]["weight"] == WEIGHT
    trainer = gc.Trainer(arts, backend=backend)
    params = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in trainer.params.items()}
    opt = torch.optim.Adam(params.values(), 0.05, amsgrad=True, weight_decay=0.01, foreach=False)
    kwargs = {**loss, "weight": torch.tensor(WEIGHT, dtype=torch.float64)}
    for t, batch in enumerate(_batches(), start=1):
        x, y = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])
        hidden = torch.tanh(x @ params["fc1.weight"].T + params["fc1.bias"])
        want = torch.nn.functional.cross_entropy(hidden @ params["fc2.weight"].T + params["fc2.bias"], y, **kwargs)
        step_both(trainer, opt, params, batch, want, t)


def test_evaluate_loader_weights_batches_by_their_class_weights():
    """The loader's loss is the weighted mean over all its labels, as one batch: each batch counts by
    the sum of its labels' class weights, not by their number."""
    arts = _arts(LOSSES[1], gc.optim.SGD(0.1))
    trainer, batches = gc.Trainer(arts, backend="numpy"), _batches(3)
    whole = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    np.testing.assert_allclose(trainer.evaluate_loader(batches)["loss"], trainer.evaluate(whole)["loss"], rtol=1e-13)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("spec", [gc.optim.AdamW(0.05, amsgrad=True, maximize=True),
                                  gc.optim.SGD(0.05, momentum=0.9, dampening=0.4)], ids=["adamw", "sgd"])
def test_resume_with_the_new_slots_is_bit_exact(tmp_path, backend, spec):
    arts = _arts(LOSSES[0], spec)
    straight, resumed = straight_and_resumed(arts, _batches(10), 4, tmp_path / "ck", backend=backend)
    state = straight.state_dict()
    if spec.kind == "adamw":
        assert {"fc1.weight.max_exp_sum_sq", "fc2.bias.exp_sum_sq"} <= set(state)
    for name, value in state.items():
        assert resumed.state_dict()[name].tobytes() == value.tobytes(), name


def test_class_weights_are_checked():
    with pytest.raises(ValueError, match="one finite number per class"):
        gc.losses.cross_entropy("logits", label="y", weight=[1.0, float("nan")])
    with pytest.raises(ValueError, match="one finite number per class"):
        gc.losses.cross_entropy("logits", label="y", weight=[[1.0, 2.0]])
    with pytest.raises(Exception, match="classes and weights"):
        _arts({"weight": [1.0, 2.0]}, gc.optim.SGD(0.1))  # 4 classes
    with pytest.raises(ValueError, match="has no option"):
        gc.losses.mse("out", label="y").model_copy(update={"options": {"weight": [1.0]}}).resolved_options()


def test_cli_grad_flags(tmp_path):
    import onnx

    from test_grad_clipping import _graphc

    onnx.save(gc.capture(_MLP(), x=gc.spec("float64", ("N", 5))).proto, tmp_path / "net.onnx")
    np.save(tmp_path / "w.npy", np.array(WEIGHT))
    for weights in ("1,2.5,0.5,0", tmp_path / "w.npy"):
        r = _graphc("grad", tmp_path / "net.onnx", "--loss", "cross_entropy:logits:y", "--optimizer", "adamw",
                    "--amsgrad", "--maximize", "--class-weights", weights, "-o", tmp_path / "arts")
        assert r.returncode == 0, r.stderr
        assert "amsgrad maximize" in r.stdout
        manifest = gc.training.read_manifest(tmp_path / "arts")
        assert gc.optim.from_dict(manifest.optimizer) == gc.optim.AdamW(amsgrad=True, maximize=True)
        assert manifest.loss["options"]["weight"] == WEIGHT
    r = _graphc("grad", tmp_path / "net.onnx", "--loss", "cross_entropy:logits:y", "--momentum", "0.9",
                "--dampening", "0.5", "-o", tmp_path / "sgd")
    assert r.returncode == 0, r.stderr
    assert gc.training.read_manifest(tmp_path / "sgd").optimizer["dampening"] == 0.5
    for flags, message in [(("--amsgrad",), "--amsgrad applies to adam and adamw, not --optimizer sgd"),
                           (("--class-weights", "1,x"), "--class-weights must be numbers"),
                           (("--class-weights", "1,2"), "classes and weights"),
                           (("--loss", "mse:logits:y", "--class-weights", "1,2"), "applies to a cross_entropy loss")]:
        loss = () if "--loss" in flags else ("--loss", "cross_entropy:logits:y")
        r = _graphc("grad", tmp_path / "net.onnx", *loss, *flags, "-o", tmp_path / "bad")
        assert r.returncode != 0 and message in r.stderr, (flags, r.stderr)


def _weightless(batches: list[dict], ignore: int, *numbers: int) -> list[dict]:
    """``batches`` with those of ``numbers`` (0-based) holding labels of class weight 0 (class 3)
    and ignored ones only."""
    for i in numbers:
        batches[i]["y"][:] = 3
        batches[i]["y"][::4] = ignore
    return batches


@pytest.mark.parametrize("loss", LOSSES[:2], ids=["weight", "weight-ignore-smoothing"])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_evaluate_loader_joins_a_batch_whose_labels_weigh_0(loss, backend):
    """A batch whose counted labels all have class weight 0 has a mean of 0/0 on its own, yet its
    labels count in the set's accuracy and, with label smoothing, its smoothing term in the set's
    weighted sum (torch's one call over the whole set). evaluate_loader skipped it: 1.6878 for
    1.8233 (and an accuracy of 0.333 for 0.364) with smoothing. Now it is evaluated joined to a
    neighbour: first, last, in the middle, two in a row, next to a batch of ignored labels only."""
    torch = pytest.importorskip("torch")
    trainer = gc.Trainer(_arts(loss, gc.optim.SGD(0.1)), backend=backend)
    ignore = loss.get("ignore_index", -100)
    for numbers in [(1,), (0,), (4,), (1, 2), (0, 1, 3)]:
        batches = _weightless(_batches(5), ignore, *numbers)
        if 3 not in numbers:
            batches[3]["y"][:] = ignore
        whole = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        p = trainer.params
        logits = np.tanh(whole["x"] @ p["fc1.weight"].T + p["fc1.bias"]) @ p["fc2.weight"].T + p["fc2.bias"]
        want = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(whole["y"]),
                                                 **{**loss, "weight": torch.tensor(WEIGHT, dtype=torch.float64)})
        got, one = trainer.evaluate_loader(batches), trainer.evaluate(whole)
        np.testing.assert_allclose(got["loss"], want.item(), rtol=1e-12, err_msg=str(numbers))
        np.testing.assert_allclose(got["loss"], one["loss"], rtol=1e-12, err_msg=str(numbers))
        assert got["accuracy"] == pytest.approx(one["accuracy"], rel=1e-12), numbers
    with pytest.raises(gc.InputError, match="no sample of the eval loader counts in the loss .* class weights sum to 0"):
        trainer.evaluate_loader(_weightless(_batches(2), ignore, 0, 1))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_batch_whose_labels_weigh_0_is_refused_by_step_and_skipped_by_fit(backend):
    """torch's weighted mean over labels whose class weights sum to 0 is 0/0, NaN; the train step
    wrote NaN into every param (an inf loss with label smoothing) with no error, and fit then
    raised TrainingFailed. As for a batch of ignored labels only: step and evaluate refuse it,
    naming it, before any update; fit skips it with a warning (no step, no loss, no samples); a
    training set whose labels all weigh 0 is refused before the first step."""
    torch = pytest.importorskip("torch")
    arts = _arts(LOSSES[1], gc.optim.Adam(0.05))
    trainer = gc.Trainer(arts, backend=backend)
    batches = _weightless(_batches(3), 1, 1)
    logits = torch.zeros(len(batches[1]["y"]), 4, dtype=torch.float64)
    assert torch.nn.functional.cross_entropy(logits, torch.from_numpy(batches[1]["y"]), ignore_index=1,
                                             weight=torch.tensor(WEIGHT, dtype=torch.float64)).isnan()
    before = trainer.state_dict()
    for call, what in ((trainer.step, "a train step"), (trainer.evaluate, "an evaluation")):
        with pytest.raises(gc.InputError, match=rf"{what}: the class weights of the labels in 'y' that are not the "
                                                r"ignore index 1 sum to 0 \(weight=\[1.0, 2.5, 0.5, 0.0\]\)"):
            call(batches[1])
    assert trainer.step_count == 0
    for name, value in before.items():
        np.testing.assert_array_equal(trainer.state_dict()[name], value, err_msg=name)
    data = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    with pytest.warns(UserWarning, match=r"epoch [12], batch 2 of 3: the class weights of its labels in 'y' sum to "
                                         r"0 \(weight=\[1.0, 2.5, 0.5, 0.0\]\); skipped \(no step: ") as caught:
        history = trainer.fit(gc.data.DataLoader(data, 6, shuffle=False), 2, progress=False, quiet=True)
    assert len([w for w in caught if "sum to 0" in str(w.message)]) == 2
    oracle = gc.Trainer(arts, backend=backend)
    losses = [oracle.step(batch) for _ in range(2) for batch in (batches[0], batches[2])]
    assert history.step_losses == losses and trainer.step_count == 4
    assert [(e.steps, e.samples) for e in history.epochs] == [(2, 12), (2, 12)]
    for name, value in oracle.state_dict().items():
        np.testing.assert_array_equal(trainer.state_dict()[name], value, err_msg=name)
    with pytest.raises(gc.InputError, match="the training loader: the class weights .* sum to 0"):
        trainer.fit(gc.data.DataLoader(batches[1], 3), 3, progress=False)
    assert trainer.step_count == 4


def test_evaluate_loader_refuses_a_batch_whose_labels_weigh_0_with_no_batch_dim_to_join_by():
    """A model captured with a fixed batch size cannot evaluate two batches joined: the batch
    whose labels weigh 0 is named, where it was dropped from the loss and the metrics."""
    model = gc.capture(_MLP(), seed=0, x=gc.spec("float64", (6, 5)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y", **LOSSES[1]), gc.optim.SGD(0.1))
    with pytest.raises(gc.InputError, match=r"batch 2 of the eval loader: the class weights .* sum to 0, .* no input "
                                            r"of the eval graph has a symbolic batch dim"):
        gc.Trainer(arts, backend="numpy").evaluate_loader(_weightless(_batches(3), 1, 1))
