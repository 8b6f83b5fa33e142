"""Ctrl-C that waits for a consistent state: SIGINT inside a block is raised when the block ends.

The Trainer runs each step and its bookkeeping (params, optimizer state, RNG, step and batch
counters, the epoch's running loss) inside ``DeferredInterrupt``, so a Ctrl-C never leaves them
half updated and the checkpoint saved on it resumes exactly. A second Ctrl-C inside the block
raises at once (the user insists) and marks the state ``torn``: it must not be saved.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["DeferredInterrupt"]


class DeferredInterrupt:
    """Reentrant context manager holding SIGINT until the outermost block ends, then raising
    ``KeyboardInterrupt``; between blocks SIGINT raises at once. Works in the main thread while
    Python's default SIGINT handler is installed (a program with its own handler keeps it);
    elsewhere a no-op. ``armed()`` keeps the handler installed across many blocks: installing
    it costs a system call, a few microseconds, twice per block otherwise."""

    def __init__(self) -> None:
        self._depth = 0
        self._installed = False
        self._owner = False  # this block installed the handler and removes it
        self._pending = False
        self.torn = False  # a second SIGINT cut a block short: its state changes may be partial

    def __enter__(self) -> DeferredInterrupt:
        if self._depth == 0:
            self._owner = self._install()
        self._depth += 1
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._depth -= 1
        if self._depth:
            return False
        if self._owner:
            self._uninstall()
            self._owner = False
        pending, self._pending = self._pending, False
        if pending and exc_type is None:
            raise KeyboardInterrupt
        return False

    @contextmanager
    def armed(self) -> Iterator[DeferredInterrupt]:
        """Install the handler for the whole ``with`` (blocks inside then skip installing it)."""
        owner = self._install()
        try:
            yield self
        finally:
            if owner:
                self._uninstall()

    def _install(self) -> bool:
        if (self._installed or threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return False
        signal.signal(signal.SIGINT, self._handle)
        self._installed = True
        return True

    def _uninstall(self) -> None:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self._installed = False

    def _handle(self, signum, frame) -> None:
        if self._depth == 0:
            raise KeyboardInterrupt
        if self._pending:
            self.torn = True
            raise KeyboardInterrupt
        self._pending = True
