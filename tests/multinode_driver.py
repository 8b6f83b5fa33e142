"""The driver the multi-node tests run as a program of its own (``test_distributed_multinode.py``):
it joins the loopback cluster at ``spec["address"]`` with Ray's multi-node switch off (the test
sets it), trains a float64 MLP on 2 workers, and prints one JSON line of what it saw.

``spec``: ``backend``, ``placement``, ``num_cpus``, ``max_restarts``, ``checkpoint`` (a folder),
``accumulate`` (k, both runs; default 1), ``rows`` and ``batch`` (the data's and a batch's rows;
48 and 8), ``loader``: ``"ray"`` trains the workers from a ``RayDataLoader`` whose blocks are made
on each node in turn (the one process from a ``DataLoader`` over the same rows; default both a
``DataLoader``); ``kill`` (a node's session id, all of whose processes it kills just before
optimizer step ``at + 1``, as a machine lost); ``resume``: after the run, train on from its checkpoint on what is left;
``client``: ``address`` is a Ray Client one (``ray://``): count the cluster round trips for the
session (``ray.get_runtime_context``) during ``fit``, try the addresses ``refused``, then step
after ``ray.shutdown()``.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
import warnings

import numpy as np

import float64_models
import graphc as gc
from ray_nodes import _session

EPOCHS, BATCH = 3, 8


def main(spec: dict) -> dict:
    import ray

    ray.init(address=spec["address"], log_to_driver=False)
    while sum(n["Alive"] for n in ray.nodes()) < spec["nodes"]:
        time.sleep(0.2)
    arts = gc.training.generate(float64_models.mlp(), gc.losses.mse("out", label="y"), gc.optim.AdamW(0.01, weight_decay=0.1))
    rng = np.random.default_rng(0)
    rows, batch = spec.get("rows", 48), spec.get("batch", BATCH)
    data = {"x": rng.normal(size=(rows, 4)), "y": rng.normal(size=(rows, 2))}

    def loader():
        return gc.data.DataLoader(data, batch_size=batch, seed=3)

    k = spec.get("accumulate", 1)
    if spec.get("loader") == "ray":
        dataset, made = _dataset_on_each_node(ray, data)
        ray_loader = functools.partial(gc.data.RayDataLoader, dataset, batch_size=batch, seed=3)
    single = gc.Trainer(arts, backend=spec["backend"], accumulate=k)
    want = single.fit(loader(), epochs=EPOCHS, progress=False, quiet=True)
    run = {"workers": 2, "backend": spec["backend"], "ray_address": spec["address"], "timeout_s": 60,
           "num_cpus": spec["num_cpus"], "placement": spec["placement"], "max_restarts": spec["max_restarts"],
           "accumulate": k}
    dp = gc.Trainer(arts, **run)
    out = {"want": want.step_losses, "want_params": {k: v.tolist() for k, v in single.params.items()},
           "nodes": dp._nodes, "who": dp._who}
    if spec.get("loader") == "ray":
        loader = ray_loader
        out["block_nodes"] = [made[b]["node_ids"] for b in made]
        out["stored_as_made"] = loader()._store() == list(made)  # the loader reads those blocks, not copies
    if "kill" in spec:
        step = dp._step_on  # fit's one optimizer step (k loader batches)

        def killing(*args):
            if dp.step_count == spec["at"]:
                del dp._step_on
                out["killed_at"] = time.monotonic()
                for pid in _session(spec["kill"]):
                    os.kill(pid, signal.SIGKILL)
            return step(*args)

        dp._step_on = killing
    started, contexts = time.monotonic(), _counting(ray, "get_runtime_context")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = dp.fit(loader(), epochs=EPOCHS, progress=False, quiet=True, checkpoint=spec["checkpoint"])
        out["contexts"] = len(contexts)
        out["got"], out["warnings"] = got.step_losses, [str(w.message) for w in seen]
        out["ms_per_step"] = 1e3 * (time.monotonic() - started) / len(got.step_losses)
    except gc.GraphcError as exc:
        out["error"] = [type(exc).__name__, str(exc)]
    out["seconds"] = time.monotonic() - out.get("killed_at", started)
    out["params"] = {k: v.tolist() for k, v in dp.params.items()} if "got" in out else None
    out["checkpoint_step"] = gc.Trainer(spec["checkpoint"], backend=spec["backend"], accumulate=k).step_count
    if spec.get("resume"):
        resumed = gc.Trainer(spec["checkpoint"], **run)
        out["resumed_nodes"] = sorted({n for n in resumed._nodes})
        out["resumed"] = resumed.fit(loader(), epochs=EPOCHS, progress=False, quiet=True).step_losses
        out["params"] = {k: v.tolist() for k, v in resumed.params.items()}
    if spec.get("client"):
        out["refused"] = [_error(lambda: gc.Trainer(arts, **{**run, "ray_address": other})) for other in spec["refused"]]
        ray.shutdown()
        out["after_shutdown"] = _error(lambda: dp.step({k: v[:BATCH] for k, v in data.items()}))
    return out


def _block(columns: dict):
    """``columns`` as a Ray Data block (run in a task: the block is stored on its node)."""
    from ray.data.block import BlockAccessor

    return BlockAccessor.batch_to_block(columns)


def _dataset_on_each_node(ray, data: dict, blocks: int = 4):
    """``data`` as a ``ray.data.Dataset`` of ``blocks`` contiguous blocks, block ``i`` made by a task
    on the ``i % nodes``-th live node (soft affinity: a block lost with its node is made again
    elsewhere), and where each block is (``ray.experimental.get_object_locations``) before any read."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    make = ray.remote(_block)
    cuts = np.array_split(np.arange(len(next(iter(data.values())))), blocks)
    refs = [make.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True))
            .remote({name: a[rows] for name, a in data.items()}) for i, rows in enumerate(cuts)]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    made = ray.experimental.get_object_locations(refs)  # before Ray Data reads them (it copies some)
    return ray.data.from_arrow_refs(refs), made


def _counting(owner, name: str) -> list:
    """Count the calls of ``owner.name`` from now on: the list gets one entry per call."""
    calls, call = [], getattr(owner, name)

    def counted(*args, **kwargs):
        calls.append(1)
        return call(*args, **kwargs)

    setattr(owner, name, counted)
    return calls


def _error(run) -> list:
    """[type name, message] of what ``run()`` raised (it must raise a graphc error)."""
    try:
        run()
    except gc.GraphcError as exc:
        return [type(exc).__name__, str(exc)]
    raise AssertionError("no error")


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
