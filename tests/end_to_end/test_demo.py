"""``xorack demo`` end to end on local Spark: failures, poison and losses injected, every source
record accounted for, word counts equal to a failure-free reference."""

from __future__ import annotations

import json

import pytest

from xorack import demo
from xorack.spark.pipeline import REPORT_KEYS

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
pytestmark = pytest.mark.spark


@pytest.mark.fallback_smoke  # CI runs it on the pure-Python install too
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


def test_demo_with_ft_off_injects_nothing_and_reports_no_acker(spark, capsys):
    """--ft off runs the plain Spark plan: the default failure rates are not applied (nothing
    to say about them), and the report has no account of the records (no acker counted them)."""
    code = demo.main(["--records", "300", "--ft", "off", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0
    assert captured.err == ""
    text = captured.out
    assert "FT                     off" in text
    assert "results match          yes" in text
    for acker_line in ("LOST", "dead-lettered", "completed", "replayed", "source records"):
        assert acker_line not in text, text
    code = demo.main(["--records", "300", "--ft", "off", "--fail-rate", "0", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert report["ft"] is False
    assert report["lost"] is None
    assert report["results_match"] is True


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


@pytest.mark.slow
def test_stream_demo_json_with_failures_injected_loses_nothing(spark, capsys):
    """``--stream``: a live query over files fed one by one, failures, poison and losses
    injected; every record accounted for, the windows equal to the failure-free reference, one
    progress line per micro-batch (on stderr: stdout holds the one JSON object)."""
    code = demo.main(
        [
            "--stream",
            "--files", "3",
            "--records", "240",
            "--partitions", "2",
            "--fail-rate", "0.05",
            "--poison-rate", "0.02",
            "--drop-rate", "0.05",
            "--max-attempts", "2",
            "--interval", "0.5",
            "--trigger", "0.5",
            "--timeout", "4",
            "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out.strip().splitlines()
    assert len(out) == 1, out
    report = json.loads(out[0])
    assert tuple(report)[: len(REPORT_KEYS)] == REPORT_KEYS
    assert code == 0
    assert report["lost"] == 0
    assert report["results_match"] is True
    assert report["source_records"] == 240
    assert report["completed"] + report["dead_lettered"] == 240
    assert report["failed"] > 0
    assert report["timed_out"] > 0  # the words lost in transit
    assert report["dead_lettered"] >= report["poisoned"] > 0
    assert report["files_read"] == 3
    # the final watermark (the last event time - 5 s) closes the first two files' windows
    assert report["windows_written"] == report["windows_expected"] == 2
    assert report["final_watermark"] == report["expected_watermark"] == "12:00:24.875"
    progress = [line.split() for line in captured.err.splitlines()]
    batches = [cols[0] for cols in progress if len(cols) == 8 and cols[0].isdigit()]
    assert batches == [str(b) for b in range(report["micro_batches"])]
    assert sum(int(cols[1]) for cols in progress if len(cols) == 8 and cols[0].isdigit()) == 240
    assert progress[-1][0] == "stop"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stream", "--files", "0"], "argument --files: must be >= 1, got 0"),
        (["--stream", "--files", "1"], "--files 1: the streaming demo needs 2 files at least"),
        (["--files", "3"], "--files needs --stream"),
        (["--stream", "--timeout", "0"], "argument --timeout: must be a number > 0, got 0"),
        (["--stream", "--ft", "off"], "--ft off: not with --stream"),
        (["--stream", "--files", "5", "--records", "4"], "--records 4 is fewer than --files 5"),
    ],
)
def test_stream_demo_rejects_bad_options(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_stream_demo_split_keeps_event_time_and_lineage_and_marks_lost_words():
    import numpy as np
    import pandas as pd

    import xorack
    from xorack import demo_stream

    sid = np.arange(400)
    pdf = pd.DataFrame(
        {
            "sid": sid,
            "ts": pd.Timestamp("2026-01-01 12:00:00") + pd.to_timedelta(sid, unit="ms"),
            "text": demo.make_sentences(sid, 5),
            "_ft_src": sid + 1000,  # a lineage column: kept on every word of its sentence
        }
    )
    with pytest.raises(xorack.FailRecord, match="poisoned"):
        demo_stream.SplitTimedWords(5, 0.0, 0.05, 0.0)(pdf)
    words = demo_stream.SplitTimedWords(5, 0.0, 0.0, 0.1)(pdf)
    assert list(words.columns) == ["sid", "ts", "_ft_src", "word", "lossy"]
    assert (words["_ft_src"] == words["sid"] + 1000).all()
    assert (words["ts"] == pdf["ts"].to_numpy()[words["sid"]]).all()
    lossy = set(words.loc[words["lossy"], "sid"])
    assert lossy
    assert lossy <= set(sid[demo.chosen(sid, 0.1, 5, demo._DROP)])
    assert words.groupby("sid")["lossy"].mean().max() < 1  # about half of a sentence's words


def test_stream_demo_reference_leaves_the_open_window_out():
    from xorack import demo_stream

    cfg = demo_stream.StreamConfig(files=4, records=80, poison_rate=0.0)
    ref = demo_stream.reference_windows(cfg, exclude=set())
    assert sorted({end.second for _, end, _ in ref}) == [10, 20, 30]  # [30, 40) stays open
    assert not {w for _, _, w in ref} & demo.STOP_WORDS
    fewer = demo_stream.reference_windows(cfg, exclude={0, 1, 2})
    assert sum(fewer.values()) < sum(ref.values())
