"""How `graphc --help` names values: a word per value (``--epochs N``, ``ARTIFACT_DIR``), not
typer's type placeholders (``--epochs <int range>``, ``{ARTIFACT_DIR}``, ``ARTIFACT_DIR <path>``);
and the command class that does so, which also names a refused value and says Ctrl-C's line.
Help, ``--version`` and completion scripts print while the command line is parsed, before any
command runs: parsing too ends on a closed standard output with exit 141 (``interrupted``), not
click's exit 1. A usage error (a missing argument, an unknown option or command, a refused value)
is one line, exit 2, as graphc's other errors: ``error: MESSAGE (graphc train -h: the usage)``,
not click's usage line, hint, blank line and error."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer._click.exceptions import UsageError  # typer 0.29's own click: typer.BadParameter's base
from typer.core import TyperCommand, TyperGroup

from graphc.cli.interrupted import said_when_interrupted
from graphc.cli.paths import user_paths

# The word an option's value gets by the type it converts to, where the option names none.
METAVARS = {"int": "N", "float": "X", "str": "NAME", "Path": "PATH"}


def argument_word(param: Any) -> str:
    """An argument's word: its metavar or upper-cased name, ``...`` after one taking several."""
    return (param.metavar or param.name.upper()) + ("..." if param.nargs != 1 else "")


class OneLineUsageError(UsageError):
    """A usage error printed as graphc prints its errors: ``error: MESSAGE`` on one line (exit 2)."""

    def show(self, file: Any = None) -> None:
        typer.echo(f"error: {self.format_message()}", err=True)


@contextmanager
def one_line_usage_error() -> Iterator[None]:
    """A ``UsageError`` raised inside said in one line: its message and where the usage is."""
    try:
        yield
    except OneLineUsageError:  # a command's, passing through its group
        raise
    except UsageError as exc:
        where = f" ({exc.ctx.command_path} -h: the usage)" if exc.ctx is not None else ""
        raise OneLineUsageError(exc.format_message() + where) from None


class ParsingEndsOnClosedPipe:
    """A click command whose parsing (the eager ``--help`` and ``--version`` print there) is cut
    short like its run: Ctrl-C in one line (exit 130), a closed standard output silently (exit
    141); a usage error in one line."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        with said_when_interrupted(), one_line_usage_error():
            return super().make_context(*args, **kwargs)


def refusing_empty(param: Any, process: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``param``'s ``process_value`` (``process``), an empty value (``-o ""``, ``-o "$UNSET"``) refused as a usage
    error: converted, it was the path ``.``, the current folder (`graphc grad m.onnx -o ""` wrote
    its artifacts there)."""

    def process_value(ctx: typer.Context, value: Any) -> Any:
        if value == "":
            raise typer.BadParameter("an empty path (an unset shell variable?); give a path", ctx=ctx, param=param)
        return process(ctx, value)

    return process_value


class PlainHelpGroup(ParsingEndsOnClosedPipe, TyperGroup):
    """`graphc` and `graphc deploy`: their help and ``--version`` end on a closed pipe as commands
    do; an unknown command is one line."""

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> Any:
        with one_line_usage_error():
            return super().resolve_command(ctx, args)


class PlainHelpCommand(ParsingEndsOnClosedPipe, TyperCommand):
    """A command whose usage line and help name each value by a word: an option's own metavar, else
    ``METAVARS``' word for its type; an argument bare in the usage line when required, in brackets
    when not (click's form); an empty path refused (``refusing_empty``). Ctrl-C in it prints one
    line and exits 130."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "option" and param.metavar is None and not (param.is_flag or param.count):
                param.metavar = METAVARS.get(param.bare_type(), "VALUE")
            if param.bare_type() == "Path":
                param.process_value = refusing_empty(param, param.process_value)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        """Click's parsing, each path's ``~`` expanded (``paths.user_paths``); a value typer's
        pydantic check refused is named in the error (``Invalid value for '--epochs': Input should
        be greater than or equal to 1 (got '0')``), which typer's message leaves out."""
        from pydantic import ValidationError

        try:
            rest = super().parse_args(ctx, args)
        except typer.BadParameter as exc:
            if isinstance(exc.__cause__, ValidationError) and exc.__cause__.errors():
                exc.message = f"{exc.message} (got {exc.__cause__.errors()[0]['input']!r})"
            raise
        ctx.params = {name: user_paths(value) for name, value in ctx.params.items()}
        return rest

    def invoke(self, ctx: typer.Context) -> Any:
        """The command, a Ctrl-C inside said in one line (``interrupted``)."""
        with said_when_interrupted():
            return super().invoke(ctx)

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        arguments = [p for p in self.get_params(ctx) if p.param_type_name == "argument"]
        words = [argument_word(p) if p.required else f"[{argument_word(p)}]" for p in arguments]
        return [self.options_metavar, *words] if self.options_metavar else words

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:  # an argument's record is "WORD <type>": the word alone
                name = argument_word(param) if param.param_type_name == "argument" else record[0]
                sections[param.param_type_name].append((name, record[1]))
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            if sections[kind]:
                with formatter.section(title):
                    formatter.write_dl(sections[kind])


class GraphcTyper(typer.Typer):
    """A ``typer.Typer`` whose commands are ``PlainHelpCommand`` unless one names its own ``cls``,
    the group itself a ``PlainHelpGroup``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, cls=PlainHelpGroup, **kwargs)

    def command(self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any) -> Any:
        return super().command(*args, cls=cls or PlainHelpCommand, **kwargs)
