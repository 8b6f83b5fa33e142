"""TensorBoard logs of a training run: ``gc.Trainer(..., tensorboard=DIR)``, ``graphc train
--tensorboard DIR``; watch with ``tensorboard --logdir DIR``.

Event files are written with TensorBoard's own ``EventFileWriter`` (the optional dependency
``pip install 'graphc[tensorboard]'``). Scalars, on the global step axis (so a resumed run
continues its curves): ``train/loss`` each step (held until ``fit`` saves a checkpoint, ends an epoch or
stops on Ctrl-C, so a resume logs each step once), ``train/epoch_loss`` (the epoch's mean),
``train/epoch_<metric>`` (the epoch's train metrics),
``eval/<metric>`` after each epoch with an evaluation set, ``train/lr``, with loss scaling
``train/loss_scale`` (the scale at the epoch's end) and ``train/skipped_steps`` (the epoch's). The graph tab shows
the model (the artifacts' inference graph): ONNX nodes become TensorBoard nodes with their op
type, edges follow the values between them, inputs are ``Placeholder`` and params ``Const``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional, Union

import onnx

from graphc.errors import MissingDependency

__all__ = ["TensorBoardWriter", "graph_def"]


def _tensorboard(logdir) -> SimpleNamespace:
    """TensorBoard's protos and writer; ``MissingDependency`` naming ``logdir`` without them."""
    try:
        from tensorboard.compat.proto import attr_value_pb2, event_pb2, graph_pb2, node_def_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError as exc:
        raise MissingDependency(f"writing TensorBoard logs to {logdir} needs the tensorboard package, which is not "
                                "installed: pip install 'graphc[tensorboard]' (or tensorboard)") from exc
    return SimpleNamespace(AttrValue=attr_value_pb2.AttrValue, Event=event_pb2.Event, GraphDef=graph_pb2.GraphDef,
                           NodeDef=node_def_pb2.NodeDef, Summary=summary_pb2.Summary, SessionLog=event_pb2.SessionLog,
                           EventFileWriter=EventFileWriter)


def graph_def(model: onnx.ModelProto):
    """The main graph of ``model`` as a TensorBoard ``GraphDef`` (ONNX has no converter for it
    outside PyTorch's and tensorboardX's writers, which this module does not depend on)."""
    tb = _tensorboard("a GraphDef")
    graph = model.graph
    nodes, producer, taken = [], {}, set()

    def unique(name: str) -> str:
        base, n = name or "node", 1
        while name in taken or not name:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        return name

    initializers = {t.name for t in graph.initializer}
    for value in [*(v for v in graph.input if v.name not in initializers), *graph.initializer]:
        name = unique(value.name)
        producer[value.name] = name
        nodes.append(tb.NodeDef(name=name, op="Const" if value.name in initializers else "Placeholder"))
    for i, node in enumerate(graph.node):
        name = unique(node.name or f"{node.op_type}_{i}")
        for k, out in enumerate(node.output):
            producer[out] = name if k == 0 else f"{name}:{k}"
        attrs = {a.name: tb.AttrValue(s=str(onnx.helper.get_attribute_value(a)).encode()[:200])
                 for a in node.attribute if a.type != onnx.AttributeProto.GRAPH}
        attrs.update({p.key: tb.AttrValue(s=p.value.encode()) for p in node.metadata_props})
        nodes.append(tb.NodeDef(name=name, op=node.op_type, attr=attrs,
                                          input=[producer[v] for v in node.input if v in producer]))
    return tb.GraphDef(node=nodes)


class TensorBoardWriter:
    """One event file in ``logdir``; ``MissingDependency`` without the tensorboard package."""

    def __init__(self, logdir: Union[str, os.PathLike]):
        self.logdir = Path(logdir)
        self._tb = _tensorboard(self.logdir)
        if self.logdir.exists() and not self.logdir.is_dir():
            raise ValueError(f"cannot write TensorBoard logs to {self.logdir}: it is a file, not a directory")
        self._writer = self._tb.EventFileWriter(str(self.logdir))
        self._steps: list[tuple[int, float, Optional[float]]] = []  # held by ``step`` until ``flush``

    def scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._tb.Summary(value=[self._tb.Summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(self._tb.Event(wall_time=time.time(), step=int(step), summary=summary))

    def graph(self, model: onnx.ModelProto) -> None:
        self._writer.add_event(self._tb.Event(wall_time=time.time(),
                                                 graph_def=graph_def(model).SerializeToString()))

    def start(self, step: int) -> None:
        """Mark a run (re)starting at global ``step``: TensorBoard drops the events of this folder at
        ``step`` and after written before (its ``SessionLog.START``), those of a run killed after
        its last checkpoint, which the resume writes again."""
        self._writer.add_event(self._tb.Event(wall_time=time.time(), step=int(step),
                                              session_log=self._tb.SessionLog(status=self._tb.SessionLog.START)))

    def step(self, step: int, loss: float, grad_norm: Optional[float] = None) -> None:
        """Hold global step ``step``'s ``train/loss`` (and ``train/grad_norm``, with
        ``max_grad_norm``) until ``flush``: ``fit`` flushes at each checkpoint save, epoch end and
        Ctrl-C, so the file holds the steps a checkpoint covers and a resume writes the rest once."""
        self._steps.append((int(step), float(loss), grad_norm))

    def discard(self) -> None:
        """Drop the steps held since the last ``flush`` (a run rewound before them: they are trained again)."""
        self._steps.clear()

    def flush(self) -> None:
        """Write the held steps' scalars and flush the file."""
        for step, loss, norm in self._steps:
            self.scalar("train/loss", loss, step)
            if norm is not None:
                self.scalar("train/grad_norm", norm, step)
        self._steps.clear()
        self._writer.flush()

    def epoch(self, record, step: int, lr: float) -> None:
        """An epoch's scalars at global ``step`` (its last), written with the steps held."""
        self.scalar("train/epoch_loss", record.loss, step)
        for name, value in record.metrics.items():
            self.scalar(f"train/epoch_{name}", value, step)
        for name, value in record.eval.items():
            self.scalar(f"eval/{name}", value, step)
        self.scalar("train/lr", lr, step)
        if record.loss_scale is not None:
            self.scalar("train/loss_scale", record.loss_scale, step)
            self.scalar("train/skipped_steps", record.skipped_steps, step)
        self.flush()

    def close(self) -> None:
        self._writer.close()
