"""bfloat16 (and float16) models where torch 2.13 runs them on the CPU: ops whose ONNX schema takes
no bfloat16 before opset 22 (Conv, ConvTranspose, MaxPool, AveragePool, GridSample, Sin ... Atanh,
Mish, Round) are captured in float32 between Casts; onnxruntime's CPU provider, which has bfloat16
kernels for moving data only, runs every other bfloat16 node in float32 between Casts
(``backends/narrow_casts.py``); the numpy backend reduces narrow floats in float32; batch norm
computes its statistics in float32 and keeps its running statistics in the param dtype. Values
are held to torch's own error against a float64 oracle (at least 2 spacings of the dtype), on
numpy and ort-cpu; gradients to torch.autograd's on the float32 upcast; a small bfloat16 conv net
with BatchNorm trains as torch's does."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphc as gc
import graphc.nn.functional as F
from graphc.backends import narrow_casts
from graphc.model.dtypes import to_numpy

try:
    from torch_grad_util import TorchNS, gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import TorchNS, gc_grads

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
T = TorchNS(torch)
BACKENDS = ("numpy", "ort-cpu")


def _u(lo, hi, *shape):
    return lambda r: r.uniform(lo, hi, shape)


S = _u(-3, 3, 300)
# name -> (fn(M, *xs), input makers): each refused at capture or on ort-cpu in bfloat16 before
CASES = {
    "sin": (lambda M, x: M.sin(x), [S]),
    "cos": (lambda M, x: M.cos(x), [S]),
    "tan": (lambda M, x: M.tan(x), [_u(-1.5, 1.5, 300)]),
    "atan2": (lambda M, a, b: M.atan2(a, b), [S, S]),
    "asinh": (lambda M, x: M.asinh(x), [S]),
    "acos": (lambda M, x: M.acos(x), [_u(-0.95, 0.95, 300)]),
    "atanh": (lambda M, x: M.atanh(x), [_u(-0.95, 0.95, 300)]),
    "cosh": (lambda M, x: M.cosh(x), [S]),
    "mish": (lambda M, x: M.mish(x), [S]),
    "round": (lambda M, x: M.round(x), [S]),
    "relu": (lambda M, x: M.relu(x), [S]),
    "tanh": (lambda M, x: M.tanh(x), [S]),
    "pow": (lambda M, a, b: M.pow(a, b), [_u(0.1, 3, 300), S]),
    "clamp": (lambda M, x: M.clamp(x, -1, 1), [S]),
    "matmul": (lambda M, a, b: M.matmul(a, b), [_u(-1, 1, 8, 64), _u(-1, 1, 64, 16)]),
    "conv1d": (lambda M, x, w: M.conv1d(x, w, padding=1), [_u(-1, 1, 2, 16, 20), _u(-1, 1, 4, 16, 3)]),
    "conv2d": (lambda M, x, w, b: M.conv2d(x, w, b, padding=1, stride=2),
               [_u(-1, 1, 2, 16, 9, 9), _u(-1, 1, 4, 16, 3, 3), _u(-1, 1, 4)]),
    "conv2d_depthwise": (lambda M, x, w: M.conv2d(x, w, padding=1, groups=8),
                         [_u(-1, 1, 2, 8, 9, 9), _u(-1, 1, 8, 1, 3, 3)]),
    "conv_transpose2d": (lambda M, x, w: M.conv_transpose2d(x, w, stride=2, padding=1),
                         [_u(-1, 1, 2, 16, 5, 5), _u(-1, 1, 16, 4, 3, 3)]),
    "max_pool2d": (lambda M, x: M.max_pool2d(x, 3, 2, 1), [_u(-3, 3, 2, 3, 9, 9)]),
    "lp_pool2d": (lambda M, x: M.lp_pool2d(x, 2, 2), [_u(0, 3, 2, 3, 8, 8)]),
    "interpolate": (lambda M, x: M.interpolate(x, scale_factor=2, mode="bilinear"), [_u(-3, 3, 1, 2, 5, 5)]),
    "pad_reflect": (lambda M, x: M.pad(x, (1, 2, 2, 1), mode="reflect"), [_u(-3, 3, 1, 2, 5, 5)]),
    "grid_sample": (lambda M, x, g: M.grid_sample(x, g, align_corners=False),
                    [_u(-3, 3, 1, 2, 5, 5), _u(-1, 1, 1, 4, 4, 2)]),
    "unfold": (lambda M, x: M.unfold(x, 3), [_u(-3, 3, 1, 2, 5, 5)]),
    "batch_norm_eval": (lambda M, x, m, v, w, b: M.batch_norm(x, m, v, w, b),
                        [_u(-3, 3, 4, 3, 5, 5), _u(-1, 1, 3), _u(0.5, 2, 3), _u(0.5, 2, 3), _u(-1, 1, 3)]),
    "batch_norm_train": (lambda M, x, m, v: M.batch_norm(x, m, v, training=True),
                         [_u(50, 60, 8, 3, 10, 10), _u(-1, 1, 3), _u(0.5, 2, 3)]),
}
# outputs of order 1 whose entries cancel to about 0 are measured in the spacing at 1
FLOOR = {"batch_norm_train": 1.0, "batch_norm_eval": 1.0}


def _inputs(name: str, dtype: str) -> list[np.ndarray]:
    r = np.random.default_rng(sum(map(ord, name)))
    return [make(r).astype(np.float32).astype(to_numpy(dtype)) for make in CASES[name][1]]


def _torch(name: str, arrays: list[np.ndarray], dtype) -> np.ndarray:
    out = CASES[name][0](T, *(torch.from_numpy(a.astype(np.float64)).to(dtype) for a in arrays))
    return out.double().numpy()


def _spacings(got: np.ndarray, exact: np.ndarray, dtype: str, floor: float) -> float:
    """The largest ``|got - exact|`` in units of ``dtype``'s spacing at ``max(|exact|, floor)``."""
    finfo = torch.finfo(getattr(torch, dtype))
    scale = np.maximum(np.maximum(np.abs(exact), floor), finfo.tiny) * finfo.eps
    return float(np.max(np.abs(np.asarray(got, np.float64) - exact) / scale))


def _capture(name: str, arrays: list[np.ndarray], **kw) -> gc.Model:
    names = [f"x{k}" for k in range(len(arrays))]
    return gc.capture(lambda **xs: CASES[name][0](F, *(xs[n] for n in names)), **dict(zip(names, arrays)), **kw)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_within_torchs_error(name, dtype):
    arrays = _inputs(name, dtype)
    exact = _torch(name, arrays, torch.float64)
    floor = FLOOR.get(name, 0.0)
    bound = max(2.0, _spacings(_torch(name, arrays, getattr(torch, dtype)), exact, dtype, floor))
    model = _capture(name, arrays)
    feeds = {f"x{k}": a for k, a in enumerate(arrays)}
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run(feeds)["output"]
        assert got.dtype == to_numpy(dtype), (backend, got.dtype)
        err = _spacings(got, exact, dtype, floor)
        assert err <= bound, f"{name} {dtype} on {backend}: {err:.2f} spacings, torch's {bound:.2f}"


@pytest.mark.parametrize("name", ["sin", "mish", "max_pool2d"])
def test_opset_22_takes_bfloat16_in_the_op_itself(name):
    """From opset 22 the schema takes bfloat16: no Cast added at capture, onnxruntime's CPU session
    casts (the numpy backend's Conv does not yet accumulate a bfloat16 one in float32 there)."""
    arrays = _inputs(name, "bfloat16")
    model = _capture(name, arrays, opset=22)
    wide = _capture(name, [a.astype(np.float32) for a in arrays], opset=22)
    assert Counter(n.op_type for n in model.proto.graph.node) == Counter(n.op_type for n in wide.proto.graph.node)
    exact = _torch(name, arrays, torch.float64)
    bound = max(2.0, _spacings(_torch(name, arrays, torch.bfloat16), exact, "bfloat16", 0.0))
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run({f"x{k}": a for k, a in enumerate(arrays)})["output"]
        assert _spacings(got, exact, "bfloat16", 0.0) <= bound, backend


def _nodes(name: str, dtype: str) -> list[onnx.NodeProto]:
    return list(_capture(name, _inputs(name, dtype)).proto.graph.node)


@pytest.mark.parametrize("name", ["sin", "mish", "conv2d", "conv_transpose2d", "max_pool2d", "grid_sample",
                                  "batch_norm_train", "batch_norm_eval"])
def test_bfloat16_graphs_add_only_casts_and_wide_graphs_none(name):
    """The bfloat16 graph is the float32 one and Casts; float32 and float64 graphs cast to no other float."""
    wide, narrow = (Counter(n.op_type for n in _nodes(name, d)) for d in ("float32", "bfloat16"))
    assert set((narrow - wide).keys()) == {"Cast"} and not wide - narrow
    for dtype, own in (("float32", TensorProto.FLOAT), ("float64", TensorProto.DOUBLE)):
        to = {a.i for n in _nodes(name, dtype) if n.op_type == "Cast" for a in n.attribute if a.name == "to"}
        assert not to & {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16} - {own}


def test_numpy_backend_reduces_bfloat16_in_float32():
    """A bfloat16 ReduceMean of 1,000 values near 50 was 16.4 on numpy (its sum stopped at 16,384)."""
    node = helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [1000])],
                              [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [])])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    x = np.random.default_rng(0).uniform(49, 51, 1000).astype(to_numpy("bfloat16"))
    want = float(torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).mean())
    for backend in BACKENDS:
        assert float(gc.Session(model, backend=backend).run({"x": x})["y"]) == want, backend


def test_float32_models_reach_onnxruntime_unchanged():
    model = _capture("conv2d", _inputs("conv2d", "float32")).proto
    assert narrow_casts.lower(model) is model


def test_bfloat16_in_a_loop_body_runs_on_ort_cpu():
    """Subgraph nodes are cast too: a bfloat16 fori_loop body (Mul, Add) loads and matches numpy."""
    x = np.linspace(-1, 1, 16).astype(to_numpy("bfloat16"))
    model = gc.capture(lambda x: gc.fori_loop(0, 3, lambda i, h: h * 1.5 + x, x), x=x)
    want = gc.Session(model, backend="numpy").run({"x": x})["output"]
    got = gc.Session(model, backend="ort-cpu").run({"x": x})["output"]
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


GRADS = ["sin", "atan2", "mish", "conv2d", "conv_transpose2d", "max_pool2d", "grid_sample", "batch_norm_train"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", GRADS)
def test_gradient_is_torchs_in_float32(name, backend):
    """``gc.grad`` of ``sum(f(x) * c)`` in bfloat16 against torch.autograd's of ``f`` on the float32
    upcast of the same inputs, within 4 bfloat16 spacings of the largest gradient entry."""
    arrays = _inputs(name, "bfloat16")
    x, rest = arrays[0], {f"x{k}": a for k, a in enumerate(arrays) if k}
    leaf = torch.from_numpy(x.astype(np.float32)).requires_grad_()
    out = CASES[name][0](T, leaf, *(torch.from_numpy(a.astype(np.float32)) for a in arrays[1:]))
    c = np.random.default_rng(1).uniform(-1, 1, out.shape).astype(np.float32).astype(to_numpy("bfloat16"))
    (out * torch.from_numpy(c.astype(np.float32))).sum().backward()
    want = leaf.grad.numpy()

    def fn(_, x0, **kw):
        return CASES[name][0](F, x0, *(kw[f"x{k}"] for k in range(1, len(arrays))))

    got = gc_grads(fn, {"x0": x}, rest, c, backend=backend)["x0"]
    assert got.dtype == to_numpy("bfloat16")
    err = np.abs(got.astype(np.float32) - want) / np.maximum(np.abs(want), np.abs(want).max() * 2.0**-4)
    assert err.max() <= 4 * 2.0**-8, f"{name} on {backend}: {err.max() * 2**8:.1f} spacings"


# -- a bfloat16 conv net with BatchNorm, trained ---------------------------------------------------
_BF16 = {"dtype": "bfloat16"}


class _Net(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = gc.nn.Conv2d(3, 8, 3, padding=1, **_BF16)
        self.bn = gc.nn.BatchNorm2d(8, **_BF16)
        self.pool = gc.nn.MaxPool2d(2)
        self.fc = gc.nn.Linear(8, 2, **_BF16)

    def forward(self, x):
        return self.fc(self.pool(gc.relu(self.bn(self.conv(x)))).mean(axis=(2, 3)))


def _twin(net: _Net, dtype):
    twin = torch.nn.ModuleDict({"conv": torch.nn.Conv2d(3, 8, 3, padding=1), "bn": torch.nn.BatchNorm2d(8),
                                "pool": torch.nn.MaxPool2d(2), "fc": torch.nn.Linear(8, 2)})
    state = {k: np.asarray(v) for k, v in net.state_dict().items()}
    twin.load_state_dict({k: torch.from_numpy(v if v.dtype.kind in "iu" else v.astype(np.float64))
                          for k, v in state.items()})
    return twin.to(dtype).train()


def _forward(twin, x):
    return twin.fc(twin.pool(torch.relu(twin.bn(twin.conv(x)))).mean((2, 3)))


def _torch_steps(twin, batches, dtype) -> list[tuple[float, dict]]:
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.5)
    out = []
    for b in batches:
        opt.zero_grad()
        x, y = (torch.from_numpy(b[k].astype(np.float64)).to(dtype) for k in ("x", "y"))
        loss = torch.nn.functional.mse_loss(_forward(twin, x), y)
        loss.backward()
        opt.step()
        state = {k: v.double().numpy() for k, v in twin.state_dict().items() if v.is_floating_point()}
        out.append((loss.item(), state))
    return out


def _spacings_at_scale(got: np.ndarray, want: np.ndarray) -> float:
    """``|got - want|`` in bfloat16 spacings at each entry (at least 1/16 of the largest)."""
    return float(np.max(np.abs(got - want) / (2.0**-8 * np.maximum(np.abs(want), np.abs(want).max() / 16))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bfloat16_conv_net_with_batchnorm_trains_as_torch(backend):
    """SGD with momentum on a bfloat16 Conv2d-BatchNorm2d-ReLU-MaxPool-Linear net: losses within 2
    spacings of torch's bfloat16 ones; every param and running statistic as near a float64 run
    as torch's bfloat16 one is (twice its error, or 4 spacings); the running statistics move."""
    net = _Net()
    rng = np.random.default_rng(0)
    bf16 = to_numpy("bfloat16")
    batches = [{"x": (rng.standard_normal((8, 3, 12, 12)) * 3 + 20).astype(np.float32).astype(bf16),
                "y": rng.standard_normal((8, 2)).astype(np.float32).astype(bf16)} for _ in range(4)]
    arts = gc.training.generate(gc.capture(net, x=gc.spec("bfloat16", ("N", 3, 12, 12))),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.1, momentum=0.5))
    exact = _torch_steps(_twin(net, torch.float64), batches, torch.float64)
    narrow = _torch_steps(_twin(net, torch.bfloat16), batches, torch.bfloat16)
    trainer = gc.Trainer(arts, backend=backend)
    start = trainer.state_dict()
    for step, (batch, (_, oracle), (torch_loss, torch_state)) in enumerate(zip(batches, exact, narrow)):
        loss = trainer.step(batch)
        assert abs(loss - torch_loss) <= 2 * 2.0**-8 * abs(torch_loss), f"step {step}: {loss} vs torch's {torch_loss}"
        state = trainer.state_dict()
        for k, want in oracle.items():
            assert state[k].dtype == bf16, k
            err = _spacings_at_scale(np.asarray(state[k], np.float64), want)
            torch_err = _spacings_at_scale(torch_state[k], want)
            assert err <= max(4.0, 2 * torch_err), f"step {step} {k}: {err:.1f} spacings, torch's {torch_err:.1f}"
    for k in ("bn.running_mean", "bn.running_var"):
        assert not np.array_equal(state[k], start[k]), k
