"""`graphc optimize`: run the optimization pipeline on an ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import onnx
import typer
from rich.markup import escape
from rich.table import Table

from graphc.cli.app import (OUT_ALIAS, app, check_dtype_options, chosen_onnx_output, console, keep_io_types_option,
                            one_line_warnings, output_option)
from graphc.cli.interrupted import wrote
from graphc.errors import PassError
from graphc.model import load
from graphc.passes.optimize import LEVELS, OptimizeReport, count_nodes

_LEVEL_HELP = "Optimization level, each adding to the one below. " + " ".join(f"{k}: {v}." for k, v in LEVELS.items())


def report_table(report: OptimizeReport) -> Table:
    """The per-pass report as a rich table (one row per pass, summed over fixed-point rounds)."""
    table = Table(title=f"level {report.level}: {report.nodes_before} -> {report.nodes_after} nodes, "
                        f"{report.seconds * 1e3:.1f} ms, {report.rounds} round(s)")
    for column in ("pass", "runs", "changed", "nodes removed", "ms"):
        table.add_column(column, justify="left" if column == "pass" else "right")
    for row in report.by_pass():
        table.add_row(row["pass"], str(row["runs"]), str(row["modified"]), str(row["nodes_removed"]),
                      f"{row['seconds'] * 1e3:.1f}")
    return table


@app.command("optimize")
def optimize_cmd(
    ctx: typer.Context,
    model: Path = typer.Argument(..., metavar="MODEL.onnx",
                                 help="The ONNX model to optimize (never modified unless -o names it)."),
    output: Optional[Path] = output_option("The optimized .onnx file to write (required).", "FILE.onnx"),
    out: Optional[Path] = OUT_ALIAS,
    level: int = typer.Option(2, "-O", "--level", min=0, max=3, help=_LEVEL_HELP),
    report: bool = typer.Option(False, "--report", help="Print what each pass did."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar="float16|bfloat16", help="float16 or bfloat16: convert the optimized "
                                        "model (gc.convert_float; default: keep float32)."),
    keep_io_types: bool = keep_io_types_option(False, ", for clients that send float32."),
) -> None:
    """Optimize MODEL.onnx and write FILE.onnx (-o) atomically.

    An invalid or unsupported model exits with status 2 and writes nothing.

    Example:

    \b
    graphc optimize net.onnx -o net.opt.onnx -O 3 --report
    """
    from graphc.compile.optimize import optimize

    output = chosen_onnx_output(output, out, inputs={"MODEL.onnx": model})
    check_dtype_options(ctx, dtype)
    original = load(model)
    optimized, rep = optimize(original, level, report=True)
    if dtype is not None:
        from graphc.compile.precision import convert_float
        from graphc.passes.precision import RangeWarning

        with one_line_warnings(RangeWarning):
            optimized = convert_float(optimized, dtype, keep_io_types=keep_io_types)
    try:  # never write a model onnx itself would reject
        onnx.checker.check_model(optimized.proto)
    except onnx.checker.ValidationError as exc:
        raise PassError(f"optimize level {level} produced an invalid model; nothing written: "
                        f"{str(exc).strip().splitlines()[0]}") from None
    wrote(optimized.save(output))
    if report:
        console.print(report_table(rep))
    written = count_nodes(optimized.ir)  # --dtype's Casts included
    console.print(escape(f"{model} -> {output}: {rep.nodes_before} -> {written} nodes (level {level}"
                         + (f", {dtype})" if dtype else ")")), highlight=False, soft_wrap=True)
