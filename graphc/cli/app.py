"""The typer app every `graphc` command registers on, and the one-line error policy.

Exit codes: 0 success, 1 a check failed (commands raise ``typer.Exit(1)``), 2 bad usage or
bad input (any ``GraphcError``, ``ValueError``, ``FileNotFoundError``).
"""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    name="graphc",
    help="Capture, optimize, differentiate, train, run and deploy ONNX graphs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
deploy_app = typer.Typer(help="Write a model into an inference server's repository.", no_args_is_help=True)
app.add_typer(deploy_app, name="deploy")

console = Console()
err_console = Console(stderr=True)
state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors.")) -> None:
    state["debug"] = debug
