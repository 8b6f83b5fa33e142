"""``gc.nn.Module``'s methods a torch model or training script calls behave as ``torch.nn.Module``'s: the same
names, keys, order, results and errors on the same module tree, and hooks whose ops are in the graph (float64,
values within 1e-12 of torch on the numpy backend and ort-cpu)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")


def _tree(nn):
    """One module tree in ``torch.nn`` or ``gc.nn``: a Linear shared under a second name (``tied``), a
    persistent and a non-persistent buffer, BatchNorm's buffers in a Sequential."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.register_buffer("scale", torch.ones(3))
            self.register_buffer("cache", torch.zeros(3), persistent=False)

        def forward(self, x):
            return self.fc(x) * self.scale + self.cache

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Block()
            self.b = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
            self.tied = self.a.fc
            self.head = nn.Linear(4, 2)

        def forward(self, x):
            return self.head(self.b(self.a(x) + self.tied(x)))

    return Net()


def _pair():
    """The tree in torch and in graphc, float64, in eval mode, graphc's holding torch's weights."""
    theirs, ours = _tree(torch.nn).double().eval(), _tree(gc.nn).double()
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    return theirs, ours


def _run(module, x):
    """``module``'s output for ``x`` on each backend (graphc), or torch's."""
    if isinstance(module, torch.nn.Module):
        return module(torch.tensor(x)).detach().numpy()
    model = gc.capture(module, x=x)
    return [gc.Session(model, backend=b).run({"x": x})["output"] for b in BACKENDS]


def _assert_runs_alike(theirs, ours, x):
    want = _run(theirs, x)
    for backend, got in zip(BACKENDS, _run(ours, x)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=backend)


def _names(pairs):
    return [name for name, _ in pairs]


TRAVERSALS = {
    "named_modules": lambda m: _names(m.named_modules()),
    "named_modules(prefix)": lambda m: _names(m.named_modules(prefix="net")),
    "named_modules(remove_duplicate=False)": lambda m: _names(m.named_modules(remove_duplicate=False)),
    "named_modules(memo)": lambda m: _names(m.named_modules(memo={m.a})),
    "modules(remove_duplicate=False)": lambda m: len(list(m.modules(remove_duplicate=False))),
    "named_children": lambda m: _names(m.named_children()),
    "named_children(shared)": lambda m: _names(m.b.__class__(m.head, m.head).named_children()),
    "children": lambda m: [type(c).__name__ for c in m.children()],
    "named_parameters(remove_duplicate=False)": lambda m: _names(m.named_parameters(remove_duplicate=False)),
    "named_buffers": lambda m: _names(m.named_buffers()),
    "named_buffers(prefix, recurse)": lambda m: _names(m.a.named_buffers(prefix="p", recurse=False)),
    "named_buffers(remove_duplicate=False)": lambda m: _names(m.named_buffers(remove_duplicate=False)),
    "buffers(recurse=False)": lambda m: len(list(m.b[1].buffers(recurse=False))),
    "state_dict": lambda m: list(m.state_dict()),
    "state_dict(prefix)": lambda m: list(m.state_dict(prefix="model.")),
    "state_dict(destination)": lambda m: list(m.a.state_dict(destination={"first": 0}, prefix="a.")),
}


@pytest.mark.parametrize("name", sorted(TRAVERSALS))
def test_traversal_gives_torchs_names_in_torchs_order(name):
    call = TRAVERSALS[name]
    assert call(_tree(gc.nn)) == call(_tree(torch.nn))


def test_state_dict_keep_vars_holds_the_parameters_and_buffers_themselves():
    ours = _tree(gc.nn)
    kept = ours.state_dict(keep_vars=True)
    assert list(kept) == list(_tree(torch.nn).state_dict(keep_vars=True))
    assert all(v is ours.get_parameter(k) for k, v in kept.items() if not v.buffer)
    assert all(v is ours.get_buffer(k) for k, v in kept.items() if v.buffer)


def test_a_module_shared_under_two_names_is_saved_and_loaded_under_both():
    theirs, ours = _pair()
    assert {"tied.weight", "tied.bias"} <= set(ours.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()}, strict=True)
    _assert_runs_alike(theirs, ours, RNG.standard_normal((5, 3)))


def _error(call, module):
    with pytest.raises(Exception) as info:
        call(module)
    return type(info.value).__name__, str(info.value)


LOOKUPS = {
    "get_submodule": lambda m: m.get_submodule("a.fc") is m.a.fc and m.get_submodule("") is m,
    "get_parameter": lambda m: m.get_parameter("b.0.weight") is m.b[0].weight,
    "get_buffer": lambda m: m.get_buffer("b.1.running_mean") is m.b[1].running_mean,
}
LOOKUP_ERRORS = {
    "get_submodule(missing)": lambda m: m.get_submodule("a.nope.fc"),
    "get_submodule(a buffer)": lambda m: m.get_submodule("a.scale"),
    "get_parameter(missing)": lambda m: m.get_parameter("head.nope"),
    "get_parameter(a buffer)": lambda m: m.get_parameter("a.scale"),
    "get_buffer(a parameter)": lambda m: m.get_buffer("a.fc.weight"),
    "set_submodule(strict, missing)": lambda m: m.set_submodule("b.extra", m.head, strict=True),
    "set_submodule(onto a parameter)": lambda m: m.set_submodule("head.weight", m.head),
    "set_submodule(empty target)": lambda m: m.set_submodule("", m.head),
    "set_submodule(not a module)": lambda m: m.set_submodule("head", 3),
}


@pytest.mark.parametrize("name", sorted(LOOKUPS))
def test_lookup_by_dotted_path_finds_what_torchs_does(name):
    assert LOOKUPS[name](_tree(gc.nn)) is True and LOOKUPS[name](_tree(torch.nn)) is True


@pytest.mark.parametrize("name", sorted(LOOKUP_ERRORS))
def test_lookup_by_dotted_path_fails_with_torchs_error(name):
    ours, theirs = _error(LOOKUP_ERRORS[name], _tree(gc.nn)), _error(LOOKUP_ERRORS[name], _tree(torch.nn))
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]


def test_set_submodule_replaces_and_adds_as_torchs():
    theirs, ours = _pair()
    for module, nn in ((theirs, torch.nn), (ours, gc.nn)):
        module.set_submodule("b.1", nn.Identity())
        module.set_submodule("a.extra", nn.Linear(2, 2).double())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    _assert_runs_alike(theirs, ours, RNG.standard_normal((5, 3)))


def test_load_state_dict_not_strict_returns_torchs_missing_and_unexpected_keys():
    theirs, ours = _pair()
    state = {k: v for k, v in theirs.state_dict().items() if k != "b.1.running_var"}
    state["head.extra"] = torch.zeros(2)
    want = theirs.load_state_dict(state, strict=False)
    got = ours.load_state_dict({k: v.numpy() for k, v in state.items()}, strict=False)
    assert (got.missing_keys, got.unexpected_keys) == (want.missing_keys, want.unexpected_keys)
    assert got.missing_keys == ["b.1.running_var"] and got.unexpected_keys == ["head.extra"]


def test_load_state_dict_assign_takes_the_states_dtype_as_torchs():
    theirs, ours = _tree(torch.nn), _tree(gc.nn)
    state = {k: v.double() if v.is_floating_point() else v for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(state, assign=True)
    ours.load_state_dict({k: v.numpy() for k, v in state.items()}, assign=True)
    assert [str(p.dtype) for p in ours.state_dict().values()] == [
        str(t.dtype).removeprefix("torch.") for t in theirs.state_dict().values()]


def test_requires_grad_freezes_as_torchs_and_a_frozen_parameter_gets_no_gradient():
    theirs, ours = _pair()
    assert ours.requires_grad_(False) is ours and theirs.requires_grad_(False) is theirs
    ours.head.requires_grad_()
    theirs.head.requires_grad_()
    assert [p.requires_grad for p in ours.parameters()] == [p.requires_grad for p in theirs.parameters()]
    x = RNG.standard_normal((5, 3))
    theirs(torch.tensor(x)).sum().backward()

    class Loss(gc.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            return {"loss": self.net(x).sum()}

    model = gc.grad(gc.capture(Loss(ours), x=x), "loss")
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run({"x": x})
        for name, p in theirs.named_parameters():
            if p.requires_grad:
                np.testing.assert_allclose(got[f"net.{name}_grad"], p.grad.numpy(), rtol=1e-12, atol=1e-12)
            else:
                assert p.grad is None and not np.any(got.get(f"net.{name}_grad", 0.0)), (backend, name)


def _tied(nn):
    """An embedding frozen and tied to the head, read by the lookup and at each of 4 steps."""

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.emb.weight.requires_grad_(False)
            self.proj = nn.Linear(4, 4)

        def forward(self, idx):
            h = self.emb(idx)
            for _ in range(4):
                h = self.proj(h).tanh() + (h @ self.emb.weight.T).softmax(-1) @ self.emb.weight
            return {"loss": (h @ self.emb.weight.T).sum()}
    return Tied()


def test_a_frozen_parameter_read_many_times_is_detached_once_per_graph():
    theirs = _tied(torch.nn).double()
    ours = _tied(gc.nn).double()
    ours.load_state_dict({k: v.numpy() for k, v in theirs.state_dict().items()})
    idx = RNG.integers(0, 10, (3, 5))
    theirs(torch.tensor(idx))["loss"].backward()
    captured = gc.capture(ours, idx=idx)
    assert [n.op_type for n in captured.proto.graph.node].count("Identity") == 1  # 10 reads, one gc.detach
    model = gc.grad(captured, "loss")
    for backend in BACKENDS:
        got = gc.Session(model, backend=backend).run({"idx": idx})
        np.testing.assert_allclose(got["loss"], theirs(torch.tensor(idx))["loss"].item(), rtol=1e-12)
        for name, p in theirs.named_parameters():
            if p.requires_grad:
                np.testing.assert_allclose(got[f"{name}_grad"], p.grad.numpy(), rtol=1e-12, atol=1e-12)
        assert not np.any(got.get("emb.weight_grad", 0.0)), backend


def test_assigning_onto_a_buffer_updates_it_in_place_keeping_its_persistence():
    theirs, ours = _pair()
    scale = RNG.standard_normal(3)
    for module, value in ((theirs, torch.tensor(scale)), (ours, scale)):
        module.a.scale = value
        module.a.cache = value * 0 + 0.5
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours.get_buffer("a.scale").dtype == "float64" and "a.cache" not in ours.state_dict()
    _assert_runs_alike(theirs, ours, RNG.standard_normal((5, 3)))


def test_a_buffer_may_take_a_new_shape_as_torchs():
    theirs, ours = _tree(torch.nn), _tree(gc.nn)
    theirs.a.scale, ours.a.scale = torch.ones(5), np.ones(5, np.float32)
    assert ours.state_dict()["a.scale"].shape == tuple(theirs.state_dict()["a.scale"].shape) == (5,)


ASSIGN_ERRORS = {
    "an int onto a buffer": (lambda m: setattr(m.a, "scale", 3), "cannot assign 'int' as buffer 'scale'"),
    "an array onto a parameter": (lambda m: setattr(m.head, "weight", torch.zeros(2, 4)),
                                  "as parameter 'weight'"),
    "an int onto a child module": (lambda m: setattr(m, "head", 3), "cannot assign 'int' as child module 'head'"),
    "a module onto a parameter": (lambda m: setattr(m.head, "weight", type(m.head)(4, 2)), "as parameter 'weight'"),
    "an array onto a parameter set to None": (lambda m: (setattr(m.head, "bias", None),
                                                         setattr(m.head, "bias", torch.zeros(2))), "as parameter 'bias'"),
    "an int onto a buffer set to None": (lambda m: (setattr(m.a, "scale", None), setattr(m.a, "scale", 3)),
                                         "cannot assign 'int' as buffer 'scale'"),
    "an int onto a child module set to None": (lambda m: (setattr(m, "head", None), setattr(m, "head", 3)),
                                               "cannot assign 'int' as child module 'head'"),
}


@pytest.mark.parametrize("name", sorted(ASSIGN_ERRORS))
def test_assigning_the_wrong_kind_onto_a_registered_name_is_torchs_type_error(name):
    call, message = ASSIGN_ERRORS[name]
    kept = []
    for module in (_tree(torch.nn), _tree(gc.nn)):
        with pytest.raises(TypeError, match=message):
            call(module)
        kept.append((list(module.state_dict()), _names(module.named_modules())))
    assert kept[1] == kept[0]  # what the name held is kept (a Module onto a parameter replaced it)


EMPTIED = {"a.scale": 3, "a.cache": 3, "b.1.running_mean": 4}  # a buffer and its size


@pytest.mark.parametrize("name", sorted(EMPTIED))
def test_a_buffer_set_to_none_keeps_its_slot_place_and_persistence_as_torchs(name):
    """``self.buf = None`` unregistered the buffer: a tensor assigned later was a plain attribute."""
    path, _, attr = name.rpartition(".")
    value = RNG.standard_normal(EMPTIED[name])

    def empty_then_fill(module, value):
        owner = module.get_submodule(path)
        setattr(owner, attr, None)
        empty = getattr(owner, attr), list(module.state_dict()), _names(module.named_buffers())
        setattr(owner, attr, value)
        return empty, list(module.state_dict()), _names(module.named_buffers())

    theirs, ours = _pair()
    assert empty_then_fill(ours, value) == empty_then_fill(theirs, torch.tensor(value))
    assert ours.get_buffer(name).dtype == "float64"  # the buffer's dtype, as torch's tensor keeps it
    _assert_runs_alike(theirs, ours, RNG.standard_normal((5, 3)))


def test_registering_none_keeps_a_slot_of_that_kind_as_torchs():
    def register(nn, tensor):
        module = nn.Linear(2, 2)
        module.register_buffer("extra", None, persistent=False)
        module.register_parameter("scale", None)
        module.add_module("sub", None)
        empty = [getattr(module, n) for n in ("extra", "scale", "sub")], list(module.state_dict())
        module.extra = tensor(np.ones(2))
        errors = []
        for attr, value in (("scale", tensor(np.ones(2))), ("sub", 3)):
            with pytest.raises(TypeError) as info:
                setattr(module, attr, value)
            errors.append(str(info.value).split(" as ")[1].split(" (")[0].replace(" of Linear", ""))  # the slot named
        return empty, list(module.state_dict()), _names(module.named_buffers()), errors

    assert register(gc.nn, np.asarray) == register(torch.nn, torch.tensor)


def test_a_parameter_or_module_assigned_again_keeps_its_place_as_torchs():
    """A registered name assigned again moved to the end: state_dict()'s and named_modules()' order was not torch's."""
    def assign_again(module, nn, tensor):
        module.a = type(module.a)()
        module.head.weight = nn.Parameter(tensor(np.zeros((2, 4))))
        return list(module.state_dict()), _names(module.named_modules())

    assert assign_again(_tree(gc.nn), gc.nn, np.asarray) == assign_again(_tree(torch.nn), torch.nn, torch.tensor)


@pytest.mark.parametrize("name", ["a.scale", "a.fc", "head.bias", "a.cache"])
def test_deleting_a_parameter_buffer_or_module_unregisters_it_as_torchs(name):
    def drop(module):
        path, _, attr = name.rpartition(".")
        delattr(module.get_submodule(path), attr)
        return list(module.state_dict()), _names(module.named_modules()), _names(module.named_buffers())
    assert drop(_tree(gc.nn)) == drop(_tree(torch.nn))


def test_train_and_eval_return_self_call_each_childs_train_and_refuse_a_non_bool():
    class Frozen(gc.nn.Module):
        calls: list = []

        def train(self, mode=True):
            Frozen.calls.append(mode)
            return super().train(False)

    ours = _tree(gc.nn)
    ours.b.append(Frozen())
    assert ours.train() is ours and ours.eval() is ours and Frozen.calls == [True, False]
    ours.train()
    assert [m.training for m in ours.modules()] == [not isinstance(m, Frozen) for m in ours.modules()]
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        ours.train("yes")
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        _tree(torch.nn).train("yes")


def test_zero_grad_cpu_and_cuda_change_nothing():
    ours = _tree(gc.nn)
    before = {k: v.copy() for k, v in ours.state_dict().items()}
    assert ours.zero_grad() is None and ours.cpu() is ours and ours.cuda() is ours and ours.cuda(0) is ours
    assert all(np.array_equal(v, before[k]) for k, v in ours.state_dict().items())


def _hook_all(module, log):
    """Pre-hooks and hooks of every form on ``module``'s tree (two taken off again), each logging its call."""
    def tagged(tag, fn):
        def hook(*args):
            log.append(tag)
            return fn(*args)
        return hook
    module.b.register_forward_pre_hook(tagged("b pre", lambda mod, args: args[0] * 2))
    module.head.register_forward_pre_hook(tagged("head pre kw", lambda mod, args, kwargs: ((args[0] + 1,), kwargs)),
                                          with_kwargs=True)
    module.head.register_forward_pre_hook(tagged("head pre first", lambda mod, args: None), prepend=True)
    module.a.register_forward_hook(tagged("a post", lambda mod, args, out: out - args[0]))
    module.head.register_forward_hook(tagged("head post kw", lambda mod, args, kwargs, out: out * 3),
                                      with_kwargs=True)
    module.head.register_forward_hook(tagged("head post first", lambda mod, args, out: None), prepend=True)
    module.tied.register_forward_hook(tagged("removed", lambda mod, args, out: out * 100)).remove()
    with module.register_forward_hook(tagged("left with", lambda mod, args, out: out * 100)):
        pass


def test_forward_hooks_and_pre_hooks_run_at_capture_in_torchs_order_and_their_ops_are_in_the_graph():
    theirs, ours = _pair()
    log_theirs, log_ours = [], []
    _hook_all(theirs, log_theirs)
    _hook_all(ours, log_ours)
    x = RNG.standard_normal((5, 3))
    want = theirs(torch.tensor(x)).detach().numpy()
    model = gc.capture(ours, x=x)
    assert log_ours == log_theirs == ["a post", "b pre", "head pre first", "head pre kw", "head post first",
                                      "head post kw"]
    for backend in BACKENDS:
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"x": x})["output"], want,
                                   rtol=1e-12, atol=1e-12, err_msg=backend)


def test_an_always_call_hook_runs_when_forward_raises_and_the_error_stands():
    def failing(nn):
        class Failing(nn.Module):
            def forward(self, x):
                raise RuntimeError("boom")
        return Failing()

    for module, raises in ((failing(torch.nn), RuntimeError), (failing(gc.nn), gc.CaptureError)):
        log = []
        module.register_forward_hook(lambda mod, args, out: log.append(("always", out)), always_call=True)
        module.register_forward_hook(lambda mod, args, out: log.append("not always"))
        with pytest.raises(raises, match="boom"):
            module(torch.zeros(2)) if raises is RuntimeError else gc.capture(module, x=np.zeros(2))
        assert log == [("always", None)]


def test_a_pre_hook_returning_the_wrong_form_with_kwargs_is_torchs_error():
    for module, x in ((_tree(torch.nn), torch.zeros(2, 3)), (_tree(gc.nn), None)):
        module.register_forward_pre_hook(lambda mod, args, kwargs: args, with_kwargs=True)
        with pytest.raises(Exception, match="forward pre-hook must return None or a tuple of"):
            module(x) if x is not None else gc.capture(module, x=np.zeros((2, 3), np.float32))


def test_the_deprecated_backward_hook_is_refused_naming_the_full_one():
    """torch's register_backward_hook gives the last op's input gradients; the full hooks are in test_backward_hooks."""
    with pytest.raises(NotImplementedError, match=r"register_backward_hook: torch deprecated it.*a Linear's: bias, "
                                                  r"input, weight.*use register_full_backward_hook"):
        _tree(gc.nn).register_backward_hook(lambda *args: None)


def test_repr_shows_a_child_set_to_none_in_its_place_as_torchs():
    """``(sub): None`` where a child was set to None (or added as None), in its place: graphc left the line out."""
    def shown(nn):
        module = _tree(nn)
        module.b = None
        module.add_module("late", None)
        module.a.fc = None
        return repr(module)

    assert shown(gc.nn) == shown(torch.nn)
    assert "(b): None" in shown(gc.nn)


@pytest.mark.parametrize("name", ["head", "tied", "training", "forward", "plain", "a"])
@pytest.mark.parametrize("method", ["register_buffer", "register_parameter", "add_module"])
def test_registering_a_name_that_holds_something_else_is_torchs_key_error(method, name):
    """A parameter, buffer or module registered onto a name holding another kind (a child module, a plain or class
    attribute, a method) is torch's ``KeyError: "attribute 'x' already exists"``, what it held kept (graphc replaced
    it silently); onto its own kind, or its slot, it replaces it. Bad names are torch's errors too."""
    def register(nn, tensor):
        module = _tree(nn)
        module.plain = 3
        module.a.register_parameter("w", nn.Parameter(tensor(np.ones(2))))
        value = {"register_buffer": tensor(np.ones(2)), "register_parameter": nn.Parameter(tensor(np.ones(2))),
                 "add_module": nn.ReLU()}[method]
        target = module.a if name == "a" else module
        try:
            getattr(target, method)("w" if name == "a" else name, value)
            outcome = "registered"
        except (KeyError, TypeError) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        return outcome, list(module.state_dict()), _names(module.named_modules()), module.plain

    assert register(gc.nn, np.asarray) == register(torch.nn, torch.tensor)


@pytest.mark.parametrize("method", ["register_buffer", "register_parameter", "add_module"])
@pytest.mark.parametrize("name", ["a.b", "", 3])
def test_registering_a_bad_name_is_torchs_error(method, name):
    def register(nn):
        try:
            getattr(nn.Module(), method)(name, None)
        except (KeyError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "registered"

    assert register(gc.nn) == register(torch.nn)


@pytest.mark.parametrize("method, value", [("register_parameter", "array"), ("register_buffer", 3),
                                           ("add_module", 3)])
def test_registering_the_wrong_kind_of_value_is_torchs_type_error(method, value):
    """A plain array as a parameter was registered as a plain attribute, silently; an int as a buffer failed inside
    Parameter; as torch, each is a TypeError naming the name (graphc's own types in its message)."""
    for nn, tensor in ((gc.nn, np.asarray), (torch.nn, torch.tensor)):
        with pytest.raises(TypeError, match="'x'|Module subclass"):
            getattr(nn.Module(), method)("x", tensor(np.ones(2)) if value == "array" else value)
