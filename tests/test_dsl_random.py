"""torch's sampling functions (graphc/dsl/ops_sample.py). Draws cannot equal torch's, so each is
tested by its distribution on the numpy and ort-cpu backends: 1e5 samples whose mean and variance lie
within 5 standard errors of the exact ones and whose Kolmogorov-Smirnov distance to the exact CDF is
below its 1e-3 critical value (continuous), or whose frequencies lie within 5 standard errors of the
exact probabilities (discrete); supports; dtypes and shapes against torch's; symbolic sizes at two
sizes; torch's (zero) gradients; the determinism graphc promises; and the refusals."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

import graphc as gc
try:
    from torch_grad_util import gc_grads
except ImportError:  # tests/ collected as a package
    from tests.torch_grad_util import gc_grads

BACKENDS = ("numpy", "ort-cpu")
N = 100_000
KS_CRITICAL = math.sqrt(-math.log(1e-3 / 2) / 2)  # sqrt(n) * D at the 1e-3 level (asymptotic)
_erf = np.frompyfunc(math.erf, 1, 1)


def _normal_cdf(mean, std):
    return lambda x: 0.5 * (1 + _erf((np.asarray(x, np.float64) - mean) / (std * math.sqrt(2))).astype(np.float64))


def _draws(fn, backend, runs=1, **inputs):
    """``fn``'s outputs over ``runs`` runs of one Session, through the full checker; inputs are
    (spec, array) pairs."""
    model = gc.capture(fn, **{k: spec for k, (spec, _) in inputs.items()})
    onnx.checker.check_model(model.proto, full_check=True)
    session = gc.Session(model, backend=backend)
    return [session.run({k: arr for k, (_, arr) in inputs.items()}) for _ in range(runs)]


def _ks(samples, cdf) -> float:
    """sqrt(n) times the Kolmogorov-Smirnov distance of ``samples`` to ``cdf``."""
    x = np.sort(np.asarray(samples, np.float64).ravel())
    n = x.size
    f = cdf(x)
    return math.sqrt(n) * max(np.max(np.arange(1, n + 1) / n - f), np.max(f - np.arange(n) / n))


def _assert_moments(y, mean, var):
    y = np.asarray(y, np.float64).ravel()
    assert abs(y.mean() - mean) < 5 * math.sqrt(var / y.size), (y.mean(), mean)
    assert abs(y.var() - var) < 5 * (((y - y.mean()) ** 2).std() / math.sqrt(y.size)), (y.var(), var)


def _assert_frequencies(values, probs: dict):
    """Each value's frequency within 5 standard errors of its probability; nothing else drawn."""
    values = np.asarray(values).ravel()
    assert set(np.unique(values).tolist()) <= set(probs), np.unique(values)
    for v, p in probs.items():
        assert abs(np.mean(values == v) - p) < 5 * math.sqrt(p * (1 - p) / values.size) + 1e-12, (v, p)


SPEC = gc.spec("float32", ("N",))
XS = np.zeros(N, np.float32)


def _refill(method, *args, dtype="float32"):
    def fn(x):
        y = x.to(dtype).clone()
        getattr(y, method)(*args)
        return y
    return fn


# name, fn(x) with x float32 [N], output dtype, exact CDF, mean, variance (None: no moments)
CONTINUOUS = [
    ("rand", lambda x: gc.rand(x.shape[0]), "float32", lambda t: np.clip(t, 0, 1), 0.5, 1 / 12),
    ("rand_float64", lambda x: gc.rand(x.shape[0], 1, dtype="float64"), "float64", lambda t: np.clip(t, 0, 1),
     0.5, 1 / 12),
    ("randn", lambda x: gc.randn(N), "float32", _normal_cdf(0, 1), 0.0, 1.0),
    ("rand_like", lambda x: gc.rand_like(x), "float32", lambda t: np.clip(t, 0, 1), 0.5, 1 / 12),
    ("randn_like_float64", lambda x: gc.randn_like(x, dtype="float64"), "float64", _normal_cdf(0, 1), 0.0, 1.0),
    ("normal_numbers", lambda x: gc.normal(1.5, 0.5, (x.shape[0],)), "float32", _normal_cdf(1.5, 0.5), 1.5, 0.25),
    ("normal_tensors_standardized",  # mean and std vary per element: (y - mean) / std is N(0, 1)
     lambda x: (gc.normal(gc.arange(N).float() % 7, gc.arange(N).float() % 3 + 0.5) - gc.arange(N).float() % 7)
     / (gc.arange(N).float() % 3 + 0.5), "float32", _normal_cdf(0, 1), 0.0, 1.0),
    ("uniform_", _refill("uniform_", -2.0, 3.0), "float32", lambda t: np.clip((t + 2) / 5, 0, 1), 0.5, 25 / 12),
    ("normal_float64", _refill("normal_", 1.0, 2.0, dtype="float64"), "float64", _normal_cdf(1, 2), 1.0, 4.0),
    ("exponential_", _refill("exponential_", 2.0), "float32", lambda t: 1 - np.exp(-2 * np.maximum(t, 0)), 0.5,
     0.25),
    ("log_normal_", _refill("log_normal_", 0.5, 0.4), "float32",
     lambda t: _normal_cdf(0.5, 0.4)(np.log(np.maximum(t, 1e-300))), math.exp(0.5 + 0.08),
     (math.exp(0.16) - 1) * math.exp(1 + 0.16)),
    ("cauchy_", _refill("cauchy_", 1.0, 0.5), "float32", lambda t: 0.5 + np.arctan((t - 1) / 0.5) / np.pi, None,
     None),
    ("rand_float16", lambda x: gc.rand(N, dtype="float16"), "float16", lambda t: np.clip(t, 0, 1), 0.5, 1 / 12),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,fn,dtype,cdf,mean,var", CONTINUOUS, ids=[c[0] for c in CONTINUOUS])
def test_continuous_distributions(name, fn, dtype, cdf, mean, var, backend):
    y = _draws(fn, backend, x=(SPEC, XS))[0]["output"]
    assert y.dtype == np.dtype(dtype) and y.size == N
    if name != "rand_float16":  # float16's 2048 steps of [0, 1) are coarser than the KS critical distance
        assert _ks(y, cdf) < KS_CRITICAL
    if mean is not None:
        _assert_moments(y, mean, var)
    if name in ("rand", "rand_float64", "rand_like", "rand_float16"):
        assert y.min() >= 0 and y.max() <= 1
    if name == "uniform_":
        assert y.min() >= -2 and y.max() <= 3


GEOMETRIC = {k: 0.3 * 0.7 ** (k - 1) for k in range(1, 60)}
# name, fn(x) with x float32 [N], output dtype, {value: probability}
DISCRETE = [
    ("randint", lambda x: gc.randint(-2, 3, (x.shape[0],)), "int64", {v: 0.2 for v in range(-2, 3)}),
    ("randint_high_float32", lambda x: gc.randint(4, (N,), dtype="float32"), "float32", {v: 0.25 for v in range(4)}),
    ("randint_like_int32", lambda x: gc.randint_like(x.int(), 1, 4), "int32", {v: 1 / 3 for v in range(1, 4)}),
    ("random_int8", _refill("random_", -3, 2, dtype="int8"), "int8", {v: 0.2 for v in range(-3, 2)}),
    ("random_to", _refill("random_", 3), "float32", {v: 1 / 3 for v in range(3)}),
    ("random_bool", _refill("random_", dtype="bool"), "bool", {False: 0.5, True: 0.5}),
    ("geometric_", _refill("geometric_", 0.3), "float32", GEOMETRIC),
    ("geometric_int64", _refill("geometric_", 0.3, dtype="int64"), "int64", GEOMETRIC),
    ("bernoulli_number", lambda x: gc.bernoulli(x, 0.3), "float32", {0: 0.7, 1: 0.3}),
    ("bernoulli_method", lambda x: x.double().bernoulli(0.8), "float64", {0: 0.2, 1: 0.8}),
    ("bernoulli_", _refill("bernoulli_", 0.25, dtype="int64"), "int64", {0: 0.75, 1: 0.25}),
    ("bernoulli_tensor_p", lambda x: gc.bernoulli(x + 0.6), "float32", {0: 0.4, 1: 0.6}),
    ("bernoulli__tensor_p", lambda x: x.clone().bernoulli_(x + 0.1), "float32", {0: 0.9, 1: 0.1}),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,fn,dtype,probs", DISCRETE, ids=[c[0] for c in DISCRETE])
def test_discrete_distributions(name, fn, dtype, probs, backend):
    y = _draws(fn, backend, x=(SPEC, XS))[0]["output"]
    assert y.dtype == np.dtype(dtype) and y.size == N
    _assert_frequencies(y, probs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_defaults_span_torchs_ranges(backend):
    outs = _draws(lambda x: {"f16": x.half().clone().random_(), "u8": x.to("uint8").clone().random_(),
                             "f32": x.clone().random_()}, backend, x=(SPEC, XS))[0]
    for key, top in (("f16", 2048), ("u8", 255), ("f32", 2 ** 24)):
        y = outs[key].astype(np.float64)
        assert y.min() >= 0 and y.max() <= top and np.all(y == np.round(y)), key
        _assert_moments(y, top / 2, ((top + 1) ** 2 - 1) / 12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_randperm_is_a_uniform_permutation(backend):
    """50 randperm(3) nodes in one graph, 60 runs: each a permutation, the 6 orders equally often
    (the nodes are independent draws: their seeds differ)."""
    runs = _draws(lambda x: gc.stack([gc.randperm(3) for _ in range(50)]), backend, runs=60, x=(SPEC, XS[:3]))
    perms = np.concatenate([r["output"] for r in runs])
    assert perms.dtype == np.int64 and np.all(np.sort(perms, axis=1) == np.arange(3))
    codes = perms[:, 0] * 9 + perms[:, 1] * 3 + perms[:, 2]
    _assert_frequencies(codes, {a * 9 + b * 3 + c: 1 / 6 for a, b, c in
                                [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)]})


W = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
ROWS = 30_000


@pytest.mark.parametrize("backend", BACKENDS)
def test_multinomial_without_replacement(backend):
    """Distinct indices per row; the first draw has probability w / sum(w); each category's
    inclusion in a sample of 2 is ``p_i + sum_{j != i} p_j p_i / (1 - p_j)``."""
    weights = np.tile(W, (ROWS, 1))
    y = _draws(lambda w: gc.multinomial(w, 2), backend, w=(gc.spec("float32", ("B", 4)), weights))[0]["output"]
    assert y.dtype == np.int64 and y.shape == (ROWS, 2) and np.all(y[:, 0] != y[:, 1])
    p = W / W.sum()
    _assert_frequencies(y[:, 0], dict(enumerate(p)))
    for i in range(4):
        inclusion = p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(4) if j != i)
        assert abs(np.mean(np.any(y == i, axis=1)) - inclusion) < 5 * math.sqrt(inclusion * (1 - inclusion) / ROWS)
    whole = _draws(lambda w: gc.multinomial(w, 4), backend, w=(gc.spec("float32", (4,)), W))[0]["output"]
    assert sorted(whole.tolist()) == [0, 1, 2, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_multinomial_with_replacement(backend):
    """Frequencies w / sum(w); a zero weight is never drawn; 1-D input gives [num_samples]."""
    w = np.array([0.0, 1.0, 3.0], np.float64)
    y = _draws(lambda w: w.multinomial(N, replacement=True), backend, w=(gc.spec("float64", (3,)), w))[0]["output"]
    assert y.dtype == np.int64 and y.shape == (N,)
    _assert_frequencies(y, {0: 0.0, 1: 0.25, 2: 0.75})


def test_dtypes_and_shapes_match_torch():
    torch = pytest.importorskip("torch")
    x = np.zeros((2, 3), np.float64)
    cases = {  # name: (graphc fn of x, torch fn of x)
        "rand": (lambda x: gc.rand(2, 3), lambda x: torch.rand(2, 3)),
        "rand_tuple": (lambda x: gc.rand((4,)), lambda x: torch.rand((4,))),
        "randn_f64": (lambda x: gc.randn(3, dtype="float64"), lambda x: torch.randn(3, dtype=torch.float64)),
        "randint": (lambda x: gc.randint(10, (2, 3)), lambda x: torch.randint(10, (2, 3))),
        "randint_f32": (lambda x: gc.randint(1, 4, (2,), dtype="float32"),
                        lambda x: torch.randint(1, 4, (2,), dtype=torch.float32)),
        "rand_like": (gc.rand_like, torch.rand_like), "randn_like": (gc.randn_like, torch.randn_like),
        "randint_like": (lambda x: gc.randint_like(x.int(), 5), lambda x: torch.randint_like(x.int(), 5)),
        "randperm": (lambda x: gc.randperm(5), lambda x: torch.randperm(5)),
        "normal_broadcast": (lambda x: gc.normal(x[:, :1], x[0] + 1), lambda x: torch.normal(x[:, :1], x[0] + 1)),
        "normal_std_number": (lambda x: gc.normal(x, 2.0), lambda x: torch.normal(x, 2.0)),
        "normal_mean_number": (lambda x: gc.normal(1.0, x[0] + 1), lambda x: torch.normal(1.0, x[0] + 1)),
        "bernoulli": (lambda x: gc.bernoulli(x), torch.bernoulli),
        "bernoulli_int_p": (lambda x: gc.bernoulli(x.long(), 0.5), lambda x: torch.bernoulli(x.long(), 0.5)),
        "multinomial_1d": (lambda x: gc.multinomial(x[0] + 1, 2), lambda x: torch.multinomial(x[0] + 1, 2)),
        "multinomial_2d": (lambda x: (x + 1).multinomial(5, True), lambda x: (x + 1).multinomial(5, True)),
        "uniform_": (lambda x: x.float().uniform_(), lambda x: x.float().uniform_()),
        "geometric_int32": (lambda x: x.int().geometric_(0.5), lambda x: x.int().geometric_(0.5)),
        "random_int16": (lambda x: x.short().random_(), lambda x: x.short().random_()),
        "bernoulli__uint8": (lambda x: x.byte().bernoulli_(0.5), lambda x: x.byte().bernoulli_(0.5)),
    }
    for name, (ours, theirs) in cases.items():
        got = gc.Session(gc.capture(ours, x=gc.spec("float64", (2, 3))), backend="numpy").run({"x": x})["output"]
        want = theirs(torch.from_numpy(x))
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_symbolic_sizes_at_two_sizes(backend):
    def fn(x):
        n = x.shape[0]
        return {"rand": gc.rand(n, 3), "randint": gc.randint(0, 5, (2, n)), "randn_like": gc.randn_like(x),
                "perm": gc.randperm(n), "normal": gc.normal(x, 1.0), "multinomial": gc.multinomial(x.exp(), 2),
                "bernoulli": gc.bernoulli(x.sigmoid()), "refill": x.clone().exponential_()}
    model = gc.capture(fn, x=gc.spec("float32", ("N", 4)))
    onnx.checker.check_model(model.proto, full_check=True)
    session = gc.Session(model, backend=backend)
    for n in (3, 7):
        out = session.run({"x": np.zeros((n, 4), np.float32)})
        assert out["rand"].shape == (n, 3) and out["randint"].shape == (2, n) and out["perm"].shape == (n,)
        assert sorted(out["perm"].tolist()) == list(range(n))
        assert out["multinomial"].shape == (n, 2) and np.all(out["multinomial"][:, 0] != out["multinomial"][:, 1])
        for key in ("randn_like", "normal", "bernoulli", "refill"):
            assert out[key].shape == (n, 4), key


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_are_torchs(backend):
    """torch gives ``normal(mean, std)`` and ``bernoulli(p)`` zero gradients; through a product with
    noise the gradient is that run's noise."""
    torch = pytest.importorskip("torch")
    m, s = torch.zeros(5, requires_grad=True), torch.ones(5, requires_grad=True)
    (torch.normal(m, s) + torch.bernoulli(torch.sigmoid(m))).sum().backward()
    ones = np.ones(5, np.float32)
    got = gc_grads(lambda F, m, s: gc.normal(m, s) + gc.bernoulli(gc.sigmoid(m)), {"m": ones * 0, "s": ones}, {},
                   ones, backend=backend)
    np.testing.assert_array_equal(got["m"], m.grad.numpy())
    np.testing.assert_array_equal(got["s"], s.grad.numpy())
    model = gc.capture(lambda x: {"noise": (u := gc.rand_like(x)), "loss": gc.sum(x * u)}, x=gc.spec("float32", (5,)))
    out = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend=backend).run({"x": ones})
    np.testing.assert_array_equal(out["x_grad"], out["noise"])


def _first_draws(seed=0, backend="ort-cpu"):
    model = gc.capture(lambda x: gc.cat([gc.rand(1) for _ in range(20)]), x=gc.spec("float32", (1,)), seed=seed)
    return gc.Session(model, backend=backend), model


@pytest.mark.parametrize("backend", BACKENDS)
def test_determinism_contract(backend):
    """Each run of a Session draws anew; a new Session of the same model replays the same draws (the
    numpy backend's generator seed, onnxruntime's node seeds from the capture's ``seed``); the nodes'
    draws are independent (onnxruntime's default seeds, one clock value plus the node's index, gave 20
    nearly equal first draws)."""
    x = {"x": np.zeros(1, np.float32)}
    session, model = _first_draws(backend=backend)
    first, second = session.run(x)["output"], session.run(x)["output"]
    assert not np.array_equal(first, second)
    assert np.ptp(first) > 0.2  # 20 independent uniforms: a range below 0.2 has probability < 1e-12
    replay = gc.Session(model, backend=backend)
    np.testing.assert_array_equal(replay.run(x)["output"], first)
    np.testing.assert_array_equal(replay.run(x)["output"], second)
    other = gc.Session(_first_draws(seed=1)[1], backend=backend).run(x)["output"]
    assert np.array_equal(other, first) == (backend == "numpy")  # numpy: the Session's generator, seed 0


ERRORS = [
    ("rand_int_dtype", lambda x: gc.rand(3, dtype="int64"), "dtype must be a floating point type, got int64"),
    ("rand_negative", lambda x: gc.rand(2, -1), r"size \(2, -1\): expected ints >= 0 or dim names"),
    ("rand_unknown_dim", lambda x: gc.rand("M"), r"size \('M',\).*\['N'\]\), got 'M'"),
    ("randint_empty", lambda x: gc.randint(3, 3, (2,)), "expects low < high, got low=3, high=3"),
    ("randint_wide", lambda x: gc.randint(0, 2 ** 60, (2,)), "more than 2\\*\\*53 values"),
    ("randint_no_size", lambda x: gc.randint(3), "needs a size"),
    ("rand_like_int", lambda x: gc.rand_like(x.long()), "dtype must be a floating point type, got int64"),
    ("normal_std", lambda x: gc.normal(0.0, -1.0, (2,)), "expects std >= 0, got std=-1.0"),
    ("normal_no_size", lambda x: gc.normal(0.0, 1.0), "needs a size"),
    ("normal_tensor_size", lambda x: gc.normal(x, 1.0, (3,)), "takes no size with a Tensor mean"),
    ("bernoulli_p", lambda x: gc.bernoulli(x, 1.5), r"expects p in \[0, 1\], got p=1.5"),
    ("bernoulli_int", lambda x: gc.bernoulli(x.long()), "input must be floating point"),
    ("multinomial_too_many", lambda x: gc.multinomial(x, 5), r"num_samples \(5\) > the 4 categories"),
    ("multinomial_zero", lambda x: gc.multinomial(x, 0), "num_samples must be an int > 0, got 0"),
    ("multinomial_3d", lambda x: gc.multinomial(x.reshape(1, 2, 2), 1), "input must be 1-D or 2-D"),
    ("multinomial_int", lambda x: gc.multinomial(x.long(), 1), "input must be floating point"),
    ("uniform_bounds", lambda x: x.uniform_(2, 1), "expects from <= to, got from=2, to=1"),
    ("exponential_lambd", lambda x: x.exponential_(0), "expects lambd > 0, got lambd=0"),
    ("exponential_int", lambda x: x.long().exponential_(), "needs a floating point tensor, got int64"),
    ("geometric_p", lambda x: x.geometric_(1.0), r"expects p in \(0, 1\), got p=1.0"),
    ("cauchy_sigma", lambda x: x.cauchy_(0, -1), "expects sigma > 0, got sigma=-1"),
    ("log_normal_std", lambda x: x.log_normal_(1, 0), "expects std > 0, got std=0"),
    ("random_bounds", lambda x: x.byte().random_(300), r"\[0, 300\) is out of uint8's bounds"),
    ("random_int64_default", lambda x: x.long().random_(), "more than 2\\*\\*53 values"),
]


@pytest.mark.parametrize("name,fn,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_are_refused(name, fn, match):
    with pytest.raises(gc.CaptureError, match=match) as info:
        gc.capture(fn, x=gc.spec("float32", ("N", 4)) if "dim" in name else np.ones(4, np.float32))
    assert "test_dsl_random.py:" in str(info.value)


@pytest.mark.parametrize("opset", [17, 21])
def test_other_opsets_and_eager_capture(opset):
    """The same nodes at opsets 17 and 21, captured eagerly (every draw evaluated as it is traced): the
    shapes on both backends. (onnxruntime 1.31 has no kernels for the random ops' opset-22 versions.)"""
    x = np.ones(4, np.float32)
    fn = lambda x: {"rand": gc.rand(2, 3) + x.sum(), "perm": gc.randperm(4), "without": gc.multinomial(x, 2),  # noqa: E731
                    "with": gc.multinomial(x, 3, True), "cauchy": x.clone().cauchy_()}
    model = gc.capture(fn, x=x, opset=opset)
    onnx.checker.check_model(model.proto, full_check=True)
    for backend in BACKENDS:
        out = gc.Session(model, backend=backend).run({"x": x})
        assert {k: v.shape for k, v in out.items()} == {"rand": (2, 3), "perm": (4,), "without": (2,), "with": (3,),
                                                       "cauchy": (4,)}, backend
