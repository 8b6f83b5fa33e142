"""This session's training features drawn together with the older options: an Embedding with
``max_norm`` looked up inside ``gc.fori_loop``/``gc.scan``/``gc.cond`` under loss scaling, autocast,
recompute, fused updates, clipping and frozen params, against torch's Python loop (``torch.autocast``,
``torch.amp.GradScaler``), resumed bit for bit and exported; ``SyncBatchNorm`` in one process under
frozen params, loss scaling, autocast and recompute, against plain BatchNorm; uint8 labels with label
smoothing, class weights and an ignore index, against int64 labels and torch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(0)
ROWS, DIM = 8, 4


# --- Embedding(max_norm) inside a control-flow body ------------------------------------------------

def _acc(kind: str, emb, i, zeros):
    """The embeddings of ``i``'s rows summed in a loop (``cond``: rows 0 and 2 where ``i[0, 0] >= 3``)."""
    if kind == "fori_loop":
        return gc.fori_loop(0, 3, lambda k, a: a + emb(i[k]).sum(0), zeros)
    if kind == "scan":
        return gc.scan(lambda a, row: (a + emb(row).sum(0), row), zeros, i)[0]
    return gc.cond(i[0, 0] >= 3, lambda: emb(i[0]).sum(0) + emb(i[2]).sum(0), lambda: zeros)


class _LoopNet(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.emb = nn.Embedding(ROWS, DIM, max_norm=1.0, dtype="float32")
        self.emb.weight = nn.Parameter((RNG.normal(size=(ROWS, DIM)) * 1.5).astype(np.float32), dtype="float32")
        self.fc, self.head = nn.Linear(DIM, 6, dtype="float32"), nn.Linear(6, 3, dtype="float32")

    def forward(self, i):
        return self.head(self.fc(_acc(self.kind, self.emb, i, gc.zeros((DIM,), dtype="float32"))).relu())


class _LoopTwin(torch.nn.Module):
    def __init__(self, kind: str, state: dict):
        super().__init__()
        self.kind = kind
        self.emb = torch.nn.Embedding(ROWS, DIM, max_norm=1.0)
        self.fc, self.head = torch.nn.Linear(DIM, 6), torch.nn.Linear(6, 3)
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})

    def forward(self, i):
        acc = torch.zeros(DIM)
        for k in ([0, 2] if i[0, 0] >= 3 else []) if self.kind == "cond" else range(3):
            acc = acc + self.emb(i[k]).sum(0)  # renormalises the rows looked up in place, in order
        return self.head(torch.relu(self.fc(acc)))


LOOP_CASES = {  # autocast, loss scale, optimizer, frozen, backend; all with recompute, fused and clipping
    "bf16-dynamic-adam": ("bfloat16", "dynamic", "adam", (), "ort-cpu"),
    "f16-static-sgd-frozen": ("float16", 256.0, "sgd", ("head.bias",), "numpy"),
    "f32-dynamic-sgd-frozen-fc": (None, "dynamic", "sgd", ("fc.weight",), "ort-cpu"),
}


def _torch_scaler(scale):
    if scale is None:
        return None
    dynamic = scale == "dynamic"
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 12 if dynamic else scale,
                                growth_interval=2 if dynamic else 10 ** 9)


@pytest.mark.parametrize("case", sorted(LOOP_CASES))
@pytest.mark.parametrize("kind", ["fori_loop", "scan", "cond"])
def test_max_norm_in_a_body_with_the_options_matches_torch_resumes_and_exports(tmp_path, kind, case):
    """6 steps: losses and params within 2e-5 of torch's loop (measured 1.2e-7), the scale sequence
    exact; a run resumed from step 3's checkpoint bit for bit; the export equal to ``predict``."""
    autocast, scale, opt, frozen, backend = LOOP_CASES[case]
    net = _LoopNet(kind)
    model = gc.capture(net, seed=1, i=gc.spec("int64", (3, 4)))
    spec = (gc.optim.Adam(lr=0.02, max_grad_norm=0.5) if opt == "adam"
            else gc.optim.SGD(lr=0.1, momentum=0.9, max_grad_norm=0.5))
    loss_scale = gc.amp.GradScaler(init_scale=2.0 ** 12, growth_interval=2) if scale == "dynamic" else scale
    gc.training.generate(model, gc.losses.mse("output", label="y"), spec, frozen=frozen, fused=True, recompute=True,
                         loss_scale=loss_scale, autocast=autocast).save(tmp_path / "arts")
    twin = _LoopTwin(kind, net.state_dict())
    params = [p for n, p in twin.named_parameters() if n not in frozen]
    for n, p in twin.named_parameters():
        p.requires_grad_(n not in frozen)
    topt = torch.optim.Adam(params, lr=0.02) if opt == "adam" else torch.optim.SGD(params, lr=0.1, momentum=0.9)
    scaler = _torch_scaler(scale)
    batches = [{"i": RNG.integers(0, ROWS, (3, 4)), "y": RNG.normal(size=(3,)).astype(np.float32)} for _ in range(6)]
    for b in batches:
        b["i"][0, 0] = 5  # cond takes the branch that looks up (an untaken one: see the hand-back)
    want = []
    for b in batches:
        topt.zero_grad()
        with torch.autocast("cpu", dtype=getattr(torch, autocast or "float32"), enabled=autocast is not None):
            loss = F.mse_loss(twin(torch.from_numpy(b["i"])).float(), torch.from_numpy(b["y"]))
        (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale_(topt)
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        if scaler is None:
            topt.step()
        else:
            scaler.step(topt)
            scaler.update()
        want.append(loss.item())

    trainer = gc.Trainer(tmp_path / "arts", backend=backend)
    losses = [trainer.step(b) for b in batches[:3]]
    trainer.save_checkpoint(tmp_path / "ck")
    losses += [trainer.step(b) for b in batches[3:]]
    np.testing.assert_allclose(losses, want, rtol=2e-5, atol=2e-6)
    ours = trainer.state_dict()
    for name, value in twin.state_dict().items():
        if name not in frozen:
            np.testing.assert_allclose(ours[name], value.numpy(), rtol=2e-5, atol=2e-6, err_msg=name)
    if scaler is not None:
        assert trainer.loss_scale == scaler.get_scale()
    resumed = gc.Trainer(tmp_path / "ck", backend=backend)
    assert [resumed.step(b) for b in batches[3:]] == losses[3:]
    for name, value in resumed.state_dict().items():
        np.testing.assert_array_equal(value, ours[name], err_msg=name)
    path = trainer.export_inference(tmp_path / "inference.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    want_out = trainer.predict({"i": batches[0]["i"]})["output"]
    got = gc.Session(path, backend=backend).run({"i": batches[0]["i"]})["output"]
    np.testing.assert_allclose(got, want_out, rtol=1e-5, atol=1e-6)


# --- SyncBatchNorm in one process ------------------------------------------------------------------

class _NormNet(nn.Module):
    def __init__(self, sync: bool):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1, bias=False, dtype="float32")
        self.bn = (nn.SyncBatchNorm if sync else nn.BatchNorm2d)(3, dtype="float32")
        self.fc = nn.Linear(48, 5, bias=False, dtype="float32")  # a bias before BatchNorm: true gradient 0
        self.bn2 = (nn.SyncBatchNorm if sync else nn.BatchNorm1d)(5, momentum=None, dtype="float32")
        self.head = nn.Linear(5, 3, dtype="float32")

    def forward(self, x):
        return self.head(self.bn2(self.fc(self.bn(self.conv(x)).relu().flatten(1))).relu())


NORM_CASES = {  # frozen, loss scale, autocast, recompute, fused, optimizer
    "frozen-bn-dynamic-recompute": (("bn.weight",), "dynamic", None, True, True, "adamw"),
    "frozen-bias-static-bf16": (("head.bias", "bn2.bias"), 128.0, "bfloat16", False, False, "sgd"),
}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("case", sorted(NORM_CASES))
def test_sync_batchnorm_with_the_options_trains_as_batchnorm_in_one_process_and_resumes(tmp_path, case, backend):
    """5 steps of label-smoothed cross-entropy with clipping: SyncBatchNorm's written-out statistics
    (exchanges the identity) train as BatchNorm's to 1e-6 (measured 1.2e-7), the running
    statistics too; resumed bit for bit; the exports agree."""
    frozen, scale, autocast, recompute, fused, opt = NORM_CASES[case]
    batches = [{"x": (RNG.standard_normal((6, 2, 4, 4)) * 2 + 1).astype(np.float32), "y": RNG.integers(0, 3, 6)}
               for _ in range(5)]
    runs = {}
    for sync in (False, True):
        model = gc.capture(_NormNet(sync), seed=3, x=gc.spec("float32", ("N", 2, 4, 4)))
        spec = (gc.optim.AdamW(0.01, max_grad_norm=1.0) if opt == "adamw"
                else gc.optim.SGD(0.1, momentum=0.9, clip_grad_value=0.5))
        loss_scale = gc.amp.GradScaler(init_scale=2.0 ** 14, growth_interval=2) if scale == "dynamic" else scale
        folder = tmp_path / f"sync{sync}"
        gc.training.generate(model, gc.losses.cross_entropy("output", label="y", label_smoothing=0.1), spec,
                             frozen=frozen, fused=fused, recompute=recompute, loss_scale=loss_scale,
                             autocast=autocast).save(folder / "arts")
        trainer = gc.Trainer(folder / "arts", backend=backend)
        losses = [trainer.step(b) for b in batches[:2]]
        trainer.save_checkpoint(folder / "ck")
        losses += [trainer.step(b) for b in batches[2:]]
        resumed = gc.Trainer(folder / "ck", backend=backend)
        assert [resumed.step(b) for b in batches[2:]] == losses[2:]
        for name, value in resumed.state_dict().items():
            np.testing.assert_array_equal(value, trainer.state_dict()[name], err_msg=name)
        out = gc.Session(trainer.export_inference(folder / "m.onnx"), backend=backend).run({"x": batches[0]["x"]})
        runs[sync] = losses, trainer.state_dict(), out["output"], trainer.loss_scale
    (plain_losses, plain, plain_out, plain_scale), (losses, state, out, loss_scale) = runs[False], runs[True]
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    assert set(state) == set(plain) and loss_scale == plain_scale
    for name, value in plain.items():
        np.testing.assert_allclose(state[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(out, plain_out, rtol=1e-5, atol=1e-6)


# --- uint8 labels ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_uint8_labels_with_smoothing_weights_ignore_index_scaling_and_autocast(backend):
    """uint8 labels (255 the ignore index) with label smoothing, class weights, a dynamic loss scale and
    bfloat16 autocast train bit for bit as int64 labels and evaluate to torch's loss of the Long labels
    (torch 2.13 refuses Byte targets with both label smoothing and class weights)."""
    from trainer_models import BNNet

    x = RNG.standard_normal((12, 8)).astype(np.float32)
    y = RNG.integers(0, 3, 12).astype(np.uint8)
    y[[3, 8]] = 255
    loss = gc.losses.cross_entropy("logits", label="y", label_smoothing=0.2, weight=[0.5, 2.0, 1.0], ignore_index=255)
    arts = gc.training.generate(gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8))), loss,
                                gc.optim.AdamW(0.01), loss_scale=gc.amp.GradScaler(), autocast="bfloat16")
    byte, wide = gc.Trainer(arts, backend=backend), gc.Trainer(arts, backend=backend)
    logits = torch.from_numpy(byte.predict({"x": x})["logits"])
    with pytest.raises(RuntimeError, match="Expected dtype int32/int64 for index"):
        F.cross_entropy(logits, torch.from_numpy(y), weight=torch.tensor([0.5, 2.0, 1.0]), label_smoothing=0.2,
                        ignore_index=255)
    want = F.cross_entropy(logits, torch.from_numpy(y).long(), weight=torch.tensor([0.5, 2.0, 1.0]), label_smoothing=0.2,
                           ignore_index=255).item()
    assert byte.evaluate({"x": x, "y": y})["loss"] == pytest.approx(want, rel=1e-6)
    for _ in range(3):
        assert byte.step({"x": x, "y": y}) == wide.step({"x": x, "y": y.astype(np.int64)})
    for name, value in wide.state_dict().items():
        np.testing.assert_array_equal(byte.state_dict()[name], value, err_msg=name)
