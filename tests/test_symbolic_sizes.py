"""A symbolic dim used as torch code uses an int: ``T = x.shape[1]`` then ``pos[:, :T]``, ``gc.arange(T)``,
``gc.zeros(T, D)``, ``gc.tril(gc.ones(T, T))``, ``x.view(B * T, C)``, ``T - 1``: sizes read at run time. A GPT
with learned positions and causal masks built from T, captured once, runs at T=5 and T=17 and trains as torch's."""

from __future__ import annotations

import math

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

RNG = np.random.default_rng(0)
BACKENDS = ("numpy", "ort-cpu")
VOCAB, BLOCK, D, HEADS = 11, 24, 8, 2


class _Attention(nn.Module):
    """nanoGPT's attention; ``mask`` picks how the causal mask is built from T."""

    def __init__(self, mask: str):
        super().__init__()
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.mask = mask
        self.register_buffer("bias", np.tril(np.ones((BLOCK, BLOCK))).reshape(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.shape  # noqa: N806 - nanoGPT's names
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.mask == "buffer":  # nanoGPT's registered buffer, sliced by T
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        elif self.mask == "tril":
            att = att.masked_fill(gc.tril(gc.ones(T, T)).view(1, 1, T, T) == 0, float("-inf"))
        else:  # an additive -inf mask above the diagonal
            att = att + gc.triu(gc.full((T, T), float("-inf"), dtype=x.dtype), diagonal=1)
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class _GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(BLOCK, D)
        self.pos = nn.Parameter(RNG.standard_normal((1, BLOCK, D)) * 0.1)
        self.blocks = nn.ModuleList([_Attention(kind) for kind in ("buffer", "tril", "triu")])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx, targets):
        B, T = idx.shape  # noqa: N806
        x = self.wte(idx) + self.wpe(gc.arange(0, T)) + self.pos[:, :T]
        for block in self.blocks:
            x = x + block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))
        return {"logits": logits, "loss": loss}


def _torch_gpt(torch, state: dict):
    tnn, tF = torch.nn, torch.nn.functional

    class Attention(tnn.Module):
        def __init__(self, mask):
            super().__init__()
            self.c_attn, self.c_proj, self.mask = tnn.Linear(D, 3 * D), tnn.Linear(D, D), mask
            self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

        def forward(self, x):
            B, T, C = x.size()  # noqa: N806
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.mask == "buffer":
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            elif self.mask == "tril":
                att = att.masked_fill(torch.tril(torch.ones(T, T)).view(1, 1, T, T) == 0, float("-inf"))
            else:
                att = att + torch.triu(torch.full((T, T), float("-inf"), dtype=x.dtype), diagonal=1)
            y = tF.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class GPT(tnn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = tnn.Embedding(VOCAB, D), tnn.Embedding(BLOCK, D)
            self.pos = tnn.Parameter(torch.zeros(1, BLOCK, D))
            self.blocks = tnn.ModuleList([Attention(kind) for kind in ("buffer", "tril", "triu")])
            self.ln_f, self.lm_head = tnn.LayerNorm(D), tnn.Linear(D, VOCAB, bias=False)

        def forward(self, idx, targets):
            B, T = idx.size()  # noqa: N806
            x = self.wte(idx) + self.wpe(torch.arange(0, T)) + self.pos[:, :T]
            for block in self.blocks:
                x = x + block(x)
            logits = self.lm_head(self.ln_f(x))
            return logits, tF.cross_entropy(logits.view(B * T, -1), targets.view(B * T))

    net = GPT().double()
    net.load_state_dict({k: torch.tensor(v) for k, v in state.items()})
    return net


def _batch(t: int) -> dict[str, np.ndarray]:
    return {"idx": RNG.integers(0, VOCAB, (3, t)), "targets": RNG.integers(0, VOCAB, (3, t))}


def _captured() -> tuple[_GPT, gc.Model]:
    net = _GPT().double()
    model = gc.capture(net, idx=gc.spec("int64", ("B", "T")), targets=gc.spec("int64", ("B", "T")), seed=1)
    return net, model


def test_gpt_with_a_symbolic_length_matches_torch_at_two_lengths():
    torch = pytest.importorskip("torch")
    net, model = _captured()
    assert {o.name: tuple(o.shape) for o in model.outputs}["logits"] == ("B", "T", VOCAB)  # T stays symbolic
    grads = gc.grad(model, "loss")
    tnet = _torch_gpt(torch, net.state_dict())
    for t in (5, 17):
        batch = _batch(t)
        logits, loss = tnet(*(torch.tensor(batch[k]) for k in ("idx", "targets")))
        tnet.zero_grad()
        loss.backward()
        for backend in BACKENDS:
            got = gc.Session(grads, backend=backend).run(batch)
            np.testing.assert_allclose(got["logits"], logits.detach().numpy(), rtol=1e-12, atol=1e-13,
                                       err_msg=f"{backend} T={t}")
            np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-12, err_msg=f"{backend} T={t}")
            for name, param in tnet.named_parameters():
                np.testing.assert_allclose(got[f"{name}_grad"], param.grad.numpy(), rtol=1e-9, atol=1e-12,
                                           err_msg=f"{backend} T={t} {name}")


def test_gpt_with_a_symbolic_length_trains_as_torch():
    """SGD steps alternating T=5 and T=17 on one train_step: the params after each equal torch's."""
    torch = pytest.importorskip("torch")
    net, model = _captured()
    arts = gc.training.generate(model, "loss", gc.optim.SGD(0.5))
    tnet = _torch_gpt(torch, net.state_dict())
    opt = torch.optim.SGD(tnet.parameters(), lr=0.5)
    trainers = {backend: gc.Trainer(arts, backend=backend) for backend in BACKENDS}
    for t in (5, 17, 5, 17):
        batch = _batch(t)
        opt.zero_grad()
        loss = tnet(*(torch.tensor(batch[k]) for k in ("idx", "targets")))[1]
        loss.backward()
        opt.step()
        for backend, trainer in trainers.items():
            assert trainer.step(batch) == pytest.approx(loss.item(), rel=1e-11), (backend, t)
            params = trainer.params
            for name, param in tnet.named_parameters():
                np.testing.assert_allclose(params[name], param.detach().numpy(), rtol=1e-10, atol=1e-12,
                                           err_msg=f"{backend} T={t} {name}")


def _run(fn, specs: dict, feeds_at, sizes=(3, 7)) -> gc.Model:
    """Capture ``fn`` once on ``specs``, run it on both backends at each size of ``sizes`` (``feeds_at(n)``
    gives feeds and the expected outputs) and return the model."""
    model = gc.capture(fn, **specs)
    for n in sizes:
        feeds, want = feeds_at(n)
        for backend in BACKENDS:
            got = gc.Session(model, backend=backend).run(feeds)
            for key, value in want.items():
                assert got[key].dtype == np.asarray(value).dtype, (key, backend, n)
                np.testing.assert_array_equal(got[key], value, err_msg=f"{key} {backend} n={n}")
    return model


def _shapes(model: gc.Model) -> dict[str, tuple]:
    return {o.name: o.shape and tuple(o.shape) for o in model.outputs}


def test_slice_bounds_of_dim_names_and_sizes_from_them():
    def fn(x, y):
        T = y.shape[0]  # noqa: N806
        return {"stop": x[:, :T], "from": x[T - 1:], "last": x[-T:, ::2], "both": x[1:T, T // 2:T + 1],
                "step": x[::T], "back": x[::(1 - T) // (T - 1)], "at": x[:, T:-1], "float": y[:T] * 2,
                "pick": x[T, T - 1]}

    def feeds_at(t):
        x, y = RNG.standard_normal((12, 10)), RNG.standard_normal(t)
        return {"x": x, "y": y}, {"stop": x[:, :t], "from": x[t - 1:], "last": x[-t:, ::2],
                                  "both": x[1:t, t // 2:t + 1], "step": x[::t], "back": x[::-1], "at": x[:, t:-1],
                                  "float": y[:t] * 2, "pick": x[t, t - 1]}

    model = _run(fn, {"x": gc.spec("float64", (12, 10)), "y": gc.spec("float64", ("T",))}, feeds_at)
    shapes = _shapes(model)
    assert shapes["stop"] == (12, "T") and shapes["float"] == ("T",)  # [:T] keeps the name
    assert shapes["from"][1] == 10 and shapes["last"][1] == 5 and shapes["both"][0] is None  # static axes stay


def test_factories_take_dim_names_and_sizes_from_them():
    def fn(x):
        B, T = x.shape  # noqa: N806
        return {"zeros": gc.zeros(T, 3), "ones": gc.ones(B * T), "full": gc.full((T, 2), 2.5),
                "empty": gc.empty(T, dtype=gc.int64), "new_zeros": x.new_zeros(T, 2), "new_ones": x.new_ones((T,)),
                "new_full": x.new_full((B, T), 7.0), "new_empty": x.new_empty(T - 1), "arange": gc.arange(T),
                "arange2": gc.arange(2, T), "arange_f": gc.arange(T, dtype=gc.float64),
                "arange_step": gc.arange(0, T, 2),
                "mask": gc.triu(gc.ones(T, T, dtype=gc.bool_), diagonal=1), "tril": gc.tril(gc.ones(T, T)),
                "rand": gc.rand(B * T, 2).shape[1] * gc.ones(1, dtype=gc.int64)}

    def feeds_at(t):
        x = RNG.standard_normal((2, t))
        return {"x": x}, {"zeros": np.zeros((t, 3), np.float32), "ones": np.ones(2 * t, np.float32),
                          "full": np.full((t, 2), 2.5, np.float32), "empty": np.zeros(t, np.int64),
                          "new_zeros": np.zeros((t, 2)), "new_ones": np.ones(t), "new_full": np.full((2, t), 7.0),
                          "new_empty": np.zeros(t - 1), "arange": np.arange(t), "arange2": np.arange(2, t),
                          "arange_f": np.arange(t, dtype=np.float64), "arange_step": np.arange(0, t, 2),
                          "mask": np.triu(np.ones((t, t), bool), 1), "tril": np.tril(np.ones((t, t), np.float32)),
                          "rand": np.array([2])}

    shapes = _shapes(_run(fn, {"x": gc.spec("float64", ("B", "T"))}, feeds_at))
    assert shapes["zeros"] == ("T", 3) and shapes["new_full"] == ("B", "T") and shapes["arange"] == ("T",)
    assert shapes["mask"] == ("T", "T") and shapes["ones"] == (None,)


def test_a_run_time_dim_read_is_one_shape_node_everywhere():
    """A dim name read for a factory's size (``gc.zeros(T, 3)``), as a 0-d int (``T - 1``) and as a slice bound
    emits one form, ``Shape(x, start=1, end=2)`` (squeezed where 0-d): no Slice or Gather of a whole Shape."""
    def fn(x):
        B, T = x.shape  # noqa: N806
        return {"zeros": gc.zeros(T, 3), "sub": T - 1, "head": x[:, :T - 1]}

    def feeds_at(t):
        x = RNG.standard_normal((2, t))
        return {"x": x}, {"zeros": np.zeros((t, 3), np.float32), "sub": np.int64(t - 1), "head": x[:, :t - 1]}

    nodes = _run(fn, {"x": gc.spec("float64", ("B", "T"))}, feeds_at).proto.graph.node
    shapes = [n for n in nodes if n.op_type == "Shape"]
    assert len(shapes) >= 2 and all({a.name: a.i for a in n.attribute} == {"start": 1, "end": 2} for n in shapes)
    read = {o for n in shapes for o in n.output}
    assert not [n.op_type for n in nodes if n.op_type in ("Slice", "Gather") and n.input[0] in read]


def test_view_and_reshape_take_dim_names_and_products():
    def fn(x, y):
        B, T, C = x.shape  # noqa: N806
        flat = x.view(B * T, C)
        return {"flat": flat, "back": flat.view(B, T, 2, -1), "other": y.reshape(T, -1),
                "heads": x.reshape(B, T, 2, C // 2).transpose(1, 2).reshape(B, 2, -1)}

    def feeds_at(t):
        x, y = RNG.standard_normal((2, t, 4)), RNG.standard_normal((t * 3,))
        return {"x": x, "y": y}, {"flat": x.reshape(2 * t, 4), "back": x.reshape(2, t, 2, 2), "other": y.reshape(t, 3),
                                  "heads": x.reshape(2, t, 2, 2).transpose(0, 2, 1, 3).reshape(2, 2, -1)}

    model = _run(fn, {"x": gc.spec("float64", ("B", "T", 4)), "y": gc.spec("float64", ("M",))}, feeds_at)
    shapes = _shapes(model)
    assert shapes["back"] == ("B", "T", 2, None) and shapes["other"] == ("T", None) and shapes["flat"] == (None, 4)
    read = {name for n in model.proto.graph.node for name in n.input} | {o.name for o in model.proto.graph.output}
    assert not [n.op_type for n in model.proto.graph.node if not read & set(n.output)]  # no Constant left unread


def test_a_view_of_a_run_time_product_is_ten_nodes():
    """``x.view(B * T, -1)``: two dim reads, their product, its Unsqueeze, the -1, a Concat and the Reshape (the
    shape made by ``ops.int64_vector``; a Constant for the product's place was made and left unread: 11)."""
    def fn(x):
        B, T, _ = x.shape  # noqa: N806
        return x.view(B * T, -1)

    def feeds_at(t):
        x = RNG.standard_normal((2, t, 4))
        return {"x": x}, {"output": x.reshape(2 * t, 4)}

    assert len(_run(fn, {"x": gc.spec("float64", ("B", "T", 4))}, feeds_at).proto.graph.node) == 10


def test_dim_name_arithmetic_is_a_run_time_int_as_torch_symint():
    seen = {}

    def fn(x):
        B, T = x.shape  # noqa: N806
        seen.update(name=T, text=f"{T}", concat=T + "_len", format="%s" % T)  # noqa: UP031 - str behaviour kept
        return {"sub": T - 1, "rsub": 10 - T, "mul": B * T, "rmul": 3 * T, "floordiv": T // 2, "rfloordiv": 20 // T,
                "mod": T % 3, "neg": -T, "add": T + B, "truediv": T / 2, "scaled": x * T, "rscaled": T * x}

    def feeds_at(t):
        x = RNG.standard_normal((2, t))
        i = np.int64
        return {"x": x}, {"sub": i(t - 1), "rsub": i(10 - t), "mul": i(2 * t), "rmul": i(3 * t), "floordiv": i(t // 2),
                          "rfloordiv": i(20 // t), "mod": i(t % 3), "neg": i(-t), "add": i(t + 2),
                          "truediv": np.float32(t / 2), "scaled": x * t, "rscaled": x * t}

    _run(fn, {"x": gc.spec("float64", ("B", "T"))}, feeds_at)
    assert seen == {"name": "T", "text": "T", "concat": "T_len", "format": "T"}
    assert all(type(v) is str for v in seen.values() if v is not seen["name"])
    import copy
    import pickle
    assert type(pickle.loads(pickle.dumps(seen["name"]))) is str and type(copy.deepcopy(seen["name"])) is str


@pytest.mark.parametrize("fn,match", [
    (lambda x: x[: x.sum()], r"the slice stop on axis 0: expected ints or dim names of the captured inputs "
                             r"\(\['N'\]\), got float64\[\]; a size computed from them \(B \* T\) is a 0-d integer"),
    (lambda x: x[: x.shape[0] * gc.ones(2, dtype=gc.int64)], r"slice stop on axis 0.*got int64\[2\]"),
    (lambda x: gc.zeros(x[x > 0].shape[0]), r"zeros\(\): size \(None,\): expected ints >= 0 .*got None"),
    (lambda x: gc.zeros("M", 2), r"zeros\(\): size \('M', 2\): expected ints >= 0 or dim names .*\['N'\]\), got 'M'"),
    (lambda x: gc.ones(x.sum()), r"ones\(\): size .*got float64\[\]; a size computed from them \(B \* T\) is a 0-d"),
    (lambda x: x.view(x.sum(), 1), r"Reshape.*reshape's dim 0: expected ints or dim names .*got float64\[\]"),
    (lambda x: x.view("M", -1), r"reshape's dim 0: expected ints or dim names .*\['N'\]\), got 'M'"),
    (lambda x: gc.arange(x.shape[0] * 0.5), r"unsupported operand"),
    (lambda x: x if x.shape[0] > 4 else x, r"N > 4: the dim 'N' is symbolic, its size is known only when the graph"),
    (lambda x: x * 2 if x.shape[0] == 1 else x, r"N == 1: the dim 'N' is symbolic.*\(at .*test_symbolic_sizes.py:\d+\)"),
    (lambda x: x if x.shape[0] != 5.0 else x, r"N != 5.0: .*read at run time \(N - 5.0 != 0 for N != 5.0\), a bool"),
    (lambda x: x if x.shape[0] in (1, 2) else x, r"N == 1: the dim 'N' is symbolic"),
    (lambda x: x if x.shape == (3,) else x, r"N == 3: the dim 'N' is symbolic"),
    (lambda x: x if x.shape[0] else x, r"bool\(N\): .*\(N \+ 0 != 0\), a bool Tensor for gc.where or gc.cond"),
])
def test_what_stays_unsupported_says_so(fn, match):
    with pytest.raises((gc.CaptureError, TypeError), match=match):
        gc.capture(fn, x=gc.spec("float64", ("N",)))


def test_dim_names_compare_as_names_and_hash_as_str():
    """A dim name equals its name (and another name's dim), keys dicts as the str; graphc's own ``d == 1`` checks
    on symbolic dims keep working (a broadcast against [1] and a squeeze of a size-1 dim below)."""
    seen = {}

    def fn(x, y):
        N, M = x.shape[0], y.shape[0]  # noqa: N806
        seen.update(same=N == "N", other=N != M, key={N: 1}["N"], member=N in {"N"}, text=N == x.shape[0])
        return (x + gc.ones(1, dtype=x.dtype)).unsqueeze(0).squeeze(0) * 2

    model = gc.capture(fn, x=gc.spec("float64", ("N",)), y=gc.spec("float64", ("M",)))
    assert seen == {"same": True, "other": True, "key": 1, "member": True, "text": True}
    np.testing.assert_array_equal(gc.Session(model).run({"x": np.ones(3), "y": np.ones(2)})["output"], np.full(3, 4.0))


def test_a_zero_run_time_step_fails_at_run_time_naming_the_line():
    model = gc.capture(lambda x: x[:: x.shape[0] - x.shape[0]], x=gc.spec("float64", ("N",)))
    for backend in BACKENDS:
        with pytest.raises(gc.BackendError, match=r"Slice.*test_symbolic_sizes.py:\d+.*step"):
            gc.Session(model, backend=backend).run({"x": np.ones(3)})


# slices of a [12, 10] param by bounds read at run time, as (row slice, column slice) of T: negative and
# missing bounds, bounds past the axis (clamped as Slice clamps), empty slices, steps of either sign
_RUN_TIME_SLICES = (
    lambda T: (slice(None, T), slice(None)),  # noqa: N803 - torch code's name
    lambda T: (slice(T - 1, None), slice(-T, None)),  # noqa: N803
    lambda T: (slice(1, T), slice(T // 2, T + 20)),  # noqa: N803
    lambda T: (slice(-T - 20, -2), slice(T * 3, None)),  # noqa: N803 - a start before the axis, one past it
    lambda T: (slice(T, 2), slice(None, None, 2)),  # noqa: N803 - empty for T >= 2
    lambda T: (slice(T - 2, None, 3), slice(1, T, 4)),  # noqa: N803
    lambda T: (slice(T, None, -1), slice(None, T, -2)),  # noqa: N803
    lambda T: (slice(-T, None, -3), slice(T + 20, 1, -4)),  # noqa: N803
    lambda T: (slice(None, T - 20, -1), slice(-1, -T, -1)),  # noqa: N803 - a negative step's end before the axis
    lambda T: (slice(1, T, 3), slice(None, T)),  # noqa: N803 - a step off the last axis: spread by a Pad
    lambda T: (slice(None, None, T), slice(None, -T)),  # noqa: N803 - a step read at run time: scattered back
)


class _Slices(nn.Module):
    """sum_k (k + 1) * sum(table[slice_k(T)] ** 2): its gradient puts each slice's 2 * x back in place."""

    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(RNG.standard_normal((12, 10)))

    def forward(self, y):
        T = y.shape[0]  # noqa: N806
        return sum((k + 1) * (self.table[rows, cols] ** 2).sum()
                   for k, (rows, cols) in enumerate(f(T) for f in _RUN_TIME_SLICES))


def test_the_gradient_of_a_slice_with_run_time_bounds_pads_dy_back():
    """Each Slice above gets its gradient as a Pad, but the run-time step and the four stepping the last axis by
    2 or 4 (either sign): those scatter dy back, as constant bounds do there (faster on ort-cpu; see
    autodiff/slice_pads.padded_slice_grad); the gradients equal torch float64's (the same positions picked by
    index_select) at T=3, 7, 11."""
    torch = pytest.importorskip("torch")
    net = _Slices().double()
    grads = gc.grad(gc.capture(net, y=gc.spec("float64", ("T",))), "output")
    assert sum(n.op_type == "ScatterElements" for n in grads.ir.graph) == 5
    assert sum(n.op_type == "Pad" for n in grads.ir.graph) >= len(_RUN_TIME_SLICES) - 5
    for t in (3, 7, 11):
        table = torch.tensor(net.state_dict()["table"], requires_grad=True)
        picked = (lambda size, s: torch.tensor(np.arange(size)[s].copy()))  # noqa: E731 - torch takes no step < 0
        loss = sum((k + 1) * (table.index_select(0, picked(12, rows)).index_select(1, picked(10, cols)) ** 2).sum()
                   for k, (rows, cols) in enumerate(f(t) for f in _RUN_TIME_SLICES))
        loss.backward()
        for backend in BACKENDS:
            got = gc.Session(grads, backend=backend).run({"y": np.zeros(t)})
            np.testing.assert_allclose(got["output"], loss.item(), rtol=1e-14, err_msg=f"{backend} T={t}")
            np.testing.assert_array_equal(got["table_grad"], table.grad.numpy(), err_msg=f"{backend} T={t}")


@pytest.mark.parametrize("example, net_class, input_name, vocab, past", [
    ("gpt", "GPT", "idx", 100, 33), ("transformer", "TransformerEncoder", "tokens", 1000, 65)])
def test_the_sequence_examples_take_a_symbolic_length(example, net_class, input_name, vocab, past):
    """models/gpt.py and models/transformer.py captured with [N, T] equal their captures at a static 7 at T=7; a
    run past their length limit fails naming the example's file."""
    import importlib

    net = getattr(importlib.import_module(f"graphc.models.{example}"), net_class)()
    symbolic = gc.capture(net, **{input_name: gc.spec("int64", ("N", "T"))}, seed=0)
    static = gc.capture(net, **{input_name: gc.spec("int64", ("N", 7))}, seed=0)
    tokens = RNG.integers(0, vocab, (2, 7))
    for backend in BACKENDS:
        want = gc.Session(static, backend=backend).run({input_name: tokens})["output"]
        np.testing.assert_array_equal(gc.Session(symbolic, backend=backend).run({input_name: tokens})["output"], want)
        with pytest.raises(gc.BackendError, match=f"{example}.py"):
            gc.Session(symbolic, backend=backend).run({input_name: np.zeros((1, past), np.int64)})


def test_the_transformer_example_refuses_a_static_length_past_its_limit():
    from graphc.models import transformer

    with pytest.raises(gc.GraphError, match=r"at most 64, got int64\[N,65\]"):
        gc.capture(transformer.TransformerEncoder(), tokens=gc.spec("int64", ("N", 65)))
