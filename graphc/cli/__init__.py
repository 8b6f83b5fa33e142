"""`graphc` command line. Each command group lives in its own module; importing registers it."""

from __future__ import annotations

import sys

from rich.markup import escape

from graphc.cli import model_cmds, run_cmds, optimize_cmds, train_cmds, deploy_cmds, view_cmds  # noqa: F401  (register)
from graphc.cli.app import app, err_console, state
from graphc.errors import GraphcError


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: one clear error line and exit 2 for bad input, unless --debug."""
    args = sys.argv[1:] if argv is None else argv
    state["debug"] = "--debug" in args
    try:
        app(args=args, standalone_mode=True)
    except SystemExit:
        raise
    except (GraphcError, ValueError, FileNotFoundError, KeyError, TypeError) as exc:
        if state["debug"]:
            raise
        message = str(exc) if not isinstance(exc, KeyError) else str(exc.args[0])
        err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(message)}", highlight=False, markup=True,
                          soft_wrap=True)
        sys.exit(2)
