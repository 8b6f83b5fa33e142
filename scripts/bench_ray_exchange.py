"""The fixed per-step cost of exchanging gradients between Ray actors, protocol against protocol,
interleaved in one run (no model compute: each worker holds a gradient of ``--mb`` MB).

    .venv/bin/python scripts/bench_ray_exchange.py [--workers 2] [--mb 0.4] [--steps 60]

Protocols (median ms per step over ``--steps`` steps, run in alternating rounds of 10):

* ``driver``: the driver gets every worker's gradients, sums them, puts the sum in the object
  store, and calls ``apply`` on each worker (graphc before the one-call protocol: 2 calls per
  worker per step, 2N*G bytes through the driver);
* ``gather``: one call per worker per step; it applies the previous step's gradients, whose
  refs it gets as arguments (each worker reads all N from the object store: an all-gather), and
  returns its loss (to the driver) and its gradients (left in the object store): what
  ``graphc.runtime.distributed`` does;
* ``scatter``: reduce-scatter then all-gather through the object store (each worker returns N
  chunks; worker i sums the i-th chunks; the next step gathers the N sums): the bandwidth of a
  ring all-reduce in 2 rounds, at 2 calls per worker per step;
* ``compiled``: ``gather`` as a Ray compiled graph (``ray.dag``, shared-memory channels).

It also prints the CPU an idle worker burns with a compiled graph up and without one (the
compiled graph's actors poll their channels).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback-only local cluster
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np  # noqa: E402


class Peer:
    """A worker holding a gradient of ``size`` float32s."""

    def __init__(self, rank: int, size: int, workers: int):
        self.rank, self.workers = rank, workers
        self.grad = np.full(size, rank + 1.0, dtype=np.float32)
        self.param = np.zeros(size, dtype=np.float32)

    def _update(self, parts) -> None:
        total = parts[0].copy()
        for part in parts[1:]:
            total += part
        self.param -= total

    # driver
    def grads(self, message):
        return {"loss": 1.0, "grad": self.grad}

    def apply(self, reduced) -> None:
        self.param -= reduced

    # gather
    def step(self, message, *previous):
        if previous:
            self._update(list(previous))
        return {"loss": 1.0}, self.grad

    def cpu_seconds(self) -> float:
        return time.process_time()

    def gradient(self, message):
        return self.grad

    def gather_apply(self, *grads):
        self._update(list(grads))
        return 1.0

    # scatter
    def chunks(self, message, *sums):
        if sums:
            self.param -= np.concatenate(sums)
        return ({"loss": 1.0}, *np.array_split(self.grad, self.workers))

    def reduce(self, *chunks):
        total = chunks[0].copy()
        for chunk in chunks[1:]:
            total += chunk
        return total


def idle_cpu(ray, peers, seconds: float = 2.0) -> float:
    """The mean share of a core each of ``peers`` burns while no step runs."""
    before = ray.get([p.cpu_seconds.remote() for p in peers])
    time.sleep(seconds)
    after = ray.get([p.cpu_seconds.remote() for p in peers])
    return sum(b - a for a, b in zip(before, after)) / len(peers) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mb", type=float, default=0.4)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    import ray
    from ray.dag import InputNode, MultiOutputNode

    ray.init(num_cpus=max(2, args.workers), include_dashboard=False, log_to_driver=False)
    n, size = args.workers, int(args.mb * 1e6 / 4)
    actor = ray.remote(Peer).options(num_cpus=max(2, n) / n / 2)
    peers = [actor.remote(rank, size, n) for rank in range(n)]
    state = {"gather": [], "scatter": []}

    def driver():
        parts = ray.get([p.grads.remote(0) for p in peers])
        total = parts[0]["grad"].copy()
        for part in parts[1:]:
            total += part["grad"]
        reduced = ray.put(total / n)
        ray.get([p.apply.remote(reduced) for p in peers])

    def gather():
        calls = [p.step.options(num_returns=2).remote(0, *state["gather"]) for p in peers]
        ray.get([info for info, _ in calls])
        state["gather"] = [grads for _, grads in calls]

    def scatter():
        calls = [p.chunks.options(num_returns=n + 1).remote(0, *state["scatter"]) for p in peers]
        ray.get([c[0] for c in calls])
        state["scatter"] = [p.reduce.remote(*[c[1 + i] for c in calls]) for i, p in enumerate(peers)]

    with InputNode() as inp:
        grads = [p.gradient.bind(inp) for p in peers]
        dag = MultiOutputNode([p.gather_apply.bind(*grads) for p in peers])
    compiled_dag = dag.experimental_compile()

    def compiled():
        ray.get(compiled_dag.execute(0), timeout=60)

    protocols = {"driver": driver, "gather": gather, "scatter": scatter, "compiled": compiled}
    times: dict[str, list[float]] = {name: [] for name in protocols}
    for fn in protocols.values():  # warm up
        for _ in range(3):
            fn()
    for _ in range(max(1, args.steps // 10)):
        for name, fn in protocols.items():
            for _ in range(10):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
    idle = {"compiled graph up": idle_cpu(ray, peers)}
    compiled_dag.teardown()
    peers = [actor.remote(rank, size, n) for rank in range(n)]  # teardown stopped the first ones
    idle["no compiled graph"] = idle_cpu(ray, peers)
    ray.shutdown()
    print(f"{n} workers, {args.mb:g} MB of gradients each; load average {os.getloadavg()[0]:.1f}")
    print("CPU a worker uses while idle: " + ", ".join(f"{k} {v:.0%} of a core" for k, v in idle.items()))
    print("| protocol | median ms/step | actor calls per worker/step |")
    print("|---|---|---|")
    calls = {"driver": 2, "gather": 1, "scatter": 2, "compiled": "1 (compiled)"}
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {calls[name]} |")


if __name__ == "__main__":
    main()
