"""torch's per-row pick ``logp[torch.arange(B), y]`` as torch.onnx writes it (``passes/training/row_linear.py``):
the TorchScript exporter flattens ``logp`` and gathers at ``arange(B) * C + y``, the dynamo exporter gathers
(GatherND) a flattened ``logp`` at that index or ``logp`` at ``(arange(B), y)``. Cross-entropy and label smoothing
by hand, a gather of per-row targets and the flat index written out give no ``gc.DataParallelWarning``; a
flipped, rolled or halved position, a stride other than the row's or the batch's size as the stride still
warn, on both exporters. 2 workers on loopback Ray warn for the flipped pick and
their loss is not the whole batch's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
from test_row_mixing import _found

torch = pytest.importorskip("torch")

from ray_util import ray_cluster  # noqa: E402, F401 - the module's fixture

RNG = np.random.default_rng(0)


class _Pick(torch.nn.Module):
    """x [N, 6] -> the per-row negative log-probability ``kind`` picks from logp [N, 3] (t [N, 3, 3]: per-row
    target distributions by label)."""

    def __init__(self, kind: str):
        super().__init__()
        self.fc, self.kind = torch.nn.Linear(6, 3, dtype=torch.float64), kind

    def forward(self, x, y, t):
        logp, r = torch.log_softmax(self.fc(x), -1), torch.arange(x.shape[0])
        return -{
            "ce": lambda: logp[r, y],
            "smoothing": lambda: 0.9 * logp[r, y] + 0.1 * logp.mean(-1),
            "gather": lambda: logp.gather(1, y[:, None])[:, 0],
            "targets": lambda: (logp * t[r, y]).sum(-1),
            "flat": lambda: logp.reshape(-1)[r * 3 + y],
            "flat_last": lambda: logp.reshape(-1)[r * 3 + 2],
            "flipped": lambda: logp[r.flip(0), y],
            "rolled": lambda: logp[r.roll(1, 0), y],
            "halved": lambda: logp[r // 2, y],
            "flat_stride_2": lambda: logp.reshape(-1)[r * 2 + y],
            "flat_by_size": lambda: logp.reshape(-1)[r * (x.shape[0] - 1) + y],  # 3 at N = 4 only
        }[self.kind]()


KEEPS = ["ce", "smoothing", "gather", "targets", "flat", "flat_last"]
MIXES = ["flipped", "rolled", "halved", "flat_stride_2", "flat_by_size"]


def _export(kind: str, dynamo: bool, path) -> gc.Model:
    args = (torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 2, 1, 0]), torch.rand(4, 3, 3, dtype=torch.float64))
    names = {"input_names": ["x", "y", "t"], "output_names": ["out"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            n = torch.export.Dim("N", min=2)
            torch.onnx.export(_Pick(kind), args, str(path), dynamo=True, verbose=False, **names,
                              dynamic_shapes={"x": {0: n}, "y": {0: n}, "t": {0: n}})
        else:
            torch.onnx.export(_Pick(kind), args, str(path), dynamo=False, opset_version=17, **names,
                              dynamic_axes={k: {0: "N"} for k in ("x", "y", "t", "out")})
    return gc.load(path)


def _ce(model: gc.Model):
    """The mean of the model's per-row negative log-probabilities: an L1 loss to zeros."""
    return gc.training.generate(model, gc.losses.l1("out", label="zero"), gc.optim.SGD(0.1))


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
@pytest.mark.parametrize("kind", KEEPS + MIXES)
def test_a_torch_exported_per_row_pick(kind, dynamo, tmp_path):
    if dynamo:
        pytest.importorskip("onnxscript")
    model = _export(kind, dynamo, tmp_path / "m.onnx")
    found = [f.split()[0] for f in _found(_ce(model))]
    if kind in KEEPS:
        assert found == []
    else:
        assert found[:1] == ["GatherND" if dynamo else "Gather"], found


@pytest.mark.xdist_group("ray")
def test_two_workers_warn_for_a_flipped_pick_and_their_loss_is_not_the_whole_batchs(ray_cluster, tmp_path):
    """TorchScript export of ``-logp[arange(B).flip(0), y]``, a batch of 6 as shards of 3 on numpy: the
    workers' loss, 1.28257 (each shard picks its own rows in reverse; torch's on the shards to 1e-12), is not the
    whole batch's, 1.31618; the per-row pick ``-logp[arange(B), y]`` gives 2 workers the whole batch's loss
    (1.23614) and no warning."""
    x, y = RNG.standard_normal((6, 6)), np.array([0, 2, 1, 0, 1, 2])
    batch = {"x": x, "y": y, "t": np.zeros((6, 3, 3)), "zero": np.zeros(6)}
    for kind, warns in (("flipped", True), ("ce", False)):
        torch.manual_seed(0)
        model = _export(kind, False, tmp_path / f"{kind}.onnx")
        net = _Pick(kind)
        net.load_state_dict({k: torch.from_numpy(v) for k, v in model.params.items()})
        whole = net(*(torch.from_numpy(batch[k]) for k in ("x", "y", "t"))).mean().item()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = gc.Trainer(_ce(model), workers=2, num_cpus=0.5, timeout_s=120, backend="numpy")
        try:
            assert any(issubclass(w.category, gc.DataParallelWarning) for w in caught) == warns
            loss = trainer.step(batch)
        finally:
            trainer.shutdown()
        shards = np.mean([net(*(torch.from_numpy(batch[k][s]) for k in ("x", "y", "t"))).mean().item()
                          for s in (slice(3), slice(3, 6))])
        np.testing.assert_allclose(loss, shards, rtol=1e-12)
        assert (abs(loss - whole) > 1e-2) == warns, (kind, loss, whole)
