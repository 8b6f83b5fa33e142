"""Print the `graphc` command reference in Markdown, read from the typer app itself.

    .venv/bin/python scripts/cli_reference.py                 # print it
    .venv/bin/python scripts/cli_reference.py --write docs/api.md

``--write`` replaces the text between the ``<!-- cli-reference:start -->`` and
``<!-- cli-reference:end -->`` markers of that file, so the reference in docs/api.md is exactly
what ``graphc COMMAND --help`` says. tests/test_docs.py checks that every command and option is
there.
"""

from __future__ import annotations

import sys
from pathlib import Path

START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def commands():
    """(command words, click command) for every leaf command of the `graphc` app, in help order."""
    import typer

    from graphc.cli import app

    def walk(command, words):
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            yield words, command
            return
        for name, sub in subcommands.items():
            yield from walk(sub, [*words, name])

    yield from walk(typer.main.get_command(app), [])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param) -> str:
    if param.required or param.default in (None, (), []) or param.is_flag and param.default is False:
        return ""
    if param.is_flag:
        return f"`{param.opts[0] if param.default else (param.secondary_opts or ['off'])[0]}`"
    return f"`{param.default}`"


def reference() -> str:
    """The Markdown reference: one section per command with its usage line, arguments and options,
    each value named by the word ``--help`` shows."""
    import typer

    from graphc.cli.help_layout import argument_word

    lines = []
    for words, command in commands():
        usage = " ".join(["graphc", *words, *command.collect_usage_pieces(typer.Context(command))])
        summary = _cell((command.help or "").strip().split("\n\n")[0])
        lines += [f"#### `{' '.join(['graphc', *words])}`", "", summary, "", f"`{usage}`", ""]
        rows = []
        for p in command.params:
            if p.param_type_name == "argument":
                rows.append((_cell(f"`{argument_word(p)}` (argument)"), "", "yes", "", _cell(p.help or "")))
            else:
                flags = " / ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
                help_text = _cell(p.help or "")
                if p.multiple and "repeatable" not in help_text:
                    help_text += " (repeatable)"
                value = "" if p.is_flag or p.count else _cell(f"`{p.metavar}`")
                rows.append((flags, value, "yes" if p.required else "", _default(p), help_text))
        if rows:
            lines += ["| argument / option | value | required | default | meaning |", "| --- | --- | --- | --- | --- |"]
            lines += [f"| {' | '.join(row)} |" for row in rows]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write(path: Path) -> None:
    text = path.read_text()
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"{path}: no {START} ... {END} markers to write between")
    path.write_text(f"{head}{START}\n{reference()}{END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write(Path(sys.argv[2]))
    elif len(sys.argv) == 1:
        sys.stdout.write(reference())
    else:
        raise SystemExit(__doc__)
