"""`graphc` command line. Each command group lives in its own module; importing registers it."""

from __future__ import annotations

import sys
import warnings

import rich
from rich.markup import escape

from graphc.cli import (  # noqa: F401  (register)
    model_cmds, run_cmds, optimize_cmds, grad_cmds, train_cmds, deploy_cmds, view_cmds)
from graphc.cli.app import app, ends_on_closed_pipe, err_console, print_warning, state, validation_problem
from graphc.errors import GraphcError
from graphc.startup import restore_interrupts


def main(argv: list[str] | None = None) -> None:
    """Console-script entry: one clear error line and exit 2 for bad input, unless --debug; each
    warning one ``warning: ...`` line."""
    restore_interrupts()  # the imports are done: commands get KeyboardInterrupt
    ends_on_closed_pipe(rich.get_console())  # the one `graphc train`'s epoch lines print through
    args = sys.argv[1:] if argv is None else argv
    state["debug"] = "--debug" in args
    try:
        with warnings.catch_warnings():  # restores Python's showwarning when an in-process run ends
            warnings.showwarning = print_warning
            app(args=args, prog_name="graphc", standalone_mode=True)
    except SystemExit:
        raise
    except (GraphcError, ValueError, OSError, KeyError, TypeError, MemoryError) as exc:
        if state["debug"]:
            raise
        message = _one_line(exc)
        err_console.print(f"[bold red]error:[/] {type(exc).__name__}: {escape(message)}", highlight=False, markup=True,
                          soft_wrap=True)
        sys.exit(2)


def _one_line(exc: Exception) -> str:
    """The error's message on one line; a pydantic ``ValidationError`` (a spec no command put in
    its options' words) as each field, what it must be and the value given, not its multi-line
    report with a link."""
    from pydantic import ValidationError

    if isinstance(exc, KeyError):
        return str(exc.args[0])
    if isinstance(exc, ValidationError):
        return f"invalid {exc.title}: " + "; ".join(map(validation_problem, exc.errors()))
    return str(exc)

