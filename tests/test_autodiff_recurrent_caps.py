"""Long recurrent layers in gradient graphs: past its cap (``MAX_UNROLLED_RNN_STEPS``, ``_GRU_``,
``_LSTM_``, and never past ``MAX_UNROLLED_STEPS``) an RNN/GRU/LSTM without
``sequence_lens`` becomes a Scan differentiated in reverse mode, so the train step's graph stops
growing with the sequence length; its gradients still equal torch.autograd's."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.passes.autodiff import recurrent
from graphc.passes.autodiff.rules_control import MAX_SCAN_UNROLL

try:
    from torch_grad_util import gc_grads, torch_twin
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads, torch_twin

LAYERS = ["RNN(3, 4, batch_first=True, bidirectional=True)", "GRU(3, 4, batch_first=True, bidirectional=True)",
          "LSTM(3, 4, batch_first=True, bidirectional=True)", "LSTM(3, 4)"]


@pytest.mark.parametrize("ctor", LAYERS)
def test_a_layer_longer_than_the_cap_gets_torchs_gradients(ctor):
    """Past the cap (a Scan in reverse mode): the output and the gradients of the input and of
    every parameter equal torch.autograd's, on numpy and onnxruntime."""
    torch = pytest.importorskip("torch")
    length = _cap(ctor) + 6
    shape = (2, length, 3) if "batch_first" in ctor else (length, 2, 3)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    layer, twin = torch_twin(ctor, seed=4)
    xt = torch.tensor(x, requires_grad=True)
    want = twin(xt)[0]
    c = np.random.default_rng(0).standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, x: m(x), {"x": x}, {}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=backend)
        np.testing.assert_allclose(got["x"], xt.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{backend} x")
        for k, p in twin.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{backend} {k}")


class _Classifier(gc.nn.Module):
    def __init__(self, ctor: str):
        super().__init__()
        self.rnn = eval(f"gc.nn.{ctor}", {"gc": gc})  # noqa: S307 - constructors written in the tests
        self.head = gc.nn.Linear(8, 5)

    def forward(self, x):
        return self.head(gc.reshape(self.rnn(x)[0][:, -1], (-1, 8)))


def _train_graph(ctor: str, length: int):
    model = gc.capture(_Classifier(ctor), seed=0, x=gc.spec("float32", ("N", length, 3)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.1))
    return arts.train_step.proto.graph


def _train_step(ctor: str, length: int) -> list[str]:
    return [n.op_type for n in _train_graph(ctor, length).node]


def _cap(ctor: str) -> int:
    """The longest sequence of the layer ``ctor`` that autodiff unrolls."""
    return min(recurrent.MAX_UNROLLED_STEPS, getattr(recurrent, f"MAX_UNROLLED_{ctor[:ctor.index('(')]}_STEPS"))


@pytest.mark.parametrize("ctor", LAYERS[:3])
def test_an_unrolled_layers_recurrence_weight_gradient_is_one_gemm(ctor):
    """Unrolled, the recurrence weight's gradient (a product per step) is one Gemm of the steps'
    stacked states and gate gradients (two Concats) per direction and gate group, not a Gemm per
    step summed by a Sum."""
    graph = _train_graph(ctor, _cap(ctor))
    made_by = {o: n.op_type for n in graph.node for o in n.output}
    stacked = [n for n in graph.node if n.op_type == "Gemm" and [made_by.get(v) for v in n.input] == ["Concat"] * 2]
    assert len(stacked) == (4 if ctor.startswith("GRU") else 2), len(stacked)
    # a weight's product per step is a Gemm of transposed rows (dh's, Gemm(dgates, R), may be summed)
    rows_products = {o for n in graph.node for o in n.output
                     if n.op_type == "Gemm" and any(a.name == "transA" and a.i for a in n.attribute)}
    assert not [n.name for n in graph.node if n.op_type == "Sum" and len(rows_products & set(n.input)) > 1]


@pytest.mark.parametrize("ctor", LAYERS[:3])
def test_the_train_step_stops_growing_past_the_cap(ctor):
    """At two lengths past the cap the train step has the same nodes (per direction a taped Scan
    forward and a backward Scan); up to the cap the layer is unrolled (no Scan)."""
    short, long = _train_step(ctor, _cap(ctor) + 1), _train_step(ctor, 3 * _cap(ctor))
    assert len(short) == len(long) and short.count("Scan") == 4, (len(short), len(long))
    assert "Scan" not in _train_step(ctor, _cap(ctor))


def test_the_cap_is_read_when_a_graph_is_made(monkeypatch):
    """``MAX_UNROLLED_STEPS`` set lower (as ``scripts/bench_recurrent.py --forms`` sets it) sends a
    shorter layer to a Scan: the cap is read per call, not bound when the module is imported."""
    assert "Scan" not in _train_step(LAYERS[2], 4)
    monkeypatch.setattr(recurrent, "MAX_UNROLLED_STEPS", 2)
    assert "Scan" in _train_step(LAYERS[2], 4)


def _scan_grads(length: int) -> gc.Model:
    """gc.grad of sum(ys * c) + sum(h_T) for h <- tanh(h w + x_t), y = 2 h scanned over x [length, 2, 3]
    (y is not h itself: onnxruntime runs a Scan body that outputs one value twice wrongly)."""
    def cell(h, x_t, w):
        h = gc.tanh(gc.matmul(h, w) + x_t)
        return h, 2 * h

    def f(x, w, c):
        h, ys = gc.scan(lambda h, x_t: cell(h, x_t, w), gc.zeros_like(x[0]), x)
        return {"loss": gc.sum(ys * c) + gc.sum(h)}

    x, w, c = _scan_inputs(length)
    return gc.grad(gc.capture(f, x=x, w=w, c=c), "loss", wrt=["x", "w"])


def _scan_inputs(length: int):
    rng = np.random.default_rng(length)
    return rng.standard_normal((length, 2, 3)), rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((length, 2, 3))


def test_a_scan_longer_than_its_cap_gets_reverse_mode_gradients_that_match_torch():
    """Past MAX_SCAN_UNROLL a Scan's gradient is a backward Scan, the same nodes at any length,
    and equals torch.autograd's of the same recurrence (float64, numpy and onnxruntime)."""
    torch = pytest.importorskip("torch")
    length = MAX_SCAN_UNROLL + 6
    grads = _scan_grads(length)
    ops = [n.op_type for n in grads.proto.graph.node]
    assert ops.count("Scan") == 2 and len(ops) == len(_scan_grads(3 * MAX_SCAN_UNROLL).proto.graph.node)
    assert [n.op_type for n in _scan_grads(MAX_SCAN_UNROLL).proto.graph.node].count("Scan") == 1  # unrolled
    x, w, c = _scan_inputs(length)
    xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    h, loss = torch.zeros(2, 3, dtype=torch.float64), 0
    for t in range(length):
        h = torch.tanh(h @ wt + xt[t])
        loss = loss + (2 * h * torch.from_numpy(c[t])).sum()
    (loss + h.sum()).backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"x": x, "w": w, "c": c})
        np.testing.assert_allclose(got["loss"], loss.item() + h.sum().item(), rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x_grad"], xt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["w_grad"], wt.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


@pytest.mark.parametrize("ctor", LAYERS[:3])
def test_a_layer_past_its_cap_is_differentiated_in_reverse_mode_at_any_length(ctor, monkeypatch):
    """A layer written out as a Scan is marked for reverse mode: at a length under
    ``MAX_SCAN_UNROLL`` too its train step is a taped Scan and a backward Scan per direction, the
    same nodes as at three times the length (a plain Scan's gradient that short is unrolled)."""
    monkeypatch.setattr(recurrent, "MAX_UNROLLED_STEPS", 2)
    short, long = _train_step(ctor, 4), _train_step(ctor, 12)
    assert 12 <= MAX_SCAN_UNROLL and short.count("Scan") == 4 and len(short) == len(long), (len(short), len(long))


@pytest.mark.parametrize("ctor", LAYERS[:3])
def test_an_unrolled_layer_reads_its_run_time_batch_once_for_ys_gradient(ctor):
    """Unrolled with the batch known only at run time, Y's Concat of the steps' [B, H] outputs
    splits its gradient by one Shape read of B, not one per step: the train step's Shape nodes do
    not grow with the length."""
    counts = [_train_step(ctor, length).count("Shape") for length in (2, _cap(ctor))]
    assert counts[0] == counts[1], counts


@pytest.mark.parametrize("ctor", LAYERS[:3])
def test_an_unrolled_cell_steps_on_matrices_by_gemms(ctor):
    """Unrolled, each step's recurrence product is one ``Gemm(h, R, x_t, transB=1)`` on [B, H]
    states (a GRU's two), as are their gradients: no Transpose per step, nor a MatMul (a GRU's
    recurrence bias, added by every step's Gemm under ``linear_before_reset``, gets its gradient
    from one GEMV over the stacked steps), so their counts in the train step do not grow with the
    length."""
    short, long = _train_step(ctor, 2), _train_step(ctor, _cap(ctor))
    assert [short.count(op) for op in ("Transpose", "MatMul")] == [long.count(op) for op in ("Transpose", "MatMul")]

