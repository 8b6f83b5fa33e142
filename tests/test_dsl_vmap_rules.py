"""``gc.vmap``'s batching rules for Pad, Tile, OneHot, Gather of mapped indices into mapped data,
GatherND/ScatterND, Conv/ConvTranspose of mapped weights, MaxPool's indices and Resize against
``torch.vmap``: values on numpy and onnxruntime, ``gc.grad``'s gradients against torch.autograd. Each
vmap here passes ``fallback="error"``, so a case a rule does not rewrite fails instead of running as
a Scan. Then ``fallback``'s warning and error, and per-sample gradients of a small CNN."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest

import graphc as gc
from tests.torch_grad_util import TorchNS, assert_matches_torch, gc_grads

torch = pytest.importorskip("torch")


def _ns(M):
    """(vmap, the namespace of tile/index ops, functional) of the torch side or the DSL's."""
    if isinstance(M, TorchNS):
        return torch.vmap, torch, torch.nn.functional
    return functools.partial(gc.vmap, fallback="error"), gc, gc.nn.functional


def _data(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _check(fn, params, inputs=None, seed=0):
    """Values on both backends and numpy gradients against torch (``assert_matches_torch``), then
    onnxruntime's gradients against numpy's."""
    rng = np.random.default_rng(seed)
    assert_matches_torch(fn, params, inputs or {}, rng)
    if not params:
        return
    names = {f"p{i}": p for i, p in enumerate(params)}
    c = np.random.default_rng(seed + 1).standard_normal(fn(TorchNS(torch), *map(torch.from_numpy, params),
                                                           **{k: torch.from_numpy(v) for k, v in
                                                              (inputs or {}).items()}).shape)
    ref = gc_grads(fn, names, inputs or {}, c)
    ort = gc_grads(fn, names, inputs or {}, c, backend="ort-cpu")
    for k in names:
        np.testing.assert_allclose(ort[k], ref[k], rtol=1e-6, atol=1e-9, err_msg=k)


# -- Pad, Tile, OneHot -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_pad_along_the_examples_axes(mode):
    def fn(M, x):
        vmap, _, F = _ns(M)
        return vmap(lambda a: F.pad(a, (2, 1, 1, 0), mode=mode) * 2.0)(x)
    _check(fn, _data((3, 2, 4, 5)))


def test_tile():
    def fn(M, x):
        vmap, T, _ = _ns(M)
        return vmap(lambda a: T.tile(a, (2, 1, 3)))(x)
    _check(fn, _data((3, 2, 4)))


def test_one_hot_of_mapped_indices():
    def fn(M, x):
        vmap, _, F = _ns(M)
        return vmap(lambda a: F.one_hot(a, 5))(x)
    _check(fn, [], {"x": np.random.default_rng(0).integers(0, 5, (4, 3, 2))})


# -- indexing --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_select_of_mapped_indices_into_mapped_data(dim):
    def fn(M, x, idx):
        vmap, T, _ = _ns(M)
        return vmap(lambda a, i: T.index_select(a, dim, i))(x, idx)
    idx = np.random.default_rng(1).integers(0, 3, (4, 2, 3))
    _check(fn, _data((4, 3, 3, 3)), {"idx": idx.reshape(4, 6)})


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_index_select_of_mapped_data_by_shared_indices(dim):
    """Rows of at most a few values after the axis (dims 1, 2) take the mapped dim innermost."""
    def fn(M, x, idx):
        vmap, T, _ = _ns(M)
        return vmap(lambda a: T.index_select(a, dim, idx))(x)
    _check(fn, _data((4, 3, 5, 2)), {"idx": np.array([1, 0, 1, 1])})


def test_advanced_indexing_of_mapped_data_by_mapped_indices_gathernd():
    def fn(M, x, i, j):
        vmap, _, _ = _ns(M)
        return vmap(lambda a, p, q: a[p, q] * 1.5)(x, i, j)
    rng = np.random.default_rng(2)
    _check(fn, _data((4, 3, 5, 2)), {"i": rng.integers(0, 3, (4, 6)), "j": rng.integers(0, 5, (4, 6))})


def test_index_put_scatternd_into_mapped_data():
    def fn(M, x, v, i):
        vmap, T, _ = _ns(M)
        return vmap(lambda a, b, p: T.index_put(a, (p,), b, accumulate=True))(x, v, i)
    rng = np.random.default_rng(3)
    _check(fn, _data((4, 5, 2), (4, 3, 2)), {"i": rng.integers(0, 5, (4, 3))})


# -- convolutions, pools, resize -------------------------------------------------------------------


@pytest.mark.parametrize("images_mapped", [True, False], ids=["per_example_images", "ensemble"])
@pytest.mark.parametrize("groups", [1, 2])
def test_conv2d_of_mapped_weights(images_mapped, groups):
    def fn(M, w, b, x):
        vmap, _, F = _ns(M)
        return vmap(lambda ww, bb, xx: F.conv2d(xx, ww, bb, stride=2, padding=1, groups=groups),
                    in_dims=(0, 0, 0 if images_mapped else None))(w, b, x)
    w, b = _data((3, 4, 4 // groups, 3, 3), (3, 4), seed=1)
    x, = _data((3, 2, 4, 7, 6) if images_mapped else (2, 4, 7, 6), seed=2)
    _check(fn, [w, b, x])


def test_conv_transpose2d_of_mapped_weights():
    def fn(M, w, x):
        vmap, _, F = _ns(M)
        return vmap(lambda ww, xx: F.conv_transpose2d(xx, ww, stride=2, padding=1, output_padding=1))(w, x)
    _check(fn, [*_data((3, 4, 2, 3, 3), seed=1), *_data((3, 2, 4, 5, 5), seed=2)])


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_max_pool2d_indices(backend):
    x, = _data((3, 2, 4, 6, 6))
    want = torch.vmap(lambda a: torch.nn.functional.max_pool2d(a, 3, 2, 1, return_indices=True))(torch.from_numpy(x))
    model = gc.capture(lambda x: gc.vmap(lambda a: gc.nn.functional.max_pool2d(a, 3, 2, 1, return_indices=True),
                                         fallback="error")(x), x=x)
    got = gc.Session(model, backend=backend).run({"x": x})
    np.testing.assert_allclose(got["output_0"], want[0].numpy(), rtol=1e-12)
    np.testing.assert_array_equal(got["output_1"], want[1].numpy())


@pytest.mark.parametrize("kw", [{"scale_factor": 2, "mode": "nearest"},
                                {"scale_factor": 2, "mode": "bilinear", "align_corners": False},
                                {"size": (5, 3), "mode": "bilinear", "align_corners": True}], ids=str)
def test_interpolate_resize(kw):
    def fn(M, x):
        vmap, _, F = _ns(M)
        return vmap(lambda a: F.interpolate(a, **kw))(x)
    _check(fn, _data((3, 2, 4, 4, 3)))


# -- per-sample gradients of a CNN -----------------------------------------------------------------


def _torch_cnn(params):
    def net(p, x):
        h = torch.relu(torch.nn.functional.conv2d(x, p["c1.weight"], p["c1.bias"], padding=1))
        h = torch.nn.functional.max_pool2d(h, 2)
        h = torch.relu(torch.nn.functional.conv2d(h, p["c2.weight"], p["c2.bias"], stride=2))
        return torch.nn.functional.linear(h.flatten(1), p["fc.weight"], p["fc.bias"])
    return net


class _CNN(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = gc.nn.Conv2d(1, 4, 3, padding=1), gc.nn.Conv2d(4, 6, 3, stride=2)
        self.fc = gc.nn.Linear(6 * 2 * 2, 3)

    def forward(self, x):
        h = gc.relu(self.c2(gc.nn.functional.max_pool2d(gc.relu(self.c1(x)), 2)))
        return self.fc(h.flatten(1))


def test_per_sample_gradients_of_a_cnn_are_rewritten_and_match_torch():
    net = _CNN()
    shapes = {"c1.weight": (4, 1, 3, 3), "c1.bias": (4,), "c2.weight": (6, 4, 3, 3), "c2.bias": (6,),
              "fc.weight": (3, 24), "fc.bias": (3,)}
    rng = np.random.default_rng(4)
    params = {k: rng.standard_normal(s) * 0.5 for k, s in shapes.items()}
    x, y = rng.standard_normal((5, 1, 10, 10)), rng.integers(0, 3, 5)

    def per_sample(x, y, **p):
        def loss(ps, a, t):
            return gc.losses.cross_entropy(gc.func.functional_call(net, ps, (a.unsqueeze(0),)), t.unsqueeze(0))
        return gc.vmap(gc.func.grad(loss), in_dims=(None, 0, 0), fallback="error")(
            {k: p[k.replace(".", "_")] for k in shapes}, x, y)

    feeds = {"x": x, "y": y, **{k.replace(".", "_"): v for k, v in params.items()}}
    model = gc.capture(per_sample, **feeds)
    tnet = _torch_cnn(params)

    def tloss(p, a, t):
        return torch.nn.functional.cross_entropy(tnet(p, a.unsqueeze(0)), t.unsqueeze(0))
    want = torch.func.vmap(torch.func.grad(tloss), in_dims=(None, 0, 0))(
        {k: torch.from_numpy(v) for k, v in params.items()}, torch.from_numpy(x), torch.from_numpy(y))
    for backend in ["numpy", "ort-cpu"]:
        got = gc.Session(model, backend=backend).run(feeds)
        assert len(got) == len(shapes)
        for (k, w), g in zip(want.items(), got.values()):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-7, atol=1e-10, err_msg=f"{backend} {k}")


# -- the fallback ----------------------------------------------------------------------------------


def _branchy(a):
    """A body with no batching rule: ``Det`` has none."""
    return gc.linalg.det(a) * 2.0


def test_fallback_warns_once_per_capture_naming_the_op_and_lines():
    x, = _data((4, 3, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = gc.capture(lambda x: [gc.vmap(_branchy)(x) for _ in range(3)][0], x=x)
    found = [w for w in caught if issubclass(w.category, gc.PerformanceWarning)]
    assert len(found) == 1, [str(w.message) for w in caught]
    message = str(found[0].message)
    assert "Det at " in message and "test_dsl_vmap_rules.py" in message and "fallback='scan'" in message
    assert found[0].filename.endswith("test_dsl_vmap_rules.py")
    got = gc.Session(model, backend="numpy").run({"x": x})["output"]
    np.testing.assert_allclose(got, np.linalg.det(x) * 2, rtol=1e-12)


def test_fallback_error_and_scan():
    x, = _data((4, 3, 3))
    with pytest.raises(gc.CaptureError, match=r"no batching rule for Det at .*fallback='error'"):
        gc.capture(lambda x: gc.vmap(_branchy, fallback="error")(x), x=x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.capture(lambda x: gc.vmap(_branchy, fallback="scan")(x), x=x)
    with pytest.raises(gc.CaptureError, match=r"fallback must be one of 'warn', 'scan', 'error', got 'loud'"):
        gc.vmap(_branchy, fallback="loud")


def test_symbolic_mapped_size():
    """The rules' run-time sizes (a mapped size only known at run time), float32 on both backends."""
    def fn(M, x, i):
        vmap, T, F = _ns(M)

        def one(a, p):
            pooled, where = F.max_pool2d(F.pad(a, (1, 1, 1, 1), mode="reflect"), 2, return_indices=True)
            up = F.interpolate(pooled, scale_factor=2, mode="nearest")
            return T.index_put(up, (p,), up[p] * 2.0), where
        return vmap(one)(x, i)

    rng = np.random.default_rng(5)
    x, i = rng.standard_normal((3, 2, 2, 4, 4)).astype(np.float32), rng.integers(0, 2, (3, 1))
    want = fn(TorchNS(torch), torch.from_numpy(x), torch.from_numpy(i))
    model = gc.capture(lambda x, i: fn(gc, x, i), x=gc.spec("float32", ("N", 2, 2, 4, 4)), i=gc.spec("int64", ("N", 1)))
    for backend in ["numpy", "ort-cpu"]:
        got = gc.Session(model, backend=backend).run({"x": x, "i": i})
        np.testing.assert_allclose(got["output_0"], want[0].numpy(), rtol=1e-6, err_msg=backend)
        np.testing.assert_array_equal(got["output_1"], want[1].numpy(), err_msg=backend)


# -- recurrent ops ---------------------------------------------------------------------------------


class _Seq(gc.nn.Module):
    """``sum(vmap(rnn)(x, h0)[0] * c)`` (``h0`` mapped or not), the per-example outputs beside."""

    def __init__(self, rnn, mapped_h0: bool):
        super().__init__()
        self.rnn, self.mapped_h0 = rnn, mapped_h0

    def forward(self, x, h0, c):
        def one(a, h):
            hx = (h, h * 0.5) if isinstance(self.rnn, gc.nn.LSTM) else h
            out, _ = self.rnn(a, hx)
            return out
        out = gc.vmap(one, in_dims=(0, 0 if self.mapped_h0 else None), fallback="error")(x, h0)
        return {"out": out, "loss": gc.sum(out * c)}


@pytest.mark.parametrize("mapped_h0", [True, False], ids=["mapped_h0", "shared_h0"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
def test_recurrent_layers_fold_the_examples_into_their_batch(kind, batch_first, mapped_h0):
    """torch.vmap has no rule for aten::lstm (nor a fallback), so the oracle is torch per example."""
    tnet = getattr(torch.nn, kind)(3, 4, bidirectional=True, batch_first=batch_first).double()
    net = getattr(gc.nn, kind)(3, 4, bidirectional=True, batch_first=batch_first, dtype="float64").init_parameters(0)
    for k, p in tnet.named_parameters():
        dict(net.named_parameters())[k].data = p.detach().numpy()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 2, 5, 3) if batch_first else (3, 5, 2, 3))
    h0 = rng.standard_normal((3, 2, 2, 4) if mapped_h0 else (2, 2, 4))
    tx, th = torch.from_numpy(x), torch.from_numpy(h0)
    outs = []
    for e in range(3):
        h = th[e] if mapped_h0 else th
        outs.append(tnet(tx[e], (h, h * 0.5) if kind == "LSTM" else h)[0])
    want = torch.stack(outs)
    c = rng.standard_normal(tuple(want.shape))
    (want * torch.from_numpy(c)).sum().backward()
    grads = gc.grad(gc.capture(_Seq(net, mapped_h0), x=x, h0=h0, c=c), "loss")
    for backend in ["numpy", "ort-cpu"]:
        got = gc.Session(grads, backend=backend).run({"x": x, "h0": h0, "c": c})
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        for k, p in tnet.named_parameters():
            np.testing.assert_allclose(got[f"rnn.{k}_grad"], p.grad.numpy(), rtol=1e-9, atol=1e-11,
                                       err_msg=f"{backend} {k}")


# -- control flow ----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [True, False])
def test_cond_on_a_condition_shared_by_the_examples_batches_both_branches(flag):
    """``gc.cond`` on an unmapped flag: one If of batched branches (one branch's output not per example,
    the other's per example: both batched); its gradient through the taken branch."""
    x, w = _data((4, 3), (3,), seed=7)

    def fn(M, x, w, f):
        if isinstance(M, TorchNS):
            return torch.vmap(lambda a: torch.tanh(a) * w if bool(f) else w * 2.0 + 0 * a, in_dims=0)(x)
        return gc.vmap(lambda a: gc.cond(f, lambda: gc.tanh(a) * w, lambda: w * 2.0), fallback="error")(x)

    model = gc.capture(lambda x, w, f: {"out": fn(gc, x, w, f), "loss": gc.sum(fn(gc, x, w, f) ** 2)},
                       x=x, w=w, f=np.array(flag))
    assert "Scan" not in {n.op_type for n in model.ir.graph} and "If" in {n.op_type for n in model.ir.graph}
    tx, tw = (torch.tensor(v, requires_grad=True) for v in (x, w))
    want = fn(TorchNS(torch), tx, tw, flag)
    (want ** 2).sum().backward()
    grads = gc.grad(model, "loss", wrt=["x", "w"])
    for backend in ["numpy", "ort-cpu"]:
        got = gc.Session(grads, backend=backend).run({"x": x, "w": w, "f": np.array(flag)})
        np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["x_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)
        np.testing.assert_allclose(got["w_grad"], tw.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


# -- computed operands (as gc.func's gradient graphs make them) --------------------------------------


def test_reduce_over_computed_axes_and_reshape_with_allowzero():
    """ReduceSum of axes computed from the example's shape (a sum over the last one; with
    noop_with_empty_axes, maybe none) and Reshape with allowzero, against torch.vmap."""
    from graphc.dsl import ops

    def fn(M, x):
        if isinstance(M, TorchNS):
            return torch.vmap(lambda a: a.sum(-1, keepdim=True).reshape(2, 3) * 2.0 + a.sum())(x)

        def one(a):
            last = ops.emit("Shape", [a], {"start": -1}) * 0 + ops.emit("Size", [ops.emit("Shape", [a])]) - 1
            total = ops.emit("ReduceSum", [a, last], {"keepdims": 1})
            none = ops.emit("Slice", [last, ops.const_i64([0]), ops.const_i64([0])])  # no axes: a as it is
            same = ops.emit("ReduceSum", [a, none], {"keepdims": 1, "noop_with_empty_axes": 1})
            return ops.emit("Reshape", [total, ops.const_i64([2, 3])], {"allowzero": 1}) * 2.0 + \
                ops.emit("ReduceSum", [same], {"keepdims": 0})
        return gc.vmap(one, fallback="error")(x)
    x, = _data((4, 2, 3, 5))
    want = fn(TorchNS(torch), torch.from_numpy(x)).numpy()
    for specs in ({"x": x}, {"x": gc.spec("float64", ("N", 2, 3, 5))}):
        model = gc.capture(lambda x: fn(gc, x), **specs)
        for backend in ["numpy", "ort-cpu"]:
            got = gc.Session(model, backend=backend).run({"x": x})["output"]
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=backend)
