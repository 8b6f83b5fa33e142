"""The torch names the reach sweep added (torch.lstm/gru/rnn_tanh/rnn_relu, the native_* tuples, aliases, the
Householder methods, post-accumulate hooks), against torch 2.13 in float64 on the numpy and ort-cpu backends:
values and the gradients of ``sum(out * c)``; and the refusals naming what to use instead."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from tests.torch_grad_util import TorchNS, gc_grads, run_both

torch = pytest.importorskip("torch")


def rng(seed=0):
    return np.random.default_rng(seed)


def matches_torch(fn, params, inputs=None, seed=0, rtol=1e-10, atol=1e-12):
    """``fn(M, *params, **inputs)`` with ``M`` gc (``F`` passed, as ``torch_grad_util``'s) and torch: the value on
    numpy and ort-cpu, and ``gc.grad`` of ``sum(out * c)`` with respect to every param on both backends, against
    torch's value and torch.autograd's gradients (float64, to ``rtol``)."""
    inputs = inputs or {}
    ts = [torch.tensor(p, requires_grad=True) for p in params]
    want = fn(TorchNS(torch), *ts, **{k: torch.from_numpy(v) for k, v in inputs.items()})
    c = rng(seed).standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    names = [f"p{i}" for i in range(len(params))]
    feeds = {**dict(zip(names, params)), **inputs}
    got = run_both(gc.capture(lambda **kw: fn(F, *(kw.pop(n) for n in names), **kw), **feeds), feeds)["output"]
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=rtol, atol=atol)
    for backend in ("numpy", "ort-cpu"):
        grads = gc_grads(fn, dict(zip(names, params)), inputs, c, backend=backend)
        for n, t in zip(names, ts):
            np.testing.assert_allclose(grads[n], 0 if t.grad is None else t.grad.numpy(), rtol=rtol, atol=atol,
                                       err_msg=f"{backend} {n}")


def joined(M, outs):
    """The outputs of a tuple-returning op flattened into one vector (``M``: the namespace, gc's or torch's)."""
    G = gc if M is F else M.torch
    return G.cat([o.reshape(-1) for o in outs])


# -- torch.lstm / gru / rnn_tanh / rnn_relu -------------------------------------------------------------

RNN_CASES = [  # (op, layers, bidirectional, has_biases, batch_first, proj_size)
    ("lstm", 2, True, True, False, 0), ("lstm", 1, False, False, True, 0), ("lstm", 2, True, True, True, 2),
    ("gru", 2, True, True, False, 0), ("gru", 1, False, False, True, 0),
    ("rnn_tanh", 2, False, True, False, 0), ("rnn_relu", 1, True, True, True, 0),
]


@pytest.mark.parametrize("op,layers,bidirectional,bias,batch_first,proj", RNN_CASES)
def test_functional_rnns_match_torch(op, layers, bidirectional, bias, batch_first, proj):
    T, N, I, H = 3, 2, 4, 5
    kind = {"lstm": "LSTM", "gru": "GRU"}.get(op, "RNN")
    kw = {"proj_size": proj} if proj else {"nonlinearity": "relu"} if op == "rnn_relu" else {}
    twin = getattr(torch.nn, kind)(I, H, layers, bias=bias, batch_first=batch_first, bidirectional=bidirectional,
                                   **kw).double()
    weights = [w.detach().numpy().copy() for w in twin._flat_weights]
    D, r = 2 if bidirectional else 1, rng(1)
    x = r.standard_normal((N, T, I) if batch_first else (T, N, I))
    h0, c0 = r.standard_normal((layers * D, N, proj or H)), r.standard_normal((layers * D, N, H))

    def fn(M, x, h0, c0, *ws):
        G = gc if M is F else M.torch
        hx = [h0, c0] if op == "lstm" else h0 + 0 * c0.sum()
        return joined(M, getattr(G, op)(x, hx, list(ws), bias, layers, 0.0, False, bidirectional, batch_first))

    matches_torch(fn, [x, h0, c0, *weights])


def test_functional_rnn_refusals_name_the_problem():
    x, h = np.zeros((3, 2, 4)), np.zeros((1, 2, 5))
    w = [np.zeros((15, 4)), np.zeros((15, 5))]
    with pytest.raises(gc.CaptureError, match=r"torch.gru: 2 weights .* expected 4"):
        gc.capture(lambda x, h: gc.gru(x, h, w, True, 1, 0.0, False, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match="packed form, is not captured"):
        gc.capture(lambda x, h: gc.gru(x, np.array([2, 2, 2]), h, w, False, 1, 0.0, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match=r"torch.lstm hx is \[h_0, c_0\]"):
        gc.capture(lambda x, h: gc.lstm(x, h, w, False, 1, 0.0, False, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match=r"torch.lstm\(data, batch_sizes, hx, params, ...\), the packed form"):
        gc.capture(lambda x, h: gc.lstm(x, np.array([2, 2, 2]), [h, h], w, False, 1, 0.0, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match=r"torch.gru takes a rank-3 input \(L, N, H_in\), got float64\[2,4\]"):
        gc.capture(lambda x, h: gc.gru(x[0], h, w, False, 1, 0.0, False, False, False), x=x, h=h)
    # weights that do not fit hx's width, and states of another layer count, were a broadcast error deep in the
    # run or sliced silently: torch's "Expected hidden size" check, naming the weight or the state
    with pytest.raises(gc.CaptureError, match=r"torch.gru: params\[1\] \(weight_hh_l0\) is float64\[15,4\]; expected "
                                              r"\[15, 5\] for hidden size 5 \(hx's width\)"):
        gc.capture(lambda x, h: gc.gru(x, h, [w[0], np.zeros((15, 4))], False, 1, 0.0, False, False, False), x=x, h=h)
    with pytest.raises(gc.CaptureError, match=r"GRU\(float64\[2,2,5\]\): expects a state of shape \(num_layers \* "
                                              r"directions, N, width\) \[1, 2, 5\]"):
        gc.capture(lambda x, h: gc.gru(x, h, w, False, 1, 0.0, False, False, False), x=x, h=np.zeros((2, 2, 5)))
    with pytest.raises(gc.CaptureError, match=r"LSTM\(float64\[2,3,5\]\): expects a state .* \[2, 2, 5\]"):
        lstm = gc.nn.LSTM(4, 5, num_layers=2).double()
        gc.capture(lambda x, h, c: lstm(x, (h, c))[0], x=x, h=np.zeros((2, 3, 5)), c=np.zeros((2, 2, 5)))


# -- the native_* tuples ----------------------------------------------------------------------------

@pytest.mark.parametrize("affine", [True, False])
def test_native_layer_norm_matches_torch(affine):
    x, w, b = rng(2).standard_normal((2, 3, 4, 5)), rng(3).standard_normal((4, 5)), rng(4).standard_normal((4, 5))

    def fn(M, x, w, b):
        G = gc if M is F else M.torch
        return joined(M, G.native_layer_norm(x, [4, 5], w if affine else None, b if affine else None, 1e-5))

    matches_torch(fn, [x, w, b])


@pytest.mark.parametrize("training,running", [(True, True), (True, False), (False, True)])
def test_native_batch_norm_matches_torch(training, running):
    x, w, b = rng(5).standard_normal((4, 3, 5)), rng(6).standard_normal(3), rng(7).standard_normal(3)
    stats = {"rm": rng(8).standard_normal(3), "rv": rng(9).uniform(0.5, 2, 3)} if running else {}

    def fn(M, x, w, b, rm=None, rv=None):
        G = gc if M is F else M.torch
        return joined(M, G.native_batch_norm(x, w, b, None if rm is None else rm.clone() if G is not gc else rm,
                                             rv, training, 0.1, 1e-5))

    matches_torch(fn, [x, w, b], stats)


def test_native_batch_norm_evaluation_statistics_are_empty():
    x, rm, rv = rng(5).standard_normal((4, 3)), np.zeros(3), np.ones(3)
    got = run_both(gc.capture(lambda x: gc.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5), x=x), {"x": x})
    assert got["output_1"].shape == got["output_2"].shape == (0,)


def test_native_group_norm_statistics_are_differentiable_as_torchs():
    x, w, b = rng(10).standard_normal((2, 4, 3, 2)), rng(11).standard_normal(4), rng(12).standard_normal(4)
    matches_torch(lambda M, x, w, b: joined(M, (gc if M is F else M.torch).native_group_norm(x, w, b, 2, 4, 6, 2, 1e-5)),
                  [x, w, b])
    with pytest.raises(gc.GraphError, match=r"N=2, C=4, HxW=5 do not describe the input \(2, 4, 3, 2\)"):
        gc.capture(lambda x: gc.native_group_norm(x, None, None, 2, 4, 5, 2, 1e-5), x=x)


@pytest.mark.parametrize("train", [True, None, False])
def test_native_dropout_returns_the_mask_it_applied_and_its_gradient(train):
    x, c, p = rng(13).standard_normal((40, 50)) + 5, rng(14).standard_normal((40, 50)), 0.3
    model = gc.capture(lambda x: gc.native_dropout(x, p, train), x=x)
    want = torch.native_dropout(torch.from_numpy(x), p, train)
    scale = 1 / (1 - p) if train is not False else 1.0
    for backend in ("numpy", "ort-cpu"):  # onnxruntime's kept values divided in double (backends/doubles.py)
        out, mask = gc.Session(model, backend=backend).run({"x": x}).values()
        assert mask.dtype == want[1].numpy().dtype == np.bool_
        np.testing.assert_allclose(out, x * mask * scale, rtol=1e-12)
        assert (mask.mean() == 1.0) if train is False else abs(mask.mean() - (1 - p)) < 0.05, (backend, mask.mean())
        got = gc_grads(lambda M, x: gc.native_dropout(x, p, train)[0], {"x": x}, {}, c, backend=backend)
        np.testing.assert_allclose(got["x"], c * (got["out"] != 0) * scale, rtol=1e-12)


# -- torch.embedding_bag's four outputs -------------------------------------------------------------

@pytest.mark.parametrize("mode,padding_idx,last,weighted", [
    (0, None, False, False), (0, None, False, True), (0, 2, False, False), (1, None, False, False), (1, 2, False, False),
    (1, None, True, False), (2, None, False, False), (2, 2, False, False), (2, -1, True, False)])
def test_embedding_bag_four_outputs_match_torch(mode, padding_idx, last, weighted):
    w, r = rng(15).standard_normal((10, 3)), rng(16)
    idx = np.array([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = np.array([0, 4, 4, 6, 8] if last else [0, 4, 4, 6])
    psw = r.standard_normal(8) if weighted else None
    want = torch.embedding_bag(torch.from_numpy(w), torch.from_numpy(idx), torch.from_numpy(offsets), False, mode,
                               False, None if psw is None else torch.from_numpy(psw), last, padding_idx)
    got = run_both(gc.capture(lambda w: gc.embedding_bag(w, idx, offsets, False, mode, False, psw, last, padding_idx),
                              w=w), {"w": w})
    for i, t in enumerate(want):
        assert got[f"output_{i}"].dtype == t.numpy().dtype and got[f"output_{i}"].shape == tuple(t.shape), i
        np.testing.assert_allclose(got[f"output_{i}"], t.numpy(), rtol=1e-12, err_msg=str(i))
    matches_torch(lambda M, w: (gc if M is F else M.torch).embedding_bag(
        w, *[x if M is F else torch.from_numpy(x) for x in (idx, offsets)], False, mode, False,
        None if psw is None else psw if M is F else torch.from_numpy(psw), last, padding_idx)[0], [w])


def test_embedding_bag_max_indices_of_tied_maxima_are_the_first_positions_as_torchs():
    """Two rows equal in a column: torch's max_indices is the row at the bag's first position holding the maximum
    (the highest row id was taken before)."""
    w = np.array([[1.0, 2.0], [1.0, 5.0], [0.0, 5.0]])
    idx, offsets = np.array([0, 1, 1, 2]), np.array([0, 2])
    want = torch.embedding_bag(torch.from_numpy(w), torch.from_numpy(idx), torch.from_numpy(offsets), False, 2)[3]
    got = run_both(gc.capture(lambda w: gc.embedding_bag(w, idx, offsets, False, 2), w=w), {"w": w})["output_3"]
    np.testing.assert_array_equal(got, want.numpy())
    np.testing.assert_array_equal(got, [[0, 1], [1, 1]])


def test_embedding_bag_float32_sum_keeps_torchs_empty_offset2bag():
    w, idx, offsets = rng(17).standard_normal((10, 3)).astype(np.float32), np.array([1, 2, 4]), np.array([0, 2])
    want = torch.embedding_bag(torch.from_numpy(w), torch.from_numpy(idx), torch.from_numpy(offsets))
    got = run_both(gc.capture(lambda w: gc.embedding_bag(w, idx, offsets), w=w), {"w": w})
    assert [got[f"output_{i}"].shape for i in range(4)] == [tuple(t.shape) for t in want] == [(2, 3), (0,), (2,), (2,)]
    with pytest.raises(gc.GraphError, match="torch.embedding_bag takes a 1-D indices, its offsets and an int mode"):
        gc.capture(lambda w: gc.embedding_bag(w, idx, offsets, False, "sum"), w=w)


# -- aliases: grid_sampler_2d/3d, unfold_copy, i0_/ldexp_, the Householder methods ---------------------------

def test_grid_sampler_2d_and_3d_match_torch_and_check_the_rank():
    x2, g2 = rng(18).standard_normal((1, 2, 4, 5)), rng(19).uniform(-1, 1, (1, 3, 2, 2))
    matches_torch(lambda M, x, g: (gc if M is F else M.torch).grid_sampler_2d(x, g, 0, 1, False), [x2, g2])
    x3, g3 = rng(20).standard_normal((1, 2, 3, 4, 5)), rng(21).uniform(-1, 1, (1, 2, 2, 2, 3))
    matches_torch(lambda M, x, g: (gc if M is F else M.torch).grid_sampler_3d(x, g, 0, 0, True), [x3, g3],
                  rtol=1e-9)
    with pytest.raises(gc.CaptureError, match="grid_sampler_3d takes a rank-5 input, got float64"):
        gc.capture(lambda x, g: gc.grid_sampler_3d(x, g, 0, 0, False), x=x2, g=g2)


def test_unfold_copy_and_the_top_level_in_place_special_functions_match_torch():
    x = rng(22).uniform(0.5, 2, (3, 7))
    matches_torch(lambda M, x: (gc if M is F else M.torch).unfold_copy(x, 1, 3, 2), [x])
    e = np.array([[1, -2, 0, 3, 1, 2, -1]] * 3)
    want_i0, want_ldexp = torch.from_numpy(x.copy()).i0_(), torch.from_numpy(x.copy()).ldexp_(torch.from_numpy(e))

    def both(x):
        a, b = x + 0, x * 1
        gc.i0_(a)
        gc.ldexp_(b, e)
        return a, b

    got = run_both(gc.capture(both, x=x), {"x": x})
    np.testing.assert_allclose(got["output_0"], want_i0.numpy(), rtol=1e-12)
    np.testing.assert_allclose(got["output_1"], want_ldexp.numpy(), rtol=1e-12)


def test_householder_methods_match_torch():
    a, c = rng(23).standard_normal((2, 5, 3)), rng(24).standard_normal((2, 5, 2))
    tau = torch.geqrf(torch.from_numpy(a))[1].numpy()
    matches_torch(lambda M, a, t: a.orgqr(t), [a, tau], rtol=1e-9, atol=1e-11)
    matches_torch(lambda M, a, t, c: a.ormqr(t, c, True, True), [a, tau, c], rtol=1e-9, atol=1e-11)
    got = run_both(gc.capture(lambda a: a.geqrf(), a=a), {"a": a})
    for i, t in enumerate(torch.from_numpy(a).geqrf()):
        np.testing.assert_allclose(got[f"output_{i}"], t.numpy(), rtol=1e-10, atol=1e-12)


# -- post-accumulate hooks, and the Tensor attributes a captured value has no place for --------------------

def _hooked_grads(lib, params, x, y, backend=None):
    """d loss / d params of a 4-3-1 MLP whose first weight has a pre hook (x3) registered after a post-accumulate
    hook that clamps ``.grad`` in place and whose second weight's post hook assigns ``.grad``."""
    kw = {"dtype": "float64"} if lib is gc else {}

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = lib.nn.Sequential(lib.nn.Linear(4, 3, **kw), lib.nn.Tanh(), lib.nn.Linear(3, 1, **kw))

        def forward(self, x, y):
            return ((self.net(x) - y) ** 2).sum()

    def clamp(p):
        p.grad.clamp_(-0.05, 0.05)

    net = Net().double() if lib is torch else Net()
    for k, p in net.named_parameters():
        p.data = torch.tensor(params[k]) if lib is torch else params[k]
    net.net[0].weight.register_post_accumulate_grad_hook(clamp)
    net.net[0].weight.register_hook(lambda g: g * 3)
    net.net[2].weight.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", p.grad * p.grad.abs()))
    if lib is torch:
        net(torch.tensor(x), torch.tensor(y)).backward()
        return {k: p.grad.numpy() for k, p in net.named_parameters()}
    grads = gc.Session(gc.grad(gc.capture(net, x=x, y=y), "output"), backend=backend).run({"x": x, "y": y})
    return {k.removesuffix("_grad"): v for k, v in grads.items() if k.endswith("_grad")}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_post_accumulate_grad_hooks_change_the_gradient_as_torchs(backend):
    r = rng(25)
    params = {"net.0.weight": r.standard_normal((3, 4)), "net.0.bias": r.standard_normal(3),
              "net.2.weight": r.standard_normal((1, 3)), "net.2.bias": r.standard_normal(1)}
    x, y = r.standard_normal((8, 4)), r.standard_normal((8, 1))
    want = _hooked_grads(torch, params, x, y)
    assert np.abs(want["net.0.weight"]).max() == pytest.approx(0.05)  # the clamp bites
    got = _hooked_grads(gc, params, x, y, backend)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-12, atol=1e-15, err_msg=k)


def test_post_accumulate_grad_hook_refuses_none_a_result_and_uncallables():
    lin = gc.nn.Linear(2, 1)
    handle = lin.weight.register_post_accumulate_grad_hook(lambda p: p.grad)
    with pytest.raises(gc.CaptureError, match="post accumulate grad hooks should return None"):
        gc.grad(gc.capture(lambda x: lin(x).sum(), x=np.ones((3, 2), np.float32)), "output")
    handle.remove()
    with pytest.raises(TypeError, match="register_post_accumulate_grad_hook at .*a hook must be callable"):
        lin.weight.register_post_accumulate_grad_hook(3)
    lin.weight.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
    with pytest.raises(gc.CaptureError, match="set .grad to None; torch then skips the parameter's update"):
        gc.grad(gc.capture(lambda x: lin(x).sum(), x=np.ones((3, 2), np.float32)), "output")


@pytest.mark.parametrize("read,words", [
    (lambda x: x.sum().item() * x, r"reducesum.item\(\) at .*test_dsl_torch_reach.py:\d+ reads traced value"),
    (lambda x: gc.tensor(x.tolist()), r"x.tolist\(\) at .*test_dsl_torch_reach.py:\d+ reads traced value x: float32"),
    (lambda x: x * gc.is_nonzero(x[0, 0]), r"torch.is_nonzero at .*: branch in the graph with gc.where"),
    (lambda x: x.retain_grad(), r"x.retain_grad\(\) at .*fills no .grad; take an intermediate's gradient with "
                                r"gc.autograd.grad"),
    (lambda x: x.grad, r"x.grad at .*test_dsl_torch_reach.py:\d+: a captured value has no .grad"),
    (lambda x: x.register_post_accumulate_grad_hook(print), r"leaf tensors only: register it on the gc.nn.Parameter"),
])
def test_python_values_and_autograd_attributes_of_traced_values_are_refused_naming_the_line(read, words):
    with pytest.raises(gc.CaptureError, match=words):
        gc.capture(read, x=np.ones((2, 3), np.float32))


def test_values_made_outside_a_capture_are_read_and_new_makes_torchs_tensors():
    made = gc.tensor([[1.5, 0.0]], dtype="float64")
    t = torch.tensor([[1.5, 0.0]], dtype=torch.float64)
    assert made[0, 0].item() == t[0, 0].item() and made.tolist() == t.tolist()
    assert gc.is_nonzero(made[0, :1]) is torch.is_nonzero(t[0, :1]) is True
    assert gc.is_nonzero(made[0, 1]) is torch.is_nonzero(t[0, 1]) is False
    with pytest.raises(gc.CaptureError, match="a Tensor with 2 elements cannot be converted to a Python scalar"):
        made.item()
    assert made.retains_grad is False
    x = np.ones((2, 3), np.float32)
    got = run_both(gc.capture(lambda x: (x.new(2, 4), x.new([1, 2]), x.new(), x.new(x.shape), x.new((2, 3))), x=x),
                   {"x": x})
    tx = torch.from_numpy(x)
    for i, want in enumerate((t.float().new(2, 4).zero_(), torch.ones(1).new([1, 2]), torch.ones(1).new(),
                              tx.new(tx.shape).zero_(), tx.new((2, 3)))):  # a Size: a shape; a tuple: data
        assert got[f"output_{i}"].dtype == want.numpy().dtype and got[f"output_{i}"].shape == tuple(want.shape)
    np.testing.assert_array_equal(got["output_1"], [1, 2])
    np.testing.assert_array_equal(got["output_4"], [2, 3])


# -- torch.lu_solve, svd_lowrank, pca_lowrank ---------------------------------------------------------------

def test_lu_solve_is_torchs_deprecated_argument_order():
    a, b = rng(26).standard_normal((2, 4, 4)), rng(27).standard_normal((2, 4, 3))
    lu, piv = (t.numpy() for t in torch.linalg.lu_factor(torch.from_numpy(a)))
    with warnings.catch_warnings():  # torch's deprecation warning, given once per process (TORCH_WARN_ONCE)
        warnings.simplefilter("ignore")
        want = torch.lu_solve(torch.from_numpy(b), torch.from_numpy(lu), torch.from_numpy(piv)).numpy()
    got = run_both(gc.capture(lambda b, lu: gc.lu_solve(b, lu, piv), b=b, lu=lu), {"b": b, "lu": lu})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_svd_lowrank_and_pca_lowrank_give_the_top_singular_triplets():
    r = rng(28)
    a = r.standard_normal((2, 7, 3)) @ r.standard_normal((2, 3, 5))  # rank 3: torch's randomized result is exact
    for fn, q in (("svd_lowrank", 3), ("svd_lowrank", None), ("pca_lowrank", None)):  # None: 6, cut to 5
        want = getattr(torch, fn)(torch.from_numpy(a), q)
        got = run_both(gc.capture(lambda a: getattr(gc, fn)(a, q), a=a), {"a": a})
        u, s, v = (got[f"output_{i}"] for i in range(3))
        assert [u.shape, s.shape, v.shape] == [tuple(t.shape) for t in want]
        np.testing.assert_allclose(s, want[1].numpy(), rtol=1e-10, atol=1e-13)  # pca: q 5, two zeros
        np.testing.assert_allclose((u * s[..., None, :]) @ np.swapaxes(v, -1, -2),
                                   (want[0] * want[1][..., None, :] @ want[2].mT).numpy(), rtol=1e-9, atol=1e-10)
    # the gradient of the exact top-q singular values (torch's randomized one approximates it)
    matches_torch(lambda M, a: gc.svd_lowrank(a, 2)[1] if M is F else M.torch.linalg.svdvals(a)[..., :2],
                  [r.standard_normal((6, 4))], rtol=1e-9)
    with pytest.raises(gc.CaptureError, match=r"pca_lowrank q=4 must be .* not greater than min\(m, n\)=3"):
        gc.capture(lambda a: gc.pca_lowrank(a, 4), a=a[0, :3])


def test_functional_lstm_takes_numpy_weights_in_the_inputs_dtype_at_a_symbolic_length():
    twin = torch.nn.LSTM(4, 5, 2, proj_size=3).double()
    weights = [w.detach().numpy() for w in twin._flat_weights]
    x, h, c = rng(29).standard_normal((7, 2, 4)), np.zeros((2, 2, 3)), np.zeros((2, 2, 5))
    model = gc.capture(lambda x, h, c: gc.lstm(x, [h, c], weights, True, 2, 0.0, False, False, False),
                       x=gc.spec("float64", ("T", 2, 4)), h=gc.spec("float64", (2, 2, 3)), c=gc.spec("float64", (2, 2, 5)))
    got = run_both(model, {"x": x, "h": h, "c": c})
    out, (h_n, c_n) = twin(torch.from_numpy(x))
    for i, want in enumerate((out, h_n, c_n)):
        np.testing.assert_allclose(got[f"output_{i}"], want.detach().numpy(), rtol=1e-10, atol=1e-14)
