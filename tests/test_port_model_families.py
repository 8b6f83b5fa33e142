"""Ten model families ported from their torch code by the imports alone (tests/port_families.py,
tests/port_families_more.py): each runs as
torch's at the same weights (state_dict names), float64, on the numpy backend and ort-cpu: forward values and
the gradients of every parameter (``gc.grad``) within 1e-12; and the torch idioms they needed, one by one."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn

try:
    import port_families as families
    import port_families_more as more
except ImportError:  # tests/ collected as a package
    from tests import port_families as families
    from tests import port_families_more as more

RNG = np.random.default_rng(0)
# a 6-node graph's [2, E] edges (source row, destination row): node 1 and 4 receive two, node 2 one from each side
EDGES = np.array([[0, 1, 2, 3, 4, 5, 0, 2, 4, 1], [1, 2, 3, 4, 5, 0, 3, 5, 1, 4]], np.int64)


def _load(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<port>", "exec"), namespace)  # noqa: S102 - the sources in port_families.py
    return namespace


class _Loss(nn.Module):
    """The ported model's first output and ``sum(out * g) + 0.5 * aux`` (a second output: MoE's aux loss)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, g, **inputs):
        out = self.net(**inputs)
        out, aux = out if isinstance(out, tuple) else (out, 0.0)
        return {"out": out, "loss": (out * g).sum() + 0.5 * aux}


def _no_dropout(net):
    """``net`` with its dropouts and drop paths at 0 (a training-mode forward then draws nothing)."""
    for m in net.modules():
        kind = type(m).__name__
        if kind == "Dropout":
            m.p = 0.0
        elif kind == "MultiheadAttention":
            m.dropout = 0.0
        elif kind == "DropPath":
            m.drop_prob = 0.0
    return net


CASES = {
    "unet": (families.UNET, lambda: {"x": RNG.standard_normal((2, 3, 8, 8)), "t": np.array([3.0, 500.0])}),
    "conformer": (families.CONFORMER, lambda: {"x": RNG.standard_normal((3, 9, 16)), "lengths": np.array([9, 5, 7])}),
    "moe": (families.MOE, lambda: {"x": RNG.standard_normal((2, 5, 8))}),
    "convnext": (families.CONVNEXT, lambda: {"x": RNG.standard_normal((2, 4, 8, 8))}),
    "detr": (families.DETR, lambda: {"memory": RNG.standard_normal((6, 2, 16)), "targets": RNG.random((2, 3, 4))}),
    "mamba": (more.MAMBA, lambda: {"x": RNG.standard_normal((2, 6, 8))}),
    "gnn": (more.GNN, lambda: {"x": RNG.standard_normal((6, 5)), "edge_index": EDGES}),
    "wavenet": (more.WAVENET, lambda: {"x": RNG.standard_normal((2, 1, 20))}),
    "swin": (more.SWIN, lambda: {"x": RNG.standard_normal((2, 16, 8))}),
    "seq2seq": (more.SEQ2SEQ, lambda: {"src": np.array([[3, 4, 5, 6, 7], [8, 9, 2, 0, 0]]), "src_lengths": np.array([5, 3]),
                                       "tgt": np.array([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])}),
}


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_ported_family_matches_torch(name, training):
    torch = pytest.importorskip("torch")
    source, make_inputs = CASES[name]
    torch.manual_seed(0)
    theirs = _no_dropout(_load(source)["Model"]()).double().train(training)
    ours = _no_dropout(_load(families.port(source))["Model"]()).double().train(training)
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    inputs = make_inputs()
    want = theirs(**{k: torch.tensor(v) for k, v in inputs.items()})
    want, aux = want if isinstance(want, tuple) else (want, 0.0)
    g = RNG.standard_normal(tuple(want.shape))
    ((want * torch.tensor(g)).sum() + 0.5 * aux).backward()
    # torch's None: a parameter the output does not reach (WaveNet's last residual conv), graphc's zeros
    grads = {f"net.{k}_grad": np.zeros(tuple(p.shape)) if p.grad is None else p.grad.numpy()
             for k, p in theirs.named_parameters()}
    model = gc.grad(gc.capture(_Loss(ours).train(training), g=g, **inputs), "loss")
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run({"g": g, **inputs})
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=backend)
        for key, grad in grads.items():
            np.testing.assert_allclose(got[key], grad, rtol=1e-10, atol=1e-12, err_msg=f"{backend} {key}")
