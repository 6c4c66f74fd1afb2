"""``xorack demo`` end to end on local Spark: failures, poison and losses injected, every source
record accounted for, word counts equal to a failure-free reference."""

from __future__ import annotations

import json

import pytest

from xorack import demo
from xorack.spark.pipeline import REPORT_KEYS

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
pytestmark = pytest.mark.spark


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
    # rows lost in the network: their records time out, or (first round, before the combined
    # count) fail their chunk, whose records come back as collateral replays
    assert report["timed_out"] + report["collateral_replays"] > 0
    assert report["dead_lettered"] > 0
    assert report["completed"] + report["dead_lettered"] == 3000
    # the counts come from the aggregation inside the pipeline (one row per word): words of
    # the attempts that did not complete were staged but left out, never counted twice
    assert report["derived_records"] == report["distinct_words"] > 0
    # the words lost in transit are counted where they vanished: the untracked transform
    assert report["vanished_rows"]["lossy-network"] > 0


def test_demo_reference_excludes_exactly_the_poisoned_sentences():
    cfg = demo.DemoConfig(records=500, poison_rate=0.1, seed=3)
    poisoned = demo.chosen(range(500), 0.1, 3, demo._POISON)
    assert 20 < poisoned.sum() < 80
    clean = demo.reference_counts(demo.DemoConfig(records=500, poison_rate=0.0, seed=3))
    ref = demo.reference_counts(cfg)
    assert sum(ref.values()) < sum(clean.values())
    assert not (set(ref) & demo.STOP_WORDS)


def test_demo_rejects_bad_options(capsys):
    with pytest.raises(SystemExit) as info:
        demo.main(["--fail-rate", "2"])
    assert info.value.code == 2
    assert "argument --fail-rate: must be in [0, 1], got 2" in capsys.readouterr().err


def test_demo_split_names_the_failing_rows():
    import numpy as np
    import pandas as pd

    import xorack

    sid = np.arange(2000)
    pdf = pd.DataFrame({"sid": sid, "text": demo.make_sentences(sid, 5)})
    fail = demo.chosen(sid, 0.05, 5, demo._FAIL)
    poison = demo.chosen(sid, 0.01, 5, demo._POISON)
    split = demo.SplitWords(5, 0.05, 0.01)
    with pytest.raises(xorack.FailRecord, match="poisoned") as first:
        split(pdf)
    assert (np.asarray(first.value.rows) == poison).all()
    rest = pdf[~poison]
    with pytest.raises(xorack.FailRecord, match="first attempt") as second:
        split(rest)
    assert (np.asarray(second.value.rows) == (fail & ~poison)[~poison]).all()
    words = split(rest[~second.value.rows])
    assert set(words["sid"]) == set(sid[~(fail | poison)])
    with pytest.raises(xorack.FailRecord) as plain:
        demo.SplitWords(5, 0.05, 0.01, vectorized=False)(pdf)
    assert plain.value.rows is None  # the stage bisects


def test_demo_with_plain_failures_is_bisected_and_loses_nothing(spark, capsys):
    key = demo.ARROW_BATCH_CONF
    assert spark.conf.get(key, None) is None
    argv = ["--records", "1500", "--fail-rate", "0.03", "--poison-rate", "0.01"]
    code = demo.main([*argv, "--drop-rate", "0", "--plain-failures", "--json", "--no-progress"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert report["lost"] == 0
    assert report["results_match"] is True
    assert report["failed"] > 0
    assert report["dead_lettered"] == report["poisoned"] > 0
    assert spark.conf.get(key, None) is None  # the demo's larger batches were for its run only
