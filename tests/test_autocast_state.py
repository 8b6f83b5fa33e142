"""``gc.autocast``'s state, as torch keeps it: per thread and per asyncio task (two threads capturing at
once, one inside a block and one outside, each get the graph they get alone), and per device type (a
``cuda`` block inside a ``cpu`` block leaves the CPU state; the ops follow the innermost block whose
device type is on)."""

from __future__ import annotations

import asyncio
import threading

import graphc as gc
from graphc.model.dtypes import as_dtype

X = gc.spec("float32", ("N", 2, 6, 6))


class _Net(gc.nn.Module):
    """A small CNN that waits at ``barrier`` (when given) halfway through its capture."""

    def __init__(self, barrier: threading.Barrier | None = None):
        super().__init__()
        self.barrier = barrier
        self.conv, self.bn = gc.nn.Conv2d(2, 4, 3, padding=1), gc.nn.BatchNorm2d(4)
        self.fc = gc.nn.Linear(4 * 36, 3)

    def forward(self, x):
        h = gc.relu(self.bn(self.conv(x)))
        if self.barrier is not None:
            self.barrier.wait(timeout=30)  # both captures are in flight here
        return gc.softmax(self.fc(gc.flatten(h, 1)), -1)


def _bytes(net, autocast: bool) -> bytes:
    if autocast:
        with gc.autocast("cpu"):
            return gc.capture(net, x=X).proto.SerializeToString()
    return gc.capture(net, x=X).proto.SerializeToString()


def test_two_threads_capturing_at_once_each_get_their_graph_alone():
    barrier = threading.Barrier(2)
    net = _Net(barrier)
    got: dict[bool, bytes] = {}
    failed: list[BaseException] = []

    def run(autocast: bool) -> None:
        try:
            got[autocast] = _bytes(net, autocast)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            failed.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(flag,)) for flag in (True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not failed, failed
    net.barrier = None  # alone now
    alone = {flag: _bytes(net, flag) for flag in (True, False)}
    assert alone[True] != alone[False]  # the block does change the graph
    assert got == alone


def test_a_block_in_one_thread_is_not_on_in_another():
    seen = []
    with gc.autocast("cpu"):
        t = threading.Thread(target=lambda: seen.append(gc.is_autocast_enabled()))
        t.start()
        t.join()
        assert gc.is_autocast_enabled()
    assert seen == [False]


def test_asyncio_tasks_keep_their_own_state():
    async def inside(started: asyncio.Event, done: asyncio.Event) -> bool:
        with gc.autocast("cpu"):
            started.set()
            await done.wait()
            return gc.is_autocast_enabled()

    async def outside(started: asyncio.Event, done: asyncio.Event) -> bool:
        await started.wait()  # the other task is inside its block now
        enabled = gc.is_autocast_enabled()
        done.set()
        return enabled

    async def both():
        started, done = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(inside(started, done), outside(started, done))

    assert asyncio.run(both()) == [True, False]


def _dtypes(fn) -> list[str]:
    model = gc.capture(fn, x=gc.spec("float32", (2, 2)))
    return [str(as_dtype(int(o.dtype))) for o in model.ir.graph.outputs]


def test_state_is_per_device_type():
    """A matmul and a softmax (float32 on CUDA only) under nested blocks of both device types."""

    def nested(x):
        outs = []
        with gc.autocast("cpu", "float16"):
            with gc.autocast("cuda", "bfloat16"):  # the CUDA policy now; the CPU state is kept
                assert gc.is_autocast_enabled("cpu") and gc.is_autocast_enabled("cuda")
                outs += [gc.matmul(x, x), gc.softmax(gc.matmul(x, x), -1)]
                with gc.autocast("cuda", enabled=False):  # CUDA off: the CPU block's float16 again
                    assert gc.is_autocast_enabled("cpu") and not gc.is_autocast_enabled("cuda")
                    outs += [gc.matmul(x, x), gc.softmax(gc.matmul(x, x), -1)]
                with gc.autocast("cpu", enabled=False):  # CPU off: CUDA's bfloat16 still
                    outs.append(gc.matmul(x, x))
            assert not gc.is_autocast_enabled("cuda")
        assert not gc.is_autocast_enabled()
        return tuple(outs)

    assert _dtypes(nested) == ["bfloat16", "float32", "float16", "float16", "bfloat16"]
