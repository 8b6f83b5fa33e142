"""Ctrl-C while the ``graphc`` command is still importing at start-up: one line and exit 130,
no traceback. The SIGINT comes deterministically: a ``sitecustomize`` sends it to the process
when ``graphc.model`` (imported by ``graphc/__init__.py``) is first looked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_HOOK = """
import os, signal, sys

class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["INTERRUPT_AT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _Interrupt())
"""

# the console script pip writes for ``graphc = "graphc.cli:main"``
_SCRIPT = """import sys
from graphc.cli import main
if __name__ == '__main__':
    sys.argv[0] = sys.argv[0].removesuffix('.exe')
    sys.exit(main())
"""


def _run(tmp_path: Path, script: str, interrupt_at: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(_HOOK)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / script).write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "INTERRUPT_AT": interrupt_at}
    return subprocess.run([sys.executable, str(tmp_path / "bin" / script), "--help"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("interrupt_at", ["graphc.model", "typer", "graphc.cli.deploy_cmds"])
def test_ctrl_c_while_the_command_imports_exits_130_with_one_line(tmp_path: Path, interrupt_at):
    done = _run(tmp_path, "graphc", interrupt_at)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "graphc: interrupted\n"
    assert done.stdout == ""


def test_ctrl_c_guard_only_in_the_graphc_command(tmp_path: Path):
    # another program importing graphc keeps Python's KeyboardInterrupt
    done = _run(tmp_path, "other", "graphc.model")
    assert done.returncode != 130 and "KeyboardInterrupt" in done.stderr


def test_the_command_runs_when_not_interrupted(tmp_path: Path):
    done = _run(tmp_path, "graphc", "no.such.module")
    assert done.returncode == 0 and "Usage" in done.stdout, done.stderr
