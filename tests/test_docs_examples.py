"""The code examples in README.md and docs/*.md are true (the convention is in docs/architecture.md,
"Examples in the docs").

* A ```python block runs as a whole script in an empty folder, unless an HTML comment on the line
  before it says what it is: `<!-- not-run: why -->` (a fragment), `<!-- excerpt: FILE -->` (a quote
  of FILE: its lines, `...` lines aside, are FILE's lines in order) or `<!-- needs: MODULE -->`
  (skipped when MODULE is not installed).
* In every other block, a `graphc ...` line parses as that command with those options,
  `.venv/bin/python scripts/X.py --flag` names a script that takes `--flag`, and `make X` a target.
* In the prose, a `graphc COMMAND ... --flag` code span names options COMMAND has.

tests/test_readme.py also runs the README's shell walkthrough line by line.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
MARK = re.compile(r"<!--\s*([\w-]+):\s*(.*?)\s*-->\s*\Z")  # <!-- not-run: why -->, excerpt: FILE, needs: MODULE


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    code: str
    mark: str = ""  # "not-run", "excerpt" or "needs"
    arg: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"


def blocks(pages=PAGES) -> list[Block]:
    """Every fenced block of ``pages`` with the marker on the line before it, if any."""
    found = []
    for page in pages:
        text = page.read_text()
        for m in FENCE.finditer(text):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                               *(mark.groups() if mark else ())))
    return found


PYTHON = [b for b in blocks() if b.lang == "python"]
SHELL = [b for b in blocks() if b.lang == ""]


def run_block(block: Block, folder: Path, monkeypatch) -> None:
    """Run a python block as a script whose working directory is ``folder``."""
    monkeypatch.chdir(folder)
    exec(compile(block.code, f"{block.page}:{block.line}", "exec"), {"__name__": "__main__"})


def excerpt_mismatch(block: Block) -> str | None:
    """The first line of an excerpt block that its file does not have (in order), else None."""
    source = [line.strip() for line in (ROOT / block.arg).read_text().splitlines()]
    at = 0
    for quoted in (line.strip() for line in block.code.splitlines()):
        if quoted.startswith("...") or not quoted:
            continue
        try:
            at = source.index(quoted, at) + 1
        except ValueError:
            return quoted
    return None


def test_every_python_block_is_run_or_marked():
    assert PYTHON, "no python blocks found"
    for block in PYTHON:
        assert block.mark in ("", "not-run", "excerpt", "needs"), f"{block.id}: unknown marker {block.mark!r}"
        assert block.mark != "not-run" or block.arg, f"{block.id}: say why it is not run"
        assert block.mark != "excerpt" or (ROOT / block.arg).is_file(), f"{block.id}: no file {block.arg}"


@pytest.mark.parametrize("block", [b for b in PYTHON if b.mark in ("", "needs")], ids=lambda b: b.id)
def test_python_example_runs(block: Block, tmp_path, monkeypatch):
    if block.mark == "needs":
        pytest.importorskip(block.arg)
    run_block(block, tmp_path, monkeypatch)


@pytest.mark.parametrize("block", [b for b in PYTHON if b.mark == "excerpt"], ids=lambda b: b.id)
def test_python_excerpt_quotes_its_file(block: Block):
    missing = excerpt_mismatch(block)
    assert missing is None, f"{block.id} quotes {block.arg}, which has no line {missing!r} (in this order)"


def _command(words: list[str]) -> None:
    """Parse a `graphc ...` line's words: click raises a UsageError for an unknown command or option."""
    import typer

    from graphc.cli import app

    command, name, args = typer.main.get_command(app), "graphc", [w for w in words if w != "--debug"]
    while hasattr(command, "commands"):
        name, *args = args
        assert name in command.commands, f"graphc has no command {name!r}"
        command = command.commands[name]
    command.make_context(name, args)


def _shell_lines(block: Block):
    for line in block.code.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            yield words


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.id)
def test_shell_block_names_real_commands_scripts_and_options(block: Block):
    for words in _shell_lines(block):
        if words[0] == "graphc":
            _command(words[1:])  # raises click's UsageError for an unknown command or option
        elif words[0] == "make":
            targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
            assert words[1] in targets, f"{block.id}: the Makefile has no target {words[1]!r}"
        elif words[0].endswith("python") and words[1].startswith("scripts/"):
            script = ROOT / words[1]
            assert script.is_file(), f"{block.id}: {words[1]} does not exist"
            source = script.read_text()
            flags = [w.split("=")[0] for w in words[2:] if w.startswith("--")]
            unknown = [flag for flag in flags if f'"{flag}"' not in source]
            assert unknown == [], f"{block.id}: {words[1]} takes no {unknown}"


SPAN = re.compile(r"`(graphc [a-z][^`]*)`")


def _leaf_options() -> dict[tuple[str, ...], set[str]]:
    """Command words -> every option of that `graphc` command."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from cli_reference import commands
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return {tuple(words): {f for p in command.params for f in (*p.opts, *p.secondary_opts) if f.startswith("-")}
            for words, command in commands()}


def test_graphc_options_named_in_the_prose_exist():
    """`graphc train ... --tensorboard runs` in a sentence or table names an option `graphc train` has."""
    options = _leaf_options()
    wrong = []
    for page in PAGES:
        for span in SPAN.findall(FENCE.sub("", page.read_text())):
            words = span.split()
            command = next((c for c in sorted(options, key=len, reverse=True) if words[1:1 + len(c)] == list(c)), None)
            if command is None:
                continue
            flags = set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(words[1 + len(command):])))
            wrong += [f"{page.name}: `{span}`: {flag}" for flag in flags - options[command] - {"--debug", "--help"}]
    assert wrong == [], "options these commands do not have:\n" + "\n".join(wrong)


def test_a_broken_example_fails(tmp_path, monkeypatch):
    """The checks can fail: a wrong name in a runnable block, a changed line in an excerpt."""
    runnable = next(b for b in PYTHON if b.mark == "" and "gc.capture(" in b.code)
    broken = Block(runnable.page, runnable.line, "python", runnable.code.replace("gc.capture(", "gc.captur("))
    with pytest.raises(AttributeError, match="captur"):
        run_block(broken, tmp_path, monkeypatch)
    quote = next(b for b in PYTHON if b.mark == "excerpt")
    first = next(line for line in quote.code.splitlines() if line.strip() and not line.strip().startswith("..."))
    assert excerpt_mismatch(Block(quote.page, quote.line, "python", quote.code.replace(first, first + " + 1"),
                                  "excerpt", quote.arg)) == (first + " + 1").strip()


def test_an_unknown_option_in_a_shell_line_fails():
    with pytest.raises(Exception, match="No such option: --no-such-flag"):
        _command(["train", "arts", "--data", "d.npz", "--epochs", "1", "--batch-size", "2", "--no-such-flag"])
