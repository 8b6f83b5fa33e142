"""``gc.vmap`` and ``gc.func.functional_call`` against ``torch.vmap`` and ``torch.func``: each case captured
eagerly and on specs, run on the numpy backend and onnxruntime, both by the batching rules and by the
``Scan`` every function can fall back to (``path``); gradients through vmap by ``gc.grad`` against
torch.autograd; the errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.dsl import vmap_rules
from tests.dsl_util import check

torch = pytest.importorskip("torch")

BACKENDS = ["numpy", "ort-cpu"]


@pytest.fixture(params=["rules", "scan"])
def path(request, monkeypatch):
    """"scan": no batching rule, so every mapped body runs as a Scan (its warning silenced)."""
    if request.param == "scan":
        monkeypatch.setattr(vmap_rules, "RULES", {})
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=gc.PerformanceWarning)
        yield request.param


def _data(*shapes, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _ops(model: gc.Model) -> set[str]:
    found = set()

    def walk(graph):
        for node in graph:
            found.add(node.op_type)
            for attr in node.attributes.values():
                if hasattr(attr.value, "__iter__") and hasattr(attr.value, "inputs"):
                    walk(attr.value)
    walk(model.ir.graph)
    return found


def _compare(fn, arrays: list[np.ndarray], path: str, symbolic: bool = True, rtol=1e-5, atol=1e-6):
    """``fn(M, *tensors)`` with ``M`` graphc, then torch: outputs (a tensor or a tuple of them) equal
    on both backends, captured on example arrays (eager) and, with ``symbolic``, on specs of a
    symbolic first dim (``N``, where it is the first array's)."""
    names = [f"x{i}" for i in range(len(arrays))]
    want = fn(torch, *(torch.from_numpy(a) for a in arrays))
    want = [w.numpy() for w in (want if isinstance(want, tuple) else (want,))]
    feeds = dict(zip(names, arrays))
    n = arrays[0].shape[0]
    symbolic_specs = {k: gc.spec(v.dtype, ("N" if v.shape[0] == n else v.shape[0], *v.shape[1:]))
                      for k, v in feeds.items()}
    specs = [feeds] + ([symbolic_specs] if symbolic else [])
    for spec in specs:
        model = gc.capture(lambda **kw: fn(gc, *(kw[n] for n in names)), **spec)
        check(model)
        has_scan = "Scan" in _ops(model)
        assert has_scan == (path == "scan"), sorted(_ops(model))
        for backend in BACKENDS:
            out = gc.Session(model, backend=backend).run(feeds)
            got = [out[k] for k in sorted(out)] if len(out) > 1 else list(out.values())
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.shape == w.shape, (backend, g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=backend)


# -- values --------------------------------------------------------------------------------------


def test_elementwise(path):
    _compare(lambda M, x, y: M.vmap(lambda a, b: M.tanh(a) * b + 1.0)(x, y), _data((5, 4), (5, 4)), path)


def test_broadcast_against_a_closed_over_tensor_of_higher_rank(path):
    def fn(M, x, w):
        return M.vmap(lambda a: a * w - M.exp(a), in_dims=0)(x)
    _compare(fn, _data((5, 4), (3, 4)), path)


@pytest.mark.parametrize("case", ["vec@mat", "mat@mat", "mat@vec", "vec@vec", "batched@batched3"])
def test_matmul(path, case):
    shapes = {"vec@mat": ((5, 3), (3, 4)), "mat@mat": ((5, 2, 3), (3, 4)), "mat@vec": ((4, 3), (5, 3)),
              "vec@vec": ((5, 3), (5, 3)), "batched@batched3": ((5, 2, 3), (5, 6, 3, 4))}[case]
    in_dims = {"vec@mat": (0, None), "mat@mat": (0, None), "mat@vec": (None, 0), "vec@vec": (0, 0),
               "batched@batched3": (0, 0)}[case]
    _compare(lambda M, a, b: M.vmap(lambda p, q: p @ q, in_dims=in_dims)(a, b), _data(*shapes), path)


def test_linear_layer_gemm_per_example(path):
    """``F.linear`` on a per-example matrix is a Gemm; its rule is a batched MatMul."""
    def fn(M, x, w, b):
        F = M.nn.functional
        return M.vmap(lambda a: F.linear(a, w, b), in_dims=0)(x)
    _compare(fn, _data((5, 2, 3), (4, 3), (4,)), path)


def test_reductions_with_dims(path):
    def fn(M, x):
        return M.vmap(lambda a: (M.sum(a, 1), M.mean(a, -1, True), a.amax(0), M.sum(a)))(x)
    _compare(fn, _data((5, 3, 4)), path)


@pytest.mark.parametrize("opset", [17, 18])
def test_reductions_of_all_axes_either_side_of_opset_18(path, opset):
    """ReduceMean takes its axes as an attribute before opset 18, as an input from it."""
    x, = _data((5, 3, 4))
    model = gc.capture(lambda x: gc.vmap(lambda a: (gc.mean(a), gc.max(a, 1)))(x), x=x, opset=opset)
    check(model)
    out = gc.Session(model, backend="ort-cpu").run({"x": x})
    np.testing.assert_allclose(out["output_0"], x.mean((1, 2)), rtol=1e-6)
    np.testing.assert_allclose(out["output_1"], x.max(2), rtol=1e-6)


def test_softmax_and_log_softmax(path):
    def fn(M, x):
        return M.vmap(lambda a: (M.softmax(a, 0), M.log_softmax(a, -1)))(x)
    _compare(fn, _data((5, 3, 4)), path)


def test_in_dims_none_and_negative(path):
    def fn(M, x, w):
        return M.vmap(lambda a, m: M.softmax(a @ m, -1), in_dims=(-1, None))(x, w)
    _compare(fn, _data((3, 4, 5), (4, 2)), path, symbolic=False)


@pytest.mark.parametrize("out_dims", [1, -1, (1, 0)])
def test_out_dims(path, out_dims):
    def fn(M, x):
        return M.vmap(lambda a: (a.T * 2.0, a.sum(0)), out_dims=out_dims)(x)
    _compare(fn, _data((5, 3, 4)), path)


def test_out_dims_none_for_an_output_the_same_for_all(path):
    def fn(M, x, w):
        return M.vmap(lambda a: (a * w, w * 3.0), out_dims=(0, None))(x)
    _compare(fn, _data((5, 3), (3,)), path)


def test_an_output_that_ignores_the_mapped_input_is_repeated(path):
    def fn(M, x, w):
        return M.vmap(lambda a, m: (a + 1.0, m * 2.0), in_dims=(0, None))(x, w)
    _compare(fn, _data((5, 3), (2,)), path)


def test_nested_vmap(path):
    def outer(M, x, y):
        inner = M.vmap(lambda a, b: (a * b).sum(), in_dims=(None, 0))
        return M.vmap(inner, in_dims=(0, None))(x, y)
    _compare(outer, _data((3, 4), (5, 4)), path)

    def twice(M, x):
        return M.vmap(M.vmap(lambda a: M.softmax(a, -1) * a))(x)
    _compare(twice, _data((2, 3, 4)), path)


def test_pytree_arguments_and_outputs(path):
    def fn(M, x, y, z):
        f = M.vmap(lambda d, t: {"s": d["a"] * t[0] + t[1], "p": [d["a"] * t[1]]},
                   in_dims=({"a": 0}, (1, None)), out_dims={"s": 0, "p": [1]})
        out = f({"a": x}, (y, z))
        return out["p"][0], out["s"]
    _compare(fn, _data((5, 3), (3, 5), (3,)), path, symbolic=False)


def test_non_tensor_arguments_and_keywords_are_closed_over(path):
    def fn(M, x):
        return M.vmap(lambda a, k, scale=1.0: M.sum(a, k) * scale, in_dims=(0, None))(x, 1, scale=3.0)
    _compare(fn, _data((5, 3, 4)), path)


def test_reshape_transpose_concat_slice_gather(path):
    def fn(M, x, idx):
        def per_example(a):
            b = a.reshape(2, 6).transpose(0, 1)
            c = M.cat([b, b[1:3] * 2.0], 0)
            return c[:, 1:], a.flatten()[idx], a.unsqueeze(0).squeeze(0)
        return M.vmap(per_example)(x)
    x, = _data((5, 3, 4))
    _compare(lambda M, x: fn(M, x, [0, 5, 7]), [x], path)


def test_gather_with_mapped_indices_into_a_fixed_table(path):
    """``embedding``: mapped indices into a table the same for all examples."""
    table, = _data((7, 3))
    idx = np.array([[0, 6], [2, 2], [5, 1]], np.int64)

    def fn(M, i, t):
        return M.vmap(lambda j: M.nn.functional.embedding(j, t).T)(i)
    _compare(fn, [idx, table], path)


def test_conv_over_examples(path):
    def fn(M, x, w):
        return M.vmap(lambda a: M.nn.functional.conv2d(a, w, padding=1).relu())(x)
    _compare(fn, _data((4, 1, 2, 5, 5), (3, 2, 3, 3)), path, rtol=1e-4, atol=1e-5)


def test_data_dependent_gc_cond(path):
    """``gc.cond`` on a per-example predicate: both branches and a Where by the rules, else the whole
    body a Scan. torch's vmap refuses data-dependent control flow; numpy is the oracle."""
    x, = _data((6, 3))
    model = gc.capture(lambda x: gc.vmap(lambda a: gc.cond(a.sum() > 0, lambda: a * 2.0, lambda: -a))(x), x=x)
    assert ("Scan" in _ops(model)) == (path == "scan")
    want = np.where(x.sum(1, keepdims=True) > 0, x * 2, -x)
    for backend in BACKENDS:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want, rtol=1e-6)


# -- functional_call -----------------------------------------------------------------------------


def _torch_mlp(params: dict[str, np.ndarray]):
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in params.items()})
    return net


def _mlp() -> gc.nn.Module:
    return gc.nn.Sequential(gc.nn.Linear(4, 8, dtype="float64"), gc.nn.Tanh(), gc.nn.Linear(8, 3, dtype="float64"))


def _ensemble(n: int) -> list[dict[str, np.ndarray]]:
    return [{k: np.asarray(v, np.float64) for k, v in _mlp().init_parameters(seed).state_dict().items()}
            for seed in range(n)]


def test_functional_call_replaces_parameters():
    params, = _ensemble(1)
    x, = _data((6, 4), dtype=np.float64)
    net = _mlp().init_parameters(7)
    feeds = {"x": x, **{k.replace(".", "_"): v for k, v in params.items()}}
    model = gc.capture(lambda x, **p: gc.func.functional_call(net, {k.replace("_", "."): v for k, v in p.items()}, x),
                       **feeds)
    want = _torch_mlp(params)(torch.from_numpy(x)).detach().numpy()
    for backend in BACKENDS:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run(feeds)["output"], want, rtol=1e-12)
    assert not model.params, "the module's own parameters are not read"


def test_model_ensembling_vmap_over_stacked_parameters(path):
    members = _ensemble(3)
    stacked = {k: np.stack([m[k] for m in members]) for k in members[0]}
    x, = _data((6, 4), dtype=np.float64)
    net = _mlp()
    names = sorted(stacked)
    feeds = {"x": x, **{f"p{i}": stacked[k] for i, k in enumerate(names)}}

    def fn(x, **p):
        params = {k: p[f"p{i}"] for i, k in enumerate(names)}
        return gc.vmap(lambda ps, xs: gc.func.functional_call(net, ps, (xs,)), in_dims=(0, None))(params, x)

    model = gc.capture(fn, **feeds)
    check(model)
    assert ("Scan" in _ops(model)) == (path == "scan")
    tnet = _torch_mlp(members[0])
    tparams = {k: torch.from_numpy(v) for k, v in stacked.items()}
    want = torch.vmap(lambda p, xs: torch.func.functional_call(tnet, p, (xs,)), in_dims=(0, None))(
        tparams, torch.from_numpy(x)).detach().numpy()
    for backend in BACKENDS:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run(feeds)["output"], want, rtol=1e-12)


def test_functional_call_ties_and_strict():
    class Tied(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = gc.nn.Linear(3, 3, bias=False)
            self.b = gc.nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x))

    net = Tied()
    w, x = _data((3, 3), (2, 3))
    want = x @ w.T @ w.T
    tied = gc.capture(lambda x, w: gc.func.functional_call(net, {"a.weight": w}, (x,)), x=x, w=w)
    np.testing.assert_allclose(gc.Session(tied, backend="numpy").run({"x": x, "w": w})["output"], want, rtol=1e-5)
    untied = gc.capture(lambda x, w: gc.func.functional_call(net, {"a.weight": w}, (x,), tie_weights=False),
                        x=x, w=w)
    b_weight = net.b.weight.numpy()  # drawn at the capture; a.weight's own value, not w
    np.testing.assert_allclose(gc.Session(untied, backend="numpy").run({"x": x, "w": w})["output"],
                               x @ w.T @ b_weight.T, rtol=1e-5)
    with pytest.raises(gc.CaptureError, match=r"strict=True.*missing \['b.weight'\]"):
        gc.capture(lambda x, w: gc.func.functional_call(net, {"a.weight": w}, x, tie_weights=False, strict=True),
                   x=x, w=w)
    with pytest.raises(gc.CaptureError, match=r"\['c.weight'\] name no parameter"):
        gc.capture(lambda x, w: gc.func.functional_call(net, {"c.weight": w}, x), x=x, w=w)
    with pytest.raises(gc.CaptureError, match="more than one"):
        gc.capture(lambda x, w: gc.func.functional_call(net, ({"a.weight": w}, {"a.weight": w}), x), x=x, w=w)


# -- gradients -----------------------------------------------------------------------------------


def test_gradients_through_vmap_match_torch_autograd(path):
    """``gc.grad`` of ``sum(vmap(f)(x) * c)`` for a parameter the body closes over and one mapped."""
    w0, v0, x, c = _data((4, 3), (5, 3), (5, 4), (5, 3), dtype=np.float64)

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(w0, dtype="float64")
            self.v = gc.nn.Parameter(v0, dtype="float64")

        def forward(self, x, c):
            out = gc.vmap(lambda a, v: gc.softmax(gc.tanh(a @ self.w) * v, -1))(x, self.v)
            return {"loss": gc.sum(out * c)}

    grads = gc.grad(gc.capture(Net(), x=x, c=c), "loss")
    tw, tv = (torch.tensor(p, requires_grad=True) for p in (w0, v0))
    out = torch.vmap(lambda a, v: torch.softmax(torch.tanh(a @ tw) * v, -1))(torch.from_numpy(x), tv)
    (out * torch.from_numpy(c)).sum().backward()
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x, "c": c})
        np.testing.assert_allclose(got["w_grad"], tw.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["v_grad"], tv.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


def test_per_sample_losses_by_functional_call_have_torch_gradients(path):
    params, = _ensemble(1)
    x, = _data((5, 4), dtype=np.float64)
    y = np.array([0, 2, 1, 1, 0], np.int64)
    net = _mlp().init_parameters(0)
    for k, v in params.items():
        dict(net.named_parameters())[k].data = v

    class PerSample(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, x, y):
            ps = {k: getattr(self.net[int(k[0])], k[2:]) for k in params}

            def loss(a, t):
                logits = gc.func.functional_call(self.net, ps, (a.unsqueeze(0),))
                return gc.losses.cross_entropy(logits, t.unsqueeze(0))
            return {"loss": gc.sum(gc.vmap(loss)(x, y))}

    grads = gc.grad(gc.capture(PerSample(), x=x, y=y), "loss")
    tnet = _torch_mlp(params)
    tx = torch.from_numpy(x)
    losses = torch.vmap(lambda a, t: torch.nn.functional.cross_entropy(tnet(a.unsqueeze(0)), t.unsqueeze(0)))(
        tx, torch.from_numpy(y))
    losses.sum().backward()
    for backend in BACKENDS:
        got = gc.Session(grads, backend=backend).run({"x": x, "y": y})
        for k, p in tnet.named_parameters():
            np.testing.assert_allclose(got[f"net.{k}_grad"], p.grad.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{backend} {k}")


class _XAsParam(gc.nn.Module):
    """``sum(vmap(log_softmax(a * a))(x) ** 2) * c`` with ``x`` a parameter."""

    def __init__(self, x):
        super().__init__()
        self.x = gc.nn.Parameter(x, dtype="float64")

    def forward(self, c):
        return {"loss": gc.sum(gc.vmap(lambda a: gc.log_softmax(a * a, -1))(self.x) ** 2) * c}


def test_gradient_with_respect_to_the_mapped_input_matches_central_differences(path):
    x, = _data((4, 3), dtype=np.float64)
    one = {"c": np.ones((), np.float64)}
    grads = gc.grad(gc.capture(_XAsParam(x), **one), "loss")
    direction, eps = np.random.default_rng(3).standard_normal(x.shape), 1e-6
    losses = [gc.Session(gc.capture(_XAsParam(x + s * eps * direction), **one), backend="numpy").run(one)["loss"]
              for s in (1, -1)]
    numeric = (losses[0] - losses[1]) / (2 * eps)
    for backend in BACKENDS:
        analytic = float((gc.Session(grads, backend=backend).run(one)["x_grad"] * direction).sum())
        np.testing.assert_allclose(analytic, numeric, rtol=1e-6, err_msg=backend)


# -- randomness ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("draw", ["rand_like", "dropout"])
def test_randomness_same_and_different(path, backend, draw):
    x = np.ones((6, 50), np.float32)

    def noisy(a):
        return a * gc.rand_like(a) if draw == "rand_like" else gc.nn.functional.dropout(a, 0.5, training=True)

    for randomness, all_equal in (("same", True), ("different", False)):
        if path == "scan" and randomness == "same":
            continue
        model = gc.capture(lambda x, r=randomness: gc.vmap(noisy, randomness=r)(x), x=x)
        out = gc.Session(model, backend=backend).run({"x": x})["output"]
        assert out.shape == x.shape
        rows_equal = all(np.array_equal(out[0], r) for r in out[1:])
        assert rows_equal == all_equal, (randomness, out[:2])
        assert len(np.unique(out[0])) > 1


def test_randomness_error_refuses_random_ops_as_torch():
    x, = _data((3, 4))
    with pytest.raises(gc.CaptureError, match=r"RandomUniform at .*test_dsl_vmap.py:\d+ draws random numbers.*"
                                              r"randomness is 'error'"):
        gc.capture(lambda x: gc.vmap(lambda a: a * gc.rand_like(a))(x), x=x)
    with pytest.raises(RuntimeError, match="randomness"):
        torch.vmap(lambda a: a * torch.rand_like(a))(torch.from_numpy(x))


def test_randomness_same_on_mapped_values_in_a_scan_is_refused(monkeypatch):
    monkeypatch.setattr(vmap_rules, "RULES", {})
    x, = _data((3, 4))
    with pytest.raises(gc.CaptureError, match="randomness='same' for Dropout"):
        gc.capture(lambda x: gc.vmap(lambda a: gc.nn.functional.dropout(a, 0.5), randomness="same")(x), x=x)


# -- errors --------------------------------------------------------------------------------------


def _raises(fn, match, **arrays):
    with pytest.raises(gc.CaptureError, match=match):
        gc.capture(fn, **arrays)


def test_mismatched_mapped_sizes_name_both_arguments_and_the_line():
    x, y = _data((3, 4), (4, 4))
    _raises(lambda x, y: gc.vmap(lambda a, b: a + b)(x, y),
            r"mapped dims differ in size: args\[0\] \(float32\[3,4\]\) has 3 at dim 0, args\[1\] \(float32\[4,4\]\) "
            r"has 4 at dim 0 \(at .*test_dsl_vmap.py:\d+\)", x=x, y=y)
    _raises(lambda x, y: gc.vmap(lambda a, b: a + b)(x, y), r"dim N is 4|has N", x=gc.spec("float32", ("N", 4)),
            y=gc.spec("float32", (4, 4)))


def test_in_dims_that_do_not_match_the_arguments():
    x, = _data((3, 4))
    _raises(lambda x: gc.vmap(lambda a, b: a, in_dims=(0,))(x, x), r"in_dims is a tuple of 1 but the function gets 2",
            x=x)
    _raises(lambda x: gc.vmap(lambda t: t[0], in_dims=((0, 0),))((x,)),
            r"in_dims\[0\] is \(0, 0\), which does not match the structure of args\[0\]: a tuple of 1", x=x)
    _raises(lambda x: gc.vmap(lambda a, k: a * k, in_dims=(0, 0))(x, 2.0), r"args\[1\] dim 0, but it is a float",
            x=x)
    _raises(lambda x: gc.vmap(lambda a: a, in_dims=2)(x), r"args\[0\] dim 2, out of range for its rank 2", x=x)
    _raises(lambda x: gc.vmap(lambda a: a, in_dims=None)(x), "no argument is mapped", x=x)
    _raises(lambda x: gc.vmap(lambda a: a, in_dims="0")(x), "in_dims must be an int, None", x=x)
    _raises(lambda x: gc.vmap(lambda a: a, randomness="sometimes")(x), "randomness must be one of", x=x)


def test_out_dims_errors():
    x, = _data((3, 4))
    _raises(lambda x: gc.vmap(lambda a: a * 2.0, out_dims=None)(x), r"out_dims is None for outputs, which differs",
            x=x)
    _raises(lambda x: gc.vmap(lambda a: (a, a), out_dims=(0,))(x), r"out_dims is \(0,\), which does not match", x=x)
    _raises(lambda x: gc.vmap(lambda a: a, out_dims=3)(x), "out of range for its rank 2", x=x)
    _raises(lambda x: gc.vmap(lambda a: 3)(x), "returned a int at outputs", x=x)


def test_python_control_flow_on_a_mapped_value_is_a_clear_error():
    x, = _data((3, 4))

    def branchy(a):
        if a.sum() > 0:  # data-dependent: the trace cannot take both ways
            return a
        return -a

    with pytest.raises(gc.CaptureError, match=r"gc.vmap \(called at .*test_dsl_vmap.py:\d+\): Python `if`.*"
                                              r"test_dsl_vmap.py:\d+.*gc.where"):
        gc.capture(lambda x: gc.vmap(branchy)(x), x=x)
    with pytest.raises(RuntimeError):  # torch refuses it too
        torch.vmap(branchy)(torch.from_numpy(x))
