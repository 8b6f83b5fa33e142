"""A request's time limit (``--request-timeout``): a ``CancelToken`` the event loop cancels when
the limit passes, which stops the model's run (numpy: before its next node; onnxruntime:
``RunOptions.terminate``) and a wait for the model's lock, so the worker thread and the lock are
free again; the request then gets a 504 naming the model and the limit.

The limit counts from when the request's body is in (receiving it is ``--read-timeout``'s): a
wait for a worker thread, decoding, a wait for the model (the numpy backend runs one request of a
model at a time), the run. Writing the reply is not stopped (``--max-reply-bytes`` bounds it).
"""

from __future__ import annotations

import time

from graphc.backends.cancel import CancelToken
from graphc.serving.kserve.protocol import ProtocolError

# TorchServe's default_response_timeout: long legitimate runs (a large batch on the numpy
# backend) keep working, a run that never ends holds its thread and model for two minutes at most.
DEFAULT_REQUEST_TIMEOUT = 120.0


class Deadline(CancelToken):
    """``seconds`` from now; ``cancel`` is called when they pass (by the event loop's timer)."""

    __slots__ = ("seconds", "expires")

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds, self.expires = seconds, time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self.expires - time.monotonic())

    def exceeded(self, model: str, why: str) -> ProtocolError:
        """The 504 of a request to ``model`` stopped at its deadline; ``why`` says where."""
        return ProtocolError(f"model {model!r} did not answer within the server's limit of {self.seconds:g} s for "
                             f"one request (--request-timeout); {why}", 504)
