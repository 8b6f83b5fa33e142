"""The pass runner: run a level's passes to a fixed point and record what each one did."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence

import onnx_ir as ir

from graphc.errors import PipelineError

__all__ = ["SUBGRAPH_OPS", "Declared", "LibraryPass", "OptimizeReport", "PassRecord", "Pipeline", "PipelineError",
           "all_nodes", "count_nodes"]


# ai.onnx ops with graph attributes; a custom-domain node is searched for them too.
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def all_nodes(graph: ir.Graph) -> list[ir.Node]:
    """Every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies), parents first. Like
    onnx-ir's RecursiveGraphIterator, but it looks for subgraphs only in the ops that can have
    them, which makes it several times faster (it runs before and after every pass)."""
    nodes: list[ir.Node] = []
    stack = [graph]
    while stack:
        for node in stack.pop():
            nodes.append(node)
            if node.op_type in SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
                for attr in node.attributes.values():
                    if attr.type == ir.AttributeType.GRAPH:
                        stack.append(attr.value)
                    elif attr.type == ir.AttributeType.GRAPHS:
                        stack.extend(attr.value)
    return nodes


def count_nodes(model: ir.Model) -> int:
    """Nodes in the main graph and every subgraph (If/Loop/Scan bodies)."""
    return len(all_nodes(model.graph))


class Declared:
    """What a pass tells the ``Pipeline`` about itself (the defaults assume nothing):
    ``name`` (the report's), ``effect`` (a name for the only kind of change it makes),
    ``ignores`` (effects that cannot enable it), ``idempotent`` (a second run right after
    itself changes nothing) and ``structural`` (False: its ``modified`` flag says nothing about
    the node list, e.g. a sort; then only a changed node count counts as a change)."""

    name: str | None = None
    effect: str | None = None
    ignores: frozenset[str] = frozenset()
    idempotent: bool = False
    structural: bool = True


class LibraryPass(Declared, ir.passes.InPlacePass):
    """A library pass used as it is, with what the ``Pipeline`` should know of it."""

    def __init__(self, inner: ir.passes.PassBase, name: str, *, effect: str | None = None,
                 ignores: frozenset[str] = frozenset(), idempotent: bool = False, structural: bool = True):
        super().__init__()
        self.inner, self.name, self.effect = inner, name, effect
        self.ignores, self.idempotent, self.structural = ignores, idempotent, structural

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return self.inner(model)


_UNDECLARED = Declared()


def declared(p: ir.passes.PassBase) -> Declared:
    """``p``'s declarations: ``p`` itself when it is ``Declared``, else the defaults."""
    return p if isinstance(p, Declared) else _UNDECLARED


def pass_name(p: ir.passes.PassBase) -> str:
    return declared(p).name or type(p).__name__


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """One run of one pass: which round of the fixed-point loop, node counts, seconds."""

    name: str
    round: int
    nodes_before: int
    nodes_after: int
    seconds: float
    modified: bool


@dataclasses.dataclass
class OptimizeReport:
    """What an optimization run did; ``gc.optimize(..., report=True)`` returns one."""

    level: int
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0
    rounds: int = 0
    records: list[PassRecord] = dataclasses.field(default_factory=list)

    def by_pass(self) -> list[dict]:
        """One row per pass name, in first-run order: runs, nodes removed, total seconds."""
        rows: dict[str, dict] = {}
        for r in self.records:
            row = rows.setdefault(r.name, {"pass": r.name, "runs": 0, "modified": 0,
                                           "nodes_removed": 0, "seconds": 0.0})
            row["runs"] += 1
            row["modified"] += int(r.modified)
            row["nodes_removed"] += r.nodes_before - r.nodes_after
            row["seconds"] += r.seconds
        return list(rows.values())

    def __str__(self) -> str:
        lines = [f"level {self.level}: {self.nodes_before} -> {self.nodes_after} nodes in "
                 f"{self.seconds * 1e3:.1f} ms ({self.rounds} rounds)"]
        for row in self.by_pass():
            change = f"{-row['nodes_removed']:+d}" if row["nodes_removed"] else "0"  # a rewrite may add nodes
            lines.append(f"  {row['pass']:<36} runs {row['runs']:>2}  nodes {change:<6}"
                         f" {row['seconds'] * 1e3:8.1f} ms")
        return "\n".join(lines)


def _interface(model: ir.Model) -> tuple[list[str], list[str]]:
    return [v.name for v in model.graph.inputs], [v.name for v in model.graph.outputs]


@contextlib.contextmanager
def _quiet_libraries():
    """onnx-ir/onnxscript log a warning for every initializer a pass leaves alone on purpose
    (graph inputs are never deduplicated or folded); with no logging configured Python prints
    each to stderr. The report says what happened, so they are muted while a pipeline runs."""
    loggers = [logging.getLogger(name) for name in ("onnx_ir", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class Pipeline:
    """Runs ``loop`` passes in rounds until none can change
    anything more (at most ``max_rounds``), then ``finish`` passes (one that is also in
    ``loop``, the same instance, only if something changed since it last ran idle); both again
    while a finish pass's change can enable a loop pass. Every in-place pass runs on the same model.

    A loop pass is skipped while nothing that could enable it changed since it last ran idle.
    By default any change by any pass counts; a pass may narrow that with three attributes:
    ``effect`` (a name for the only kind of change it makes), ``ignores`` (effects that cannot
    enable it) and ``idempotent`` (a second run right after itself changes nothing), which a
    ``Declared`` pass declares. Skipping a pass is always sound; a wrong declaration can only
    leave a rewrite undone.

    After each pass the graph's input and output names are checked against the start: a pass
    that renames or drops one is a bug in that pass and raises ``PipelineError`` naming it.
    """

    def __init__(self, loop: Sequence[ir.passes.PassBase], finish: Sequence[ir.passes.PassBase] = (),
                 max_rounds: int = 8):
        self.loop = list(loop)
        self.finish = list(finish)
        self.max_rounds = max_rounds

    @property
    def pass_names(self) -> list[str]:
        return [pass_name(p) for p in [*self.loop, *self.finish]]

    def run(self, model: ir.Model, report: OptimizeReport) -> ir.Model:
        with _quiet_libraries():
            return self._run(model, report)

    def _run(self, model: ir.Model, report: OptimizeReport) -> ir.Model:
        start = time.perf_counter()
        nodes = all_nodes(model.graph)
        report.nodes_before = len(nodes)
        # The node count after every pass: with no subgraph in the model it is the main graph's
        # length (O(1)); no pass creates an If/Loop/Scan body (folding may only inline one).
        flat = len(nodes) == len(model.graph)
        count = (lambda m: len(m.graph)) if flat else count_nodes
        interface = _interface(model)
        # A pass runs only while "dirty": something changed since it last ran idle that can
        # enable it. A pass that modifies the model dirties every other pass, except those
        # that declare its ``effect`` in their ``ignores`` (e.g. CSE cannot be enabled by dead
        # nodes going away), and itself unless it is ``idempotent``. With no declarations this
        # is "rerun everything after any change"; the loop ends when no pass is dirty.
        dirty = [True] * len(self.loop)
        in_loop = {id(p): i for i, p in enumerate(self.loop)}

        def changed_by(i: int | None, p) -> None:
            effect = declared(p).effect
            for j, q in enumerate(self.loop):
                if j != i and (effect is None or effect not in declared(q).ignores):
                    dirty[j] = True
            if i is not None and not declared(p).idempotent:
                dirty[i] = True

        # Loop to a fixed point, then the finish; a finish pass's change may enable a loop pass (constants lifted to
        # initializers, deduplicated, let CSE merge the Reshapes that read them), so the loop and the finish run
        # again until the finish leaves no loop pass dirty (at most ``max_rounds`` rounds in all).
        round_ = 0
        while True:
            while self.loop and round_ < self.max_rounds:
                round_ += 1
                report.rounds = round_
                for i, p in enumerate(self.loop):
                    if not dirty[i]:
                        continue
                    dirty[i] = False
                    model, modified = self._run_one(p, model, round_, interface, report, count)
                    if modified:
                        changed_by(i, p)
                if not any(dirty):
                    break
            # A finish pass that is also a loop pass (the same instance) is skipped unless dirty.
            for p in self.finish:
                i = in_loop.get(id(p))
                if i is not None and not dirty[i]:
                    continue
                model, modified = self._run_one(p, model, report.rounds + 1, interface, report, count)
                if i is not None:
                    dirty[i] = False
                if modified:
                    changed_by(i, p)
            if not any(dirty) or round_ >= self.max_rounds:
                break
        report.nodes_after = count(model)
        report.seconds = time.perf_counter() - start
        return model

    @staticmethod
    def _run_one(p, model, round_, interface, report, count=count_nodes):
        before = report.records[-1].nodes_after if report.records else report.nodes_before
        t0 = time.perf_counter()
        result = p(model)
        seconds = time.perf_counter() - t0
        model = result.model
        if _interface(model) != interface:
            raise PipelineError(
                f"pass {pass_name(p)} changed the graph interface from {interface} to "
                f"{_interface(model)}; pass developer: graph inputs/outputs must keep their names")
        after = count(model)
        # Some library passes report modified=True when they only re-ran (``structural=False``
        # marks them: for those only the node count tells), and onnxscript's rewriter removes
        # dead nodes on the side without reporting it: a changed node count always counts.
        modified = (bool(result.modified) and declared(p).structural) or after != before
        report.records.append(PassRecord(pass_name(p), round_, before, after, seconds, modified))
        return model, modified
