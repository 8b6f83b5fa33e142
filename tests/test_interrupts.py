"""DeferredInterrupt: Ctrl-C inside a block is raised when the block ends, never half way."""

import signal
import threading

import pytest

from graphc.runtime.interrupts import DeferredInterrupt


def test_sigint_inside_a_block_waits_for_its_end():
    held = DeferredInterrupt()
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held:
            signal.raise_signal(signal.SIGINT)
            done.append("rest of the block")
            with held:  # nested blocks: held until the outermost ends
                signal.raise_signal(signal.SIGINT)  # a second Ctrl-C ... raises at once
                done.append("never")
    assert done == ["rest of the block"] and held.torn
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_armed_raises_at_once_between_blocks_and_holds_inside_them():
    held = DeferredInterrupt()
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with held.armed():
            for i in range(3):
                with held:
                    if i == 1:
                        signal.raise_signal(signal.SIGINT)
                    steps.append(i)
    assert steps == [0, 1] and not held.torn
    with pytest.raises(KeyboardInterrupt):
        with held.armed():
            signal.raise_signal(signal.SIGINT)  # between blocks
            steps.append("never")
    assert steps == [0, 1] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_exception_in_the_block_wins_and_other_handlers_are_kept():
    held = DeferredInterrupt()
    with pytest.raises(ValueError):
        with held:
            signal.raise_signal(signal.SIGINT)
            raise ValueError("the block's own error")
    with held:
        pass  # nothing pending is left over
    calls = []
    previous = signal.signal(signal.SIGINT, lambda *a: calls.append(a))
    try:
        with held:
            signal.raise_signal(signal.SIGINT)
        assert len(calls) == 1  # the program's own handler ran, nothing was held
    finally:
        signal.signal(signal.SIGINT, previous)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(held.__enter__() and held.__exit__(None, None, None)))
    thread.start()
    thread.join()
    assert errors == [False] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
