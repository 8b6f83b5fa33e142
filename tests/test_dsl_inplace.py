"""In-place writes (graphc.dsl.inplace): ``x[index] = v`` for each index kind, ``+=`` and torch's ``_``
methods against torch (numpy backend and onnxruntime), gradients against torch.autograd, the
write-through into views and the refusals, and a model built with writes trained one step."""

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F

torch = pytest.importorskip("torch")

X = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)


def _run(fn, **feeds):
    """``fn`` captured on ``feeds`` (checked by onnx), run on numpy and onnxruntime; both outputs."""
    model = gc.capture(fn, **feeds)
    onnx.checker.check_model(model.proto, full_check=True)
    outs = [gc.Session(model, backend=b).run(feeds)["output"] for b in ("numpy", "ort-cpu")]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    return outs[0]


def _torch(fn, **feeds):
    return fn(**{k: torch.tensor(v) for k, v in feeds.items()}).numpy()


# (id, index, value shape or a Python scalar); a "mask" index is ``x > 0``
SETITEM = [
    ("int", (1,), (5, 6)),
    ("negative_int_slice", (-1, slice(1, 4)), (3, 6)),
    ("step_broadcast", (slice(None), slice(None, None, 2)), (6,)),
    ("ellipsis_none", (Ellipsis, None, slice(0, 3)), (3,)),
    ("int_list", ([0, 2],), (5, 6)),
    ("two_lists_apart", ([0, 3], slice(None), [1, 5]), (1,)),
    ("scalar", (slice(1, 3), 2), 7.0),
    ("mask", "mask", -1.5),
    ("mask_tensor_value", "mask", ()),
    ("bool_list", ([True, False, True, False],), (6,)),
    ("leading_ones", (0, 1), (1, 1, 6)),
]


@pytest.mark.parametrize("index, value", [c[1:] for c in SETITEM], ids=[c[0] for c in SETITEM])
def test_setitem_matches_torch(index, value):
    def fn(x, v=None):
        y = x * 1
        y[x > 0 if index == "mask" else index] = value if v is None else v
        return y
    feeds = {"x": X}
    if not isinstance(value, float):
        feeds["v"] = np.random.default_rng(1).standard_normal(value).astype(np.float32)
    np.testing.assert_allclose(_run(fn, **feeds), _torch(fn, **feeds), rtol=1e-6)


def test_setitem_negative_step_matches_numpy():
    def fn(x):
        x[:, ::-2, 1] = 0.5
        return x
    want = X.copy()
    want[:, ::-2, 1] = 0.5
    np.testing.assert_array_equal(_run(fn, x=X), want)


def test_setitem_gradients_match_torch():
    """The overwritten slots of x get no gradient; v gets the sum of its slots' gradients (broadcast)."""
    c = np.random.default_rng(2).standard_normal((4, 5, 6)).astype(np.float32)

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = gc.nn.Parameter(X)
            self.b = gc.nn.Parameter(np.random.default_rng(3).standard_normal((1, 6)).astype(np.float32))

        def forward(self, c):
            y = self.a * 1
            y[1:3, ::2] = self.b * 2
            y[y > 1] = 0.0
            return {"loss": (y * c).sum()}

    grads = gc.Session(gc.grad(gc.capture(Net(), c=c), "loss"), backend="numpy").run({"c": c})
    a = torch.tensor(X, requires_grad=True)
    b = torch.tensor(Net().b.numpy(), requires_grad=True)
    y = a * 1
    y[1:3, ::2] = b * 2
    y[y > 1] = 0.0
    (y * torch.tensor(c)).sum().backward()
    np.testing.assert_allclose(grads["a_grad"], a.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(grads["b_grad"], b.grad.numpy(), rtol=1e-5)


def _views(x):
    y = x * 1
    y[0] += 1             # getitem, iadd (writes through the view), setitem
    v = y.view(-1)
    v[3] = 9.0            # a reshape view writes into y
    w = y.transpose(0, 2)
    w[1] *= 2             # through a transpose
    z = y
    z -= 0.25             # z is y: both see it
    c = y.clone()
    c[1] = 0.0            # a clone is not a view
    return y + z + c


def test_writes_through_views_match_torch():
    np.testing.assert_allclose(_run(_views, x=X), _torch(_views, x=X), rtol=1e-6)


# (id, a reshape of a view): torch's reshape, flatten and contiguous copy where the strides allow no view
RESHAPED_VIEWS = [
    ("transpose_reshape_copies", lambda y: y.transpose(0, 2).reshape(-1)),
    ("transpose_flatten_copies", lambda y: y.transpose(1, 2).flatten(1)),
    ("transpose_contiguous_copies", lambda y: y.transpose(0, 1).contiguous()),
    ("columns_reshape_copies", lambda y: y[:, :, :4].reshape(4, -1)),
    ("permute_reshape_views", lambda y: y.permute(2, 0, 1).reshape(6, 2, 2, 5)),
    ("columns_reshape_views", lambda y: y[:, 1:3].reshape(4, 2, 3, 2)),
    ("rows_flatten_views", lambda y: y[1:3].flatten()),
    ("sliced_contiguous_views", lambda y: y[2:].contiguous()),
]


@pytest.mark.parametrize("reshaped", [c[1] for c in RESHAPED_VIEWS], ids=[c[0] for c in RESHAPED_VIEWS])
def test_write_into_a_reshaped_view_reaches_the_base_as_torch(reshaped):
    def fn(x):
        y = x * 1
        r = reshaped(y)
        r.mul_(3.0)
        r[0] = -1.0
        return y * 2 + r.sum()
    np.testing.assert_allclose(_run(fn, x=X), _torch(fn, x=X), rtol=1e-5)


def test_write_into_select_reaches_the_base_as_torch():
    def fn(x):
        y = x * 1
        y.select(1, -2).zero_()
        y.select(2, 3)[1:] += 5.0
        return y
    np.testing.assert_allclose(_run(fn, x=X), _torch(fn, x=X), rtol=1e-6)


def _diagonal_writes(x):
    y = x * 1
    y.diagonal(0, -2, -1).fill_(0.0)      # the main diagonal of each matrix
    y.diagonal(1, 1, 2).mul_(3.0)         # above it
    y[0].diagonal(-2)[1:] += 5.0          # below it, through a slice of a view
    return y * y


def test_write_into_diagonal_reaches_the_base_as_torch():
    np.testing.assert_allclose(_run(_diagonal_writes, x=X), _torch(_diagonal_writes, x=X), rtol=1e-6)

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = gc.nn.Parameter(X)

        def forward(self, c):
            return {"loss": (_diagonal_writes(self.a) * c).sum()}

    c = np.random.default_rng(6).standard_normal(X.shape).astype(np.float32)
    grads = gc.Session(gc.grad(gc.capture(Net(), c=c), "loss"), backend="ort-cpu").run({"c": c})
    a = torch.tensor(X, requires_grad=True)
    (_diagonal_writes(a) * torch.tensor(c)).sum().backward()
    np.testing.assert_allclose(grads["a_grad"], a.grad.numpy(), rtol=1e-5, atol=1e-6)


def _use_stale(x):
    v = x.view(-1)
    x[0] = 1.0
    return v * 2


def _param_write():
    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(np.ones(3, np.float32))

        def forward(self, x):
            self.w.add_(1.0)
            return x * self.w
    return Net()


def _expand_write(x):
    e = x[0:1].expand(3, 5, 6)
    e[0] = 0.0
    return e


@pytest.mark.parametrize("fn, match", [
    (_use_stale, r"view of a tensor that changed.*written in place at .*test_dsl_inplace.py:\d+.*clone"),
    (_expand_write, r"view made by expand.*clone"),
    (lambda x: x.sum(0).add_(x), r"shape \(4, 5, 6\) is not the written tensor's \(5, 6\)"),
    (lambda x: x.__setitem__([0], x.astype("float64")[:1]), r"dtype mismatch float32 vs float64"),  # index_put_'s
    (lambda x: x.__setitem__(0, x[:2]), r"value of shape \[2, 5, 6\] cannot be written into .* \[5, 6\]"),
    (lambda x: x.long().div_(2), r"dtype float32 can't be cast to the written tensor's int64"),
], ids=["stale_view", "expand", "broadcast_add_", "dtype", "value_shape", "int_div_"])
def test_refusals(fn, match):
    with pytest.raises(gc.GraphError, match=match):
        gc.capture(fn, x=X)


def test_parameter_write_refused():
    with pytest.raises(gc.GraphError, match=r"in-place write into the parameter or buffer w .*would not persist"):
        gc.capture(_param_write(), x=np.ones(3, np.float32))



def test_writes_into_a_clone_of_a_parameter_match_torch():
    """A clone of a parameter is a new tensor: writing it (directly or through a view) leaves the parameter
    alone, in the gradient too, as in torch (graph-fuzz find: it was refused as a write into the parameter)."""
    c = np.random.default_rng(4).standard_normal((3, 4))
    a0, q0 = np.random.default_rng(5).standard_normal((3, 4)), np.random.default_rng(6).standard_normal(4)

    def forward(a, q, c):
        x, y = a.clone(), a.clone()
        x[1:][:, 2] = q[:2]
        y.T[1] += q[:3]
        return ((x * a + y) * c).sum()

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.q = gc.nn.Parameter(a0, dtype="float64"), gc.nn.Parameter(q0, dtype="float64")

        def forward(self, c):
            return {"loss": forward(self.a, self.q, c)}

    grads = gc.Session(gc.grad(gc.capture(Net(), c=c), "loss"), backend="numpy").run({"c": c})
    a, q = torch.tensor(a0, requires_grad=True), torch.tensor(q0, requires_grad=True)
    loss = forward(a, q, torch.tensor(c))
    loss.backward()
    np.testing.assert_allclose(grads["loss"], loss.item(), rtol=1e-12)
    np.testing.assert_allclose(grads["a_grad"], a.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(grads["q_grad"], q.grad.numpy(), rtol=1e-12)

# (method, args): each applied in place to x, whose alias y must see the write
METHODS = [
    ("add_", (1.5,)), ("sub_", ("y",)), ("mul_", ("y",)), ("div_", (3.0,)), ("clamp_", (-0.5, 0.5)),
    ("clamp_min_", (0.1,)), ("clamp_max_", (0.2,)), ("fill_", (2.0,)), ("zero_", ()),
    ("masked_fill_", ("mask", -3.0)), ("copy_", ("row",)), ("relu_", ()), ("sigmoid_", ()), ("tanh_", ()),
    ("exp_", ()), ("neg_", ()), ("abs_", ()), ("pow_", (2.0,)), ("log_", ()), ("sqrt_", ()),
    ("index_add_", (1, "index", "source")), ("scatter_", (2, "index3", 0.5)),
    ("unsqueeze_", (1,)), ("t_", ()), ("__iadd__", ("y",)), ("__imul__", (0.5,)), ("__itruediv__", ("pos",)),
    ("index_copy_", (1, "index", "source")), ("ceil_", ()), ("floor_", ()), ("round_", ()), ("trunc_", ()),
    ("frac_", ()), ("reciprocal_", ()), ("square_", ()), ("rsqrt_", ()), ("sin_", ()), ("cos_", ()), ("erf_", ()),
    ("sign_", ()), ("fmod_", (0.7,)), ("remainder_", (0.7,)), ("nan_to_num_", ()), ("tril_", ()), ("triu_", (1,)),
    ("cumsum_", (1,)), ("cumprod_", (2,)),
    ("scatter_add_", (2, "index3", "y")), ("scatter_reduce_", (2, "index3", "y", "amax")),
    ("index_fill_", (1, "index", -1.0)), ("masked_scatter_", ("mask", "y")), ("lerp_", ("y", 0.3)),
    ("addcmul_", ("y", "y")), ("addcdiv_", ("y", "pos")), ("atan2_", ("y",)), ("hypot_", ("y",)),
    ("copysign_", ("y",)), ("xlogy_", ("pos",)), ("floor_divide_", ("pos",)), ("true_divide_", ("pos",)),
    ("heaviside_", ("y",)), ("tan_", ()), ("sinh_", ()), ("cosh_", ()), ("asin_", ()), ("acos_", ()), ("atan_", ()),
    ("asinh_", ()), ("acosh_", ()), ("atanh_", ()), ("log1p_", ()), ("expm1_", ()), ("log2_", ()), ("log10_", ()),
    ("exp2_", ()), ("erfc_", ()), ("erfinv_", ()), ("logit_", ()), ("sinc_", ()), ("deg2rad_", ()), ("rad2deg_", ()),
    ("sgn_", ()), ("fix_", ()),
]


@pytest.mark.parametrize("name, args", METHODS, ids=[m[0] for m in METHODS])
def test_in_place_methods_match_torch(name, args):
    def fn(x, y, index, index3):
        x = (x.abs() + 0.1) if name in ("log_", "sqrt_", "rsqrt_") else x * 1
        x = x.sum(0) if name == "t_" else x
        alias = x
        named = {"y": y, "mask": x > 0, "row": y[0], "pos": y.abs() + 1, "index": index,
                 "source": y[:, :2], "index3": index3}
        result = getattr(x, name)(*(named.get(a, a) if isinstance(a, str) else a for a in args))
        assert result is x
        return alias * 1
    feeds = {"x": X, "y": np.random.default_rng(4).standard_normal(X.shape).astype(np.float32),
             "index": np.array([4, 0]), "index3": np.ones((4, 5, 6), np.int64)}
    np.testing.assert_allclose(_run(fn, **feeds), _torch(fn, **feeds), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, args", [("relu_", ()), ("elu_", (0.5,)), ("leaky_relu_", (0.2,)),
                                        ("hardtanh_", (-0.5, 0.5)), ("celu_", (2.0,)), ("selu_", ()),
                                        ("rrelu_", ()), ("threshold_", (0.1, -2.0))])
def test_functional_in_place_matches_torch(name, args):
    def fn(x):
        y = x * 1
        alias = y
        assert getattr(torch.nn.functional if isinstance(x, torch.Tensor) else F, name)(y, *args) is y
        return alias
    np.testing.assert_allclose(_run(fn, x=X), _torch(fn, x=X), rtol=1e-6, atol=1e-7)


def test_model_with_writes_trains_like_torch():
    """A causal mask and an output buffer built with writes: one SGD step against torch's."""
    rng = np.random.default_rng(5)
    w0 = rng.standard_normal((4, 4)).astype(np.float32) * 0.5
    x, label = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32)

    def forward(lib, w, x):
        h = x @ w
        mask = lib.zeros(3, 3)
        for i in range(2):
            mask[i, i + 1:] = float("-inf")
        att = (h @ h.transpose(1, 2) + mask).softmax(-1)
        out = lib.zeros(2, 3, 4)
        for t in range(3):
            out[:, t] = att[:, t].unsqueeze(1).matmul(h).squeeze(1)
        out.add_(x)
        return out

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(w0)

        def forward(self, x):
            return forward(gc, self.w, x)

    arts = gc.training.generate(gc.capture(Net(), x=x), gc.losses.mse("output", label="y"), gc.optim.SGD(0.1))
    trainer = gc.Trainer(arts, backend="numpy")
    loss = trainer.step({"x": x, "y": label})
    w = torch.tensor(w0, requires_grad=True)
    want = torch.nn.functional.mse_loss(forward(torch, w, torch.tensor(x)), torch.tensor(label))
    want.backward()
    np.testing.assert_allclose(loss, want.item(), rtol=1e-5)
    np.testing.assert_allclose(trainer.params["w"], (w - 0.1 * w.grad).detach().numpy(), rtol=1e-5, atol=1e-6)


def _loop_writes_outer(x):
    acc = x * 1

    def body(i, c):
        acc[0] += 1.0
        return c + 1.0
    return gc.fori_loop(0, 3, body, x)


def _scan_writes_outer_view(x):
    acc = x * 1

    def step(c, row):
        view = acc[1:]
        view.mul_(2.0)
        return c + row, row
    return gc.scan(step, x[0], x)[0]


@pytest.mark.parametrize("fn", [
    _loop_writes_outer, _scan_writes_outer_view,
    lambda x: gc.cond(x.sum() > 0, lambda a: a.relu_(), lambda a: a * 2, x * 1),
    lambda x: gc.cond(x.sum() > 0, lambda: F.relu(x, inplace=True), lambda: x),
    lambda x: gc.fori_loop(0, 2, lambda i, c: c + x.unsqueeze_(0).sum(0), x),
], ids=["fori_loop", "scan_view", "cond_operand", "cond_inplace_relu", "shape_method"])
def test_write_in_a_body_to_an_outer_tensor_refused(fn):
    with pytest.raises(gc.GraphError, match=r"in-place write into \S+, a value from outside the gc.cond/gc.fori_loop/"
                                            r"gc.scan body being traced, at .*test_dsl_inplace.py:\d+: .*return the "
                                            r"new value from the body instead"):
        gc.capture(fn, x=X)


def _local_writes(lib, x):
    """Writes in bodies to their own values: a carried value, a value made in the body, a branch's clone."""
    def body(i, c):
        c[0] += 1.0
        t = c * 2
        t[:, 1:] = 0.5
        return c + t
    if lib is gc:
        loop = gc.fori_loop(0, 3, body, x * 1)
        branch = gc.cond(x.sum() > 0, lambda a: a.clone().clamp_(-0.5, 0.5), lambda a: a, x)
        scanned = gc.scan(lambda c, row: (c.add_(row), F.relu(row * 1, inplace=True)), x[0] * 0, x)
    else:
        loop = x * 1
        for i in range(3):
            loop = body(i, loop)
        branch = x.clone().clamp_(-0.5, 0.5) if x.sum() > 0 else x
        scanned = (x.sum(0), torch.relu(x))
    return loop + branch + scanned[0] + scanned[1]


def test_writes_in_a_body_to_its_own_values_match_torch():
    np.testing.assert_allclose(_run(lambda x: _local_writes(gc, x), x=X), _local_writes(torch, torch.tensor(X)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_shape", [(4,), (4, 5), (4, 5, 6)])
def test_a_bool_mask_over_leading_dims_writes_whole_rows_as_torch(mask_shape):
    """``y[m] = v`` with ``m`` over the first dims of a non-square ``y`` (a number, and a row of the trailing dims)."""
    m = np.random.default_rng(1).random(mask_shape) > 0.5

    def write(lib, x, m):
        y = x * 1
        y[m] = 0.5
        z = x * 2
        z[m] = x[0, 0, :] if len(mask_shape) == 2 else 0.25
        return y + z

    got = _run(lambda x, m: write(gc, x, m), x=X, m=m)
    np.testing.assert_allclose(got, write(torch, torch.tensor(X), torch.tensor(m)), rtol=1e-6, atol=1e-6)
