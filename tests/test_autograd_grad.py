"""``gc.autograd.grad`` inside model code against torch 2.13's ``autograd.grad`` (float64, numpy backend and
ort-cpu): a WGAN-GP critic's gradient penalty (loss, parameter gradients, Trainer steps), a physics-informed
residual with a second derivative, the forces of an energy net; torch's arguments (grad_outputs, several
outputs and inputs, a dict of inputs, allow_unused, materialize_grads, is_grads_batched, create_graph) and
its errors, which name the output or input."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from tests.dsl_util import check

torch = pytest.importorskip("torch")

BACKENDS = ["numpy", "ort-cpu"]
RNG = np.random.default_rng(0)


def _run(model: gc.Model, feeds: dict) -> dict[str, dict]:
    return {b: gc.Session(model, backend=b).run(feeds) for b in BACKENDS}


def _torch_params(module: torch.nn.Module, model: gc.Model, prefix: str = "net.") -> torch.nn.Module:
    module.load_state_dict({k.removeprefix(prefix): torch.tensor(v) for k, v in model.params.items()})
    return module


def _assert_grads(model: gc.Model, feeds: dict, tmodule: torch.nn.Module, tloss, prefix: str = "net.") -> None:
    """``gc.grad`` of the model's loss on both backends equals torch's loss and parameter gradients."""
    tloss.backward()
    want = {prefix + k: p.grad.numpy() for k, p in tmodule.named_parameters()}
    assert sorted(want) == sorted(model.params)
    for backend, out in _run(gc.grad(model, "loss"), feeds).items():
        np.testing.assert_allclose(out["loss"], tloss.item(), rtol=1e-12, err_msg=backend)
        for name, w in want.items():
            np.testing.assert_allclose(out[f"{name}_grad"], w, rtol=1e-10, atol=1e-12, err_msg=f"{backend} {name}")


# -- WGAN-GP ---------------------------------------------------------------------------------------


def _critic(nn, act: str):
    a = {"leaky_relu": nn.LeakyReLU(0.2), "tanh": nn.Tanh(), "silu": nn.SiLU()}[act]
    return nn.Sequential(nn.Linear(3, 8), a, nn.Linear(8, 8), nn.LayerNorm(8), a, nn.Linear(8, 1))


def _wgan_loss(lib, critic, real, fake, eps, create_graph=True):
    x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
    g = lib.autograd.grad(critic(x_hat).sum(), x_hat, create_graph=create_graph)[0]
    gp = ((g.norm(2, dim=1) - 1) ** 2).mean()
    return critic(fake).mean() - critic(real).mean() + 10.0 * gp


class Critic(gc.nn.Module):
    def __init__(self, act: str, create_graph: bool = True):
        super().__init__()
        self.net, self.create_graph = _critic(gc.nn, act), create_graph

    def forward(self, real, fake, eps):
        return {"loss": _wgan_loss(gc, self.net, real, fake, eps, self.create_graph)}


def _wgan(act: str, create_graph: bool = True) -> gc.Model:
    specs = {"real": gc.spec("float64", ("N", 3)), "fake": gc.spec("float64", ("N", 3)),
             "eps": gc.spec("float64", ("N", 1))}
    return gc.capture(Critic(act, create_graph).double(), **specs)


def _wgan_feeds(n: int = 5) -> dict:
    return {"real": RNG.normal(size=(n, 3)), "fake": RNG.normal(size=(n, 3)), "eps": RNG.uniform(size=(n, 1))}


def _wgan_torch(act, model, feeds, create_graph=True):
    net = _torch_params(_critic(torch.nn, act).double(), model)
    args = (torch.tensor(feeds[k]) for k in ("real", "fake", "eps"))
    return net, _wgan_loss(torch, net, *args, create_graph=create_graph)


@pytest.mark.parametrize("act", ["leaky_relu", "tanh", "silu"])
def test_wgan_gp_critic_loss_and_param_grads_match_torch(act):
    model = _wgan(act)
    check(model)
    feeds = _wgan_feeds()
    _assert_grads(model, feeds, *_wgan_torch(act, model, feeds))


def test_without_create_graph_the_penalty_is_detached_as_torchs():
    """torch's gradient without create_graph has no history: the penalty adds to the loss, not to the
    parameter gradients."""
    model = _wgan("tanh", create_graph=False)
    feeds = _wgan_feeds()
    net, tloss = _wgan_torch("tanh", model, feeds, create_graph=False)
    _assert_grads(model, feeds, net, tloss)
    with_graph = gc.Session(gc.grad(_wgan("tanh"), "loss"), backend="numpy").run(feeds)
    without = gc.Session(gc.grad(model, "loss"), backend="numpy").run(feeds)
    assert not np.allclose(with_graph["net.0.weight_grad"], without["net.0.weight_grad"])


def _row_penalty(lib, net, real, fake, eps):
    """Each row's gradient norm plus a critic term: a per-row prediction, so micro-batches weigh by rows."""
    x_hat = (eps * real + (1 - eps) * fake).requires_grad_(True)
    g = lib.autograd.grad(net(x_hat).sum(), x_hat, create_graph=True)[0]
    return g.norm(2, dim=1) + net(fake)[:, 0] * 0.3


class RowPenalty(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _critic(gc.nn, "tanh")

    def forward(self, real, fake, eps):
        return {"gnorm": _row_penalty(gc, self.net, real, fake, eps)}


def test_penalty_with_accumulation_clipping_and_resume_matches_torch(tmp_path):
    """mse(gnorm, 1) (the WGAN-GP penalty) by AdamW with max_grad_norm over 2 micro-batches a step, as torch's
    loop; a checkpoint resumed on the other backend ends where the straight run does."""
    model = gc.capture(RowPenalty().double(), **{k: gc.spec("float64", ("N", d)) for k, d in
                                                 (("real", 3), ("fake", 3), ("eps", 1))})
    arts = gc.training.generate(model, gc.losses.mse("gnorm", label="one"),
                                gc.optim.AdamW(1e-2, weight_decay=0.1, max_grad_norm=0.05))
    batches = [{**_wgan_feeds(6), "one": np.ones(6)} for _ in range(3)]
    net = _torch_params(_critic(torch.nn, "tanh").double(), model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.1)
    for b in batches:
        opt.zero_grad()
        for rows in (slice(0, 3), slice(3, 6)):
            g = _row_penalty(torch, net, *(torch.tensor(b[k][rows]) for k in ("real", "fake", "eps")))
            (((g - 1) ** 2).mean() / 2).backward()
        assert torch.nn.utils.clip_grad_norm_(net.parameters(), 0.05) > 0.05  # clipped
        opt.step()
    for backend in BACKENDS:
        trainer = gc.Trainer(arts, backend=backend, accumulate=2)
        for b in batches:
            trainer.step(b)
        for name, p in net.named_parameters():
            np.testing.assert_allclose(trainer.params[f"net.{name}"], p.detach().numpy(), rtol=1e-12, atol=1e-15)
    stopped = gc.Trainer(arts, backend="numpy", accumulate=2)
    stopped.step(batches[0])
    stopped.save_checkpoint(tmp_path / "ck")
    resumed = gc.Trainer(tmp_path / "ck", backend="ort-cpu", accumulate=2)
    for b in batches[1:]:
        resumed.step(b)
    for name, value in trainer.state_dict().items():
        np.testing.assert_allclose(resumed.state_dict()[name], value, rtol=1e-12, atol=1e-15, err_msg=name)


def test_detached_penalty_after_optimize_levels():
    """Levels 0-2 keep the detached gradient's stop-gradient mark (the same parameter gradients); level 3 drops
    it, and differentiating that model is refused naming gc.autograd.grad's results among the marks."""
    model = _wgan("tanh", create_graph=False)
    feeds = _wgan_feeds()
    want = gc.Session(gc.grad(model, "loss"), backend="numpy").run(feeds)
    for level in (0, 1, 2):
        for backend, out in _run(gc.grad(gc.optimize(model, level=level), "loss"), feeds).items():
            for name, w in want.items():
                np.testing.assert_allclose(out[name], w, rtol=1e-12, atol=1e-14, err_msg=f"{level} {backend} {name}")
    with pytest.raises(gc.GraphError, match=r"dropped 1 stop-gradient mark \(.*gc\.autograd\.grad's and "
                                            r"gc\.autograd\.functional's results without create_graph=True"):
        gc.training.generate(gc.optimize(model, level=3), "loss", gc.optim.SGD(0.1))


def _exp_sin(base, lib):
    """exp with the gradient ``g * y * sin(x)``: a saved input and a saved output, both differentiable ops."""
    class ExpSin(base):
        @staticmethod
        def forward(ctx, x):
            y = lib.exp(x)
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            return g * y * lib.sin(x)

    return ExpSin


def _through_function(lib, fn, x, w, create_graph):
    h = lib.tanh(x * w)
    y = fn.apply(h).sum()
    (gh,) = lib.autograd.grad(y, [h], create_graph=create_graph, retain_graph=True)
    return (gh * gh).sum() + y


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_function_on_the_path_takes_its_backward_as_torch(create_graph):
    """create_graph=True differentiates the backward's own ops, and its saved output through the backward again."""
    fn = _exp_sin(gc.autograd.Function, gc)

    class Net(gc.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = gc.nn.Parameter(RNG.normal(size=(3,)))

        def forward(self, x):
            return {"loss": _through_function(gc, fn, x, self.w, create_graph)}

    model = gc.capture(Net().double(), x=gc.spec("float64", ("N", 3)))
    x = RNG.normal(size=(4, 3))
    w = torch.tensor(model.params["w"], requires_grad=True)
    loss = _through_function(torch, _exp_sin(torch.autograd.Function, torch), torch.tensor(x), w, create_graph)
    loss.backward()
    for backend, out in _run(gc.grad(model, "loss"), {"x": x}).items():
        np.testing.assert_allclose(out["loss"], loss.item(), rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(out["w_grad"], w.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_three_trainer_steps_with_the_penalty_match_torch_adam(backend):
    model = _wgan("leaky_relu")
    trainer = gc.Trainer(gc.training.generate(model, "loss", gc.optim.Adam(1e-2)), backend=backend)
    net = _torch_params(_critic(torch.nn, "leaky_relu").double(), model)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):
        feeds = _wgan_feeds(6)
        got = trainer.step(feeds)
        opt.zero_grad()
        loss = _wgan_loss(torch, net, *(torch.tensor(feeds[k]) for k in ("real", "fake", "eps")))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(got, loss.item(), rtol=1e-10)
    for name, p in net.named_parameters():
        np.testing.assert_allclose(trainer.params[f"net.{name}"], p.detach().numpy(), rtol=1e-9, atol=1e-12)


# -- a physics-informed residual: u'' by grad of grad ---------------------------------------------------


def _pinn(nn):
    return nn.Sequential(nn.Linear(1, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))


def _residual(lib, net, x):
    """u'' + pi^2 sin(pi x) (Poisson's equation in 1-D), u' and u'' by autograd.grad of the network."""
    x = x.requires_grad_(True)
    u = net(x)
    du = lib.autograd.grad(u, x, grad_outputs=lib.ones_like(u), create_graph=True)[0]
    d2u = lib.autograd.grad(du, x, grad_outputs=lib.ones_like(du), create_graph=True)[0]
    res = d2u + np.pi ** 2 * lib.sin(np.pi * x)
    return (res ** 2).mean() + (u[:1] ** 2).sum(), du, d2u


class Pinn(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _pinn(gc.nn)

    def forward(self, x):
        loss, du, d2u = _residual(gc, self.net, x)
        return {"loss": loss, "du": du, "d2u": d2u}


def test_pinn_residual_with_a_second_derivative_matches_torch_and_central_differences():
    model = gc.capture(Pinn().double(), x=gc.spec("float64", ("N", 1)))
    check(model)
    x = np.linspace(-1, 1, 7)[:, None]
    net = _torch_params(_pinn(torch.nn).double(), model)
    tloss, tdu, td2u = _residual(torch, net, torch.tensor(x))
    for backend, out in _run(model, {"x": x}).items():
        np.testing.assert_allclose(out["du"], tdu.detach().numpy(), rtol=1e-12, err_msg=backend)
        np.testing.assert_allclose(out["d2u"], td2u.detach().numpy(), rtol=1e-10, atol=1e-13, err_msg=backend)
    h = 1e-4  # u'' by central differences of the network's own u'
    session = gc.Session(model, backend="numpy")
    up, dn = session.run({"x": x + h})["du"], session.run({"x": x - h})["du"]
    np.testing.assert_allclose(session.run({"x": x})["d2u"], (up - dn) / (2 * h), rtol=1e-6, atol=1e-8)
    _assert_grads(model, {"x": x}, net, tloss)


# -- an energy net: forces = -dE/dpositions ------------------------------------------------------------


def _energy(nn):
    return nn.Sequential(nn.Linear(3, 12), nn.Softplus(), nn.Linear(12, 12), nn.SiLU(), nn.Linear(12, 1))


def _force_loss(lib, net, pos, target_e, target_f):
    """Energy of each atom summed per structure ([B, A, 3] positions), forces -dE/dpos, and the usual
    energy + force matching loss."""
    pos = pos.requires_grad_(True)
    energy = net(pos).sum(dim=(1, 2))
    forces = -lib.autograd.grad(energy, pos, grad_outputs=lib.ones_like(energy), create_graph=True)[0]
    return ((energy - target_e) ** 2).mean() + ((forces - target_f) ** 2).mean(), forces


class EnergyNet(gc.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = _energy(gc.nn)

    def forward(self, pos, target_e, target_f):
        loss, forces = _force_loss(gc, self.net, pos, target_e, target_f)
        return {"loss": loss, "forces": forces}


def test_forces_of_an_energy_net_and_the_force_matching_gradients_match_torch():
    specs = {"pos": gc.spec("float64", ("B", 4, 3)), "target_e": gc.spec("float64", ("B",)),
             "target_f": gc.spec("float64", ("B", 4, 3))}
    model = gc.capture(EnergyNet().double(), **specs)
    check(model)
    feeds = {"pos": RNG.normal(size=(2, 4, 3)), "target_e": RNG.normal(size=2), "target_f": RNG.normal(size=(2, 4, 3))}
    net = _torch_params(_energy(torch.nn).double(), model)
    tloss, tforces = _force_loss(torch, net, *(torch.tensor(feeds[k]) for k in ("pos", "target_e", "target_f")))
    for backend, out in _run(model, feeds).items():
        np.testing.assert_allclose(out["forces"], tforces.detach().numpy(), rtol=1e-11, atol=1e-14, err_msg=backend)
    _assert_grads(model, feeds, net, tloss)


# -- torch's arguments ---------------------------------------------------------------------------------


def _both(fn, feeds: dict, rtol: float = 1e-12) -> None:
    """``fn(lib, **tensors)`` (a tuple of Tensors or None) captured and run on both backends equals torch's."""
    def gc_fn(**kw):
        return {f"o{i}": t for i, t in enumerate(fn(gc, **kw)) if t is not None}

    model = gc.capture(gc_fn, **{k: gc.spec("float64", v.shape) for k, v in feeds.items()})
    check(model)
    want = fn(torch, **{k: torch.tensor(v, requires_grad=True) for k, v in feeds.items()})
    assert sorted(o.name for o in model.outputs) == sorted(f"o{i}" for i, t in enumerate(want) if t is not None)
    for backend, out in _run(model, feeds).items():
        for i, w in enumerate(want):
            if w is not None:
                np.testing.assert_allclose(out[f"o{i}"], w.detach().numpy(), rtol=rtol, atol=1e-13,
                                           err_msg=f"{backend} o{i}")


def _two_outputs(lib, x, w, v):
    y, z = lib.tanh(x @ w), (x ** 3).sum()
    return lib.autograd.grad([y, z], [x, w], grad_outputs=[v, None])


def _unused(lib, x, w, v):
    return lib.autograd.grad((x * 2).sum(), [x, w], allow_unused=True) + \
        lib.autograd.grad((x * 2).sum(), [w, x], materialize_grads=True)


def _dict_inputs(lib, x, w, v):
    g = lib.autograd.grad((lib.sin(x @ w) * v).sum(), {"w": w, "x": x})
    return g["w"], g["x"]


def _batched(lib, x, w, v):
    y = lib.tanh(x @ w)  # [2, 4]: its whole Jacobian by x, one row per cotangent of the batch
    basis = lib.eye(8, dtype=lib.float64).reshape(8, 2, 4)
    return lib.autograd.grad(y, x, grad_outputs=basis, is_grads_batched=True)


def _intermediate(lib, x, w, v):
    h = lib.tanh(x @ w)  # by a value computed in the model, and by an input and a value past it
    out = (h * h * v).sum() + (x ** 2).sum()
    return lib.autograd.grad(out, [h, x], create_graph=True)


def _second_order(lib, x, w, v):
    y = (lib.exp(x) * x).sum()
    (g,) = lib.autograd.grad(y, x, create_graph=True)
    (h,) = lib.autograd.grad((g * g).sum(), x, create_graph=True)
    return g, h, lib.autograd.grad(h.sum(), w, allow_unused=True)[0]


def _through_max_pool(lib, x, w, v):
    h = lib.nn.functional.max_pool1d((x @ w)[:, None], 2)[:, 0]  # MaxPool's rule adds its Indices output
    (g,) = lib.autograd.grad((h ** 3).sum(), x, create_graph=True)
    return g, lib.autograd.grad((g ** 2).sum(), w)[0]


@pytest.mark.parametrize("fn", [_two_outputs, _unused, _dict_inputs, _batched, _intermediate, _second_order,
                                _through_max_pool])
def test_arguments_match_torchs(fn):
    _both(fn, {"x": RNG.normal(size=(2, 3)), "w": RNG.normal(size=(3, 4)), "v": RNG.normal(size=(2, 4))})


def _lstm_grads(lib, lstm, x):
    """An LSTM's input gradient and a gradient of it (second order), its output held past the call."""
    y = lstm(x)[0]
    (g,) = lib.autograd.grad((y ** 2).sum(), x, create_graph=True)
    return g, lib.autograd.grad((g ** 2).sum() + (y ** 3).sum(), x)[0], y * 2


@pytest.mark.parametrize("steps", [3, 6])  # unrolled (at most 4 steps) and a Scan
def test_through_an_lstm_of_any_length_matches_torch(steps):
    """Was an AutodiffError past 4 steps (the Scan's body untyped: "needs the rank of ..."), and at any
    length a model whose restored LSTM node read no inputs (ort-cpu and the checker refused it)."""
    lstm = gc.nn.LSTM(3, 4, batch_first=True, dtype="float64").init_parameters(1)
    tlstm = torch.nn.LSTM(3, 4, batch_first=True).double()
    tlstm.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in lstm.state_dict().items()})
    model = gc.capture(lambda x: dict(zip("ghy", _lstm_grads(gc, lstm, x))), x=gc.spec("float64", (2, steps, 3)))
    check(model)
    x = RNG.normal(size=(2, steps, 3))
    want = _lstm_grads(torch, tlstm, torch.tensor(x, requires_grad=True))
    for backend, out in _run(model, {"x": x}).items():
        for name, w in zip("ghy", want):
            np.testing.assert_allclose(out[name], w.detach().numpy(), rtol=1e-11, atol=1e-14, err_msg=backend)


# -- errors ------------------------------------------------------------------------------------------


def _by_integer(lib, x, k):
    return lib.autograd.grad((x * k[0, :3].double()).sum(), [x, k])


ERRORS = [  # id, fn(lib, x, w), message (torch raises too)
    ("unused_input", lambda L, x, w: L.autograd.grad((x * 2).sum(), [x, w]),
     r"Tensor at index 1 \(float64\[3,4\], 'w'\) appears to not have been used in the graph.*allow_unused=True"),
    ("non_scalar_output", lambda L, x, w: L.autograd.grad(x * 2, x),
     r"implicitly created only for scalar outputs: output 0 is float64\[2,3\]; pass grad_outputs"),
    ("materialize_not_unused", lambda L, x, w: L.autograd.grad(x.sum(), x, materialize_grads=True, allow_unused=False),
     r"Expected allow_unused to be True or not passed when materialize_grads=True"),
    ("cotangent_shape", lambda L, x, w: L.autograd.grad(x * 2, x, L.ones(3, dtype=L.float64)),
     r"Mismatch in shape: grad_output\[0\] has a shape of \[3\] and output\[0\] has a shape of \[2, 3\]"),
    ("cotangent_count", lambda L, x, w: L.autograd.grad([x.sum(), w * 3], x, [None]),
     r"got 2 tensors and 1 gradients"),
    ("empty_inputs", lambda L, x, w: L.autograd.grad(x.sum(), []), r"`inputs` argument to `grad\(\)` cannot be empty"),
    ("integer_output", lambda L, x, w: L.autograd.grad(x.sum().long(), x),
     r"output 0 \(int64\[\], '\w+'\) is not floating-point; only floating-point Tensors have gradients"),
    ("integer_input", lambda L, x, w: _by_integer(L, x, w.long()),
     r"input 1 \(int64\[3,4\], '\w+'\) is not floating-point"),
]


@pytest.mark.parametrize("fn, pattern", [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_errors_are_torchs_and_name_the_value(fn, pattern):
    x, w = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 4))
    with pytest.raises((RuntimeError, ValueError)):
        fn(torch, torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True))
    with pytest.raises(gc.CaptureError, match=pattern) as info:
        gc.capture(lambda x, w: fn(gc, x, w)[0], x=gc.spec("float64", x.shape), w=gc.spec("float64", w.shape))
    assert "test_autograd_grad.py:" in str(info.value)


def test_an_output_computed_outside_a_body_is_refused_by_name():
    def f(x):
        y = (x ** 2).sum()
        return gc.vmap(lambda r: gc.autograd.grad(y, x)[0].sum() * r)(x)

    with pytest.raises(gc.CaptureError, match=r"output 0 \(float64\[\]\) was computed outside the body"):
        gc.capture(f, x=gc.spec("float64", (2, 3)))


# -- gc.autograd.functional ------------------------------------------------------------------------------


def _flat(tree) -> list:
    return [leaf for t in tree for leaf in _flat(t)] if isinstance(tree, tuple) else [tree]


def _f(lib, x, w):
    return lib.tanh(x @ w) * lib.sin(x).sum()


def _s(lib, x, w):
    return (lib.exp(x @ w) * w.sum(0)).sum() + (x ** 4).sum()


FUNCTIONAL = {  # name -> fn(lib, x, w, vx, vw, vo): a tree of Tensors
    "jacobian_tensor": lambda L, x, w, vx, vw, vo: L.autograd.functional.jacobian(lambda a: _f(L, a, w), x),
    "jacobian_tuple": lambda L, x, w, vx, vw, vo: L.autograd.functional.jacobian(lambda a, b: _f(L, a, b), (x, w)),
    "jacobian_two_outputs": lambda L, x, w, vx, vw, vo: L.autograd.functional.jacobian(
        lambda a, b: (_f(L, a, b), (a * b.sum()).sum()), (x, w), vectorize=True),
    "hessian_tensor": lambda L, x, w, vx, vw, vo: L.autograd.functional.hessian(lambda a: _s(L, a, w), x),
    "hessian_tuple": lambda L, x, w, vx, vw, vo: L.autograd.functional.hessian(lambda a, b: _s(L, a, b), (x, w)),
    "vjp": lambda L, x, w, vx, vw, vo: L.autograd.functional.vjp(lambda a, b: _f(L, a, b), (x, w), vo),
    "jvp": lambda L, x, w, vx, vw, vo: L.autograd.functional.jvp(lambda a: _f(L, a, w), x, vx),
    "hvp": lambda L, x, w, vx, vw, vo: L.autograd.functional.hvp(lambda a: _s(L, a, w), x, vx),
    "vhp": lambda L, x, w, vx, vw, vo: L.autograd.functional.vhp(lambda a, b: _s(L, a, b), (x, w), (vx, vw)),
}


@pytest.mark.parametrize("name", sorted(FUNCTIONAL))
def test_functional_matches_torch(name):
    feeds = {"x": RNG.normal(size=(2, 3)), "w": RNG.normal(size=(3, 4)), "vx": RNG.normal(size=(2, 3)),
             "vw": RNG.normal(size=(3, 4)), "vo": RNG.normal(size=(2, 4))}
    fn = FUNCTIONAL[name]
    model = gc.capture(lambda **kw: {f"o{i}": t for i, t in enumerate(_flat(fn(gc, **kw)))},
                       **{k: gc.spec("float64", v.shape) for k, v in feeds.items()})
    check(model)
    want = [t.numpy() for t in _flat(fn(torch, **{k: torch.tensor(v) for k, v in feeds.items()}))]
    for backend, out in _run(model, feeds).items():
        assert len(out) == len(want)
        for i, w in enumerate(want):
            assert out[f"o{i}"].shape == w.shape, (backend, i)
            np.testing.assert_allclose(out[f"o{i}"], w, rtol=1e-11, atol=1e-12, err_msg=f"{backend} o{i}")


def test_functional_strict_refuses_an_output_independent_of_an_input_as_torch():
    x, y = RNG.normal(size=3), RNG.normal(size=2)
    with pytest.raises(RuntimeError, match="independent of input 1"):
        torch.autograd.functional.vjp(lambda a, b: a * 2, (torch.tensor(x), torch.tensor(y)), torch.tensor(x),
                                      strict=True)
    with pytest.raises(gc.CaptureError, match=r"independent of input 1\. This is not allowed in strict mode"):
        gc.capture(lambda x, y: gc.autograd.functional.vjp(lambda a, b: a * 2, (x, y), x, strict=True)[1][0],
                   x=gc.spec("float64", (3,)), y=gc.spec("float64", (2,)))


def test_grad_mode_names_are_graphcs():
    assert gc.autograd.no_grad is gc.no_grad and gc.autograd.enable_grad is gc.enable_grad
    assert gc.autograd.set_grad_enabled is gc.set_grad_enabled and gc.autograd.inference_mode is gc.inference_mode
    assert gc.autograd.grad_mode.no_grad is gc.no_grad and gc.autograd.grad_mode.enable_grad is gc.enable_grad


def test_values_held_past_a_node_the_gradient_rewrites_stay_one_computation():
    """A float32 LayerNorm and a Dropout are given more outputs (statistics, the mask) for their gradients;
    the Tensors the model holds (used after the call) read those nodes: one draw, one normalisation."""
    ln = gc.nn.LayerNorm(4)

    def f(x):
        h = ln(x * 2)
        d = gc.nn.functional.dropout(h, 0.5, training=True)
        g = gc.autograd.grad((d ** 3).sum() + (h ** 3).sum(), x, create_graph=True)[0]
        return {"g": g, "h": h * 1.0, "d": d * 1.0}

    model = gc.capture(f, x=gc.spec("float32", (2, 4)))
    check(model)
    ops = [n.op_type for n in model.proto.graph.node]
    assert ops.count("Dropout") == 1 and ops.count("LayerNormalization") == 1
    x = RNG.normal(size=(2, 4)).astype(np.float32)
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    th = torch.nn.functional.layer_norm(t * 2, (4,), eps=1e-5)
    for backend, out in _run(model, {"x": x}).items():
        mask = torch.tensor(out["d"] != 0, dtype=torch.float64) * 2.0  # the draw this run made
        want = torch.autograd.grad(((th * mask) ** 3).sum() + (th ** 3).sum(), t, retain_graph=True)[0]
        np.testing.assert_allclose(out["h"], th.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=backend)
        np.testing.assert_allclose(out["g"], want.numpy(), rtol=1e-4, atol=1e-4, err_msg=backend)
