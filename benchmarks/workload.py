"""The shared acker workload of the benchmarks (re-exported from the package, so that
``xorack bench`` works from a plain install): record trees with fan-out, births first, events
shuffled across batches of 64 K. See ``xorack._workload`` for the shape of a tree.

>>> from workload import generate_workload
>>> generate_workload(100, seed=1).num_sources
100
"""

from xorack._workload import DEFAULT_BATCH, Workload, generate_workload, run_acker

__all__ = ["DEFAULT_BATCH", "Workload", "generate_workload", "run_acker"]
