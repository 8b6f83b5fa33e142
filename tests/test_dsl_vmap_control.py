"""``gc.vmap``'s batching rules for control flow (``gc.scan``, ``gc.fori_loop``, ``gc.cond`` on a per-example
condition) and training-mode BatchNorm against torch: ``torch.vmap`` of the same computation written
with Python loops (unrolled) and ``torch.where``, values on numpy and onnxruntime, ``gc.grad``'s gradients
against torch.autograd's. Each vmap passes ``fallback="error"`` (``_ns``), so a case the rules do not
rewrite fails instead of running as the Scan over the examples."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
from tests.test_dsl_vmap_rules import _check, _data, _ns
from tests.torch_grad_util import TorchNS

torch = pytest.importorskip("torch")


def _no_fallback(fn, **feeds) -> gc.Model:
    """``fn`` captured with the fallback's warning an error; no Scan over the examples in it."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", gc.PerformanceWarning)
        model = gc.capture(fn, **feeds)
    bodies = [n.attributes["body"].value.name for n in model.ir.graph if n.op_type == "Scan"]
    assert not any(name.startswith("vmap_body") for name in bodies), bodies
    return model


# -- Scan ------------------------------------------------------------------------------------------


def _rnn(M, in_dims):
    """``(final carry, per-step outputs)`` of a tanh cell over each example's sequence, as one output."""
    def fn(M, x, h0, w):
        vmap, _, _ = _ns(M)
        if isinstance(M, TorchNS):
            def one(xs, h):
                ys = []
                for t in range(xs.shape[0]):
                    ys.append(h * 2.0 + xs[t].sum())
                    h = torch.tanh(h @ w + xs[t])
                return h, torch.stack(ys)
        else:
            def one(xs, h):
                return gc.scan(lambda c, xt: (gc.tanh(c @ w + xt), c * 2.0 + xt.sum()), h, xs)
        h, ys = vmap(one, in_dims=in_dims)(x, h0)
        return ys * 1.5 + (h.unsqueeze(-2) if h.ndim == ys.ndim - 1 else h)
    return fn


@pytest.mark.parametrize("in_dims", [(0, 0), (None, 0), (0, None), (1, 0)],
                         ids=["both_mapped", "carry_mapped", "xs_mapped_carry_grows", "xs_dim1"])
def test_scan_of_mapped_carries_and_sequences(in_dims):
    """A mapped carry batched, mapped sequences scanned as (T, B, ...); a carry the same for all that
    the body makes per example (``xs_mapped_carry_grows``) batched too."""
    x_shape = {None: (5, 3), 0: (4, 5, 3), 1: (5, 4, 3)}[in_dims[0]]
    x, h0, w = _data(x_shape, (4, 3) if in_dims[1] == 0 else (3,), (3, 3), seed=1)
    _check(_rnn(None, in_dims), [x, h0, w])


def test_scan_rule_leaves_no_fallback_on_a_symbolic_size():
    x, h0, w = _data((4, 5, 3), (4, 3), (3, 3), seed=2)
    want = _rnn(None, 0)(TorchNS(torch), *map(torch.from_numpy, (x, h0, w))).numpy()
    for specs in ({"x": x, "h0": h0}, {"x": gc.spec("float64", ("N", 5, 3)), "h0": gc.spec("float64", ("N", 3))}):
        model = _no_fallback(lambda x, h0: _rnn(None, 0)(gc.nn.functional, x, h0, w), **specs)
        for backend in ["numpy", "ort-cpu"]:
            got = gc.Session(model, backend=backend).run({"x": x, "h0": h0})["output"]
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=backend)


# -- Loop ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("init_mapped", [True, False])
def test_fori_loop_of_mapped_carries(init_mapped):
    """A per-example carry (its init mapped, or made per example by the body) through a Loop; the
    trip count the same for all."""
    def fn(M, a, w):
        vmap, _, _ = _ns(M)

        def one(a, c):
            if isinstance(M, TorchNS):
                for i in range(1, 4):
                    c = torch.tanh(c @ w) * 0.5 + a * i
                return c
            return gc.fori_loop(1, 4, lambda i, c: gc.tanh(c @ w) * 0.5 + a * i.to("float64"), c)
        return vmap(one, in_dims=(0, 0 if init_mapped else None))(a, a * 2.0 if init_mapped else w[0])
    _check(fn, _data((4, 3), (3, 3), seed=3))


# -- If on a per-example condition ------------------------------------------------------------------


def test_cond_on_a_per_example_condition_selects_each_examples_branch():
    """Both branches batched, each example's picked by a Where: torch.vmap of torch.where, and each
    example's branch alone (no NaN: both branches' derivatives are finite)."""
    def fn(M, x, w):
        vmap, _, _ = _ns(M)
        if isinstance(M, TorchNS):
            return vmap(lambda a: torch.where(a.sum() > 0, torch.tanh(a) * w, a * a + w))(x)
        return vmap(lambda a: gc.cond(a.sum() > 0, lambda: gc.tanh(a) * w, lambda: a * a + w))(x)
    x, w = _data((6, 2, 3), (3,), seed=4)
    assert len({bool(s > 0) for s in x.sum((1, 2))}) == 2, "both branches taken"
    _check(fn, [x, w])
    model = _no_fallback(lambda x: fn(gc.nn.functional, x, w), x=gc.spec("float64", ("N", 2, 3)))
    loop = np.stack([np.tanh(e) * w if e.sum() > 0 else e * e + w for e in x])
    for backend in ["numpy", "ort-cpu"]:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], loop, rtol=1e-15)


def test_cond_on_a_per_example_condition_with_random_branches_stays_a_scan():
    """A branch that draws random numbers would draw for examples that do not take it: the Scan, with
    its warning."""
    x, = _data((5, 3), seed=5)
    with pytest.warns(gc.PerformanceWarning, match="per-example condition of a branch that draws random"):
        model = gc.capture(lambda x: gc.vmap(lambda a: gc.cond(a.sum() > 0, lambda: a + gc.rand_like(a),
                                                                lambda: -a), randomness="different")(x), x=x)
    assert [n.attributes["body"].value.name.startswith("vmap_body") for n in model.ir.graph if n.op_type == "Scan"] == [True]
    got = gc.Session(model, backend="numpy").run({"x": x})["output"]
    neg = x.sum(1) <= 0
    np.testing.assert_array_equal(got[neg], -x[neg])
    assert np.all((got[~neg] - x[~neg] >= 0) & (got[~neg] - x[~neg] < 1))


# -- training-mode BatchNorm -----------------------------------------------------------------------


@pytest.mark.parametrize("images", [(4, 3, 2, 5), (4, 3, 2)], ids=["NCL", "NC"])
def test_training_batch_norm_of_mapped_running_statistics_uses_each_examples_statistics(images):
    """torch.func.vmap's training-mode batch_norm of mapped running statistics: each example normalised
    by its own batch's statistics (not the B*N values together), weight and bias shared. No rule: the
    Scan over the examples is faster (``vmap_rules_conv._batch_norm``)."""
    def fn(M, x, w, bias, m, v):
        if isinstance(M, TorchNS):
            return torch.vmap(lambda a, rm, rv: torch.nn.functional.batch_norm(a, rm, rv, w, bias, training=True))(
                x, m.clone(), v.clone())
        return gc.vmap(lambda a, rm, rv: M.batch_norm(a, rm, rv, w, bias, training=True), fallback="scan")(x, m, v)
    x, w, bias = _data(images, (2,), (2,), seed=6)
    _check(fn, [x, w, bias], {"m": np.zeros((4, 2)), "v": np.ones((4, 2))})


def test_training_batch_norm_of_shared_running_statistics_is_refused_as_torch_refuses_it():
    x, m, v = _data((4, 3, 2, 5), (2,), (2,), seed=7)
    v = np.abs(v)
    with pytest.raises(RuntimeError, match="running_mean or running_var, which will be updated in place, were not"):
        torch.vmap(lambda a: torch.nn.functional.batch_norm(a, torch.from_numpy(m), torch.from_numpy(v),
                                                            training=True))(torch.from_numpy(x))
    with pytest.raises(gc.CaptureError, match=r"training-mode BatchNorm at .*test_dsl_vmap_control.py:\d+ gets a "
                                              r"per-example input while its running_mean and running_var"):
        gc.capture(lambda x: gc.vmap(lambda a: gc.nn.functional.batch_norm(a, m, v, training=True))(x), x=x)


class _PerExampleBN(gc.nn.Module):
    """An eval-mode BatchNorm1d under gc.vmap: each example's ``(N, C)`` rows alone (folded into N)."""

    def __init__(self):
        super().__init__()
        self.bn = gc.nn.BatchNorm1d(3, dtype="float64")

    def forward(self, x):
        return gc.vmap(lambda a: self.bn(a))(x)


def test_training_an_eval_batch_norm_run_under_vmap_is_refused_as_torch_refuses_it():
    """Its training graphs would switch it to batch statistics of all the examples folded into N,
    each example updating the shared running statistics, which torch.func.vmap refuses; frozen
    BatchNorm (its inference mode) trains."""
    x = _data((2, 4, 3), seed=8)[0]
    bn = torch.nn.BatchNorm1d(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="running_mean or running_var, which will be updated in place, were not"):
        torch.vmap(bn.train())(torch.from_numpy(x))
    model = gc.capture(_PerExampleBN(), x=gc.spec("float64", (2, 4, 3)))
    want = torch.vmap(bn.eval())(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(gc.Session(model, backend="numpy").run({"x": x})["output"], want, rtol=1e-12)
    loss = gc.losses.mse("output", label="y")
    with pytest.raises(gc.PassError, match=r"the BatchNorm at .*test_dsl_vmap_control.py:\d+, run per example under "
                                           r"gc.vmap in eval mode, cannot train with batch statistics"):
        gc.training.generate(model, loss, gc.optim.SGD(lr=0.1))
    frozen = gc.training.generate(model, loss, gc.optim.SGD(lr=0.1), batchnorm="frozen")
    assert frozen.manifest.batchnorm == "frozen" and "bn.weight" in frozen.manifest.trainable
