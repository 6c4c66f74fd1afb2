"""``xorack demo`` end to end on local Spark: failures, poison and losses injected, every source
record accounted for, word counts equal to a failure-free reference."""

from __future__ import annotations

import json

import pytest

from xorack import demo
from xorack.spark.pipeline import REPORT_KEYS

pytest.importorskip("pyspark")


def test_demo_json_with_failures_injected_loses_nothing(spark, capsys):
    code = demo.main(
        [
            "--records", "3000",
            "--partitions", "4",
            "--fail-rate", "0.05",
            "--poison-rate", "0.01",
            "--drop-rate", "0.05",
            "--max-attempts", "3",
            "--json",
            "--no-progress",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out  # one JSON object, nothing else on stdout
    report = json.loads(out[0])
    assert tuple(report)[: len(REPORT_KEYS)] == REPORT_KEYS
    assert code == 0
    assert report["lost"] == 0
    assert report["results_match"] is True
    assert report["source_records"] == 3000
    assert report["failed"] > 0
    assert report["timed_out"] > 0
    assert report["dead_lettered"] > 0
    assert report["completed"] + report["dead_lettered"] == 3000
    assert report["duplicates_absorbed"] > 0  # words re-delivered by replays, stored once


def test_demo_reference_excludes_exactly_the_poisoned_sentences():
    cfg = demo.DemoConfig(records=500, poison_rate=0.1, seed=3)
    poisoned = demo.chosen(range(500), 0.1, 3, demo._POISON)
    assert 20 < poisoned.sum() < 80
    clean = demo.reference_counts(demo.DemoConfig(records=500, poison_rate=0.0, seed=3))
    ref = demo.reference_counts(cfg)
    assert sum(ref.values()) < sum(clean.values())
    assert not (set(ref) & demo.STOP_WORDS)


def test_demo_rejects_bad_options(capsys):
    assert demo.main(["--fail-rate", "2"]) == 2
    assert "--fail-rate must be in [0, 1]" in capsys.readouterr().err
