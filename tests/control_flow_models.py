"""Random small valid ONNX models of control flow (Scan, Loop, If, nested), and random DSL programs
of ``gc.scan`` / ``gc.cond`` / ``gc.fori_loop``, for differential fuzzing (tests/test_control_flow_fuzz.py;
a sweep calls ``random_model(Draw(random.Random(seed)))`` for many seeds).

A model's main graph and every body share one pool discipline: a value is made of a target shape
from the values the graph can see (its own, its inputs, the enclosing graphs'), directly (an input
or outer value passed straight through), as a constant (an initializer of the graph or a Constant
node), elementwise from values broadcasting to the shape, or as an output of nested control flow.
Scans draw carries, scanned inputs and outputs with their axes and directions, lengths 0 to 4;
Loops a trip count and/or a condition (constant, a graph input, or ``iter < k`` in the body) and
scan outputs; Ifs branches of different static shapes on an output now and then (its type merged).
Every body output reading an outer value gets an Identity (ONNX's checker wants that); body inputs
go out directly now and then. Draws come from a ``Draw``: hypothesis's ``data`` in tests,
``random.Random`` in a sweep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Shape = tuple[int, ...]
ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE}


class Draw:
    """Random choices from ``random.Random`` (a sweep); ``HypothesisDraw`` gives them from hypothesis."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, items):
        return items[self.int(0, len(items) - 1)]

    def chance(self, p: float) -> bool:
        return self.int(0, 999) < p * 1000


class HypothesisDraw(Draw):
    """``Draw`` over hypothesis's ``st.data()`` (so failures shrink)."""

    def __init__(self, data):
        self.data = data

    def int(self, lo: int, hi: int) -> int:
        from hypothesis import strategies as st

        return self.data.draw(st.integers(lo, hi))


@dataclass
class Graph:
    """A graph being built: its nodes, initializers and the (name, shape) values it can read."""

    pool: list[tuple[str, Shape]]
    depth: int
    outer: int = 0  # pool[:outer] are the enclosing graphs' values
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)


class ModelGen:
    """Draws one model; ``features`` records what it holds (for reports)."""

    def __init__(self, d: Draw, dtype=np.float32):
        self.d, self.dtype, self.elem = d, np.dtype(dtype), ELEM[np.dtype(dtype)]
        self.count = 0
        self.features: list[str] = []
        self.loop_outs: dict[str, Shape] = {}  # a Loop's scan output -> its slices' shape

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def tinfo(self, name: str, shape, elem=None, declare: bool = True):
        return helper.make_tensor_value_info(name, elem or self.elem, list(shape) if declare and shape is not None
                                             else None)

    def shape(self, max_rank: int = 3) -> Shape:
        return tuple(self.d.int(1, 3) for _ in range(self.d.int(0, max_rank)))

    def node(self, g: Graph, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str]:
        outs = [self.name(op.lower()) for _ in range(n_out)]
        g.nodes.append(helper.make_node(op, inputs, outs, name=self.name("n"), **attrs))
        return outs

    def const(self, g: Graph, shape: Shape, array=None) -> str:
        array = (np.random.default_rng(self.d.int(0, 999)).standard_normal(shape).astype(self.dtype)
                 if array is None else np.asarray(array))
        name = self.name("k")
        if self.d.chance(0.5):
            g.inits.append(numpy_helper.from_array(array, name))
            return name
        g.nodes.append(helper.make_node("Constant", [], [name], name=self.name("n"),
                                        value=numpy_helper.from_array(array, name + "v")))
        return name

    # -- values -----------------------------------------------------------------------------------

    def make(self, g: Graph, shape: Shape) -> str:
        """A value of exactly ``shape`` that ``g`` can read (possibly one it already has)."""
        exact = [n for n, s in g.pool if s == shape]
        kind = self.d.int(0, 9)
        if kind <= 1 and exact:
            self.features.append("passthrough")
            return self.d.pick(exact)
        if kind == 2:
            return self.const(g, shape)
        if kind == 3 and g.depth < 2:
            return self.control(g, shape)
        fits = [(n, s) for n, s in g.pool if _broadcasts_to(s, shape)]
        if not fits:
            return self.const(g, shape)
        a, sa = self.d.pick(fits)
        op = self.d.pick(["Tanh", "Neg", "Sin", "Add", "Sub", "Mul", "Identity"])
        if op in ("Tanh", "Neg", "Sin", "Identity"):
            out, so = self.node(g, op, [a])[0], sa
        else:
            b, sb = self.d.pick(fits)
            if op == "Mul":  # bounded factors: carries stay moderate over the steps
                b = self.node(g, "Tanh", [b])[0]
            out, so = self.node(g, op, [a, b])[0], np.broadcast_shapes(sa, sb)
        if tuple(so) != shape:
            out = self.node(g, "Add", [out, self.const(g, shape)])[0]
        g.pool.append((out, shape))
        return out

    def control(self, g: Graph, shape: Shape) -> str:
        """Nested control flow whose first output has ``shape``."""
        kind = self.d.pick(["If", "Scan", "Loop"])
        self.features.append(f"{kind}@{g.depth}")
        return {"If": self.if_, "Scan": self.scan, "Loop": self.loop}[kind](g, shape)[0][0]

    # -- control flow -----------------------------------------------------------------------------

    def body(self, g: Graph, inputs: list[tuple[str, Shape]]) -> Graph:
        return Graph(pool=[*g.pool, *inputs], depth=g.depth + 1, outer=len(g.pool))

    def output(self, b: Graph, shape: Shape) -> str:
        """A body output of ``shape``: an outer value gets an Identity (ONNX's checker wants a
        graph's outputs made or taken in by the graph itself)."""
        name = self.make(b, shape)
        if any(n == name for n, _ in b.pool[:b.outer]):
            self.features.append("outer-out")
            name = self.node(b, "Identity", [name])[0]
        return name

    def finish(self, b: Graph, name: str, inputs: list, outputs: list[tuple[str, Shape]]) -> onnx.GraphProto:
        declare = self.d.chance(0.85)
        return helper.make_graph(b.nodes, self.name(name), inputs,
                                 [self.tinfo(n, s, declare=declare) for n, s in outputs], b.inits)

    def if_(self, g: Graph, first: Shape, merged_ok: bool = False) -> list[tuple[str, Shape | None]]:
        shapes = [first] + [self.shape() for _ in range(self.d.int(0, 2))]
        branches, else_shapes = [], list(shapes)
        if merged_ok and self.d.chance(0.3):  # an output of different static shapes in the branches
            k = self.d.int(0, len(shapes) - 1)
            else_shapes[k] = tuple(self.d.int(1, 3) for _ in shapes[k])
            self.features.append("if-merged")
        for sh in (shapes, else_shapes):
            b = self.body(g, [])
            outs = [(self.output(b, s), s) for s in sh]
            branches.append(self.finish(b, "branch", [], outs))
        cond = self.condition(g)
        outs = self.node(g, "If", [cond], len(shapes), then_branch=branches[0], else_branch=branches[1])
        g.pool += [(o, s) for o, s, e in zip(outs, shapes, else_shapes) if s == e]
        return [(o, s if s == e else (None,) * len(s)) for o, s, e in zip(outs, shapes, else_shapes)]

    def condition(self, g: Graph) -> str:
        bools = [n for n, s in g.pool if s == "bool"]
        if bools and self.d.chance(0.5):
            return self.d.pick(bools)
        src = self.make(g, self.shape(2))
        total = self.node(g, "ReduceSum", [src], keepdims=0)[0]
        return self.node(g, "Greater", [total, self.const(g, (), np.zeros((), self.dtype))])[0]

    def scan(self, g: Graph, first: Shape | None = None) -> list[tuple[str, Shape]]:
        length = self.d.pick([0, 1, 2, 3, 3, 4])
        n_carry, n_in, n_out = self.d.int(0, 2), self.d.int(1, 2), self.d.int(0, 2)
        n_carry = max(n_carry, int(first is not None or n_out == 0))
        carry_shapes = [first if k == 0 and first is not None else self.shape() for k in range(n_carry)]
        in_elems = [self.shape(2) for _ in range(n_in)]
        in_axes = [self.d.int(-len(e) - 1, len(e)) for e in in_elems]
        out_elems = [self.shape(2) for _ in range(n_out)]
        out_axes = [self.d.int(-len(e) - 1, len(e)) for e in out_elems]
        carries = [(self.name("s"), s) for s in carry_shapes]
        xs = [(self.name("x"), e) for e in in_elems]
        b = self.body(g, carries + xs)
        outs = [(self.output(b, s), s) for s in carry_shapes] + [(self.output(b, e), e) for e in out_elems]
        graph = self.finish(b, "scan_body", [self.tinfo(n, s) for n, s in carries + xs], outs)
        full = [_insert(e, a, length) for e, a in zip(in_elems, in_axes)]
        inputs = [self.make(g, s) for s in carry_shapes] + [self.make(g, s) for s in full]
        attrs = {"num_scan_inputs": n_in}
        if any(in_axes) or self.d.chance(0.2):
            attrs["scan_input_axes"] = in_axes
        if self.d.chance(0.4):
            attrs["scan_input_directions"] = [self.d.int(0, 1) for _ in range(n_in)]
        if out_elems and (any(out_axes) or self.d.chance(0.2)):
            attrs["scan_output_axes"] = out_axes
        if out_elems and self.d.chance(0.4):
            attrs["scan_output_directions"] = [self.d.int(0, 1) for _ in out_elems]
        self.features.append(f"scan(L={length},carry={n_carry},in={n_in},out={n_out},attrs={sorted(attrs)})")
        names = self.node(g, "Scan", inputs, n_carry + n_out, body=graph, **attrs)
        result = list(zip(names, carry_shapes + [_insert(e, a, length) for e, a in zip(out_elems, out_axes)]))
        g.pool += result
        return result

    def loop(self, g: Graph, first: Shape | None = None) -> list[tuple[str, Shape | None]]:
        trips = self.d.pick(["const", "const", "input", "none"])
        cond_in = self.d.pick(["none", "true", "false", "input", "computed"])
        stop = self.d.int(0, 4)  # the body's condition: iter < stop
        cond_body = "less" if trips == "none" else self.d.pick(["less", "pass", "identity", "const"])
        carry_shapes = [first if first is not None else self.shape()] + [self.shape() for _ in range(self.d.int(0, 1))]
        out_elems = [self.shape(2) for _ in range(self.d.int(0, 2))]
        it, cin = self.name("iter"), self.name("cond")
        carries = [(self.name("c"), s) for s in carry_shapes]
        b = self.body(g, carries)
        if self.d.chance(0.5):  # the iteration number as a float joins the body's values
            b.pool.append((self.node(b, "Cast", [it], to=self.elem)[0], ()))
        if cond_body == "less":
            c_out = self.node(b, "Less", [it, self.const(b, (), np.array(stop, np.int64))])[0]
        elif cond_body == "pass":
            c_out = cin
        elif cond_body == "identity":
            c_out = self.node(b, "Identity", [cin])[0]
        else:
            c_out = self.const(b, (), np.array(True))
        outs = [(self.output(b, s), s) for s in carry_shapes] + [(self.output(b, e), e) for e in out_elems]
        graph = helper.make_graph(
            b.nodes, self.name("loop_body"),
            [self.tinfo(it, (), TensorProto.INT64), self.tinfo(cin, (), TensorProto.BOOL),
             *[self.tinfo(n, s) for n, s in carries]],
            [self.tinfo(c_out, (), TensorProto.BOOL), *[self.tinfo(n, s) for n, s in outs]], b.inits)
        m = {"const": lambda: self.const(g, (), np.array(self.d.int(0, 4), np.int64)),
             "input": lambda: "trips", "none": lambda: ""}[trips]()
        c = {"none": lambda: "", "true": lambda: self.const(g, (), np.array(True)),
             "false": lambda: self.const(g, (), np.array(False)), "input": lambda: "flag",
             "computed": lambda: self.condition(g)}[cond_in]()
        if not m and not c and cond_body != "less":
            raise AssertionError("unbounded loop")
        self.features.append(f"loop(M={trips},cond={cond_in},body_cond={cond_body},out={len(out_elems)})")
        inputs = [m, c] + [self.make(g, s) for s in carry_shapes]
        names = self.node(g, "Loop", inputs, len(outs), body=graph)
        result = list(zip(names, carry_shapes)) + [(n, None) for n in names[len(carry_shapes):]]
        g.pool += result[:len(carry_shapes)]
        self.loop_outs.update(zip(names[len(carry_shapes):], out_elems))
        return result

    # -- the model --------------------------------------------------------------------------------

    def model(self) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        ins = [(f"in{i}", self.shape()) for i in range(self.d.int(1, 3))]
        g = Graph(pool=[*ins, ("flag", "bool")], depth=0)
        outputs: list[tuple[str, object]] = []
        for _ in range(self.d.int(1, 2)):
            kind = self.d.pick(["If", "Scan", "Loop"])
            self.features.append(kind)
            outputs += self.if_(g, self.shape(), merged_ok=True) if kind == "If" else \
                {"Scan": self.scan, "Loop": self.loop}[kind](g)
        out_infos = [self.tinfo(n, (None, *self.loop_outs[n]) if n in self.loop_outs else s) for n, s in dict(outputs).items()]
        graph = helper.make_graph(
            g.nodes, "control_flow",
            [*(self.tinfo(n, s) for n, s in ins), self.tinfo("flag", (), TensorProto.BOOL),
             self.tinfo("trips", (), TensorProto.INT64)], out_infos, g.inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.d.pick([18, 19, 21]))])
        proto.ir_version = 9
        rng = np.random.default_rng(self.d.int(0, 2**16))
        feeds = {n: rng.standard_normal(s).astype(self.dtype) for n, s in ins}
        feeds["flag"] = np.array(self.d.chance(0.5))
        feeds["trips"] = np.array(self.d.int(0, 4), np.int64)
        return proto, feeds


def _broadcasts_to(s, shape: Shape) -> bool:
    if s == "bool":
        return False
    try:
        return np.broadcast_shapes(s, shape) == shape
    except ValueError:
        return False


def _insert(elem: Shape, axis: int, length: int) -> Shape:
    axis %= len(elem) + 1
    return (*elem[:axis], length, *elem[axis:])


def random_model(d: Draw) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[str]]:
    """A model, its feeds and the features it holds."""
    gen = ModelGen(d, d.pick([np.float32, np.float64]))
    proto, feeds = gen.model()
    return proto, feeds, gen.features


RUNS = {"numpy": {"backend": "numpy"}, "ort-all": {"backend": "ort-cpu", "graph_optimization_level": "all"},
        "ort-disable": {"backend": "ort-cpu", "graph_optimization_level": "disable"}}


def outputs(proto: onnx.ModelProto, feeds: dict, run: str) -> dict[str, np.ndarray]:
    """``proto``'s outputs on ``feeds`` in one of ``RUNS`` (a graphc Session), or onnx's reference
    evaluator (``"reference"``)."""
    if run == "reference":
        from onnx.reference import ReferenceEvaluator

        names = [o.name for o in proto.graph.output]
        return dict(zip(names, ReferenceEvaluator(proto).run(None, feeds)))
    import graphc as gc

    return gc.Session(proto, **RUNS[run]).run(feeds)


def differences(want: dict, got: dict, rtol: float = 1e-4, atol: float = 1e-5) -> list[str]:
    """What differs between two runs' outputs: shapes, dtypes, values (worst absolute error)."""
    found = []
    for name, w in want.items():
        g = np.asarray(got.get(name))
        w = np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            found.append(f"{name}: {g.dtype}{list(g.shape)} vs {w.dtype}{list(w.shape)}")
        elif not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            found.append(f"{name}: max abs err {np.max(np.abs(g.astype(np.float64) - w)):.3g}")
    return found


# -- DSL programs: gc.scan / gc.cond / gc.fori_loop with random bodies -------------------------------


_PROGRAM_OPS = {"add": lambda M, a, b: a + b, "sub": lambda M, a, b: a - b, "mul_tanh": lambda M, a, b: a * M.tanh(b),
                "tanh": lambda M, a, b: M.tanh(a), "sin": lambda M, a, b: M.sin(a), "half": lambda M, a, b: a * 0.5}


class Program:
    """A random straight-line body over vectors of one length: each step appends ``op(env[i],
    env[j])`` to the values it can read (``env``); ``run`` gives the value ``out`` picks (a
    body input or an outer value passed straight through when it picks one of those). ``M`` is
    ``graphc`` or numpy, so the same program is captured and is its own float64 oracle."""

    def __init__(self, d: Draw, n_env: int, n_out: int = 1):
        self.steps = [(d.pick(sorted(_PROGRAM_OPS)), d.int(0, n_env + k - 1), d.int(0, n_env + k - 1))
                      for k in range(d.int(0, 3))]
        self.outs = [d.int(0, n_env + len(self.steps) - 1) for _ in range(n_out)]

    def run(self, M, env: list) -> list:
        env = list(env)
        for op, i, j in self.steps:
            env.append(_PROGRAM_OPS[op](M, env[i], env[j]))
        return [env[k] for k in self.outs]


def _np_scan(fn, init, xs):
    carry, ys = init, []
    for x in xs:
        carry, y = fn(carry, x)
        ys.append(y)
    return carry, np.stack(ys) if ys else np.zeros((0, *np.shape(init)))


def _np_fori(lo, hi, fn, init):
    for i in range(lo, hi):
        init = fn(np.float64(i), init)
    return init


class NumpyControl:
    """numpy with the DSL's control flow run as Python loops: a ``DslCase``'s oracle namespace."""

    tanh, sin = staticmethod(np.tanh), staticmethod(np.sin)
    scan = staticmethod(_np_scan)
    fori_loop = staticmethod(_np_fori)

    @staticmethod
    def cond(pred, t, f, *ops):
        return t(*ops) if bool(pred) else f(*ops)

    @staticmethod
    def as_float(i):
        return np.float64(i)


class GraphcControl:
    """graphc's control flow under ``NumpyControl``'s names."""

    def __getattr__(self, name):
        import graphc as gc

        if name == "as_float":
            return lambda i: i.astype("float64")
        return getattr(gc, name)


@dataclass
class DslCase:
    """A random function ``fn(M, w, x)`` of a parameter ``w`` (n,) and an input ``x`` (T, n) made of
    ``gc.scan``, ``gc.cond`` and ``gc.fori_loop`` (nested now and then) with ``Program`` bodies."""

    kind: str
    length: int
    size: int
    programs: list
    inner: str | None
    trips: int

    @staticmethod
    def draw(d: Draw) -> DslCase:
        kind, inner = d.pick(["scan", "cond", "fori"]), d.pick([None, None, "scan", "cond", "fori"])
        # env of a body: (carry, x_t or i, w, outer): 4 values; a scan returns (carry, y)
        programs = [Program(d, 4, 2) for _ in range(3)]
        return DslCase(kind, d.int(0, 3), d.int(1, 3), programs, inner, d.int(0, 3))

    def block(self, M, kind: str, programs: list, w, x, nested: str | None):
        """``kind``'s control flow over ``x`` ((T, n) for a scan; its first row elsewhere)."""
        p, q, r = programs
        outer = w * 0.5

        def body_value(carry, item):
            value = p.run(M, [carry, item, w, outer])[0]
            if nested is not None:
                value = value + self.block(M, nested, [q, r, p], w, x, None)
            return value

        if kind == "scan":
            def step(carry, xt):
                new, y = p.run(M, [carry, xt, w, outer])
                if nested is not None:
                    new = new + self.block(M, nested, [q, r, p], w, x, None)
                return new, y
            carry, ys = M.scan(step, w * 1.0, x)
            return carry + ys.sum(axis=0)
        row = x.sum(axis=0)
        if kind == "cond":
            return M.cond(row.sum() > 0, lambda a: body_value(a, w), lambda a: q.run(M, [a, w, w, outer])[1], row)
        return M.fori_loop(0, self.trips, lambda i, c: body_value(c, M.as_float(i) * w), row)

    def fn(self, M, w, x):
        return self.block(M, self.kind, self.programs, w, x, self.inner)
