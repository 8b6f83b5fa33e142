"""gc.nn.RNNCell, LSTMCell and GRUCell against torch.nn's: parameter names, shapes and init bounds,
one step's output and gradients (input, states, every parameter; float32 and float64) on the numpy and
ort-cpu backends with torch's weights, a 5-step unrolled loop trained by SGD step for step, the dtypes
``gc.autocast`` gives them (the functional cells' policy), and torch's refusals."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.model.dtypes import as_dtype

try:
    from torch_grad_util import assert_step_matches_torch, gc_grads, torch_twin
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import assert_step_matches_torch, gc_grads, torch_twin

R = np.random.default_rng(3)
X = R.standard_normal((3, 5)).astype(np.float32)
H = R.standard_normal((3, 4)).astype(np.float32)
C = R.standard_normal((3, 4)).astype(np.float32)

# (id, the constructor in both libraries)
CASES = [("RNNCell", "RNNCell(5, 4)"), ("RNNCellRelu", "RNNCell(5, 4, nonlinearity='relu')"),
         ("RNNCellNoBias", "RNNCell(5, 4, bias=False)"), ("LSTMCell", "LSTMCell(5, 4)"),
         ("LSTMCellNoBias", "LSTMCell(5, 4, bias=False)"), ("GRUCell", "GRUCell(5, 4)"),
         ("GRUCellNoBias", "GRUCell(5, 4, bias=False)")]


def _step(m, x, *states):
    """One step; an LSTM's ``(h', c')`` joined on the last dim so both are checked."""
    if type(m).__name__ != "LSTMCell":
        return m(x, *states)
    h, c = m(x, tuple(states) if states else None)
    if isinstance(m, nn.Module):
        return gc.nn.functional.cat([h, c], -1)
    import torch
    return torch.cat([h, c], -1)


def _twin(ctor, dtype):
    """``torch_twin(ctor)`` in ``dtype``: for float64, torch's ``.double()`` and ours built as float64
    with the same weights."""
    cell, tcell = torch_twin(ctor, seed=1)
    if dtype == np.float32:
        return cell, tcell
    cell64 = eval(f"nn.{ctor[:-1]}, dtype='float64')", {"nn": nn})  # noqa: S307 - the constructors above
    cell64.load_state_dict({k: v.astype(np.float64) for k, v in cell.state_dict().items()})
    for p in cell64.parameters():
        p.data = p.numpy()
    return cell64, tcell.double()


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
@pytest.mark.parametrize("given", [True, False], ids=["hx", "no-hx"])
@pytest.mark.parametrize("name,ctor", CASES, ids=[c[0] for c in CASES])
def test_cell_step_and_gradients_match_torch(name, ctor, given, batched, dtype):
    torch = pytest.importorskip("torch")
    cell, tcell = _twin(ctor, dtype)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == np.float32 else {"rtol": 1e-10, "atol": 1e-12}
    states = ([H, C] if "LSTM" in name else [H]) if given else []
    x, states = (X, states) if batched else (X[0], [s[0] for s in states])
    x, states = x.astype(dtype), [s.astype(dtype) for s in states]
    params = {"x": x, **{f"s{i}": s for i, s in enumerate(states)}}
    tin = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    want = _step(tcell, *tin.values())
    c = R.standard_normal(tuple(want.shape)).astype(dtype)
    (want * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(_step, params, {}, c, module=cell, backend=backend)
        assert got["out"].dtype == dtype, backend
        np.testing.assert_allclose(got["out"], want.detach().numpy(), **tol, err_msg=backend)
        for k, t in tin.items():
            np.testing.assert_allclose(got[k], t.grad.numpy(), **tol, err_msg=f"{backend} {k}")
        for k, p in tcell.named_parameters():
            np.testing.assert_allclose(got[f"m.{k}"], p.grad.numpy(), **tol, err_msg=f"{backend} {k}")
    spec = {k: gc.spec(v.dtype, ("N", *v.shape[1:]) if batched else v.shape) for k, v in params.items()}
    onnx.checker.check_model(gc.capture(lambda **a: _step(cell, *a.values()), **spec).proto, full_check=True)


def _out_dtypes(fn, **spec):
    return [str(as_dtype(int(o.dtype))) for o in gc.capture(fn, **spec).ir.graph.outputs]


@pytest.mark.parametrize("given", [True, False], ids=["hx", "no-hx"])
@pytest.mark.parametrize("name,ctor", CASES, ids=[c[0] for c in CASES])
def test_autocast_runs_the_module_as_its_functional_cell(name, ctor, given):
    """Under ``gc.autocast("cuda")`` a cell module is its functional cell (torch's modules call
    ``_VF.lstm_cell`` and the like, in CUDA's lower-precision list): every argument, the float32 states
    and weights included, cast to float16, so each output is float16 (the gates written out gave a
    float32 ``c'``, the float16 gates promoted by the float32 state). Under ``"cpu"`` (the cells not in
    its list) the dtypes are torch's own, probed here: the bfloat16 gates meet float32 states."""
    torch = pytest.importorskip("torch")
    cell, tcell = torch_twin(ctor, seed=1)
    lstm = "LSTM" in name
    states = ([H, C] if lstm else [H]) if given else []
    spec = {"x": X, **{f"s{i}": s for i, s in enumerate(states)}}

    def step(device):
        def fn(x, *s):
            with gc.autocast(device):
                out = cell(x, (tuple(s) if s else None) if lstm else (s[0] if s else None))
            return out if lstm else (out,)
        return fn

    assert _out_dtypes(step("cuda"), **spec) == ["float16"] * (1 + lstm)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ts = [torch.from_numpy(v) for v in spec.values()]
        out = tcell(ts[0], (tuple(ts[1:]) if given else None) if lstm else (ts[1] if given else None))
    want = [str(o.dtype).removeprefix("torch.") for o in (out if lstm else (out,))]
    assert _out_dtypes(step("cpu"), **spec) == want


def test_parameters_are_torchs_names_shapes_and_init():
    cells = {"rnn": nn.RNNCell(3, 16), "lstm": nn.LSTMCell(3, 16), "gru": nn.GRUCell(3, 16, bias=False)}
    for gates, (key, cell) in zip((1, 4, 3), cells.items()):
        sd = cell.init_parameters(seed=0).state_dict()
        names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if key != "gru" else [])
        assert list(sd) == names, key
        assert sd["weight_ih"].shape == (16 * gates, 3) and sd["weight_hh"].shape == (16 * gates, 16)
        assert all(0.2 < np.abs(v).max() <= 0.25 for v in sd.values())  # U(+-1/sqrt(16))


class _Unrolled(nn.Module):
    """A cell stepped over the 5 time steps of ``x [N, 5, 3]`` by a Python loop, then a Linear head."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.cell = getattr(nn, kind)(3, 4, dtype="float64")
        self.head = nn.Linear(4, 1, dtype="float64")

    def forward(self, x):
        h = None
        for t in range(5):
            h = self.cell(x[:, t], h)
        return self.head(h[0] if self.kind == "LSTMCell" else h)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell", "GRUCell"])
def test_unrolled_loop_trains_like_torch(kind):
    """Three SGD steps of gc.training.generate against torch.optim on the same unrolled loop:
    the loss and every parameter step for step (float64)."""
    torch = pytest.importorskip("torch")
    net = _Unrolled(kind)
    net.init_parameters(seed=2)
    arts = gc.training.generate(gc.capture(net, x=gc.spec("float64", ("N", 5, 3))), gc.losses.mse("output", label="y"),
                                gc.optim.SGD(0.25, momentum=0.5))
    trainer = gc.Trainer(arts, backend="ort-cpu")
    tnet = torch.nn.ModuleDict({"cell": getattr(torch.nn, kind)(3, 4, dtype=torch.float64),
                                "head": torch.nn.Linear(4, 1, dtype=torch.float64)})
    tnet.load_state_dict({k: torch.from_numpy(v) for k, v in net.state_dict().items()})
    opt = torch.optim.SGD(tnet.parameters(), lr=0.25, momentum=0.5)
    rng = np.random.default_rng(4)
    for step in range(3):
        x, y = rng.standard_normal((6, 5, 3)), rng.standard_normal((6, 1))

        def unrolled(x=x, y=y):
            h, xt = None, torch.from_numpy(x)
            for t in range(5):
                h = tnet.cell(xt[:, t], h)
            return torch.nn.functional.mse_loss(tnet.head(h[0] if kind == "LSTMCell" else h), torch.from_numpy(y))

        assert_step_matches_torch(trainer, {"x": x, "y": y}, opt, unrolled, tnet, step)


def test_refusals_name_the_argument():
    with pytest.raises(gc.GraphError, match=r"RNNCell nonlinearity='gelu'; expected 'tanh' or 'relu'"):
        nn.RNNCell(5, 4, nonlinearity="gelu")
    cell, lstm = nn.GRUCell(5, 4), nn.LSTMCell(5, 4)
    with pytest.raises(gc.GraphError, match=r"GRUCell.*expects input \(N, 5\) or \(5,\), got shape \[3, 6\]"):
        gc.capture(cell, x=np.zeros((3, 6), np.float32))
    with pytest.raises(gc.GraphError, match=r"GRUCell.*expects input \(N, 5\) or \(5,\), got shape \[2, 3, 5\]"):
        gc.capture(cell, x=np.zeros((2, 3, 5), np.float32))
    with pytest.raises(gc.GraphError, match=r"expects hidden state \(4,\) for a rank-1 input, got shape \[3, 4\]"):
        gc.capture(lambda x, h: cell(x, h), x=X[0], h=H)
    with pytest.raises(gc.GraphError, match=r"expects hidden state \(N, 4\) for a rank-2 input, got shape \[3, 5\]"):
        gc.capture(lambda x, h: cell(x, h), x=X, h=X)
    with pytest.raises(gc.GraphError, match=r"LSTMCell hx must be a pair \(h, c\), got Tensor"):
        gc.capture(lambda x, h: lstm(x, h), x=X, h=H)
    for layer in (cell, lstm, nn.RNNCell(5, 4)):  # an unknown rank, with a state or without
        name = type(layer).__name__
        with pytest.raises(gc.GraphError, match=rf"{name}.*expects input \(N, 5\) or \(5,\), got unknown rank"):
            gc.capture(lambda x, h: layer(x, (h, h) if layer is lstm else h), x=gc.spec("float32", None), h=H)
        with pytest.raises(gc.GraphError, match=rf"{name}.*expects input \(N, 5\) or \(5,\), got unknown rank"):
            gc.capture(layer, x=gc.spec("float32", None))
