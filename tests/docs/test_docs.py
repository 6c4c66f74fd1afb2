"""The runnable examples in the docstrings of the installed package are true."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "xorack",
    "xorack.kernels",
    "xorack.errors",
    "xorack.clock",
    "xorack.acker",
    "xorack.hashing",
    "xorack.replay",
    "xorack.storage",
    "xorack.event_times",
    "xorack.ftlayer",
    "xorack.protocol",
    "xorack.client",
    "xorack.service",
    "xorack.sharding",
    "xorack.shards",
    "xorack.cli",
    "xorack.demo_data",
    "xorack.demo_stream",
    "xorack._checks",
    "xorack.spark.stages",
    "xorack.spark.arrow_stage",
    "xorack._kernel_api",
    "xorack.spark.sink_types",
    "xorack.spark.replays",
    "xorack.spark.optimistic",
    "xorack.spark.join_ops",
    "xorack.spark.unsupported",
    "xorack.spark.tracked_rounds",
    "xorack.spark.lineage",
    "xorack.spark.report",
    "xorack.spark.ids",
    "xorack.spark.sinks",
    "xorack.spark.guard",
    "xorack.spark.prune",
    "xorack.bench_tpch",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
