"""What a client makes `graphc serve` log: uvicorn warns once per request its HTTP parser refuses
(42 bytes of log for 11 bytes sent), so a stream of them filled a stdout pipe its reader did not
drain (about 1,560 requests for 64 KiB) and the event loop blocked writing to it, every connection
with it; such warnings are logged at most once per ``WARNING_INTERVAL`` seconds each, and at
shutdown once more with how many were left out (before, a burst's count was never told unless the
same warning came again after the interval)."""

from __future__ import annotations

import re
import signal
import socket

import onnx

from serve_util import mixed_model, read_reply, serve_process

REQUESTS = 300


def test_malformed_requests_are_answered_logged_once_and_counted_at_shutdown(tmp_path):
    onnx.save(mixed_model(), str(tmp_path / "mixed.onnx"))
    with serve_process(str(tmp_path / "mixed.onnx"), "--backend", "numpy") as (proc, port):
        for _ in range(REQUESTS):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                sock.sendall(b"GARBAGE\r\n\r\n")
                assert read_reply(sock).startswith(b"HTTP/1.1 400")
        proc.send_signal(signal.SIGTERM)
        log = proc.stdout.read()  # the server's output once it stopped
    assert proc.wait(timeout=30) == 0
    assert log.count("Invalid HTTP request received.") == 2, log[-2000:]
    assert re.search(rf"Invalid HTTP request received\. \({REQUESTS - 1} more in the last \d+ s\)", log), log[-2000:]


def test_throttled_warning_tells_how_many_were_left_out(monkeypatch):
    """A burst: the first warning, then the next one past the interval (or ``flush``, with the last
    left-out call's args and no traceback) with the count."""
    import logging

    from graphc.serving.kserve import throttled_log

    clock = [100.0]
    monkeypatch.setattr(throttled_log.time, "monotonic", lambda: clock[0])
    lines: list[str] = []
    logger = logging.getLogger("test_serve_log_flood")
    monkeypatch.setattr(logger, "warning", lambda msg, *a: lines.append(msg % a))
    log = throttled_log.ThrottledLog(logger)
    for _ in range(5):
        log.warning("Bad %s.", "request")
    log.warning("Other.")
    clock[0] += throttled_log.WARNING_INTERVAL + 1
    log.warning("Bad %s.", "request")
    clock[0] += 2
    log.warning("Bad %s.", "reply", exc_info=True)
    log.flush()
    log.flush()  # nothing left to tell
    assert lines == ["Bad request.", "Other.", f"Bad request. (4 more in the last {throttled_log.WARNING_INTERVAL + 1:.0f} s)",
                     "Bad reply. (1 more in the last 2 s)"], lines
