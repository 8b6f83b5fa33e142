"""The calling thread's floating-point mode for denormal (subnormal) floats: flushed to zero, or
kept, for the length of a block.

onnxruntime's ``session.set_denormal_as_zero`` flushes denormals in the session's own thread pool,
but the thread that calls ``run`` does part of every parallel kernel, and onnxruntime sets that
thread's mode only once per process, from whichever session is built first, for good. So a
session that flushes sets the caller's mode around each run here and leaves it as it was after
(the user's numpy code on that thread keeps IEEE denormals), and building one leaves it as it
was too. Neither onnxruntime nor numpy exposes the mode, so this reads and writes it through libm's
``fegetenv``/``fesetenv`` (ctypes): glibc on x86-64 (MXCSR's flush-to-zero and
denormals-are-zero bits) and on AArch64 (FPCR.FZ). Elsewhere ``supported()`` is False and the
calling thread keeps its mode.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import platform
import sys
from collections.abc import Iterator

__all__ = ["flushing", "supported"]


class _FloatEnv:
    """glibc's ``fenv_t`` as bytes: ``size`` long, the control word at ``offset``, ``bits`` its
    flush-to-zero bits."""

    def __init__(self, size: int, offset: int, bits: int):
        self.size, self.offset, self.bits = size, offset, bits
        self._libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")

    def _read(self) -> ctypes.Array:
        env = (ctypes.c_uint8 * self.size)()
        if self._libm.fegetenv(env) != 0:
            raise OSError("fegetenv failed")
        return env

    def word(self) -> int:
        return int.from_bytes(bytes(self._read())[self.offset:self.offset + 4], "little")

    def set_word(self, word: int) -> None:
        env = self._read()
        env[self.offset:self.offset + 4] = list(word.to_bytes(4, "little"))
        if self._libm.fesetenv(env) != 0:
            raise OSError("fesetenv failed")


@functools.cache
def _env() -> _FloatEnv | None:
    machine = platform.machine().lower()
    if not sys.platform.startswith("linux"):
        return None
    try:
        if machine in ("x86_64", "amd64"):
            return _FloatEnv(32, 28, 0x8040)  # the x87 environment (28 bytes), then MXCSR: FTZ | DAZ
        if machine in ("aarch64", "arm64"):
            return _FloatEnv(8, 0, 1 << 24)  # FPCR (its FZ bit), then FPSR
    except OSError:  # no loadable libm
        return None
    return None


def supported() -> bool:
    """Whether this platform's calling thread can be switched (the session's pool threads always can)."""
    return _env() is not None


@contextlib.contextmanager
def flushing(on: bool) -> Iterator[None]:
    """Inside the block this thread flushes denormals to zero if ``on`` (else keeps its mode); after
    it, the thread's flush mode is what it was before, whatever the block set."""
    env = _env()
    if env is None:
        yield
        return
    saved = env.word() & env.bits
    if on:
        env.set_word(env.word() | env.bits)
    try:
        yield
    finally:
        env.set_word((env.word() & ~env.bits) | saved)
