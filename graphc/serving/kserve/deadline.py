"""A request's stop signal: a ``CancelToken`` the event loop cancels when the request's time
limit (``--request-timeout``) passes or when its client disconnects. Cancelling stops the model's
run (numpy: before its next node; onnxruntime: ``RunOptions.terminate``) and a wait for the
model's lock, so the worker thread and the lock are free again; a request past its limit then
gets a 504 naming the model and the limit (a disconnected client gets nothing: nobody reads it).

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
    """Cancelled ``seconds`` from now (by the event loop's timer; None: no time limit) or when the
    client disconnects (``disconnect``)."""

    __slots__ = ("seconds", "expires", "disconnected")

    def __init__(self, seconds: float | None):
        super().__init__()
        self.seconds, self.disconnected = seconds, False
        self.expires = None if seconds is None else time.monotonic() + seconds

    def disconnect(self) -> None:
        """The client is gone: stop the run, its reply has no reader."""
        self.disconnected = True
        self.cancel()

    def remaining(self) -> float:
        """Seconds left; -1 without a time limit (``Lock.acquire``'s "wait for ever")."""
        return -1 if self.expires is None else max(0.0, self.expires - time.monotonic())

    def exceeded(self, model: str, why: str) -> ProtocolError:
        """The error of a request to ``model`` stopped by its token; ``why`` says where: a 504 at
        its deadline; after a disconnect, a 400 that no one reads."""
        if self.disconnected:
            return ProtocolError(f"the client disconnected while its request to model {model!r} was under way; "
                                 f"the run was stopped ({why})")
        return ProtocolError(f"model {model!r} did not answer within the server's limit of {self.seconds:g} s for "
                             f"one request (--request-timeout); {why}", 504)
