"""The runaway guard on small inputs: a stage of a few records that one error fails entirely,
attempt after attempt, stops the run (a typo), as it does on large inputs; a poison record among
a few never trips it; a stage of one record cannot be judged and says so in the run's log."""

from __future__ import annotations

import logging
import sys

import pandas as pd
import pytest

from xorack.spark.guard import FailureTally

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TYPO = ("stage 'count_chars'", "AttributeError: 'DataFrame' object has no attribute 'lines'")


# ---- the decision (no Spark) -----------------------------------------------------------------


def test_every_record_of_a_small_stage_failed_twice_stops_the_run():
    t = FailureTally()
    assert t.add_round({(TYPO[0], ""): 3, TYPO: 3}) is None  # one attempt proves nothing
    message = t.add_round({TYPO: 3})
    assert message is not None
    assert "3 of 3 (100%)" in message
    assert TYPO[1] in message


def test_a_poison_record_among_a_few_never_stops_the_run():
    t = FailureTally()
    assert t.add_round({(TYPO[0], ""): 3, TYPO: 1}) is None
    assert t.add_round({TYPO: 1}) is None
    assert t.add_round({TYPO: 1}) is None
    assert t.undecided() == []


def test_a_small_stage_that_recovers_never_stops_the_run():
    t = FailureTally()
    assert t.add_round({(TYPO[0], ""): 5, TYPO: 5}) is None
    assert t.add_round({TYPO: 4}) is None  # one of the five went through
    assert t.add_round({TYPO: 4}) is None  # 4 of 5: all but one, and under the 20 of a share


def test_a_stage_of_one_record_is_undecided_and_says_so():
    t = FailureTally()
    assert t.add_round({(TYPO[0], ""): 1, TYPO: 1}) is None
    assert t.undecided() == []  # once is a transient failure as much as anything
    assert t.add_round({TYPO: 1}) is None
    (note,) = t.undecided()
    assert note.startswith(f"{TYPO[0]}: its only source record failed twice")
    assert "cannot tell a systematic error from a poison record" in note


def test_no_guard_no_judgement():
    t = FailureTally(share=None)
    assert t.add_round({(TYPO[0], ""): 3, TYPO: 3}) is None
    assert t.add_round({TYPO: 3}) is None


# ---- on Spark ------------------------------------------------------------------------------


def _typo(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(n=pdf.lines.str.len())  # 'lines': the column is 'line'


def _lines(spark, n: int):
    return spark.createDataFrame([(i, f"line {i}") for i in range(n)], "id long, line string")


@pytest.mark.spark
def test_a_three_row_job_with_a_typo_stops_the_run(spark, tmp_path):
    from pyspark.errors import PythonException

    from xorack.spark import Pipeline, RunawayFailure, SQLiteSink

    # the oracle: plain Spark fails the same job (the error is the user's, not xorack's)
    with pytest.raises(PythonException, match="no attribute 'lines'"):
        _lines(spark, 3).mapInPandas(lambda it: map(_typo, it), "id long, n long").collect()
    p = Pipeline(spark, max_attempts=3)
    p.source(_lines(spark, 3), name="lines").map_in_pandas(
        _typo, "id long, n long", name="count_chars"
    ).sink(SQLiteSink(str(tmp_path / "t.db"), "t"))
    with pytest.raises(RunawayFailure) as err:
        p.run()
    message = str(err.value)
    assert "stage 'count_chars'" in message
    assert "AttributeError" in message
    assert "3 of 3" in message


@pytest.mark.spark
def test_a_one_row_job_with_a_typo_is_dead_lettered_with_a_warning(spark, tmp_path, caplog):
    from xorack.spark import Pipeline, SQLiteSink

    sink = SQLiteSink(str(tmp_path / "t.db"), "t")
    p = Pipeline(spark, max_attempts=2)
    p.source(_lines(spark, 1), name="lines").map_in_pandas(
        _typo, "id long, n long", name="count_chars"
    ).sink(sink)
    with caplog.at_level(logging.WARNING, logger="xorack"):
        report = p.run()
    assert report.dead_lettered == 1
    assert report.lost == 0
    assert len(sink.read()) == 0
    warnings = [r.getMessage() for r in caplog.records if "runaway guard" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "stage 'count_chars': its only source record failed twice" in warnings[0]
