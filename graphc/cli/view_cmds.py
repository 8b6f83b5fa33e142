"""`graphc view`: a picture of a model or training graph."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from graphc.cli.app import OUT_ALIAS, app, chosen_output, console, output_option
from graphc.cli.interrupted import wrote


@app.command("view")
def view_cmd(
    model: Path = typer.Argument(..., metavar="MODEL.onnx|ARTIFACT_DIR|CHECKPOINT",
                                 help="A model or a training graph (train_step.onnx, ...); training artifacts or a "
                                      "checkpoint: their train_step graph."),
    output: Optional[Path] = output_option("Write the picture here: .svg, or .html with a legend (default: open "
                                           "netron when it is installed, else write MODEL.html in the current "
                                           "directory).", "FILE.svg|FILE.html"),
    out: Optional[Path] = OUT_ALIAS,
) -> None:
    """Draw a model's graph as SVG/HTML, or open it in netron.

    Gradient nodes of training graphs are marked with the forward node each comes from. Training
    artifacts (graphc grad -o DIR) or a checkpoint (graphc train --checkpoint DIR) show the train_step
    graph; pass another of their .onnx files to see it.

    Example:

    \b
    graphc view net.onnx -o net.svg
    """
    from graphc.cli import view
    from graphc.cli.inspect_training import checked_kind, train_step_file
    from graphc.model import load

    kind = checked_kind(model)
    if kind is not None:
        given, model = model, train_step_file(model, kind)
        console.print(escape(f"{'training artifacts' if kind == 'artifacts' else 'checkpoint'} {given}: showing "
                             f"its train_step graph {model}"), highlight=False, soft_wrap=True)
    output = chosen_output(output, out, required=False, file="graph.svg")
    if output is None:
        try:
            import netron
        except ImportError:
            output = Path(model.stem + ".html")
        else:
            load(model)  # a missing, folder or corrupt MODEL is an error line, not a netron page
            console.print(escape(f"opening {model} in netron; Ctrl-C stops it"), highlight=False, soft_wrap=True)
            netron.start(str(model))
            netron.wait()
            return
    wrote(view.write(model, output))
    console.print(escape(f"wrote {output}"), highlight=False, soft_wrap=True)
