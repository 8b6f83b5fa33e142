"""`graphc backends`, `graphc run` and `graphc parity`."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from graphc.cli.app import JSON_OPTION, OUT_ALIAS, app, chosen_output, console, given, output_option, print_json
from graphc.cli.backend_options import backend_options, threads_option
from graphc.cli.interrupted import wrote
from graphc.cli.paths import user_path
from graphc.cli.arrays import fit_bfloat16, load_npy
from graphc.cli.output_files import check_holds_outputs, check_output_file, output_bytes
from graphc.errors import UncalibratedWarning
from graphc.fileio import atomic_write
from graphc.model.quantizers import never_calibrated, uncalibrated


def feed_files(items: list[str]) -> dict[str, Path]:
    """``NAME=FILE.npy`` items -> each input's file."""
    files = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise ValueError(f"bad --input {item!r}; expected NAME=FILE.npy")
        if name in files:
            raise ValueError(f"--input {name!r} given twice; give each input once")
        files[name] = user_path(file)
    return files


def parse_feeds(items: list[str]) -> dict[str, np.ndarray]:
    """``NAME=FILE.npy`` items -> arrays (loaded without pickle)."""
    return {name: load_npy(file, f"--input {name}") for name, file in feed_files(items).items()}


def parse_dims(items: list[str]) -> dict[str, int]:
    """``N=8`` items -> sizes for symbolic dims."""
    dims = {}
    for item in items:
        name, sep, size = item.partition("=")
        if not sep or not size.strip().isdigit():
            raise ValueError(f"bad --dim {item!r}; expected NAME=SIZE, e.g. N=8")
        name = name.strip()
        if name in dims:
            raise ValueError(f"--dim {name} given twice ({name}={dims[name]} and {name}={int(size)}); give each "
                             "dim once")
        dims[name] = int(size)
    return dims


def warn_uncalibrated(model) -> None:
    """An ``UncalibratedWarning`` where ``model`` is a capture whose fake quantizations never saw data: a
    one-off run shows what it computes, and deploy and serve refuse it."""
    names = uncalibrated(model.ir)
    if names:
        warnings.warn(UncalibratedWarning(f"{never_calibrated(names)}; these outputs are what it computes, and "
                                          "graphc deploy and graphc serve refuse it unless --allow-uncalibrated"))


@app.command("backends")
def backends_cmd(as_json: bool = JSON_OPTION) -> None:
    """List the backends and why any cannot run here."""
    import graphc as gc

    if as_json:
        print_json([info.model_dump() for info in gc.backends()])
        return
    table = Table(title="graphc backends")
    for column in ("backend", "available", "device", "reason"):
        table.add_column(column)
    for info in gc.backends():
        table.add_row(info.name, "[green]yes[/]" if info.available else "[red]no[/]", info.device, info.reason)
    console.print(table)


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="The model to run."),
    backend: str = typer.Option("auto", "--backend", "-b", help="numpy, ort-cpu, ort-cuda or auto."),
    inputs: list[str] = typer.Option([], "--input", "-i", metavar="NAME=FILE.npy", help="An input's array, one per "
                                     "input (saved with np.save; for a bfloat16 input, float32, rounded to it)."),
    output: Optional[Path] = output_option("Write the outputs to this file (default: print them): .npz (every "
                                           "output by name), .npy (a model's one output) or .json (dtype, shape "
                                           "and values by name); bfloat16 ones as float32.", "FILE.npz"),
    out: Optional[Path] = OUT_ALIAS,
    threads: Optional[int] = threads_option(),
    workers: int = typer.Option(1, "--workers", min=1, help="Run batches on this many Ray workers (graphc[ray])."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Rows per batch with --workers."),
) -> None:
    """Run a model on a backend with inputs from .npy files.

    Prints the outputs, or saves them with -o to an .npz, .npy or .json file.

    Example:

    \b
    graphc run trained.onnx --input x=x.npy -o out.npz
    """
    from graphc.runtime.session import Session

    read = {"MODEL.onnx": model, **{f"--input {name}": file for name, file in feed_files(inputs).items()}}
    output = chosen_output(output, out, required=False, file="outputs.npz", inputs=read)
    if output is not None:
        check_output_file(output)
    options = backend_options(ctx, backend)
    if given(ctx, "batch_size") and workers == 1:
        raise ValueError(f"--batch-size {batch_size} splits the inputs among --workers; without --workers N (N > 1) "
                         "they run as one batch")
    if workers > 1:
        from graphc.runtime.distributed import map_batches

        from graphc.model import load

        loaded = load(model)
        if output is not None:
            check_holds_outputs(output, loaded.outputs)
        feeds = fit_bfloat16(parse_feeds(inputs), loaded.inputs)
        results = map_batches(model, feeds, backend=backend, batch_size=batch_size, workers=workers, **options)
        ran_on = f"{backend}, {workers} Ray workers"
    else:
        session = Session(model, backend=backend, **options)
        if output is not None:
            check_holds_outputs(output, session.outputs)
        results = session.run(fit_bfloat16(parse_feeds(inputs), session.inputs))
        ran_on, loaded = session.backend, session.model
    warn_uncalibrated(loaded)
    if output is not None:
        wrote(atomic_write(output, output_bytes(output, results)))
        console.print(escape(f"wrote {len(results)} output(s) to {output} (backend {ran_on})"), highlight=False,
                      soft_wrap=True)
        return
    table = Table(title=f"{escape(model.name)} on {ran_on}")
    for column in ("output", "dtype", "shape", "values"):
        table.add_column(column)
    for name, value in results.items():  # escaped: rich reads "[nan inf]" as a markup tag and drops it
        table.add_row(escape(name), str(value.dtype), str(list(value.shape)),
                      escape(np.array2string(value, threshold=8, edgeitems=2, precision=4).replace("\n", " ")))
    console.print(table)


def parity_table(names: list[str], report) -> Table:
    """One row per output and backend, narrow enough for 80 columns: numbers in 3 significant
    digits that never wrap, the dtype and shape under the output's name; notes go below."""
    table = Table(title=f"parity: {' vs '.join(names)} (reference {names[0]})", title_justify="left",
                  box=box.SIMPLE_HEAD)
    table.add_column("output", overflow="fold")
    table.add_column("backend", no_wrap=True)
    for column in ("abs err", "rel err", "rtol", "atol"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("ok", no_wrap=True)
    for d in report.details:
        table.add_row(f"{escape(d.name)}\n[dim]{d.dtype}{list(d.shape)}[/]", d.backend, f"{d.max_abs_err:.3g}",
                      f"{d.max_rel_err:.3g}", f"{d.rtol:.3g}", f"{d.atol:.3g}", "[green]ok[/]" if d.ok else "[red]FAIL[/]")
    return table


@app.command("parity")
def parity_cmd(
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="The model to compare."),
    backends: str = typer.Option("numpy,ort-cpu", "--backends", metavar="NAME,NAME,...", help="Backends to compare, comma-separated; the first is the reference."),
    inputs: list[str] = typer.Option([], "--input", "-i", metavar="NAME=FILE.npy",
                                     help="An input's array; give every input, or none for seeded random feeds."),
    dims: list[str] = typer.Option([], "--dim", metavar="NAME=SIZE",
                                   help="Size of a dim name for the random feeds, e.g. N=8 (repeatable; names not given are 2)."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the random feeds."),
    rtol: Optional[float] = typer.Option(None, "--rtol",
                                         help="Relative tolerance, finite and >= 0 (default: by dtype)."),
    atol: Optional[float] = typer.Option(None, "--atol",
                                         help="Absolute tolerance, finite and >= 0 (default: by dtype)."),
    bisect: bool = typer.Option(False, "--bisect", help="Find the first node whose output diverges."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Compare MODEL's outputs across backends; exit 1 on a mismatch.

    --json prints the report (gc.parity.compare's ParityReport) as one JSON document, its exit
    status the same.

    Example:

    \b
    graphc parity net.onnx --backends numpy,ort-cpu
    """
    from graphc.model import load
    from graphc.runtime import parity
    from graphc.runtime.feeds import random_feeds, required_specs

    loaded = load(model)
    if inputs and dims:
        raise ValueError("--dim sizes the random inputs; with --input the arrays give every size (drop --dim)")
    if inputs:
        feeds = fit_bfloat16(parse_feeds(inputs), loaded.inputs)
    else:
        sizes, specs = parse_dims(dims), required_specs(loaded)
        named = {d for spec in specs for d in (spec.shape or ()) if isinstance(d, str)}
        unknown = sorted(set(sizes) - named)
        if unknown:  # it was ignored, the dim taking the default size
            raise ValueError(f"--dim: the model's inputs have no dim named {', '.join(map(repr, unknown))}; their dim "
                             f"names: {', '.join(sorted(named)) or 'none (every dim is fixed)'}")
        feeds = random_feeds(specs, sizes, seed)
    names = [b.strip() for b in backends.split(",") if b.strip()]
    twice = next((name for i, name in enumerate(names) if name in names[:i]), None)
    if twice is not None:  # compared with itself, it passed
        raise ValueError(f"--backends {backends}: names {twice} twice; name each backend once")
    report = parity.compare(loaded, feeds, backends=names, rtol=rtol, atol=atol, bisect=bisect)
    if as_json:
        print_json(report.model_dump())
        if not report.ok:
            raise typer.Exit(1)
        return
    console.print(parity_table(names, report))
    for d in report.details:
        if not d.ok and d.note:
            console.print(f"[red]MISMATCH[/] {escape(d.name)} on {d.backend}: {escape(d.note)}", highlight=False,
                          soft_wrap=True)
    if bisect:
        console.print(escape(report.bisect_summary()), highlight=False, soft_wrap=True)
    console.print("[green]parity OK[/]" if report.ok else "[red]parity MISMATCH[/]")
    if not report.ok:
        raise typer.Exit(1)
