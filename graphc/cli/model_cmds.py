"""`graphc capture` and `graphc inspect`."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from graphc.cli.app import JSON_OPTION, OUT_ALIAS, app, chosen_onnx_output, console, output_option, print_json
from graphc.cli.interrupted import wrote
from graphc.cli.paths import user_path
from graphc.cli.inspect_training import (artifacts_facts, checked_kind, checkpoint_facts, describe_artifacts,
                                        describe_checkpoint, shape_text)
from graphc.errors import GraphcError, InputError, did_you_mean, first_few
from graphc.fileio import missing
from graphc.model import EMITTED_OPSETS


def load_object(target: str) -> Any:
    """``FILE.py:OBJECT`` -> the object (a Module class, a Module instance or a function)."""
    file, sep, obj_name = target.rpartition(":")
    if not sep or not file or not obj_name:
        raise ValueError(f"bad target {target!r}; expected FILE.py:OBJECT, e.g. models/cnn.py:LeNet")
    path = user_path(file)
    if path.is_dir():
        raise InputError(f"{file}: a folder, not a Python file; expected FILE.py:OBJECT, e.g. models/cnn.py:LeNet")
    if not path.is_file():
        raise FileNotFoundError(f"{file}: {missing(path, 'file')}")
    module_name = f"_graphc_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{file}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except GraphcError:
        raise
    except Exception as exc:  # the user's file failed to import: report it as bad input
        raise GraphcError(f"cannot import {file}: {type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(path.resolve().parent))
    obj: Any = module
    for part in obj_name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{file} has no object {obj_name!r}{did_you_mean(part, _public_names(obj))}")
        obj = getattr(obj, part)
    return obj


def _public_names(obj: Any) -> list[str]:
    """The names a user could mean in ``FILE.py:OBJECT`` (not ``_private`` ones); a Module's
    children too, which ``dir`` does not list (``net.fc``)."""
    from graphc.nn import Module

    children = [name for name, _ in obj.named_children()] if isinstance(obj, Module) else []
    return [*children, *(n for n in dir(obj) if not n.startswith("_"))]


def resolve_capturable(obj: Any, name: str) -> Any:
    from graphc.nn import Module

    if isinstance(obj, type) and issubclass(obj, Module):
        try:
            return obj()
        except TypeError as exc:
            raise ValueError(f"{name}: cannot build the Module with no arguments ({exc}); "
                             "export an instance or a function instead") from exc
    if isinstance(obj, Module) or callable(obj):
        return obj
    raise ValueError(f"{name} is a {type(obj).__name__}; expected a Module class, a Module instance or a function")


@app.command("capture")
def capture_cmd(
    target: str = typer.Argument(..., metavar="FILE.py:OBJECT",
                                 help="A Module class, a Module instance or a function in FILE.py."),
    inputs: list[str] = typer.Option(..., "--input", "-i", metavar="NAME:DTYPE[DIM,...]",
                                     help="An input spec, e.g. x:float32[N,784]; one per parameter of forward "
                                     "(or of the function), named as there."),
    output: Optional[Path] = output_option("The .onnx file to write (required).", "FILE.onnx"),
    out: Optional[Path] = OUT_ALIAS,
    opset: int = typer.Option(21, "--opset", help="The ai.onnx opset to write (17..23)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the parameter initialisation."),
    training: Optional[bool] = typer.Option(None, "--training/--eval", help="Capture training-mode (or eval-mode) "
                                            "Dropout/BatchNorm; neither: each module's own train()/eval() mode."),
    name: Optional[str] = typer.Option(None, "--name", help="Graph name (default: the class or function name)."),
) -> None:
    """Capture a DSL model into an ONNX file.

    Example (net.py holds a class Net with forward(self, x)):

    \b
    graphc capture net.py:Net --input x:float32[N,64] -o net.onnx
    """
    import graphc as gc
    from graphc.dsl.capture import check_input_names
    from graphc.dsl.sources import on_behalf_of
    from graphc.model.dtypes import parse_spec

    output = chosen_onnx_output(output, out, inputs={"FILE.py": user_path(target.rpartition(":")[0])})
    if opset not in EMITTED_OPSETS:
        raise InputError(f"--opset {opset}: graphc captures ai.onnx opsets {EMITTED_OPSETS[0]} to {EMITTED_OPSETS[-1]}")
    specs = {}
    for text in inputs:
        sp = parse_spec(text)
        if sp.name in specs:
            raise ValueError(f"input {sp.name!r} given twice")
        specs[sp.name] = sp
    fn = resolve_capturable(load_object(target), target)
    check_input_names(fn, list(specs))
    start = time.perf_counter()
    with on_behalf_of(f"graphc capture {target}"):  # graphc's modules' nodes' source; FILE.py's code names its lines
        model = gc.capture(fn, name=name, opset=opset, seed=seed, training=training, **specs)
    elapsed = time.perf_counter() - start
    wrote(model.save(output))
    console.print(f"captured [bold]{escape(model.name)}[/] in {elapsed * 1000:.0f} ms: {len(model.ir.graph)} nodes, "
                  f"opset {opset} -> {escape(str(output))}", highlight=False, soft_wrap=True)


def _spec_table(title: str, specs: list, complex_names: frozenset[str]) -> Table:
    """The inputs or outputs; a complex one (``graphc.complex_io``) as the complex value it holds,
    its pair in the last column."""
    from graphc.model.complex_io import complex_spec
    from graphc.model.dtypes import type_text

    table = Table(title=title, title_justify="left")
    for column in ("name", "dtype", "shape", *(["held as"] if complex_names else [])):
        table.add_column(column)
    for s in specs:
        pair = s.name in complex_names
        shown = complex_spec(s) if pair else s
        table.add_row(escape(s.name), shown.dtype, escape(shape_text(shown.shape)),
                      *([escape(f"{type_text(s.dtype, s.shape)} real pair") if pair else ""] if complex_names else []))
    return table


def _complex_note(complex_inputs: frozenset[str], complex_outputs: frozenset[str]) -> str:
    """What a model's complex inputs and outputs mean for the commands (empty: it has none)."""
    if not (complex_inputs or complex_outputs):
        return ""
    return ("complex inputs and outputs are held as [..., 2] real pairs (real, imaginary): graphc run takes a complex "
            ".npy (or the pair) and writes complex arrays; graphc serve and deploy triton take and give the pairs")


# checked_kind -> (what it is, in words; its facts; their description)
_TRAINING_KINDS = {"artifacts": ("training artifacts", artifacts_facts, describe_artifacts),
                   "checkpoint": ("a checkpoint", checkpoint_facts, describe_checkpoint)}


@app.command("inspect")
def inspect_cmd(
    model_path: Path = typer.Argument(..., metavar="MODEL.onnx|ARTIFACT_DIR|CHECKPOINT",
                                      help="The model, training artifacts or checkpoint to describe."),
    dims: list[str] = typer.Option([], "--dim", metavar="NAME=SIZE", help="Size of a dim name of the model for "
                                   "the FLOPs estimate, e.g. N=64 (repeatable; names not given count as 1)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Describe a model: inputs, outputs, ops, parameters, FLOPs.

    Shows the opset, the op histogram, parameter counts and bytes, and the FLOPs of MatMul,
    Gemm and Conv nodes for the dim sizes given with --dim. Training artifacts (graphc grad
    -o DIR): the loss, optimizer, batch inputs, params and graphs; a checkpoint (graphc train
    --checkpoint DIR): its step, epochs, data, backend and seed, then its artifacts. --json: the
    same description as one JSON document.

    Example:

    \b
    graphc inspect net.onnx --dim N=32
    """
    import graphc as gc
    from graphc.cli.run_cmds import parse_dims
    from graphc.model.complex_io import complex_names
    from graphc.model.inspection import flops_estimate, op_histogram, param_stats

    kind = checked_kind(model_path)
    if kind is not None:
        what, facts_of, describe = _TRAINING_KINDS[kind]
        if dims:
            raise ValueError(f"--dim sizes a model's FLOPs estimate, and {model_path} is {what}: inspect one of its "
                             ".onnx graphs with --dim")
        facts = facts_of(model_path)
        if as_json:
            print_json(facts)
        else:
            describe(facts, console)
        return
    sizes = parse_dims(dims)
    model = gc.load(model_path)
    estimate = flops_estimate(model, sizes)  # an unknown dim name fails before anything is printed
    if as_json:
        print_json(_model_json(model, model_path, sizes, estimate))
        return
    opsets = ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in model.ir.opset_imports.items())
    console.print(f"[bold]{escape(model.name)}[/]  ({escape(str(model_path))})  opset: {opsets}  ir_version {model.ir_version}  "
                  f"producer: {model.ir.producer_name or '?'}", highlight=False, soft_wrap=True)
    complex_inputs, complex_outputs = complex_names(model.ir.metadata_props)
    console.print(_spec_table("inputs", model.inputs, complex_inputs))
    console.print(_spec_table("outputs", model.outputs, complex_outputs))
    if note := _complex_note(complex_inputs, complex_outputs):
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    hist = op_histogram(model.ir.graph)
    ops_table = Table(title=f"ops ({sum(hist.values())} nodes)", title_justify="left")
    ops_table.add_column("op")
    ops_table.add_column("count", justify="right")
    for op, n in hist.most_common():
        ops_table.add_row(escape(op), str(n))
    console.print(ops_table)
    elems, nbytes = param_stats(model)
    console.print(f"parameters: {elems:,} elements, {nbytes:,} bytes in "
                  f"{len(model.ir.graph.initializers)} initializers", highlight=False)
    used = [f"{k}={v}" for k, v in sizes.items()] + [f"{k}=1" for k in estimate.defaulted]
    console.print(f"estimated FLOPs ({', '.join(used) or 'every dim fixed'}):", highlight=False)
    flops_table = Table()
    flops_table.add_column("op")
    flops_table.add_column("FLOPs", justify="right")
    for op, n in sorted(estimate.by_op.items()):
        flops_table.add_row(escape(op), f"{n:,}")
    flops_table.add_row("[bold]total[/]", f"[bold]{estimate.total:,}[/]")
    console.print(flops_table)
    for note in _flops_notes(estimate):
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)


def _model_json(model, path: Path, sizes: dict[str, int], estimate) -> dict:
    """What `graphc inspect MODEL.onnx` prints, as `--json` writes it (shapes as lists: a dim is a
    number, a name or null)."""
    from graphc.model.complex_io import complex_names, complex_spec
    from graphc.model.inspection import op_histogram, param_stats

    elems, nbytes = param_stats(model)
    hist = op_histogram(model.ir.graph)
    complex_inputs, complex_outputs = complex_names(model.ir.metadata_props)

    def specs(values: list, complex_ones: frozenset[str]) -> list[dict]:
        """Each as the file holds it; ``complex``: the complex value its pair holds (null for the others)."""
        return [{"name": s.name, "dtype": str(s.dtype), "shape": s.shape,
                 "complex": {"dtype": (c := complex_spec(s)).dtype, "shape": c.shape} if s.name in complex_ones
                 else None} for s in values]

    return {"name": model.name, "path": str(path),
            "opsets": {domain or "ai.onnx": version for domain, version in model.ir.opset_imports.items()},
            "ir_version": model.ir_version, "producer": model.ir.producer_name or None,
            "inputs": specs(model.inputs, complex_inputs), "outputs": specs(model.outputs, complex_outputs),
            "nodes": sum(hist.values()), "ops": dict(hist.most_common()),
            "parameters": {"elements": elems, "bytes": nbytes, "initializers": len(model.ir.graph.initializers)},
            "flops": {"dims": {**sizes, **{name: 1 for name in estimate.defaulted}}, "by_op": dict(sorted(estimate.by_op.items())),
                      "total": estimate.total, "defaulted": estimate.defaulted, "independent": estimate.independent,
                      "unknown": estimate.unknown}}


def _flops_notes(estimate) -> list[str]:
    notes = []
    if estimate.defaulted:
        notes.append(f"dim(s) {', '.join(estimate.defaulted)} not given (--dim NAME=SIZE): counted as 1")
    if estimate.independent:
        notes.append(f"the FLOPs estimate does not depend on {', '.join(estimate.independent)}: "
                     "no counted node's shape follows it")
    if estimate.unknown:
        notes.append(f"{len(estimate.unknown)} MatMul/Gemm/Conv node(s) with shapes shape inference cannot "
                     f"tell are not counted: {first_few(estimate.unknown, 5, more=', ...')}")
    return notes
