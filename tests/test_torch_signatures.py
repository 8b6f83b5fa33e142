"""torch 2.13's signatures on graphc's: every keyword of a ``torch.nn`` Module's ``__init__`` and of a
``torch.nn.functional`` function is accepted by graphc's same-named one or listed in ``ABSENT`` with the
reason; and the keywords added for it (``device=``, ``input=``, ``weight=``, ``dtype=`` ...) give torch's
numbers on numpy and ort-cpu (float64)."""

from __future__ import annotations

import ast
import inspect
import re
import warnings

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn
from graphc.errors import CaptureError

torch = pytest.importorskip("torch")
TF = torch.nn.functional
RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
P = inspect.Parameter

# torch's keywords graphc does not take, and why
ABSENT = {
    ("nn.RNNBase", "mode"): "graphc's RNNBase is RNN/LSTM/GRU's base, for isinstance checks: build those",
    ("nn.RNNCellBase", "num_chunks"): "graphc's RNNCellBase is the cells' base, for isinstance checks: build "
                                      "RNNCell/LSTMCell/GRUCell",
}


def _keywords(fn) -> list[str] | None:
    """``fn``'s parameters a caller can pass by keyword; None if it has no signature or takes ``**kwargs``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is P.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.name != "self" and p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)]


def _pairs():
    """(name, torch's callable, graphc's) for torch.nn's Modules and torch.nn.functional's functions graphc has;
    a lazy module is compared as the module it becomes (its first argument, the inferred size, dropped)."""
    for name in dir(torch.nn):
        cls, ours = getattr(torch.nn, name), getattr(nn, name, None)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module) and ours is not None:
            yield f"nn.{name}", cls.__init__, getattr(ours, "cls_to_become", ours).__init__
    for name in dir(TF):
        fn, ours = getattr(TF, name), getattr(F, name, None)
        if not name.startswith("_") and callable(fn) and not isinstance(fn, type) and callable(ours):
            yield f"F.{name}", fn, ours


def test_every_torch_keyword_is_taken_or_listed_absent():
    missing, compared = [], 0
    for name, theirs, ours in _pairs():
        want, have = _keywords(theirs), _keywords(ours)
        if want is None or have is None:
            continue
        compared += 1
        missing += [f"{name}({kw}=)" for kw in want if kw not in have and (name, kw) not in ABSENT]
    assert compared > 150
    assert not missing, f"torch keywords graphc neither takes nor lists in ABSENT: {missing}"


def test_absent_keywords_are_still_absent_in_torch_and_graphc():
    pairs = {name: (theirs, ours) for name, theirs, ours in _pairs()}
    for (name, kw), why in ABSENT.items():
        theirs, ours = pairs[name]
        assert kw in _keywords(theirs) and kw not in _keywords(ours) and why


DEVICE_MODULES = [
    ("Linear", (3, 4)), ("Bilinear", (3, 2, 4)), ("Conv1d", (2, 3, 3)), ("Conv2d", (2, 3, 3)), ("Conv3d", (2, 3, 1)),
    ("ConvTranspose1d", (2, 3, 3)), ("ConvTranspose2d", (2, 3, 3)), ("ConvTranspose3d", (2, 3, 1)),
    ("BatchNorm1d", (3,)), ("BatchNorm2d", (3,)), ("BatchNorm3d", (3,)), ("SyncBatchNorm", (3,)),
    ("LayerNorm", (3,)), ("GroupNorm", (1, 3)), ("InstanceNorm1d", (3,)), ("InstanceNorm2d", (3,)),
    ("InstanceNorm3d", (3,)), ("RMSNorm", (3,)), ("Embedding", (5, 3)), ("EmbeddingBag", (5, 3)), ("PReLU", ()),
    ("MultiheadAttention", (4, 2)), ("TransformerEncoderLayer", (4, 2, 8)), ("TransformerDecoderLayer", (4, 2, 8)),
    ("Transformer", (4, 2, 1, 1, 8)), ("RNNCell", (3, 4)), ("LSTMCell", (3, 4)), ("GRUCell", (3, 4)),
    ("RNN", (3, 4)), ("LSTM", (3, 4)), ("GRU", (3, 4)), ("AdaptiveLogSoftmaxWithLoss", (4, 10, [5])),
    ("LazyLinear", (4,)), ("LazyConv2d", (2, 3)), ("LazyBatchNorm1d", ()), ("LazyInstanceNorm2d", ()),
]


@pytest.mark.parametrize("name, args", DEVICE_MODULES, ids=[n for n, _ in DEVICE_MODULES])
def test_modules_take_torch_device_keyword(name, args):
    """torch's ``factory_kwargs``: any device (cuda too: the session's backend places the graph) builds the
    module the device-less call builds; a non-device is refused naming the keyword."""
    built = [getattr(nn, name)(*args, device=d) for d in (None, "cpu", "cuda:1", torch.device("cuda"), "meta")]
    assert len({repr(m) for m in built}) == 1
    assert len({tuple((k, v.shape) for k, v in m.state_dict().items()) for m in built}) == 1
    assert "device" in inspect.signature(getattr(nn, name)).parameters or name.startswith("Lazy")
    if not name.startswith("Lazy"):  # a lazy module checks its arguments when it becomes its module
        with pytest.raises(CaptureError, match=r"device='gpu'\): expected a device"):
            getattr(nn, name)(*args, device="gpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_factory_kwargs_linear_matches_torch(backend):
    kw = {"device": torch.device("cpu"), "dtype": torch.float64}
    ours, theirs = nn.Linear(3, 4, **kw), torch.nn.Linear(3, 4, **kw)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = RNG.standard_normal((5, 3))
    model = gc.capture(ours, x=gc.spec("float64", ("N", 3)))
    got = gc.Session(model, backend=backend).run({"x": x})
    np.testing.assert_allclose(next(iter(got.values())), theirs(torch.from_numpy(x)).detach().numpy(), rtol=1e-14)


def _run(fn, backend, **feeds):
    model = gc.capture(fn, **{k: gc.spec(v.dtype, v.shape) for k, v in feeds.items()})
    return next(iter(gc.Session(model, backend=backend).run(feeds).values()))


def _t(a):
    return torch.from_numpy(a)


TORCH_INPUT_NAMES = [
    ("relu6", {}), ("sigmoid", {}), ("elu", {"alpha": 0.5}), ("hardtanh", {"min_val": -0.5}),
    ("leaky_relu", {"negative_slope": 0.2}), ("softsign", {}), ("glu", {"dim": -1}), ("layer_norm",
                                                                                      {"normalized_shape": (4,)}),
    ("normalize", {"dim": -1}), ("pad", {"pad": (1, 2)}), ("threshold", {"threshold": 0.1, "value": -1.0}),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, kw", TORCH_INPUT_NAMES, ids=[n for n, _ in TORCH_INPUT_NAMES])
def test_functional_takes_torchs_input_keyword(name, kw, backend):
    x = RNG.standard_normal((3, 4))
    got = _run(lambda x: getattr(F, name)(input=x, **kw), backend, x=x)
    np.testing.assert_allclose(got, getattr(TF, name)(input=_t(x), **kw).numpy(), rtol=1e-12, atol=1e-15)
    assert np.array_equal(got, _run(lambda x: getattr(F, name)(x, **kw), backend, x=x))
    assert list(inspect.signature(getattr(F, name)).parameters)[0] == "input"


def test_graphc_names_still_bind_and_both_names_are_refused():
    x = RNG.standard_normal((2, 3))
    np.testing.assert_array_equal(_run(lambda x: F.relu6(x=x), "numpy", x=x), np.clip(x, 0, 6))
    np.testing.assert_array_equal(_run(lambda i: F.one_hot(tensor=i, num_classes=3), "numpy",
                                       i=np.array([0, 2])), np.eye(3, dtype=np.int64)[[0, 2]])
    with pytest.raises(CaptureError, match="TypeError.*'input' and 'x', two names for one argument"):
        _run(lambda x: F.relu6(input=x, x=x), "numpy", x=x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", ["mse_loss", "l1_loss", "huber_loss"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_loss_weight_matches_torch(loss, reduction, backend):
    """torch 2.13's per-element ``weight``: the weighted losses ("mean" over the weights' sum, huber's over the
    elements, as torch's), and their
    gradient (torch's autograd)."""
    p, t, w = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4)) * 2, RNG.random((3, 4))
    got = _run(lambda p, t, w: getattr(F, loss)(p, t, reduction=reduction, weight=w), backend, p=p, t=t, w=w)
    tp = _t(p).requires_grad_()
    want = getattr(TF, loss)(tp, _t(t), reduction=reduction, weight=_t(w))
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-12)
    model = gc.capture(lambda p, t, w: {"loss": getattr(F, loss)(p, t, reduction=reduction, weight=w).sum()},
                       **{k: gc.spec("float64", (3, 4)) for k in "ptw"})
    grads = gc.grad(model, "loss", wrt=["p"])
    out = gc.Session(grads, backend=backend).run({"p": p, "t": t, "w": w})
    want.sum().backward()
    np.testing.assert_allclose(out["p_grad"], tp.grad.numpy(), rtol=1e-12, atol=1e-15)


def test_loss_weight_of_another_shape_is_refused():
    with pytest.raises(CaptureError, match=r"mse_loss: weight's shape \(4,\) must be input's \(3, 4\)"):
        _run(lambda p, w: F.mse_loss(p, p, weight=w), "numpy", p=np.ones((3, 4)), w=np.ones(4))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "softmin"])
def test_softmax_dtype_casts_first(name, backend):
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    got = _run(lambda x: getattr(F, name)(x, dim=1, dtype="float64"), backend, x=x)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, getattr(TF, name)(_t(x), dim=1, dtype=torch.float64).numpy(), rtol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_norm_dtype_and_out_refused(backend):
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    got = _run(lambda x: F.norm(x, 2, dim=1, dtype="float64"), backend, x=x)
    np.testing.assert_allclose(got, torch.norm(_t(x), 2, dim=1, dtype=torch.float64).numpy(), rtol=1e-13)
    for fn in (lambda x: F.norm(x, out=x), lambda x: F.normalize(x, out=x)):
        with pytest.raises(CaptureError, match=r"\(out=\.\.\.\): graphc does not write into a given tensor"):
            _run(fn, backend, x=x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_instance_norm_takes_torchs_order_and_running_stats(backend):
    x, w, b = RNG.standard_normal((2, 3, 5)), RNG.standard_normal(3), RNG.standard_normal(3)
    rm, rv = RNG.standard_normal(3), RNG.random(3) + 0.5
    got = _run(lambda x, w, b: F.instance_norm(x, None, None, w, b), backend, x=x, w=w, b=b)
    np.testing.assert_allclose(got, TF.instance_norm(_t(x), None, None, _t(w), _t(b)).numpy(), rtol=1e-12,
                               atol=1e-14)
    got = _run(lambda x, m, v: F.instance_norm(x, m, v, use_input_stats=False, eps=1e-3), backend, x=x, m=rm, v=rv)
    np.testing.assert_allclose(got, TF.instance_norm(_t(x), _t(rm), _t(rv), use_input_stats=False, eps=1e-3).numpy(),
                               rtol=1e-12)
    with pytest.raises(CaptureError, match="updating running_mean/running_var in place is not captured"):
        _run(lambda x, m, v: F.instance_norm(x, m, v), backend, x=x, m=rm, v=rv)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_interpolate_recompute_scale_factor(mode, backend):
    """5 x 1.3 -> 6: with ``recompute_scale_factor=True`` torch samples at 5/6 steps, without at 1/1.3."""
    x = RNG.standard_normal((1, 2, 5, 7))
    for recompute in (True, False, None):
        got = _run(lambda x: F.interpolate(x, scale_factor=1.3, mode=mode, recompute_scale_factor=recompute),
                   backend, x=x)
        want = TF.interpolate(_t(x), scale_factor=1.3, mode=mode, recompute_scale_factor=recompute).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    up = nn.Upsample(scale_factor=1.3, mode=mode, recompute_scale_factor=True)
    np.testing.assert_allclose(_run(up, backend, x=x), torch.nn.Upsample(
        scale_factor=1.3, mode=mode, recompute_scale_factor=True)(_t(x)).numpy(), rtol=1e-6, atol=1e-6)
    if mode == "nearest":  # antialias: tests/test_torch_interpolate_antialias.py
        with pytest.raises(CaptureError, match=r"antialias=True takes mode 'bilinear' or 'bicubic'"):
            _run(lambda x: F.interpolate(x, scale_factor=0.5, mode=mode, antialias=True), backend, x=x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_groupnorm_bias_false_and_hardtanh_deprecated_names(backend):
    x = RNG.standard_normal((2, 4, 3))
    theirs = torch.nn.GroupNorm(2, 4, bias=False, dtype=torch.float64)
    with torch.no_grad():
        theirs.weight.copy_(_t(RNG.standard_normal(4)))
    ours = nn.GroupNorm(2, 4, bias=False, dtype="float64")
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    assert list(ours.state_dict()) == ["weight"] and ours.bias is None
    np.testing.assert_allclose(_run(ours, backend, x=x), theirs(_t(x)).detach().numpy(), rtol=1e-12, atol=1e-14)
    lazy = nn.LazyInstanceNorm1d(bias=False)
    _run(lazy, backend, x=x.astype(np.float32))
    assert sorted(lazy.state_dict()) == sorted(torch.nn.InstanceNorm1d(4, affine=True, track_running_stats=True,
                                                                       bias=False).state_dict())
    with pytest.warns(FutureWarning, match="`min_value` is deprecated and renamed to `min_val`"):
        ours = nn.Hardtanh(min_value=-0.5, max_value=0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.nn.Hardtanh(min_value=-0.5, max_value=0.25)
    np.testing.assert_array_equal(_run(ours, backend, x=x), theirs(_t(x)).numpy())
    with pytest.raises(CaptureError, match="Hardtanh needs min_val < max_val, got 1.0 and -1.0"):
        nn.Hardtanh(1.0, -1.0)


@pytest.mark.parametrize("build, names", [
    (lambda: nn.RNNBase("LSTM", 3, 4), "nn.RNN, nn.LSTM and nn.GRU"),
    (lambda: nn.RNNBase(3, 4), "nn.RNN, nn.LSTM and nn.GRU"),
    (lambda: nn.RNNCellBase(3, 4, True, 4), "nn.RNNCell, nn.LSTMCell and nn.GRUCell"),
], ids=["RNNBase-mode", "RNNBase", "RNNCellBase-num_chunks"])
def test_recurrent_bases_refuse_to_be_built(build, names):
    """torch's ``RNNBase('LSTM', 3, 4)`` / ``RNNCellBase(3, 4, True, 4)``: refused naming the classes to build
    (before: a KeyError '' and a cell of uint16 weights, the 4 read as a dtype)."""
    with pytest.raises(CaptureError, match=rf"nn\.RNN(Cell)?Base is the base class of {names}.*not built itself"):
        build()
    assert isinstance(nn.LSTM(3, 4), nn.RNNBase) and isinstance(nn.GRUCell(3, 4), nn.RNNCellBase)



# torch's top-level functions: keywords graphc's same-named gc.* function does not take, and why
TOP_ABSENT_KEYWORDS = {
    "out": "graphc writes into no given tensor (gc.norm and F.normalize refuse it by name)",
    "memory_format": "ONNX tensors have no memory layout",
    "generator": "graphc's random ops draw from gc.manual_seed's stream",
    "out_dtype": "torch's low-precision matmul accumulator; cast the operands instead",
}
TOP_ABSENT = {
    ("max", "dim"): "gc.max/gc.min are graphc's reductions (axis, keepdims; the values only): torch's max(input, "
                    "dim, keepdim) -> (values, indices) and max(input, other) are F.max/F.min and Tensor.max",
    ("max", "keepdim"): "as max's dim", ("max", "other"): "as max's dim", ("min", "dim"): "as max's dim",
    ("min", "keepdim"): "as max's dim", ("min", "other"): "as max's dim",
    ("transpose", "dim0"): "gc.transpose(x, perm) is a permutation; torch's transpose(input, dim0, dim1) is "
                           "F.transpose and Tensor.transpose",
    ("transpose", "dim1"): "as dim0",
    ("load", "f"): "gc.load loads a graphc Model, not torch's pickles",
    ("load", "map_location"): "as f", ("load", "pickle_module"): "as f", ("load", "weights_only"): "as f",
    ("load", "mmap"): "as f",
    ("cond", "operands"): "gc.cond takes the operands positionally (*operands)",
    ("pow", "self"): "torch's overload for a number base; graphc's takes it positionally",
    ("sum", "dtype"): "cast first (x.to(dtype))", ("mean", "dtype"): "as sum's", ("cumsum", "dtype"): "as sum's",
    ("softmax", "dtype"): "F.softmax takes it", ("gather", "sparse_grad"): "graphc's gradients are dense",
    ("asarray", "copy"): "a graph's values are never shared: every gc.asarray is its own",
    ("repeat_interleave", "output_size"): "a hint for torch's CUDA kernel; the graph computes the size",
    ("stft", "align_to_window"): "torch 2.13's new framing option, not implemented",
    ("tensor_split", "sections"): "gc.tensor_split's one indices_or_sections parameter, taken positionally",
    ("tensor_split", "indices"): "as sections",
}
# where torch's docstring names differ from what its argument parser takes (torch's own TypeError lists these)
TORCH_DOC_FIXES = {"true_divide": ("input", "other"), "unsafe_split": ("input", "split_size", "dim")}


def _doc_keywords(fn, name: str) -> list[str] | None:
    """The keywords of every ``name(...)`` signature line in a C function's docstring (torch's have no
    ``inspect`` signature), or None when no line parses."""
    found: dict[str, None] = {}
    for line in (fn.__doc__ or "").splitlines():
        m = re.match(rf"(\.\. function:: )?{re.escape(name)}\((.*)\)\s*(->.*)?$", line.strip())
        try:
            args = ast.parse(f"def f({m.group(2)}): pass").body[0].args if m else None
        except SyntaxError:
            continue
        found.update(dict.fromkeys(a.arg for a in (*(args.args if args else ()), *(args.kwonlyargs if args else ()))))
    return list(found) or None


def _top_pairs():
    """(name, torch's keywords, graphc's) for torch's top-level functions that gc has."""
    for name in dir(torch):
        fn, ours = getattr(torch, name), getattr(gc, name, None)
        if name.startswith("_") or isinstance(fn, type) or not callable(fn) or not callable(ours) or \
                isinstance(ours, type) or inspect.ismodule(ours):
            continue
        want = list(TORCH_DOC_FIXES.get(name, ())) or _keywords(fn) or _doc_keywords(fn, name)
        have = _keywords(ours)
        if want is not None and have is not None:
            yield name, want, have


def test_every_torch_top_level_keyword_is_taken_or_listed_absent():
    missing, compared = [], 0
    for name, want, have in _top_pairs():
        compared += 1
        missing += [f"gc.{name}({kw}=)" for kw in want
                    if kw not in have and kw not in TOP_ABSENT_KEYWORDS and (name, kw) not in TOP_ABSENT]
    assert compared > 350
    assert not missing, f"torch keywords gc neither takes nor lists in TOP_ABSENT: {missing}"


def test_top_absent_keywords_are_still_absent_and_doc_fixes_are_torchs():
    pairs = {name: (want, have) for name, want, have in _top_pairs()}
    for (name, kw), why in TOP_ABSENT.items():
        want, have = pairs[name]
        assert kw in want and kw not in have and why
    t = torch.ones(4)
    torch.true_divide(input=t, other=t)
    torch.unsafe_split(input=t, split_size=2, dim=0)


BINARY = ["fmod", "remainder", "maximum", "minimum", "logaddexp", "floor_divide", "true_divide", "dist", "matmul",
          "atan2", "hypot", "copysign", "pow", "fmax", "xlogy"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BINARY)
def test_binary_functions_take_input_and_other(name, backend):
    """torch's ``gc.maximum(input=a, other=b)`` (``pow``'s ``exponent``) gives torch's values; graphc's ``a, b``
    still bind; ``inspect.signature`` shows torch's names."""
    a, b = RNG.random((3, 3)) + 0.5, RNG.random((3, 3)) + 0.5
    second = "exponent" if name == "pow" else "other"
    got = _run(lambda a, b: getattr(gc, name)(input=a, **{second: b}), backend, a=a, b=b)
    want = getattr(torch, name)(input=_t(a), **{second: _t(b)}).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert list(inspect.signature(getattr(gc, name)).parameters)[:2] == ["input", second]
    if name in ("fmod", "maximum"):
        np.testing.assert_array_equal(_run(lambda a, b: getattr(gc, name)(a=a, b=b), backend, a=a, b=b), got)
        np.testing.assert_array_equal(_run(lambda a, b: getattr(F, name)(input=a, other=b), backend, a=a, b=b), got)


@pytest.mark.parametrize("backend", BACKENDS)
def test_add_sub_div_keywords_and_reductions_take_torchs_names(backend):
    a, b = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 4))
    cases = [(lambda a, b: gc.add(input=a, other=b, alpha=2.5), torch.add(_t(a), _t(b), alpha=2.5)),
             (lambda a, b: gc.sub(input=a, other=b, alpha=-1.5), torch.sub(_t(a), _t(b), alpha=-1.5)),
             (lambda a, b: gc.div(input=a, other=b, rounding_mode="floor"), torch.div(_t(a), _t(b),
                                                                                     rounding_mode="floor")),
             (lambda a, b: gc.sum(input=a, dim=1, keepdim=True) + gc.mean(a, dim=0), torch.sum(_t(a), dim=1,
                                                                                                keepdim=True)
              + torch.mean(_t(a), dim=0)),
             (lambda a, b: gc.outer(input=a[0], vec2=b[0]), torch.outer(input=_t(a[0]), vec2=_t(b[0]))),
             (lambda a, b: gc.diff(a, 2, dim=1, prepend=b[:, :2], append=a[:, :1]),
              torch.diff(_t(a), 2, dim=1, prepend=_t(b[:, :2]), append=_t(a[:, :1])))]
    for fn, want in cases:
        np.testing.assert_allclose(_run(fn, backend, a=a, b=b), want.numpy(), rtol=1e-13, atol=1e-15)
    with pytest.raises(CaptureError, match="'input' and 'a', two names for one argument"):
        _run(lambda a, b: gc.maximum(a, input=a, a=b), backend, a=a, b=b)
    with pytest.raises(CaptureError, match=r"prepend must have input's rank 2, got shape \[\]"):
        _run(lambda a, b: gc.diff(a, prepend=1.5), backend, a=a, b=b)
