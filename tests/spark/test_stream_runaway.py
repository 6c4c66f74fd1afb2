"""The runaway guard of a stream: an error that fails most of a stage's records in two
consecutive micro-batches (a typo, not a poison record) stops the stream with
``RunawayFailure`` instead of dead-lettering its whole input; its records stay pending in the
FT state of the checkpoint, and a restart on it with the fix processes every one of them
exactly once. ``runaway_share=None`` keeps the old behaviour (the records go to the dead
letters, the stream goes on). Poison records and transient failures never trip the guard: the
other streaming tests run them under it.

Input: ``FILES`` JSON files of ``ROWS`` rows, one per micro-batch (``availableNow``).
"""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest

from xorack.spark import Pipeline, RunawayFailure, SQLiteSink
from xorack.spark.guard import SEEN, StreamTally

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = pytest.mark.spark

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stage functions below

FILES = 4
ROWS = 25  # per file: a micro-batch the guard judges (20 records at least)
SCHEMA = "value long, word string"
OUT = "value long, word string, double long"
WAIT = 600.0


# ---- the decision (no Spark) -----------------------------------------------------------------

STAGE = "stage 'parse'"
TYPO = (STAGE, "KeyError: 'vlaue'")


def test_two_consecutive_micro_batches_failed_by_one_error_stop_the_stream():
    t = StreamTally()
    assert t.add_round({(STAGE, SEEN): 25, TYPO: 25}, fresh=True) is None  # once proves nothing
    message = t.add_round({(STAGE, SEEN): 50, TYPO: 40}, fresh=True)
    assert message is not None
    assert "100% of its records in one micro-batch and 40 of 50 (80%) in the next" in message
    assert TYPO[1] in message


def test_small_micro_batches_with_poison_records_never_stop_the_stream():
    t = StreamTally()
    for i in range(40):  # 5 records a micro-batch, one poison record in every other one
        assert t.add_round({(STAGE, SEEN): 5, TYPO: i % 2}, fresh=True) is None
        assert t.add_round({(STAGE, SEEN): 1, TYPO: 1}, fresh=False) is None


def test_a_small_recovered_micro_batch_counts_in_its_pool():
    """A clean small micro-batch pooled with a failing one: 10 failed of 20 (under 20
    failures) is no runaway judgement, and it breaks the chain."""
    t = StreamTally()
    assert t.add_round({(STAGE, SEEN): 20, TYPO: 20}, fresh=True) is None
    assert t.add_round({(STAGE, SEEN): 10}, fresh=True) is None  # recovered, pooled
    assert t.add_round({(STAGE, SEEN): 10, TYPO: 10}, fresh=True) is None  # judged: 10 of 20
    assert t.add_round({(STAGE, SEEN): 20, TYPO: 20}, fresh=True) is None  # a new chain
    assert t.add_round({(STAGE, SEEN): 20, TYPO: 20}, fresh=True) is not None


def test_poison_records_and_idle_replay_rounds_never_stop_the_stream():
    t = StreamTally()
    for _ in range(5):  # 2 poison records in each micro-batch, replayed while idle (all fail)
        assert t.add_round({(STAGE, SEEN): 100, TYPO: 2}, fresh=True) is None
        assert t.add_round({(STAGE, SEEN): 30, TYPO: 30}, fresh=False) is None


def test_a_recovered_micro_batch_breaks_the_chain():
    t = StreamTally()
    assert t.add_round({(STAGE, SEEN): 40, TYPO: 40}, fresh=True) is None
    assert t.add_round({(STAGE, SEEN): 40, TYPO: 25}, fresh=False) is None  # idle: not judged
    assert t.add_round({(STAGE, SEEN): 40}, fresh=True) is None  # the service came back
    assert t.add_round({(STAGE, SEEN): 40, TYPO: 40}, fresh=True) is None


def test_small_micro_batches_are_judged_together_and_none_turns_it_off():
    """Micro-batches under 20 records are pooled until they hold 20: a typo in a stream of
    19-record micro-batches stops it at the fourth (two judgements of two each)."""
    t = StreamTally()
    for _ in range(3):
        assert t.add_round({(STAGE, SEEN): 19, TYPO: 19}, fresh=True) is None
    message = t.add_round({(STAGE, SEEN): 19, TYPO: 19}, fresh=True)
    assert message is not None
    assert "100% of its records in 2 micro-batches and 38 of 38 (100%) in the next 2" in message
    assert "judged together" in message
    off = StreamTally(share=None)
    for _ in range(3):
        assert off.add_round({(STAGE, SEEN): 40, TYPO: 40}, fresh=True) is None
    with pytest.raises(ValueError, match="runaway_share"):
        StreamTally(share=1.5)


# ---- on Spark ------------------------------------------------------------------------------


def _write_input(directory, files=FILES) -> None:
    directory.mkdir(parents=True)
    for f in range(files):
        with open(directory / f"part-{f}.json", "w") as out:
            for v in range(f * ROWS, (f + 1) * ROWS):
                out.write(json.dumps({"value": v, "word": f"w{v % 5}"}) + "\n")


def _typo(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(double=pdf["vlaue"] * 2)  # a KeyError on every row


def _fixed(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(double=pdf["value"] * 2)


def _start(spark, inbox, sink, fn, checkpoint=None, **settings):
    p = Pipeline(spark, max_attempts=3, **settings)
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(inbox))
    src = p.source(stream, name="files", partitions=2)
    src.map_in_pandas(fn, OUT, name="parse").sink(sink, name="out")
    where = None if checkpoint is None else str(checkpoint)
    return p, p.start_stream(timeout=300.0, checkpoint_location=where, available_now=True)


def test_a_systematic_error_stops_the_stream_and_a_restart_after_the_fix_is_exact(spark, tmp_path):
    inbox = tmp_path / "in"
    _write_input(inbox)
    checkpoint = tmp_path / "checkpoint"
    sink = SQLiteSink(str(tmp_path / "out.db"), "out")

    _, run = _start(spark, inbox, sink, _typo, checkpoint)
    with pytest.raises(RunawayFailure, match=r"stage 'parse'.*KeyError: 'vlaue'") as caught:
        run.wait(timeout=WAIT)
    assert "in the next" in str(caught.value)
    # it stopped at the second micro-batch: nothing dead-lettered, nothing in the sink
    assert run.batches == 1
    assert run.report.dead_lettered == 0
    assert sink.count() == 0

    _, run = _start(spark, inbox, sink, _fixed, checkpoint)  # the fix, on the checkpoint
    report = run.wait(timeout=WAIT)
    n = FILES * ROWS
    got = sink.read().sort_values("value")
    assert list(got["value"]) == list(range(n))  # each record once
    assert list(got["double"]) == [2 * v for v in range(n)]
    assert report.resumed
    assert report.source_records == n  # the whole query, both starts
    assert report.completed == n
    assert report.dead_lettered == 0
    assert report.lost == 0


def test_a_typo_in_a_stream_of_small_micro_batches_stops_it(spark, tmp_path):
    """Micro-batches of 5 records (one file each): each alone is too small to judge, so they
    are judged by 20 records at least; the typo stops the stream instead of dead-lettering
    every record while it goes on."""
    inbox = tmp_path / "in"
    inbox.mkdir(parents=True)
    files, rows = 12, 5
    for f in range(files):
        with open(inbox / f"part-{f:02d}.json", "w") as out:
            for v in range(f * rows, (f + 1) * rows):
                out.write(json.dumps({"value": v, "word": f"w{v % 5}"}) + "\n")
    sink = SQLiteSink(str(tmp_path / "out.db"), "out")
    _, run = _start(spark, inbox, sink, _typo)
    with pytest.raises(RunawayFailure, match=r"stage 'parse'.*micro-batches.*KeyError: 'vlaue'"):
        run.wait(timeout=WAIT)
    assert run.batches < files - 1  # it stopped before the input ran out
    assert run.report.dead_lettered < run.report.source_records
    assert sink.count() == 0


def test_without_the_guard_the_stream_dead_letters_its_input(spark, tmp_path):
    inbox = tmp_path / "in"
    _write_input(inbox, files=2)
    sink = SQLiteSink(str(tmp_path / "out.db"), "out")
    p, run = _start(spark, inbox, sink, _typo, runaway_share=None)
    report = run.wait(timeout=WAIT)
    assert report.dead_lettered == 2 * ROWS
    assert report.lost == 0
    assert sink.count() == 0
    dead = p.dead_letters().to_pandas()
    assert sorted(dead["value"]) == list(range(2 * ROWS))
    assert all("KeyError: 'vlaue'" in r for r in dead["_ft_reason"])
