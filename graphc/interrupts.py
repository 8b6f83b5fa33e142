"""Ctrl-C that waits for a consistent state: SIGINT inside a block is raised when the block ends.

The Trainer runs each step and its bookkeeping (params, optimizer state, RNG, step and batch
counters, the epoch's running loss) inside ``DeferredInterrupt``, so a Ctrl-C never leaves them
half updated and the checkpoint saved on it resumes exactly. A second Ctrl-C inside the block
raises at once (the user insists) and marks the state ``torn``: it must not be saved.
"""

from __future__ import annotations

import signal
import threading

__all__ = ["DeferredInterrupt"]


class DeferredInterrupt:
    """Reentrant context manager holding SIGINT until the outermost block ends, then raising
    ``KeyboardInterrupt``. Only in the main thread and while Python's default SIGINT handler is
    installed (a program with its own handler keeps it); elsewhere a no-op."""

    def __init__(self) -> None:
        self._depth = 0
        self._installed = False
        self._pending = False
        self.torn = False  # a second SIGINT cut a block short: its state changes may be partial

    def __enter__(self) -> DeferredInterrupt:
        self._depth += 1
        if (self._depth == 1 and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGINT, self._hold)
            self._installed = True
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._depth -= 1
        if self._depth or not self._installed:
            return False
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._installed = False
        pending, self._pending = self._pending, False
        if pending and exc_type is None:
            raise KeyboardInterrupt
        return False

    def _hold(self, signum, frame) -> None:
        if self._pending:
            self.torn = True
            raise KeyboardInterrupt
        self._pending = True
