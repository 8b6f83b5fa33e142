"""Gradient fuzzing: random small DSL programs whose params and values are read by several ops,
differentiated by ``gc.grad`` (numpy and ort-cpu) and by a training step (SGD with lr=1, so each
param moves by minus its gradient), against the same program in torch float64 and
``torch.autograd``.

A program grows a pool of values: the input ``x``, params and op results. Each op draws its
operands from the pool, so a value feeds several consumers, and a param it needs is a new one or
one already in the program of the same shape (a weight read by 2-3 matmuls or convs, a scale
shared by BatchNorms, a bias also used as a broadcast term). The program runs eagerly in torch as
it is drawn: torch gives the shapes, and an op whose values leave [-CAP, CAP], land within 1e-6 of
a kink (relu, abs, hardswish, a max's tie) or feed BatchNorm a near-constant channel is dropped, so
float64 stays well-conditioned. The loss adds ``sum`` or ``mean`` of each value no op reads, times a
fixed random ``c`` or not (then the gradient reaching it is a broadcast scalar, as in
``(a*x + a*y).sum()``). About 40 examples per run; ``GRAPHC_GRAD_FUZZ=N`` runs N.

A second test draws from REACH: broadcasting across ranks, reductions over negative dims, slices with
steps, flip, integer and boolean-mask indexing, gather/scatter/index_add, view chains, split/chunk/
stack, in-place writes into clones, matmul of 1-D and batched operands, exact max/min ties, softmax over
-inf, gc.cond, gc.fori_loop,
gc.scan and second-order gc.autograd.grad; the model goes through ``gc.optimize`` (level 0-2) first.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphc as gc
import graphc.nn.functional as F
from torch_grad_util import TorchNS

torch = pytest.importorskip("torch")

EXAMPLES = int(os.environ.get("GRAPHC_GRAD_FUZZ", "0"))
FUZZ = {"deadline": None, "derandomize": True, "database": None,
        "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
CAP, MAX_NUMEL, KINK_GAP = 30.0, 1200, 1e-6
RTOL = 1e-8  # float64 on both sides: summation order alone (~1e-15); a wrong rule is off by far more
TORCH = TorchNS(torch)
SQRT_HALF = math.sqrt(0.5)


@dataclass
class Program:
    """The pool's entries in order: ``("x",)``, ``("param", k)`` or ``("op", fn, ids, label)`` with
    ``fn(M, *operands)``; ``values`` holds each entry's torch value, ``read`` the entries an op reads,
    ``weights`` each loss term's ``c`` (None: unweighted) and reduction."""

    x: np.ndarray
    params: list[np.ndarray] = field(default_factory=list)
    entries: list[tuple] = field(default_factory=list)
    values: list = field(default_factory=list)
    read: set[int] = field(default_factory=set)
    weights: dict[int, tuple[np.ndarray | None, str]] = field(default_factory=dict)

    def run(self, M, params: list, x) -> object:
        """The loss of the program on namespace ``M`` (torch or ``gc.nn.functional``)."""
        values = []
        for entry in self.entries:
            if entry[0] == "x":
                values.append(x)
            elif entry[0] == "param":
                values.append(params[entry[1]])
            else:
                values.append(entry[1](M, *(values[i] for i in entry[2])))
        const = torch.from_numpy if M is TORCH else np.asarray
        terms = [getattr(M, how)(values[i] if c is None else values[i] * const(c))
                 for i, (c, how) in self.weights.items()]
        return sum(terms[1:], terms[0])


class Builder:
    """Draws a Program, running it in torch (params requiring grad) as it grows."""

    def __init__(self, draw, x: np.ndarray):
        self.draw, self.prog = draw, Program(x)
        self.torch_params: list = []
        self._append(("x",), torch.from_numpy(x))

    def _append(self, entry: tuple, value) -> int:
        self.prog.entries.append(entry)
        self.prog.values.append(value)
        return len(self.prog.entries) - 1

    def shape(self, i: int) -> tuple[int, ...]:
        return tuple(self.prog.values[i].shape)

    def pick(self, ok: Callable[[tuple[int, ...]], bool] = lambda s: True) -> int | None:
        """A pool entry whose shape passes ``ok`` (None when there is none), one of the latest three
        half the time, so chains grow and a value gets several consumers."""
        candidates = [i for i in range(len(self.prog.entries)) if ok(self.shape(i))]
        if not candidates:
            return None
        return self.draw(st.sampled_from(candidates[-3:] if self.draw(st.booleans()) else candidates))

    def param(self, shape: tuple, fan_in: int = 1, step: int = 1) -> int:
        """A param of ``shape``, whose None dims are any multiple of ``step``: usually one already in the
        program when there is one, else a new one drawn with scale 1/sqrt(fan_in)."""
        def fits(s: tuple[int, ...]) -> bool:
            return len(s) == len(shape) and all(d == w if w else d % step == 0 for d, w in zip(s, shape))

        same = [i for i, e in enumerate(self.prog.entries) if e[0] == "param" and fits(self.shape(i))]
        if same and self.draw(st.integers(0, 3)):
            return self.draw(st.sampled_from(same))
        shape = tuple(w or step * self.draw(st.integers(1, 4 // step or 1)) for w in shape)
        seed = self.draw(st.integers(0, 2**16))
        value = np.random.default_rng(seed).standard_normal(shape) / math.sqrt(fan_in)
        self.prog.params.append(value)
        self.torch_params.append(torch.tensor(value, requires_grad=True))
        return self._append(("param", len(self.prog.params) - 1), self.torch_params[-1])

    def add(self, label: str, fn: Callable, *ids: int, kinks: tuple[float, ...] = (), distinct: bool = False,
            batch_stats: bool = False) -> int | None:
        """Appends ``fn(M, *pool[ids])`` and returns its pool index, unless it is out of range (None: the
        op is dropped; a param drawn for it stays, a loss term of its own): values past CAP, an operand
        of a kinked op near a kink, a max's operands near a tie (``distinct``), BatchNorm over a
        near-constant channel (``batch_stats``)."""
        operands = [self.prog.values[i].detach() for i in ids]
        out = fn(TORCH, *(self.prog.values[i] for i in ids))
        well = (out.numel() <= MAX_NUMEL and bool((out.abs() <= CAP).all())  # empty results too
                and all(bool(((operands[0] - k).abs() > KINK_GAP).all()) for k in kinks)
                and not (distinct and _near_tie(operands))
                and not (batch_stats and _flat_channel(operands[0])))
        if not well:
            return None
        self.prog.read.update(ids)
        return self._append(("op", fn, ids, label), out)


def _near_tie(operands: list) -> bool:
    if len(operands) == 2:
        a, b = torch.broadcast_tensors(*operands)
        return bool(((a - b).abs() <= KINK_GAP).any())
    planes = operands[0].flatten(-2).sort(-1).values  # max pool: distinct values in each plane
    return bool((planes.diff(dim=-1) <= KINK_GAP).any())


def _flat_channel(a) -> bool:
    dims = [d for d in range(a.dim()) if d != 1]
    return bool((a.var(dim=dims) < 0.05).any())


# --- ops: each draws operands and options, then Builder.add ------------------------------------

UNARY = {
    "neg": (lambda M, a: -a, ()),
    "square": (lambda M, a: a * a, ()),
    "tanh": (lambda M, a: M.tanh(a), ()),
    "sigmoid": (lambda M, a: M.sigmoid(a), ()),
    "exp_tanh": (lambda M, a: M.exp(M.tanh(a)), ()),
    "log1p_sq": (lambda M, a: M.log(1 + a * a), ()),
    "sqrt1p_sq": (lambda M, a: M.sqrt(1 + a * a), ()),
    "relu": (lambda M, a: M.relu(a), (0.0,)),
    "abs": (lambda M, a: M.abs(a), (0.0,)),
    "gelu": (lambda M, a: M.gelu(a), ()),
    "gelu_tanh": (lambda M, a: M.gelu(a, approximate="tanh"), ()),
    "silu": (lambda M, a: M.silu(a), ()),
    "hardswish": (lambda M, a: M.hardswish(a), (-3.0, 3.0)),
    "silu_written": (lambda M, a: a * M.sigmoid(a), ()),
    "gelu_written": (lambda M, a: 0.5 * a * (1 + M.erf(a * SQRT_HALF)), ()),
}
BINARY = {
    "add": lambda M, a, b: a + b,
    "sub": lambda M, a, b: a - b,
    "mul": lambda M, a, b: a * b,
    "div": lambda M, a, b: a / (1 + b * b),
    "maximum": lambda M, a, b: M.maximum(a, b),
}


def unary(b: Builder) -> None:
    name = b.draw(st.sampled_from(sorted(UNARY)))
    fn, kinks = UNARY[name]
    b.add(name, fn, b.pick(), kinks=kinks)


def _broadcast_shape(b: Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` less some leading dims, some others set to 1."""
    cut = b.draw(st.integers(0, len(shape)))
    return tuple(1 if b.draw(st.booleans()) else d for d in shape[cut:])


def _broadcasts(s: tuple[int, ...], t: tuple[int, ...]) -> bool:
    return all(p == q or 1 in (p, q) for p, q in zip(s[::-1], t[::-1]))


def binary(b: Builder) -> None:
    name = b.draw(st.sampled_from(sorted(BINARY)))
    i = b.pick()
    j = b.pick(lambda s: _broadcasts(s, b.shape(i))) if b.draw(st.booleans()) else _param_for(b, b.shape(i))
    if b.draw(st.booleans()):
        i, j = j, i
    b.add(name, BINARY[name], i, j, distinct=name == "maximum")


def _param_for(b: Builder, shape: tuple[int, ...]) -> int:
    """A param broadcasting to ``shape``: usually one already in the program, when one does."""
    fits = [i for i, e in enumerate(b.prog.entries)
            if e[0] == "param" and len(b.shape(i)) <= len(shape)
            and all(d in (1, n) for d, n in zip(b.shape(i)[::-1], shape[::-1]))]
    if fits and b.draw(st.integers(0, 3)):
        return b.draw(st.sampled_from(fits))
    return b.param(_broadcast_shape(b, shape))


def shared_param(b: Builder) -> None:
    """``f(u, p) + g(v, p)``: one param read by two binary ops whose results are added (the Add hands
    both the same gradient), u and v the same value half the time."""
    i = b.pick()
    j = b.pick(lambda s: s == b.shape(i))
    p = _param_for(b, b.shape(i))
    first, second = (b.draw(st.sampled_from(["add", "sub", "mul", "div"])) for _ in range(2))
    k = b.add(first, BINARY[first], i, p)
    m = b.add(second, BINARY[second], j, p) if k is not None else None
    if m is not None:
        b.add("add", BINARY["add"], k, m)


def where(b: Builder) -> None:
    i = b.pick()
    j = b.pick(lambda s: _broadcasts(s, b.shape(i)))
    k = b.pick(lambda s: _broadcasts(s, b.shape(i)) and _broadcasts(s, b.shape(j)))
    b.add("where", lambda M, c, x, y: M.where(c > 0, x, y), k, i, j)


def reduce(b: Builder) -> None:
    i = b.pick(lambda s: len(s) >= 1)
    rank = len(b.shape(i))
    dims = tuple(sorted(b.draw(st.sets(st.integers(0, rank - 1), min_size=1))))
    keep, how = b.draw(st.booleans()), b.draw(st.sampled_from(["sum", "mean"]))
    b.add(f"{how} dim={dims} keepdim={keep}", lambda M, a: getattr(M, how)(a, dim=dims, keepdim=keep), i)


def matmul(b: Builder) -> None:
    i = b.pick(lambda s: len(s) >= 2)
    if i is None:
        return
    k, kind = b.shape(i)[-1], b.draw(st.sampled_from(["weight", "linear", "self"]))
    if kind == "self":  # a @ a^T: one value read twice by the MatMul
        b.add("a @ a.mT", lambda M, a: M.matmul(a, M.transpose(a, -1, -2)), i)
        return
    if kind == "weight":
        b.add("matmul", lambda M, a, w: M.matmul(a, w), i, b.param((k, None), k))
        return
    w = b.param((None, k), k)
    if b.draw(st.booleans()):
        b.add("linear", lambda M, a, w, bias: M.linear(a, w, bias), i, w, b.param((b.shape(w)[0],)))
    else:
        b.add("linear", lambda M, a, w: M.linear(a, w), i, w)


def _spatial(s: tuple[int, ...]) -> bool:
    return len(s) == 4 and min(s[2:]) >= 2


def conv(b: Builder) -> None:
    i = b.pick(_spatial)
    if i is None:
        return
    c = b.shape(i)[1]
    groups = b.draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
    stride, pad = b.draw(st.integers(1, 2)), b.draw(st.integers(0, 1))
    k = b.draw(st.integers(1, min(3, *(d + 2 * pad for d in b.shape(i)[2:]))))
    w = b.param((None, c // groups, k, k), c // groups * k * k, step=groups)
    options = {"stride": stride, "padding": pad, "groups": groups}
    if b.draw(st.booleans()):
        b.add(f"conv2d {options}", lambda M, a, w, bias: M.conv2d(a, w, bias, **options), i, w, b.param(b.shape(w)[:1]))
    else:
        b.add(f"conv2d {options}", lambda M, a, w: M.conv2d(a, w, **options), i, w)


def batch_norm(b: Builder) -> None:
    i = b.pick(lambda s: len(s) in (2, 4) and s[0] >= 2)
    if i is None:
        return
    c = b.shape(i)[1]
    w, bias = b.param((c,)), b.param((c,))
    b.add("batch_norm", lambda M, a, w, bias: M.batch_norm(a, None, None, w, bias, training=True), i, w, bias,
          batch_stats=True)


def softmax(b: Builder) -> None:
    i = b.pick(lambda s: len(s) >= 1)
    dim = b.draw(st.integers(-len(b.shape(i)), len(b.shape(i)) - 1))
    how = b.draw(st.sampled_from(["softmax", "log_softmax"]))
    b.add(f"{how} dim={dim}", lambda M, a: getattr(M, how)(a, dim=dim), i)


def concat(b: Builder) -> None:
    i = b.pick(lambda s: len(s) >= 1)
    s = b.shape(i)
    axis = b.draw(st.integers(0, len(s) - 1))

    def fits(t: tuple[int, ...]) -> bool:
        return len(t) == len(s) and all(p == q for d, (p, q) in enumerate(zip(s, t)) if d != axis)

    ids = [i] + [b.pick(fits) for _ in range(b.draw(st.integers(1, 2)))]
    b.add(f"cat dim={axis}", lambda M, *xs: M.cat(list(xs), dim=axis), *ids)


def _axis_slice(axis: int, part: slice) -> tuple:
    return (slice(None),) * axis + (part,)


def slicing(b: Builder) -> None:
    i = b.pick(lambda s: any(d >= 2 for d in s))
    if i is None:
        return
    s = b.shape(i)
    axis = b.draw(st.sampled_from([d for d, n in enumerate(s) if n >= 2]))
    n = s[axis]
    cut = b.draw(st.integers(1, n - 1))
    if b.draw(st.booleans()):  # a rotation written as Concat of two slices
        head, tail = _axis_slice(axis, slice(cut, None)), _axis_slice(axis, slice(None, cut))
        b.add(f"rotate dim={axis} by {cut}", lambda M, a: M.cat([a[head], a[tail]], dim=axis), i)
        return
    start, step = b.draw(st.integers(0, cut - 1)), b.draw(st.integers(1, 2))
    part = slice(start, cut + 1, step)
    b.add(f"slice dim={axis} {part}", lambda M, a: a[_axis_slice(axis, part)], i)


def transpose(b: Builder) -> None:
    i = b.pick(lambda s: len(s) >= 2)
    if i is None:
        return
    rank = len(b.shape(i))
    d0, d1 = b.draw(st.lists(st.integers(0, rank - 1), min_size=2, max_size=2, unique=True))
    b.add(f"transpose {d0} {d1}", lambda M, a: M.transpose(a, d0, d1), i)


def reshape(b: Builder) -> None:
    i = b.pick(lambda s: len(s) >= 1)
    s = list(b.shape(i))
    d = b.draw(st.integers(0, len(s) - 1))
    if d + 1 < len(s) and b.draw(st.booleans()):
        new = s[:d] + [s[d] * s[d + 1]] + s[d + 2:]
    else:
        f = b.draw(st.sampled_from([f for f in range(1, s[d] + 1) if s[d] % f == 0]))
        new = s[:d] + [f, s[d] // f] + s[d + 1:]
    b.add(f"reshape {new}", lambda M, a: M.reshape(a, tuple(new)), i)


def pool(b: Builder) -> None:
    i = b.pick(_spatial)
    if i is None:
        return
    k = b.draw(st.integers(2, min(3, *b.shape(i)[2:])))
    options = {"stride": b.draw(st.integers(1, 2)), "padding": b.draw(st.integers(0, k // 2)),
               "ceil_mode": b.draw(st.booleans())}
    if b.draw(st.booleans()):
        b.add(f"max_pool2d {k} {options}", lambda M, a: M.max_pool2d(a, k, **options), i, distinct=True)
    else:
        include = b.draw(st.booleans())
        b.add(f"avg_pool2d {k} {options} count_include_pad={include}",
              lambda M, a: M.avg_pool2d(a, k, count_include_pad=include, **options), i)


# --- reach: broadcasting across ranks, reductions, indexing, views, ties, -inf, control flow ----------


def _lib(M):
    """torch, or graphc (``gc.cond``, ``gc.autograd``), for the namespace ``M``."""
    return torch if M is TORCH else gc


def _const(M, value: np.ndarray):
    return torch.from_numpy(value) if M is TORCH else value


def _dims(b: Builder, rank: int) -> tuple[int, ...]:
    """One to ``rank`` distinct dims, each written positive or negative."""
    dims = sorted(b.draw(st.sets(st.integers(0, rank - 1), min_size=1)))
    return tuple(d - rank if b.draw(st.booleans()) else d for d in dims)


def rank_broadcast(b: Builder) -> None:
    """``a op p`` with ``p`` of more dims than ``a`` (new leading dims, some of ``a``'s set to 1)."""
    i = b.pick(lambda s: len(s) <= 3)
    if i is None:
        return
    shape = (b.draw(st.integers(1, 3)), *(1 if b.draw(st.booleans()) else d for d in b.shape(i)))
    name = b.draw(st.sampled_from(["add", "sub", "mul", "div"]))
    p = b.param(shape)
    i, p = (p, i) if b.draw(st.booleans()) else (i, p)
    b.add(f"{name} (rank broadcast)", BINARY[name], i, p)


REDUCTIONS = {  # name: torch / DSL call; max/min over exact ties pick the first place, as torch
    "sum": lambda M, a, d, k: M.sum(a, dim=d, keepdim=k),
    "mean": lambda M, a, d, k: M.mean(a, dim=d, keepdim=k),
    "amax": lambda M, a, d, k: M.amax(a, dim=d, keepdim=k),
    "amin": lambda M, a, d, k: M.amin(a, dim=d, keepdim=k),
    "logsumexp": lambda M, a, d, k: M.logsumexp(a, dim=d, keepdim=k),
    "var": lambda M, a, d, k: M.var(a, dim=d, keepdim=k),
    "std": lambda M, a, d, k: M.std(a, dim=d, keepdim=k),
    "norm": lambda M, a, d, k: M.norm(a, p=2, dim=d, keepdim=k),
    "prod": lambda M, a, d, k: M.prod(a, dim=d[0], keepdim=k),
    "max.values": lambda M, a, d, k: M.max(a, dim=d[0], keepdim=k).values,
    "min.values": lambda M, a, d, k: M.min(a, dim=d[0], keepdim=k).values,
}


def reduce_more(b: Builder) -> None:
    """A reduction over negative or positive dims, keepdim or not (max/min/prod: the first dim drawn)."""
    i = b.pick(lambda s: len(s) >= 1)
    name = b.draw(st.sampled_from(sorted(REDUCTIONS)))
    fn = REDUCTIONS[name]
    dims, keep = _dims(b, len(b.shape(i))), b.draw(st.booleans())
    if name in ("var", "std") and math.prod(b.shape(i)[d] for d in dims) < 2:
        return
    b.add(f"{name} dim={dims} keepdim={keep}", lambda M, a: fn(M, a, dims, keep), i)


def tie(b: Builder) -> None:
    """Exact ties reached by two paths: ``maximum``/``minimum`` of a value and the same value through a
    flip pair, ``amax`` over a value concatenated with itself, or clamp at bounds drawn from the value."""
    i = b.pick(lambda s: len(s) >= 1)
    how = b.draw(st.sampled_from(["maximum", "minimum", "amax_cat", "clamp"]))
    if how == "amax_cat":
        dim = b.draw(st.integers(-len(b.shape(i)), len(b.shape(i)) - 1))
        b.add(f"amax(cat([a, a], {dim}), {dim})", lambda M, a: M.amax(M.cat([a, a], dim=dim), dim=dim), i)
    elif how == "clamp":
        lo, hi = sorted(float(q) for q in np.quantile(b.prog.values[i].detach().numpy(), [0.25, 0.75]))
        b.add(f"clamp {lo:.3g} {hi:.3g}", lambda M, a: M.clamp(a, lo, hi), i, kinks=(lo, hi))
    else:
        b.add(f"{how}(a, flip(flip(a)))", lambda M, a: getattr(M, how)(a, M.flip(M.flip(a, (0,)), (0,))), i)


def index(b: Builder) -> None:
    """Basic slices with negative bounds and steps, flip, integer and boolean-mask indexing,
    index_select, gather, scatter, index_add, scatter_add (repeated indices included)."""
    i = b.pick(lambda s: len(s) >= 1 and s[0] >= 2)
    if i is None:
        return
    s, seed = b.shape(i), b.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    axis = b.draw(st.integers(0, len(s) - 1))
    how = b.draw(st.sampled_from(["slice", "flip", "int", "mask", "index_select", "gather", "scatter",
                                  "index_add", "scatter_add"]))
    if how == "slice":
        n = s[axis]
        part = slice(b.draw(st.integers(-n, n - 1)), b.draw(st.sampled_from([None, -1, n])), b.draw(st.integers(1, 3)))
        b.add(f"a[{_axis_slice(axis, part)}]", lambda M, a: a[_axis_slice(axis, part)], i)
    elif how == "flip":
        dims = _dims(b, len(s))
        b.add(f"flip {dims}", lambda M, a: M.flip(a, dims), i)
    elif how == "int":
        idx = rng.integers(-s[0], s[0], size=rng.integers(1, 5))
        b.add(f"a[{idx.tolist()}]", lambda M, a: a[_const(M, idx)], i)
    elif how == "mask":
        mask = rng.random(s) < 0.6
        b.add("a[mask]", lambda M, a: a[_const(M, mask)], i)
    elif how == "index_select":
        idx = rng.integers(0, s[axis], size=rng.integers(1, 5))
        b.add(f"index_select {axis} {idx.tolist()}", lambda M, a: M.index_select(a, axis, _const(M, idx)), i)
    elif how == "gather":
        idx = rng.integers(0, s[axis], size=s)
        b.add(f"gather {axis}", lambda M, a: M.gather(a, axis, _const(M, idx)), i)
    elif how == "index_add":
        src = b.param((rng.integers(1, 5), *s[1:]))
        idx = rng.integers(0, s[0], size=b.shape(src)[0])
        b.add(f"index_add 0 {idx.tolist()}", lambda M, a, u: a.index_add(0, _const(M, idx), u), i, src)
    else:  # scatter keeps one write per place (torch's order over duplicates is unspecified), scatter_add sums
        if how == "scatter":
            idx = np.moveaxis(np.argsort(rng.random(s), axis=axis), axis, -1)[..., : max(1, s[axis] // 2)]
            idx = np.ascontiguousarray(np.moveaxis(idx, -1, axis))
            b.add(f"scatter {axis}", lambda M, a, u: M.scatter(a, axis, _const(M, idx), u), i, b.param(idx.shape))
        else:
            idx = rng.integers(0, s[axis], size=s)
            b.add(f"scatter_add {axis}", lambda M, a, u: a.scatter_add(axis, _const(M, idx), u), i, b.param(s))


def write(b: Builder) -> None:
    """In-place writes into a clone: a param into a stepped slice, ``+=`` through a transposed view's row,
    a scalar under a fixed mask."""
    i = b.pick(lambda s: len(s) >= 2 and s[0] >= 2)
    if i is None:
        return
    s, how = b.shape(i), b.draw(st.sampled_from(["slice", "view", "mask"]))
    if how == "slice":
        part = (slice(1, None), slice(None, None, 2))
        p = b.param(b.prog.values[i][part].shape[-1:])

        def fn(M, a, p):
            x = a.clone()
            x[part] = p
            return x * a
        b.add("x = a.clone(); x[1:, ::2] = p; x * a", fn, i, p)
    elif how == "view":
        def fn(M, a):
            x = a.clone()
            x.transpose(0, -1)[0] += a.transpose(0, -1)[-1]
            return x * x
        b.add("x = a.clone(); x.transpose(0, -1)[0] += a.transpose(0, -1)[-1]; x * x", fn, i)
    else:
        mask = np.random.default_rng(b.draw(st.integers(0, 2**16))).random(s) < 0.5

        def fn(M, a):
            x = a * 2
            x[_const(M, mask)] = 0.5
            return x * a
        b.add("x = a * 2; x[mask] = 0.5; x * a", fn, i)


def view(b: Builder) -> None:
    """A chain of two to four views: unsqueeze (negative dims too), permute, expand of a size-1 dim,
    squeeze, flatten, movedim."""
    i = b.pick(lambda s: len(s) >= 1)
    steps, s = [], list(b.shape(i))
    for _ in range(b.draw(st.integers(2, 4))):
        how = b.draw(st.sampled_from(["unsqueeze", "permute", "expand", "squeeze", "flatten", "movedim"]))
        if how == "unsqueeze" and len(s) < 5:
            d = b.draw(st.integers(-len(s) - 1, len(s)))
            steps.append((f"unsqueeze({d})", lambda M, a, d=d: a.unsqueeze(d)))
            s.insert(d % (len(s) + 1), 1)
        elif how == "permute" and len(s) >= 2:
            order = b.draw(st.permutations(range(len(s))))
            steps.append((f"permute{tuple(order)}", lambda M, a, o=tuple(order): a.permute(*o)))
            s = [s[o] for o in order]
        elif how == "expand" and 1 in s:
            new = [b.draw(st.integers(1, 3)) if d == 1 else d for d in s]
            steps.append((f"expand{tuple(new)}", lambda M, a, n=tuple(new): a.expand(*n)))
            s = new
        elif how == "squeeze" and 1 in s:
            d = s.index(1) - (len(s) if b.draw(st.booleans()) else 0)
            steps.append((f"squeeze({d})", lambda M, a, d=d: a.squeeze(d)))
            del s[d]
        elif how == "flatten" and len(s) >= 2:
            steps.append(("flatten(-2)", lambda M, a: a.flatten(-2)))
            s = s[:-2] + [s[-2] * s[-1]]
        elif how == "movedim" and len(s) >= 2:
            src, dst = b.draw(st.integers(0, len(s) - 1)), b.draw(st.integers(-len(s), -1))
            steps.append((f"movedim({src}, {dst})", lambda M, a, p=src, q=dst: M.movedim(a, p, q)))
            s.insert(dst % len(s), s.pop(src))

    def chain(M, a):
        for _, step in steps:
            a = step(M, a)
        return a

    if steps:
        b.add(".".join(name for name, _ in steps), chain, i)


def pieces(b: Builder) -> None:
    """split into sizes or chunk (uneven pieces too), the pieces recombined by stack or a weighted sum."""
    i = b.pick(lambda s: any(d >= 2 for d in s))
    if i is None:
        return
    s = b.shape(i)
    axis = b.draw(st.sampled_from([d for d, n in enumerate(s) if n >= 2])) - (len(s) if b.draw(st.booleans()) else 0)
    n = s[axis]
    if b.draw(st.booleans()):
        cut = b.draw(st.integers(1, n - 1))
        parts, label = (lambda M, a: M.split(a, [cut, n - cut], dim=axis)), f"split [{cut}, {n - cut}] dim={axis}"
    else:
        k = b.draw(st.integers(2, n))
        parts, label = (lambda M, a: M.chunk(a, k, dim=axis)), f"chunk {k} dim={axis}"
    pick = b.draw(st.integers(0, 1))
    if b.draw(st.booleans()):
        b.add(f"{label}[{pick}]", lambda M, a: parts(M, a)[pick], i)
    else:  # every piece, stacked with itself scaled: the same piece read twice
        b.add(f"stack({label}[-1], 2 * it)", lambda M, a: M.stack([parts(M, a)[-1], 2 * parts(M, a)[-1]], dim=-1), i)


def matvec(b: Builder) -> None:
    """matmul with a 1-D operand on either side, or batched operands of different ranks."""
    i = b.pick(lambda s: len(s) >= 1)
    s = b.shape(i)
    how = b.draw(st.sampled_from(["a @ v", "v @ a", "batched"]))
    if how == "a @ v":
        b.add("a @ v", lambda M, a, v: M.matmul(a, v), i, b.param((s[-1],), s[-1]))
    elif how == "v @ a" and len(s) >= 2:
        b.add("v @ a", lambda M, a, v: M.matmul(v, a), i, b.param((s[-2],), s[-2]))
    elif how == "batched":
        batch = (b.draw(st.integers(1, 2)), *(1,) * max(0, len(s) - 2))  # a new leading dim, the rest broadcast
        w = b.param((*batch, s[-1], b.draw(st.integers(1, 3))), s[-1])
        b.add("a @ w (batched)", lambda M, a, w: M.matmul(a, w), i, w)


def masked_softmax(b: Builder) -> None:
    """softmax / log_softmax / logsumexp of a value with some places set to -inf (never a whole row);
    log_softmax's -inf places then set back to 0 by where."""
    i = b.pick(lambda s: len(s) >= 1 and s[-1] >= 2)
    if i is None:
        return
    s, rng = b.shape(i), np.random.default_rng(b.draw(st.integers(0, 2**16)))
    mask = rng.random(s) < 0.4
    mask[..., 0] = False
    how = b.draw(st.sampled_from(["softmax", "log_softmax", "logsumexp"]))

    def fn(M, a):
        m = _const(M, mask)
        z = getattr(M, how)(M.masked_fill(a, m, -math.inf), dim=-1)
        return M.where(m, 0.0, z) if how == "log_softmax" else z

    b.add(f"{how} masked", fn, i)


def branch(b: Builder) -> None:
    """gc.cond on the sign of a sum, both branches reading a param; torch takes the branch in Python."""
    i = b.pick()
    p = _param_for(b, b.shape(i))

    def fn(M, a, p):
        pred = a.sum() > 0
        yes, no = (lambda a, p: M.tanh(a) * p), (lambda a, p: a - p * p)
        return (yes if bool(pred) else no)(a, p) if M is TORCH else gc.cond(pred, yes, no, a, p)

    b.add("cond(sum(a) > 0, tanh(a) * p, a - p * p)", fn, i, p)


def loop(b: Builder) -> None:
    """gc.fori_loop or gc.scan whose body reads a param each step (torch: a Python loop)."""
    i = b.pick(lambda s: len(s) >= 1)
    s = b.shape(i)
    if b.draw(st.booleans()):
        p, n = _param_for(b, s), b.draw(st.integers(1, 3))

        def body(M, a, p):
            step = lambda _, c: M.tanh(c * p + a)  # noqa: E731
            if M is not TORCH:
                return gc.fori_loop(0, n, step, a)
            c = a
            for k in range(n):
                c = step(k, c)
            return c

        b.add(f"fori_loop {n}: c = tanh(c * p + a)", body, i, p)
        return
    p = b.param(s[1:])

    def scan(M, a, p):
        step = lambda c, x: (M.tanh(c * p + x), c * x)  # noqa: E731
        if M is not TORCH:
            return gc.scan(step, p, a)[1]
        c, ys = p, []
        for x in a:
            c, y = step(c, x)
            ys.append(y)
        return torch.stack(ys)

    b.add("scan: c = tanh(c * p + x), y = c * x", scan, i, p)


def second_order(b: Builder) -> None:
    """The gradient of ``sum(sigmoid(a) * a) + sum(a)^2`` in ``a`` with create_graph, then trained through."""
    i = b.pick(lambda s: len(s) >= 1)
    if not b.prog.values[i].requires_grad:
        return

    def fn(M, a):
        f = (M.sigmoid(a) * a).sum() + a.sum() ** 2
        return _lib(M).autograd.grad(f, a, create_graph=True)[0]

    b.add("autograd.grad(sum(sigmoid(a) * a) + sum(a)^2, a, create_graph)", fn, i)


OPS = [unary, unary, binary, binary, shared_param, where, reduce, reduce, matmul, matmul, conv, conv, batch_norm, softmax,
       concat, slicing, transpose, reshape, pool]
REACH = [unary, binary, rank_broadcast, reduce_more, reduce_more, tie, index, index, view, view, write, pieces, matvec,
         masked_softmax, branch, loop, second_order, concat, matmul]


@st.composite
def programs(draw, ops: list = OPS) -> Builder:
    # small shapes, and batches of 4 on 8x8 maps, where other conv and pool lowerings take over
    shape = draw(st.sampled_from([(3, 4), (4, 6), (2, 3, 4), (2, 3, 4, 4), (3, 2, 3, 5), (2, 4, 2, 3), (4, 2, 8, 8),
                                  (4, 4, 6, 6), (1, 2, 9, 9)]))
    x = np.random.default_rng(draw(st.integers(0, 2**16))).standard_normal(shape)
    b = Builder(draw, x)
    for _ in range(draw(st.integers(3, 10))):
        draw(st.sampled_from(ops))(b)
    if not b.prog.params:  # every program has a param to differentiate
        b.add("mul", BINARY["mul"], 0, b.param(_broadcast_shape(b, x.shape)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    for i in range(1, len(b.prog.entries)):
        if i not in b.prog.read:
            weighted = draw(st.booleans())  # unweighted: the gradient reaching v is a broadcast scalar
            b.prog.weights[i] = (rng.standard_normal(b.shape(i)) if weighted else None,
                                 draw(st.sampled_from(["sum", "mean"])))
    return b


class _Net(gc.nn.Module):
    def __init__(self, prog: Program):
        super().__init__()
        self.prog, self.count = prog, len(prog.params)
        for k, value in enumerate(prog.params):
            setattr(self, f"p{k}", gc.nn.Parameter(value, dtype="float64"))

    def forward(self, x):
        return {"loss": self.prog.run(F, [getattr(self, f"p{k}") for k in range(self.count)], x)}


def _close(got: np.ndarray, want: np.ndarray, what: str, prog: Program) -> None:
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * scale, err_msg=f"{what}\n{_describe(prog)}")


def _describe(prog: Program) -> str:
    """The program, one pool entry a line, for a failure's message."""
    lines = []
    for i, entry in enumerate(prog.entries):
        if entry[0] == "op":
            what = f"{entry[3]}({', '.join(f'v{j}' for j in entry[2])})"
        else:
            what = "x" if entry[0] == "x" else f"p{entry[1]}"
        lines.append(f"v{i} = {what} -> {tuple(prog.values[i].shape)}")
    terms = [f"{how}(v{i}{'' if c is None else f' * c{i}'})" for i, (c, how) in prog.weights.items()]
    return "\n".join([*lines, "loss = " + " + ".join(terms)])


@settings(max_examples=EXAMPLES or 40, **FUZZ)
@given(builder=programs(), trainer_backend=st.sampled_from(["numpy", "ort-cpu"]))
def test_grad_and_training_step_of_random_programs_match_torch_autograd(builder, trainer_backend):
    check_against_torch(builder, trainer_backend)


@settings(max_examples=EXAMPLES or 30, **FUZZ)
@given(builder=programs(REACH), trainer_backend=st.sampled_from(["numpy", "ort-cpu"]), level=st.sampled_from([0, 1, 2]))
def test_grads_of_indexing_views_ties_control_flow_and_second_order_match_torch(builder, trainer_backend, level):
    """The REACH ops, the captured model optimized at ``level`` before gc.grad and training."""
    check_against_torch(builder, trainer_backend, level)


def check_against_torch(builder: Builder, trainer_backend: str, level: int = 0) -> None:
    """The loss and every gradient, by gc.grad on numpy and ort-cpu and by one SGD(lr=1) step on
    ``trainer_backend``, against torch.autograd; the model optimized at ``level`` first."""
    prog = builder.prog
    loss = prog.run(TORCH, builder.torch_params, torch.from_numpy(prog.x))
    # None: no gradient reaches the param (read only through a comparison), so it is not trained (as torch's
    # optimizers skip a param whose .grad is None) and gc.grad's gradient is zeros
    found = (torch.autograd.grad(loss, builder.torch_params, allow_unused=True) if loss.requires_grad
             else [None] * len(prog.params))
    want = [None if g is None else g.numpy() for g in found]
    model = gc.capture(_Net(prog), x=gc.spec("float64", prog.x.shape))
    model = gc.optimize(model, level=level) if level else model
    grads = gc.grad(model, "loss")
    for backend in ("numpy", "ort-cpu"):
        out = gc.Session(grads, backend=backend).run({"x": prog.x})
        _close(out["loss"], loss.item(), f"{backend} loss", prog)
        for k, (w, p) in enumerate(zip(want, prog.params)):
            _close(out[f"p{k}_grad"], np.zeros_like(p) if w is None else w, f"{backend} d loss / d p{k}", prog)
    trainer = gc.Trainer(gc.training.generate(model, "loss", gc.optim.SGD(lr=1.0)), backend=trainer_backend)
    _close(trainer.step({"x": prog.x}), loss.item(), f"{trainer_backend} train_step loss", prog)
    state = trainer.state_dict()
    assert {f"p{k}" for k, w in enumerate(want) if w is not None} == {k for k in state if k.startswith("p")}
    for k, w in enumerate(want):
        if w is not None:
            _close(prog.params[k] - state[f"p{k}"], w, f"{trainer_backend} train_step p{k} delta", prog)
