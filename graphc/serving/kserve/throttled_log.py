"""A logger that tells a warning at most once per interval, with how many were left out since."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

# Seconds between two logged warnings of one kind about what a client sent (uvicorn logs one line per
# request its parser refuses: 42 bytes of log for an 11-byte request). Logged each time, 1,560 such
# requests filled a 64 KiB stdout pipe its reader did not drain and the event loop blocked writing,
# every connection with it.
WARNING_INTERVAL = 60.0


class ThrottledLog:
    """A logger whose warnings (what uvicorn's connections log about what a client sent: a request
    its parser refuses, an upgrade it does not take) go out at most once per ``WARNING_INTERVAL``
    seconds per message, with how many were left out since; ``flush`` (at shutdown) logs the
    counts still untold; other calls pass through."""

    def __init__(self, logger: logging.Logger):
        self._logger = logger
        # message -> (when logged, left out since, the last left-out call's args)
        self._last: dict[str, tuple[float, int, tuple[Any, ...]]] = {}

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        logged, left_out, _ = self._last.get(msg, (-math.inf, 0, ()))
        if now - logged < WARNING_INTERVAL:
            self._last[msg] = (logged, left_out + 1, args)
            return
        self._log(msg, now, logged, left_out, *args, **kwargs)

    def flush(self) -> None:
        """Log each message left out since it was last logged (its last args, no traceback), with
        how many times."""
        now = time.monotonic()
        for msg, (logged, left_out, args) in list(self._last.items()):
            if left_out:
                self._log(msg, now, logged, left_out, *args)

    def _log(self, msg: str, now: float, logged: float, left_out: int, *args: Any, **kwargs: Any) -> None:
        self._last[msg] = (now, 0, ())
        more = f" ({left_out} more in the last {now - logged:.0f} s)" if left_out else ""
        self._logger.warning(f"{msg}{more}", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)
