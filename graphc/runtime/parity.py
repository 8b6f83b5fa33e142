"""`gc.parity.compare`: run one model on several backends and compare every output.

    report = gc.parity.compare(model, {"x": x}, backends=("numpy", "ort-cpu"), bisect=True)
    report.ok, report.outputs["logits"].max_abs_err, report.first_divergence

The first backend is the reference. An element agrees when ``|got - ref| <= atol + rtol * |ref|``
(NaNs agree with NaNs); integers and booleans must be equal. With ``bisect=True`` every
intermediate value becomes a graph output, all backends run that copy, and the values are
compared in topological order: the first node whose output disagrees is where the backends part.
An If, Loop, Scan or local-function call found so is entered (``parity_descent``), and the node
finally named is run alone on the reference's inputs (``Divergence.differs_alone``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from pydantic import BaseModel, computed_field

from graphc.model import Model, load, node_label
from graphc.model.dtypes import FLOAT_DTYPES
from graphc.runtime.feeds import dtype_name

# dtype -> (rtol, atol). Integers and booleans compare exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (5e-2, 1e-2),
}


def check_tolerances(rtol: float | None, atol: float | None) -> None:
    """Raise ``ValueError`` naming ``rtol`` or ``atol`` when it is given but not a finite number
    >= 0 (a NaN tolerance lets every comparison pass, a negative one fails every comparison)."""
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def tolerances(dtype: str, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """The (rtol, atol) used for ``dtype``; explicit values (checked by ``check_tolerances``) win
    over the defaults."""
    check_tolerances(rtol, atol)
    default_rtol, default_atol = DEFAULT_TOLERANCES.get(dtype, (0.0, 0.0))
    return (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


class OutputDiff(BaseModel):
    """One value of one backend compared with the reference backend."""

    name: str
    backend: str
    dtype: str
    shape: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float  # |got - ref| / max(|ref|, atol): values near zero do not blow it up
    mismatched: int  # elements outside the tolerance
    rtol: float
    atol: float
    ok: bool
    note: str = ""


class Scope(BaseModel):
    """A node bisect entered on its way to a divergence: an If (its taken branch), a Loop or Scan
    (one iteration of its body) or a model-local function call (its body, inlined)."""

    node: str
    index: int | None = None
    op_type: str
    source: str | None
    entered: str  # "then_branch (cond True)", "body, iteration 2", "function local.Gate"

    def __str__(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"{node_label(self.node, self.index)} ({self.op_type}){where}, {self.entered}"


class Divergence(BaseModel):
    """The first node (in topological order) whose output differs between backends; ``index``: its
    position in its graph, set for a node without a name. Inside a subgraph or function, ``within``
    lists the nodes entered to reach it, outermost first."""

    node: str
    index: int | None = None
    op_type: str
    source: str | None
    output: str
    backend: str
    max_abs_err: float
    max_rel_err: float
    mismatched: int
    within: list[Scope] = []
    # run alone on the reference backend's values of its inputs, does the node still differ? None: not
    # checked (an If/Loop/Scan/call, or a sequence input)
    differs_alone: bool | None = None
    inside: str = ""  # the node's subgraphs or local function, where the difference is made, when not entered
    note: str = ""  # why bisect stopped at this If/Loop/Scan/call, or what its own run showed

    def __str__(self) -> str:
        within = "".join(f"{scope} > " for scope in self.within)
        where = f" at {self.source}" if self.source else ""
        alone = {None: "", True: "; run alone on the reference's inputs it differs too",
                 False: "; run alone on the reference's inputs it agrees: differences in its inputs, within "
                        "tolerance, grow through it"}[self.differs_alone]
        note = f"; {self.note}" if self.note else ""
        return (f"{within}{node_label(self.node, self.index)} ({self.op_type}){where}: output {self.output!r} differs "
                f"on {self.backend} (max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}, "
                f"{self.mismatched} elements outside tolerance){alone}{note}")


class ParityReport(BaseModel):
    """Outputs of ``backends[1:]`` compared with ``backends[0]``."""

    backends: list[str]
    outputs: dict[str, OutputDiff]  # per output: the worst backend
    details: list[OutputDiff]  # every (output, backend) pair
    bisected: bool = False
    compared_values: int = 0  # with bisect: intermediate values compared
    first_divergence: Divergence | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.details)

    @property
    def reference(self) -> str:
        return self.backends[0]

    def __str__(self) -> str:
        lines = [f"parity {' vs '.join(self.backends)}: {'OK' if self.ok else 'MISMATCH'}"]
        for d in self.details:
            lines.append(f"  {d.name} [{d.backend}] {d.dtype}{list(d.shape)}: max abs {d.max_abs_err:.3g}, "
                         f"max rel {d.max_rel_err:.3g} (rtol {d.rtol:g}, atol {d.atol:g}) "
                         f"{'ok' if d.ok else 'MISMATCH'}{' ' + d.note if d.note else ''}")
        if self.bisected:
            lines.append(f"  {self.bisect_summary()}")
        return "\n".join(lines)

    def bisect_summary(self) -> str:
        """The bisect's finding in one line, saying when it does not explain the outputs."""
        found = self.first_divergence
        if found is None and not self.ok:
            found = ("none found, yet the outputs differ: every value agrees when the intermediate values are "
                     "outputs too, so a backend computes differently when they are not (a graph optimization "
                     "such as a fusion, which exposing them turns off; try graph_optimization_level='disable') "
                     "or a kernel is not deterministic")
        elif found is None:
            found = "none, every intermediate value agrees"
        elif self.ok:
            found = f"{found}; masked downstream: the outputs agree"
        return f"first divergence ({self.compared_values} values compared): {found}"


def diff(name: str, backend: str, ref: np.ndarray, got: np.ndarray,
         rtol: float | None = None, atol: float | None = None) -> OutputDiff:
    """Compare ``got`` with the reference ``ref`` under the tolerances of ``ref``'s dtype."""
    ref, got = np.asarray(ref), np.asarray(got)
    dtype = dtype_name(ref.dtype)
    rt, at = tolerances(dtype, rtol, atol)
    base = {"name": name, "backend": backend, "dtype": dtype, "shape": ref.shape, "rtol": rt, "atol": at}
    if ref.shape != got.shape or ref.dtype != got.dtype:
        note = f"got {dtype_name(got.dtype)}{list(got.shape)}, reference {dtype}{list(ref.shape)}"
        return OutputDiff(**base, max_abs_err=float("inf"), max_rel_err=float("inf"),
                          mismatched=max(ref.size, got.size), ok=False, note=note)
    if dtype not in FLOAT_DTYPES:
        bad = int(np.count_nonzero(ref != got))
        err = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64)))) if bad else 0.0
        return OutputDiff(**base, max_abs_err=err, max_rel_err=0.0 if not bad else float("inf"),
                          mismatched=bad, ok=bad == 0)
    r, g = ref.astype(np.float64), got.astype(np.float64)
    both_nan = np.isnan(r) & np.isnan(g)
    with np.errstate(invalid="ignore", over="ignore"):
        same = both_nan | (r == g)  # r == g also holds for equal infinities
        err = np.where(same, 0.0, np.abs(g - r))
        err = np.where(np.isnan(err), np.inf, err)
        rel = err / np.maximum(np.abs(r), at if at > 0 else np.finfo(np.float64).tiny)
        rel = np.where(same, 0.0, np.where(np.isnan(rel), np.inf, rel))  # NaN agreeing with NaN: no error
        # a NaN or an infinity only agrees with itself
        bad = int(np.count_nonzero(~same & (~np.isfinite(r) | ~np.isfinite(g) | (err > at + rt * np.abs(r)))))
    return OutputDiff(**base, max_abs_err=float(err.max(initial=0.0)), max_rel_err=float(rel.max(initial=0.0)),
                      mismatched=bad, ok=bad == 0)


def compare(model: Any, feeds: Mapping[str, Any], backends: Sequence[str] = ("numpy", "ort-cpu"),
            rtol: float | None = None, atol: float | None = None, bisect: bool = False,
            **options: Any) -> ParityReport:
    """Run ``model`` on every backend in ``backends`` and compare with the first.

    Args:
        model: a ``gc.Model``, a path, bytes or ``ModelProto``.
        feeds: input name -> array (checked like ``Session.run`` does).
        rtol, atol: override the per-dtype defaults of ``DEFAULT_TOLERANCES``; finite, >= 0.
        bisect: also find the first node whose output diverges (``report.first_divergence``).
        **options: Session options for every backend (e.g. ``graph_optimization_level``).

    Raises:
        BackendUnavailable: a backend in ``backends`` cannot run here.
        InputError: the feeds do not match the model's inputs.
        ValueError: fewer than two backends, or a tolerance that is NaN, infinite or negative.
    """
    from graphc.runtime.session import Session

    check_tolerances(rtol, atol)
    backends = list(backends)
    if len(backends) < 2:
        raise ValueError(f"parity needs at least two backends, got {backends}")
    model = load(model)
    results = {b: tensors(Session(model, backend=b, **options).run(feeds)) for b in backends}
    details = [diff(name, b, results[backends[0]][name], results[b].get(name, np.array([])), rtol, atol)
               for b in backends[1:] for name in results[backends[0]]]
    worst: dict[str, OutputDiff] = {}
    for d in details:
        current = worst.get(d.name)
        if current is None or (current.ok, -current.max_abs_err) > (d.ok, -d.max_abs_err):
            worst[d.name] = d
    report = ParityReport(backends=backends, outputs=worst, details=details)
    if bisect:
        report.bisected = True
        from graphc.runtime.parity_descent import locate
        report.compared_values, report.first_divergence = locate(model, feeds, backends, rtol, atol, options)
    return report


def tensors(outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Outputs as tensors: a sequence output ``s`` becomes ``s[0]``, ``s[1]``, ... (a backend whose
    sequence is shorter then misses the later names, which ``diff`` reports as a shape change)."""
    flat: dict[str, np.ndarray] = {}
    for name, value in outputs.items():
        if isinstance(value, (list, tuple)):
            flat.update({f"{name}[{i}]": np.asarray(v) for i, v in enumerate(value)})
        else:
            flat[name] = value
    return flat


def expose_intermediates(model: Model) -> tuple[Model, list[tuple[onnx.NodeProto, list[str]]]]:
    """A copy of ``model`` whose every intermediate value is also a graph output, and the nodes in
    topological order with the values of each that can be compared.

    A value keeps the type onnx's shape inference finds; one it leaves without a shape (a Loop's
    output) or without a type is exposed all the same, unchecked (the backends type it as they
    run), since a value left out would move a divergence there to a later node."""
    proto = model.proto
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        inferred = proto
    graph = inferred.graph
    typed = {vi.name: vi for vi in [*graph.value_info, *graph.output]
             if not (vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == 0)}
    exposed = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in exposed:
                proto.graph.output.append(typed.get(name, onnx.ValueInfoProto(name=name)))
                exposed.add(name)
    steps = [(node, [o for o in node.output if o in exposed]) for node in proto.graph.node]
    # onnx's checker wants a shape on every graph output; the model was checked when it was loaded
    return load(ir.serde.deserialize_model(proto)), [(node, names) for node, names in steps if names]
