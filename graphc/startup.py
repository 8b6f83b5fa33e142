"""Ctrl-C while the ``graphc`` command is still starting up (importing graphc, typer, onnx):
one line and exit 130 where Python would print a traceback of the import under way.

``graphc/__init__.py`` calls ``quiet_interrupts`` before its own imports; it acts only in the
``graphc`` console script's process (its ``__main__`` is the script named ``graphc``), and
``graphc.cli.main`` gives SIGINT back to Python's handler once the imports are done.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path


def _interrupted(signum, frame) -> None:
    sys.stderr.write("graphc: interrupted\n")
    raise SystemExit(130)  # unwinds the imports under way, no traceback


def quiet_interrupts() -> None:
    """In the ``graphc`` command, a SIGINT until ``restore_interrupts`` exits 130 with one line."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    if (Path(main_file).stem == "graphc" and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _interrupted)


def restore_interrupts() -> None:
    """Python's KeyboardInterrupt again, where ``quiet_interrupts`` replaced it."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
