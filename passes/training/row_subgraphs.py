"""Where If, Loop and Scan send the batch's rows: their subgraphs are analysed with the same per-op
rules (``row_mixing`` walks them through ``Body``), outer values they capture carrying their Rows.
``SUBGRAPH_RULES`` maps each op type to a rule ``(node, ins, wanted, body) -> outputs' Rows``.

A value not from the batch (None) joined with rows (a branch, or a carried value's initial value and
its value after an iteration) counts as those rows: it is the same on every worker, so a row-wise
consumer treats it alike. Carried values are iterated to a fixed point: each pass turns at most one
more of them from None to Rows, so a body runs at most one pass more than it has carried values.

The batch's positions and size (``row_positions``' facts) are bound into a body as carried values and
scan inputs, as rows are: a position carried unchanged, or sliced along another axis, stays one inside (a
per-row pick there keeps rows apart); one that changes from an iteration or a branch to the next, a Scan
along the positions' own axis (each iteration one row's, its carried values going from row to row) and a
size scanned or stacked mix."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import onnx_ir as ir

from graphc.passes.training.row_axes import Mixes, Rows, norm_axis, rank_of
from graphc.passes.training.row_counts import Counted
from graphc.passes.training.row_positions import Fact, Own

__all__ = ["Body", "SUBGRAPH_RULES"]

# body(attribute, {body input: its Rows}, body outputs) -> those outputs' Rows: one pass of the
# node's subgraph held in ``attribute``, the inner nodes that mix recorded
Body = Callable[[str, Mapping[ir.Value, Fact], Sequence[ir.Value]], list[Fact]]
Ins = Sequence[Fact]
SubgraphRule = Callable[[ir.Node, Ins, Sequence[bool], Body], list[Fact]]


def _text(r: Fact) -> str:
    if not isinstance(r, Rows):
        return "nothing from the batch" if r is None else "the batch's positions or size"
    return f"the rows on axis {r.axis}" + (f" ({r.copies} copies)" if r.copies > 1 else "")


def _join(a: Fact, b: Fact, what: str) -> Fact:
    """Rows joined with None are those rows; a position or size only with itself; a count reported in the
    body (``Counted``) with anything is that count."""
    if a == b or a is None and isinstance(b, Rows) or isinstance(b, Counted):
        return b
    if isinstance(a, Counted):
        return a
    if b is None and isinstance(a, Rows):
        return a
    raise Mixes(f"{what} holds {_text(a)} one way and {_text(b)} the other")


def _graph(node: ir.Node, attribute: str) -> ir.Graph:
    return node.attributes[attribute].value


def _by_rows(node: ir.Node, ins: Ins, index: int, what: str, effect: str) -> None:
    if index < len(ins) and isinstance(ins[index], Rows):
        raise Mixes(f"its {what} {node.inputs[index].name!r} is computed from the batch's rows: {effect}")


def if_rows(node: ir.Node, ins: Ins, wanted: Sequence[bool], body: Body) -> list[Fact]:
    """Both branches analysed; an output gets the rows both agree on."""
    _by_rows(node, ins, 0, "condition", "a shard may take another branch than the whole batch")
    keep = [i for i, w in enumerate(wanted) if w]
    outs: list[Fact] = [None] * len(node.outputs)
    then = body("then_branch", {}, [_graph(node, "then_branch").outputs[i] for i in keep])
    other = body("else_branch", {}, [_graph(node, "else_branch").outputs[i] for i in keep])
    for i, a, b in zip(keep, then, other):
        outs[i] = _join(a, b, f"its output {node.outputs[i].name!r} (then_branch vs else_branch)")
    return outs


def _iterate(body: Body, bound: dict[ir.Value, Fact], carried: Sequence[ir.Value],
             updated: Sequence[ir.Value], init: Ins, also: Sequence[ir.Value]) -> tuple[list, list]:
    """Carried values' Rows at the fixed point from ``init`` (``carried``: the body's inputs for
    them, ``updated``: its outputs), and ``also``'s (more body outputs) there."""
    state = list(init)
    while True:
        got = body("body", {**bound, **dict(zip(carried, state))}, [*updated, *also])
        new = [_join(a, b, f"its carried value {v.name!r} (before an iteration vs after it)")
               for v, a, b in zip(carried, state, got)]
        if new == state:
            return state, got[len(updated):]
        state = new


def _moved(r: Fact, what: str, *, stacked: int | None = None, sliced: int | None = None) -> Fact:
    """``r`` (rows or a position) in a value that stacks it along a new axis ``stacked`` (a Loop's or Scan's
    scanned output), or in a slice along ``sliced`` (a scan input's, an axis not its own)."""
    if r is None or isinstance(r, Counted):
        return r
    if not isinstance(r, Rows) and not (isinstance(r, Own) and r.parts is None):
        raise Mixes(f"{what} holds the batch's size or flat positions, which it cannot follow")
    axis = r.axis + (stacked <= r.axis if stacked is not None else -(sliced < r.axis))
    return replace(r, axis=axis, **({"rows": r.rows and Rows(axis)} if isinstance(r, Own) else {}))


def loop_rows(node: ir.Node, ins: Ins, wanted: Sequence[bool], body: Body) -> list[Fact]:
    """Loop(M, cond, carried...): body(i, cond, carried...) -> (cond, carried..., scanned...); the
    scanned outputs stacked along a new axis 0."""
    effect = "a shard may run another number of iterations than the whole batch"
    _by_rows(node, ins, 0, "trip count", effect)
    _by_rows(node, ins, 1, "condition", effect)
    graph, n = _graph(node, "body"), len(node.inputs) - 2
    scanned = [graph.outputs[1 + n + k] for k, w in enumerate(wanted[n:]) if w]
    state, got = _iterate(body, {}, graph.inputs[2:], graph.outputs[1:1 + n], ins[2:],
                          [graph.outputs[0], *scanned])
    if isinstance(got[0], Rows):
        raise Mixes(f"its body's condition {graph.outputs[0].name!r} is computed from the batch's rows: {effect}")
    rows = iter(got[1:])
    return state + [_moved(next(rows), f"its scanned output {v.name!r}", stacked=0) if w else None
                    for w, v in zip(wanted[n:], node.outputs[n:])]


def scan_rows(node: ir.Node, ins: Ins, wanted: Sequence[bool], body: Body) -> list[Fact]:
    """Scan(carried..., scanned...): each scanned input sliced along its scan axis (which must not
    be the batch's), the body's scanned outputs stacked along their scan output axis."""
    graph = _graph(node, "body")
    m = node.attributes.get_int("num_scan_inputs")
    n = len(node.inputs) - m
    in_axes = node.attributes.get_ints("scan_input_axes", [0] * m)
    out_axes = node.attributes.get_ints("scan_output_axes", [0] * (len(node.outputs) - n))
    bound: dict[ir.Value, Fact] = {}
    for j, (value, r) in enumerate(zip(node.inputs[n:], ins[n:])):
        if r is None:
            continue
        axis = norm_axis(in_axes[j], rank_of(value))
        if axis == getattr(r, "axis", None):
            what = "along its batch axis" if isinstance(r, Rows) else "(the batch's positions) along their axis"
            raise Mixes(f"it scans {value.name!r} {what} {axis}: each iteration sees one row, and its carried values "
                        "go from row to row")
        bound[graph.inputs[n + j]] = _moved(r, f"its scan input {value.name!r}", sliced=axis)
    scanned = [graph.outputs[n + k] for k, w in enumerate(wanted[n:]) if w]
    state, got = _iterate(body, bound, graph.inputs[:n], graph.outputs[:n], ins[:n], scanned)
    rows, outs = iter(got), list(state)
    for k, (w, value) in enumerate(zip(wanted[n:], node.outputs[n:])):
        outs.append(_moved(next(rows), f"its scanned output {value.name!r}",
                           stacked=norm_axis(out_axes[k], rank_of(value)))
                    if w else None)
    return outs


SUBGRAPH_RULES: dict[str, SubgraphRule] = {"If": if_rows, "Loop": loop_rows, "Scan": scan_rows}
