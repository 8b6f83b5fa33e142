"""The typer app every `graphc` command registers on, and the one-line error policy.

Exit codes: 0 success, 1 a check failed (commands raise ``typer.Exit(1)``), 2 bad usage or
bad input (any ``GraphcError``, ``ValueError``, ``FileNotFoundError``).

Help is click's plain layout (``rich_markup_mode=None``): flags are listed without a value
placeholder (typer's rich panels print ``<bool>`` beside every flag, ``--help`` included, as if
it took a value), and the columns wrap cleanly at 80 characters. Each value is named by a word
(``--epochs N``, ``ARTIFACT_DIR``: ``help_layout``), not typer's ``<int range>`` placeholders.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

from graphc.cli.help_layout import GraphcTyper
from graphc.cli.paths import check_not_a_loop, check_not_an_input, check_not_stdout, check_onnx_name
from graphc.errors import InputError, did_you_mean

app = GraphcTyper(
    name="graphc",
    help="Capture, optimize, differentiate, train, run and deploy ONNX graphs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # the commands' contexts inherit it
)
deploy_app = GraphcTyper(help="Write a model into an inference server's repository.", no_args_is_help=True,
                         rich_markup_mode=None)
app.add_typer(deploy_app, name="deploy")


def ends_on_closed_pipe(rich_console: Console) -> Console:
    """``rich_console``, a closed standard output (``graphc inspect m.onnx | head -1``) in it made
    a ``BrokenPipeError`` for the command to end on (``interrupted.said_when_interrupted``: exit
    141), not rich's ``SystemExit(1)``, the code of a failed check."""

    def on_broken_pipe() -> None:
        raise BrokenPipeError

    rich_console.on_broken_pipe = on_broken_pipe  # rich's hook, set per console: rich's global one too
    return rich_console


console = ends_on_closed_pipe(Console())
err_console = ends_on_closed_pipe(Console(stderr=True))
state = {"debug": False}


def _print_version(value: bool) -> None:
    """``--version``: ``graphc X.Y.Z`` on stdout, exit 0, before any command is looked for."""
    if value:
        from graphc.version import __version__

        typer.echo(f"graphc {__version__}")
        raise typer.Exit()


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug/--no-debug", help="Show full tracebacks on errors."),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print graphc's version and exit.")) -> None:
    state["debug"] = debug


JSON_OPTION = typer.Option(False, "--json", help="Print the result as one JSON document on stdout (for scripts) "
                           "instead of tables and lines.")


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (``json_text``)."""
    typer.echo(json_text(data))


def json_text(data: Any, indent: Optional[int] = 2) -> str:
    """``data`` as JSON, each level indented by ``indent`` (None: on one line), no markup or colour;
    a non-finite float (an inf error) written as the string ``"inf"``, ``"-inf"`` or ``"nan"``,
    which strict JSON parsers read."""
    import json
    import math

    def finite(value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {key: finite(v) for key, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(data), indent=indent, allow_nan=False)


def output_option(help: str, metavar: str = "PATH") -> Any:
    """``-o/--output``, the one name every command gives what it writes. ``--out`` is its alias:
    declare ``out: Optional[Path] = OUT_ALIAS`` beside it and call ``chosen_output``."""
    return typer.Option(None, "-o", "--output", metavar=metavar, help=help)


OUT_ALIAS = typer.Option(None, "--out", hidden=True, help="Alias of -o/--output.")


def allow_uncalibrated_option(verb: str) -> Any:
    """``--allow-uncalibrated``: ``verb`` (Write, Serve) fake quantizations that never saw data."""
    return typer.Option(False, "--allow-uncalibrated", help=f"{verb} fake quantizations whose observers never saw "
                        "data (scales as built: 1.0 unless set by hand).")


def keep_io_types_option(default: bool, why: str) -> Any:
    """``--keep-io-types/--no-keep-io-types``, defaulting as the API the command calls does;
    ``why`` ends the help. Call ``check_dtype_options`` in the command."""
    return typer.Option(default, "--keep-io-types/--no-keep-io-types",
                        help=f"With --dtype: float32 inputs and outputs stay float32 (Casts at the edges){why}")


def check_dtype_options(ctx: typer.Context, dtype: Optional[str]) -> None:
    """Refuse up front a ``--dtype`` graphc cannot convert to (found after the work, a warning
    before it: `graphc export`'s untrained weights), and ``--keep-io-types``/``--no-keep-io-types``
    given without ``--dtype``: without a conversion it would do nothing."""
    from graphc.compile.precision import TARGETS

    if dtype is not None and dtype not in TARGETS:
        raise InputError(f"--dtype {dtype}: graphc converts to {' or '.join(sorted(TARGETS))}"
                         f"{did_you_mean(dtype, TARGETS)}")
    if dtype is None and given(ctx, "keep_io_types"):
        flag = "--keep-io-types" if ctx.params["keep_io_types"] else "--no-keep-io-types"
        raise ValueError(f"{flag} says how --dtype converts the model's inputs and outputs, and no --dtype "
                         "was given: add --dtype float16 or bfloat16, or leave it out")


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the option ``name`` (its parameter name) was on the command line, not defaulted.
    By the source's name: typer carries its own copy of click, whose ``ParameterSource`` is not
    ``click.core``'s."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def check_writable_at(path: Path, option: str, file: Optional[str] = None, folder: bool = False,
                      inputs: Optional[dict[str, Path]] = None) -> None:
    """Refuse up front an output ``path`` that cannot be written: one under a file (its folders
    cannot be made); where a file is written (``file``: an example name, ``model.onnx``) a folder,
    where a ``folder`` is, a file; ``-`` and a looping link (``paths``); one of the command's
    ``inputs`` (``paths.check_not_an_input``). Found only when writing, that failed `graphc train
    --plot` after the whole run, ``--log`` after its first epoch, and named no option; and one in
    a folder the user may not write in (a file is replaced there, a folder's files are written
    into it)."""
    check_not_stdout(path, option, "folder" if folder else "file")
    check_not_a_loop(path, option)
    check_not_an_input(path, option, inputs or {})
    if file is not None and path.is_dir():
        raise InputError(f"{option} {path}: a folder, not a file; expected a file path such as {path / file}")
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{option} {path}: a file, not a folder; expected a folder (made where missing)")
    for place in (path, *path.parents) if folder else path.parents:  # the nearest first
        if place.exists():
            if not place.is_dir():
                raise InputError(f"{option} {path}: {place} is a file, not a folder")
            if not os.access(place, os.W_OK | os.X_OK):
                raise InputError(f"{option} {path}: no permission to write in the folder {place}")
            return


def chosen_output(output: Optional[Path], out: Optional[Path], default: Optional[Path] = None,
                  required: bool = True, file: Optional[str] = None, folder: bool = False,
                  inputs: Optional[dict[str, Path]] = None) -> Optional[Path]:
    """The path given by ``-o/--output`` or its alias ``--out`` (not two different ones), else
    ``default``; with neither and no default, an error when ``required``. ``file`` (an example name
    for the error) or ``folder``: what the command writes there; ``inputs``: what it reads, never
    overwritten (``check_writable_at``)."""
    if output is not None and out is not None and output != out:
        raise ValueError(f"-o/--output {output} and --out {out} name two outputs; --out is an alias of "
                         "--output: give one")
    chosen = output if output is not None else out if out is not None else default
    if chosen is None and required:
        raise ValueError("missing option -o/--output: where to write the result")
    if chosen is not None:
        check_writable_at(chosen, "-o/--output", file, folder, inputs)
    return chosen


def chosen_onnx_output(output: Optional[Path], out: Optional[Path], inputs: dict[str, Path]) -> Path:
    """``chosen_output`` for a command writing one ONNX model: a file whose name ends in ``.onnx``
    (``paths.check_onnx_name``), refused before any work."""
    chosen = chosen_output(output, out, file="model.onnx", inputs=inputs)
    check_onnx_name(chosen, "-o/--output")
    return chosen


@contextmanager
def naming_opset(opset: Optional[int]) -> Iterator[None]:
    """An ``OpsetError`` inside said as ``--opset N: ...`` where the user gave ``--opset``."""
    from graphc.compile.opsets import OpsetError

    try:
        yield
    except OpsetError as exc:
        if opset is None:
            raise
        raise OpsetError(f"--opset {opset}: {exc}") from None


@contextmanager
def one_line_warnings(*categories: type[Warning],
                      rewrite: Optional[Callable[[Warning], Warning | str]] = None) -> Iterator[None]:
    """Each warning of ``categories`` raised inside printed to stderr as ``warning: MESSAGE``, one
    line, every time (not Python's file:line form, shown once per place); each message passed
    through ``rewrite`` where given (in a command's words)."""
    with warnings.catch_warnings(record=True) as caught:
        for category in categories:
            warnings.simplefilter("always", category)
        try:
            yield
        finally:
            for warning in caught:
                print_warning(warning.message if rewrite is None else rewrite(warning.message))


def print_warning(message: Warning | str, *_) -> None:
    """``warning: MESSAGE`` on stderr, one line; takes ``warnings.showwarning``'s arguments, so
    `graphc` shows every warning so (not Python's file:line form quoting graphc's source)."""
    err_console.print(f"[bold yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def validation_problem(error: dict, where: str = "") -> str:
    """One error of a pydantic ``ValidationError`` on one line: ``WHERE: what is wrong (got
    VALUE)``, WHERE the field's path unless given; a validator's own ValueError without pydantic's
    ``Value error,`` prefix."""
    message = error["msg"].removeprefix("Value error, ")
    where = where or ".".join(map(str, error["loc"]))
    got = "" if not error["loc"] or f"got {error['input']!r}" in message else f" (got {error['input']!r})"
    return f"{where}: {message}{got}" if where else message
