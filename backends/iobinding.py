"""onnxruntime runs through IOBinding (``OrtExecutable.run_bound``): handles bound as they are,
host arrays bound in place, device outputs left on the device as OrtValues, and the bindings of
a Trainer's steps kept and run again.

A Trainer's step feeds the same handles, and writes into the same buffers, as the step before
the last (two sets of buffers used in turn). Binding each of them anew every step cost 2-2.5 %
of the step time for models of 300 or more carried tensors at batch 2 (``run_bound``'s
docstring has the figures). So a binding whose device outputs all go into given handles is kept
(two at most) and run again when the same handles come back: only the host arrays (the batch)
and the host outputs are bound anew, the last run's host arrays being the caller's to read. A
kept binding is found by the ids of its handles and holds them, so while it is kept no new
handle can take a freed one's id.

A host array is bound as an OrtValue where ``bind_cpu_input`` cannot take it: a bfloat16 one
(numpy has no such type there), and one fed to an input that also has an initializer (an
overridable default): ``bind_cpu_input`` looks the name up among the inputs without initializers
and raised "Failed to find NodeArg with name: conv.weight in the def list" where
``InferenceSession.run`` took the same feed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from graphc.backends import bfloat16

__all__ = ["Bindings"]

KEPT = 2  # the ping-pong sets of a Trainer's buffers


class Bindings:
    """The IOBindings of one session: made for a run, or kept from an earlier one."""

    def __init__(self, session: Any, ortvalue: type, device: str, device_id: int):
        self.session, self._ortvalue, self.device, self.device_id = session, ortvalue, device, device_id
        self.kept: dict[tuple, tuple[Any, list[Any]]] = {}  # key -> (binding, the handles it holds)
        self._overridable = frozenset(value.name for value in session.get_overridable_initializers())

    def bind(self, feeds: Mapping[str, Any], host_outputs: Sequence[str], device_outputs: Sequence[str],
             given: Mapping[str, Any], graph_id: int | None, keep: bool) -> tuple[Any, list[np.ndarray]]:
        """A binding for this run, kept (``keep``) where every device output goes into a handle
        of ``given``; and the host arrays it reads, to be kept alive until the run is done."""
        handles = [(name, value) for name, value in feeds.items() if isinstance(value, self._ortvalue)]
        key = None
        if keep and all(given.get(name) is not None for name in device_outputs):
            key = (tuple(host_outputs), graph_id, tuple((name, id(value)) for name, value in handles),
                   tuple((name, id(given[name])) for name in device_outputs))
        entry = self.kept.pop(key, None) if key is not None else None
        if entry is None:
            binding = self.session.io_binding()
            for name, value in handles:
                binding.bind_ortvalue_input(name, value)
            for name in host_outputs:
                binding.bind_output(name, "cpu")
            for name in device_outputs:
                target = given.get(name)
                if target is not None:
                    binding.bind_ortvalue_output(name, target)
                else:
                    binding.bind_output(name, self.device, self.device_id)
            entry = (binding, [value for _, value in handles] + [given.get(name) for name in device_outputs])
        else:
            for name in host_outputs:  # a fresh buffer (each output keeps its place when bound again)
                entry[0].bind_output(name, "cpu")
        binding, arrays = entry[0], []
        for name, value in feeds.items():
            if not isinstance(value, self._ortvalue):
                arrays.append(np.asarray(value, order="C"))
                if arrays[-1].dtype == bfloat16.BFLOAT16 or name in self._overridable:  # the module docstring
                    arrays.append(bfloat16.to_ortvalue(self._ortvalue, arrays[-1]))
                    binding.bind_ortvalue_input(name, arrays[-1])
                else:
                    binding.bind_cpu_input(name, arrays[-1])
        if key is not None:
            self.kept[key] = entry  # the most recently run last
            while len(self.kept) > KEPT:
                del self.kept[next(iter(self.kept))]
        return binding, arrays

    def forget(self) -> None:
        """Drop the kept bindings, and with them their hold on the handles they bound."""
        self.kept.clear()

    @staticmethod
    def results(binding: Any, host_outputs: Sequence[str], device_outputs: Sequence[str],
                given: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(host arrays, device handles) of a run: an output written into a given OrtValue comes
        back as that object (a CPU OrtValue made from numpy owns no memory: its Python object
        keeps the array, and so the data, alive)."""
        values = binding.get_outputs()  # host outputs first, as bound
        host = {name: bfloat16.to_array(values[i]) for i, name in enumerate(host_outputs)}
        device = {name: given[name] if given.get(name) is not None else values[len(host_outputs) + i]
                  for i, name in enumerate(device_outputs)}
        return host, device
