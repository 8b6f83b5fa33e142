"""``gc.func.grad``, ``grad_and_value``, ``vjp``, ``jvp``, ``jacrev``, ``jacfwd`` and ``hessian`` inside a
capture against torch.func (float64, captured eagerly and on specs, run on the numpy backend and
onnxruntime); their compositions (``vmap(grad)``: per-sample gradients of an MLP through
``functional_call``; ``grad(grad)``; ``hessian``); float64 central differences as an oracle of their
own; the errors."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.dsl import vmap_rules
from tests.dsl_util import check

torch = pytest.importorskip("torch")
F, TF = gc.func, torch.func

BACKENDS = ["numpy", "ort-cpu"]
RNG = np.random.default_rng(0)
X3, X4, W34 = RNG.standard_normal(3), RNG.standard_normal(4), RNG.standard_normal((3, 4))
XS, YS = RNG.standard_normal((5, 3)), RNG.integers(0, 4, 5)


def _flat(tree) -> list:
    if isinstance(tree, (tuple, list)):
        return [leaf for t in tree for leaf in _flat(t)]
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in _flat(tree[k])]
    return [tree]


def _compare(fn, torch_fn, feeds: dict, eager: bool = True, rtol: float = 1e-9) -> gc.Model:
    """``fn(**feeds)`` captured (on the example arrays, else on specs) and run on each backend equals
    ``torch_fn(**feeds)``, leaf by leaf."""
    specs = feeds if eager else {k: gc.spec(v.dtype, v.shape) for k, v in feeds.items()}
    model = gc.capture(lambda **kw: {f"o{i}": t for i, t in enumerate(_flat(fn(**kw)))}, **specs)
    check(model)
    want = [t.detach().numpy() for t in _flat(torch_fn(**{k: torch.from_numpy(v) for k, v in feeds.items()}))]
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run(feeds)
        assert len(got) == len(want)
        for i, w in enumerate(want):
            np.testing.assert_allclose(got[f"o{i}"], w, rtol=rtol, atol=1e-12, err_msg=f"{backend} o{i}")
    return model


def _elementwise(M, x):
    return (M.sin(x) * x).sum()


def _matmul(M, x, w):
    return M.tanh(x @ w)


def _softmax_ce(M, w, x, y):
    loss = gc.losses.cross_entropy if M is gc else torch.nn.functional.cross_entropy
    return loss(x @ w, y)


CASES = {  # name -> (scalar function of (M, *args), its feeds)
    "elementwise": (_elementwise, {"x": X3}),
    "matmul": (lambda M, x, w: _matmul(M, x, w).sum(), {"x": X3, "w": W34}),
    "softmax_ce": (_softmax_ce, {"w": W34, "x": XS, "y": YS}),
}


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "specs"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_grad_and_grad_and_value_match_torch(case, eager):
    f, feeds = CASES[case]
    argnums = (0, 1) if len(feeds) > 1 else 0
    _compare(lambda **kw: F.grad(lambda *a: f(gc, *a), argnums)(*kw.values()),
             lambda **kw: TF.grad(lambda *a: f(torch, *a), argnums)(*kw.values()), feeds, eager)
    _compare(lambda **kw: F.grad_and_value(lambda *a: f(gc, *a), argnums)(*kw.values()),
             lambda **kw: TF.grad_and_value(lambda *a: f(torch, *a), argnums)(*kw.values()), feeds, eager)


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd", "hessian"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_jacrev_jacfwd_hessian_match_torch(case, transform):
    f, feeds = CASES[case]
    _compare(lambda **kw: getattr(F, transform)(lambda *a: f(gc, *a))(*kw.values()),
             lambda **kw: getattr(TF, transform)(lambda *a: f(torch, *a))(*kw.values()), feeds)


@pytest.mark.parametrize("transform", ["jacrev", "jacfwd"])
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "specs"])
def test_jacobians_of_a_vector_function_by_two_arguments(eager, transform):
    _compare(lambda x, w: getattr(F, transform)(lambda a, b: _matmul(gc, a, b), argnums=(0, 1))(x, w),
             lambda x, w: getattr(TF, transform)(lambda a, b: _matmul(torch, a, b), argnums=(0, 1))(x, w),
             {"x": X3, "w": W34}, eager)


def test_vjp_and_jvp_match_torch():
    feeds = {"x": X3, "w": W34, "u": X4}

    def gc_fn(x, w, u):
        out, vjp_fn = F.vjp(lambda a, b: gc.softmax(_matmul(gc, a, b)), x, w)
        out2, tangent = F.jvp(lambda a, b: gc.softmax(_matmul(gc, a, b)), (x, w), (x * 2, w - 1))
        return out, vjp_fn(u), out2, tangent

    def torch_fn(x, w, u):
        out, vjp_fn = TF.vjp(lambda a, b: torch.softmax(_matmul(torch, a, b), -1), x, w)
        out2, tangent = TF.jvp(lambda a, b: torch.softmax(_matmul(torch, a, b), -1), (x, w), (x * 2, w - 1))
        return out, vjp_fn(u), out2, tangent

    _compare(gc_fn, torch_fn, feeds)
    _compare(gc_fn, torch_fn, feeds, eager=False)


def test_trees_of_arguments_and_has_aux():
    feeds = {"x": X3, "w": W34}

    def loss(M, p, x):
        out = M.tanh(x @ p["w"]) * p["s"]
        return out.sum(), out

    def gc_fn(x, w):
        p = {"w": w, "s": x.sum()}
        g, aux = F.grad(lambda p, x: loss(gc, p, x), has_aux=True)(p, x)
        (g2, (value, aux2)) = F.grad_and_value(lambda p, x: loss(gc, p, x), argnums=(0, 1), has_aux=True)(p, x)
        out, vjp_fn, aux3 = F.vjp(lambda p: loss(gc, p, x), p, has_aux=True)
        return g, aux, g2, value, aux2, vjp_fn(gc.ones_like(out)), aux3

    def torch_fn(x, w):
        p = {"w": w, "s": x.sum()}
        g, aux = TF.grad(lambda p, x: loss(torch, p, x), has_aux=True)(p, x)
        (g2, (value, aux2)) = TF.grad_and_value(lambda p, x: loss(torch, p, x), argnums=(0, 1), has_aux=True)(p, x)
        out, vjp_fn, aux3 = TF.vjp(lambda p: loss(torch, p, x), p, has_aux=True)
        return g, aux, g2, value, aux2, vjp_fn(torch.ones_like(out)), aux3

    _compare(gc_fn, torch_fn, feeds)


def test_second_derivatives_by_grad_of_grad():
    def f(M, x, w):
        return (M.tanh(x @ w) ** 2).sum()

    _compare(lambda x, w: F.grad(lambda a: F.grad(lambda b: f(gc, b, w))(a).sum() * 1.5)(x),
             lambda x, w: TF.grad(lambda a: TF.grad(lambda b: f(torch, b, w))(a).sum() * 1.5)(x),
             {"x": X3, "w": W34})


def test_an_lstm_is_unrolled_for_its_gradient_and_vjp_keeps_its_output():
    lstm = gc.nn.LSTM(4, 5, batch_first=True, dtype="float64").init_parameters(1)
    tlstm = torch.nn.LSTM(4, 5, batch_first=True).double()
    tlstm.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in lstm.state_dict().items()})
    feeds = {"x": RNG.standard_normal((2, 3, 4)), "u": RNG.standard_normal((2, 3, 5))}

    def gc_fn(x, u):
        out, vjp_fn = F.vjp(lambda a: lstm(a)[0], x)
        return vjp_fn(u), out * 2, F.grad(lambda a: (lstm(a)[0] ** 2).sum())(x)

    def torch_fn(x, u):
        out, vjp_fn = TF.vjp(lambda a: tlstm(a)[0], x)
        return vjp_fn(u), out * 2, TF.grad(lambda a: (tlstm(a)[0] ** 2).sum())(x)

    _compare(gc_fn, torch_fn, feeds)
    _compare(gc_fn, torch_fn, feeds, eager=False)


# -- per-sample gradients -------------------------------------------------------------------------


def _mlp() -> gc.nn.Module:
    return gc.nn.Sequential(gc.nn.Linear(3, 8, dtype="float64"), gc.nn.Tanh(), gc.nn.Linear(8, 4, dtype="float64"))


@pytest.fixture(params=["rules", "scan"])
def path(request, monkeypatch):
    """"scan": no batching rule, so vmap maps the gradient's nodes in a Scan."""
    if request.param == "scan":
        monkeypatch.setattr(vmap_rules, "RULES", {})
    return request.param


def test_per_sample_gradients_of_an_mlp_by_vmap_of_grad(path):
    net = _mlp().init_parameters(3)
    params = {k: np.asarray(v, np.float64) for k, v in net.state_dict().items()}
    names = sorted(params)
    feeds = {"x": XS, "y": YS, **{f"p{i}": params[k] for i, k in enumerate(names)}}

    def gc_loss(p, x, y):
        return gc.losses.cross_entropy(F.functional_call(net, p, (x[None],)), y[None])

    def gc_fn(x, y, **p):
        return gc.vmap(F.grad(gc_loss), in_dims=(None, 0, 0))({k: p[f"p{i}"] for i, k in enumerate(names)}, x, y)

    tnet = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4)).double()

    def torch_fn(x, y, **p):
        def loss(p, x, y):
            return torch.nn.functional.cross_entropy(TF.functional_call(tnet, p, (x[None],)), y[None])
        return TF.vmap(TF.grad(loss), in_dims=(None, 0, 0))({k: p[f"p{i}"] for i, k in enumerate(names)}, x, y)

    model = _compare(gc_fn, torch_fn, feeds)
    ops = {n.op_type for n in model.proto.graph.node}
    assert ("Scan" in ops) == (path == "scan")


# -- central differences ---------------------------------------------------------------------------


def _f(x):
    return (gc.softmax(gc.tanh(x @ W34) * 2.0) * np.arange(4.0)).sum()


def _at(model: gc.Model, x: np.ndarray) -> np.ndarray:
    return gc.Session(model, backend="numpy").run({"x": x})["output"]


def test_grad_and_hessian_match_float64_central_differences():
    spec = gc.spec("float64", (3,))
    value, gradient = gc.capture(_f, x=spec), gc.capture(lambda x: F.grad(_f)(x), x=spec)
    hess = gc.capture(lambda x: F.hessian(_f)(x), x=spec)
    h, basis = 1e-5, np.eye(3)
    numeric = np.array([(_at(value, X3 + h * e) - _at(value, X3 - h * e)) / (2 * h) for e in basis])
    np.testing.assert_allclose(_at(gradient, X3), numeric, rtol=1e-7, atol=1e-9)
    numeric2 = np.stack([(_at(gradient, X3 + h * e) - _at(gradient, X3 - h * e)) / (2 * h) for e in basis], axis=1)
    np.testing.assert_allclose(_at(hess, X3), numeric2, rtol=1e-6, atol=1e-8)


# -- errors -----------------------------------------------------------------------------------------


def _error(fn, **feeds) -> str:
    with pytest.raises(gc.GraphError) as info:
        gc.capture(fn, **feeds)
    assert "test_dsl_func_transforms.py:" in str(info.value)
    return str(info.value)


def test_errors_name_the_argument_and_the_line():
    msg = _error(lambda x: F.grad(lambda a: a * 2)(x), x=X3)
    assert "Expected f(*args) to return a scalar Tensor, got tensor with 1 dims" in msg
    msg = _error(lambda x: F.grad(lambda a: a.sum())(gc.cast(x, "int64")), x=X3)
    assert "argument 0 is int64[3]; only floating-point Tensors can be differentiated" in msg
    msg = _error(lambda x: F.grad(lambda a, b: (a * b).sum(), argnums=2)(x, x), x=X3)
    assert "argnums 2 is out of range for the 2 positional argument(s)" in msg
    msg = _error(lambda x: F.grad(lambda a: a.sum(), has_aux=True)(x), x=X3)
    assert "has_aux=True): func must return a tuple (output, aux)" in msg
    msg = _error(lambda x: F.vjp(lambda a: a * 2, x)[1](gc.ones_like(x)[:2]), x=X3)
    assert "cotangent 0 is float64[2]; expected float64[3]" in msg
    msg = _error(lambda x: F.jacrev(lambda a: a * 2)(x), x=gc.spec("float64", ("N",)))
    assert "a Jacobian needs static dims" in msg
    msg = _error(lambda x: F.jvp(lambda a: a * 2, (x,), (x[:2],)), x=X3)
    assert "tangent 0 is float64[2]; expected float64[3]" in msg
    msg = _error(lambda x: F.grad(lambda a: a.sum())([x, "no"]), x=X3)
    assert "argument 0[1] is a str; expected a Tensor" in msg
    msg = _error(lambda x: F.grad(lambda a, b: (a * b).sum(), argnums=(0, -2))(x, x), x=X3)
    assert "argnums (0, -2) names an argument twice" in msg


def test_an_op_without_a_gradient_rule_names_the_transform_and_the_op(monkeypatch):
    from graphc.passes.autodiff import RULES

    monkeypatch.delitem(RULES, "Sin")
    with pytest.raises(gc.MissingGradientRule) as info:
        gc.capture(lambda x: F.grad(lambda a: gc.sin(a).sum())(x), x=X3)
    msg = str(info.value)
    assert msg.startswith("gc.func.grad(f)(*args) (called at tests/test_dsl_func_transforms.py:")
    assert "no gradient rule for ONNX op 'Sin'" in msg


def test_grad_vjp_jvp_on_a_symbolic_batch():
    def fn(x, w):
        f = lambda a: gc.softmax(_matmul(gc, a, w))
        return F.jvp(f, (x,), (x * 2,))[1], F.vjp(f, x)[1](x @ w)[0], F.grad(lambda a: (f(a) ** 2).sum())(x)

    def torch_fn(x, w):
        f = lambda a: torch.softmax(_matmul(torch, a, w), -1)
        return TF.jvp(f, (x,), (x * 2,))[1], TF.vjp(f, x)[1](x @ w)[0], TF.grad(lambda a: (f(a) ** 2).sum())(x)

    model = gc.capture(lambda x, w: dict(enumerate(fn(x, w))), x=gc.spec("float64", ("N", 3)), w=W34)
    check(model)
    for n in (1, 5):
        feeds = {"x": RNG.standard_normal((n, 3)), "w": W34}
        want = torch_fn(*(torch.from_numpy(v) for v in feeds.values()))
        for backend in BACKENDS:
            got = gc.Session(model, backend=backend).run(feeds)
            for k, w in enumerate(want):
                np.testing.assert_allclose(got[str(k)], w.numpy(), rtol=1e-9, atol=1e-12, err_msg=f"{backend} {k}")
