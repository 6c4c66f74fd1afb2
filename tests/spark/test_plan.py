"""The plan without a running Spark: nodes built directly, the graph questions a run asks,
each node kind's reason to refuse an optimistic round, explain(), sink capabilities and the
typed reasons of a report."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")

from pyspark.sql.types import LongType, StringType, StructField, StructType

from xorack.spark import ParquetSink, PhaseNote, Reason, RunReport, SQLiteSink
from xorack.spark.barrier import AggregateSpec, JoinSpec
from xorack.spark.outputs import (
    Aggregate,
    NativeSinkNode,
    PythonSinkNode,
    TrackedJoin,
)
from xorack.spark.plan import Plan
from xorack.spark.rows import GroupStage, PandasStage, Source, Transform, Union
from xorack.spark.sinks import SinkCapabilities, capabilities_of

WORDS = StructType([StructField("word", StringType())])
COUNTS = StructType([StructField("word", StringType()), StructField("n", LongType(), False)])


def _source(name: str, index: int, phase: int = 0, derived=None) -> Source:
    return Source(name, (), ("word",), WORDS, index=index, phase=phase, derived=derived)


def _wordcount(sink_phase1: type = NativeSinkNode):
    """lines -> split (pandas) -> aggregate | counts -> sink."""
    lines = _source("lines", 0)
    split = PandasStage("split", (lines,), ("word",), WORDS, fn=lambda pdf: pdf)
    spec = AggregateSpec(("word",), ())
    agg = Aggregate("aggregate", (split,), ("word", "n"), COUNTS, phase=1, spec=spec)
    counts = Source("aggregate", (), ("word", "n"), COUNTS, index=1, phase=1, derived=agg)
    caps = SinkCapabilities(native=sink_phase1 is NativeSinkNode)
    sink = sink_phase1("counts", (counts,), counts.columns, COUNTS, phase=1, sink=None, caps=caps)
    nodes = (lines, split, agg, counts, sink)
    return Plan(nodes, (lines, counts)), nodes


def _blockers(plan: Plan, phase: int) -> list[tuple[Reason, str] | None]:
    scope = plan.scope(phase)
    return [n.blocker(scope) for n in plan.phase_nodes(phase)]


def test_the_graph_questions_of_a_wordcount():
    plan, (lines, split, agg, counts, sink) = _wordcount()
    assert plan.readers(lines) == (split,)
    assert plan.readers(split) == (agg,)
    assert plan.readers(sink) == ()
    assert plan.phase_count() == 2
    assert plan.phase_nodes(0) == [lines, split, agg]
    assert plan.phase_nodes(1) == [counts, sink]
    assert plan.phase_nodes(1, skip=lambda s: s is counts) == []
    assert plan.derived_source(agg) is counts
    assert plan.derived_indexes() == {1}
    assert plan.direct(counts)  # read only by a native sink: written at the publish
    assert not plan.direct(lines)  # an input source is always tracked
    assert plan.births_in_stage(lines)  # a pandas stage alone reads it
    assert plan.sinks() == [sink]
    assert plan.barriers() == [agg]


def test_a_phase_of_row_nodes_and_a_native_sink_can_run_optimistically():
    plan, _ = _wordcount()
    assert _blockers(plan, 0) == [None, None, None]
    assert _blockers(plan, 1) == [None, None]


def test_a_sink_written_from_python_blocks_its_phase():
    plan, _ = _wordcount(PythonSinkNode)
    assert not plan.direct(plan.sources[1])
    assert _blockers(plan, 1)[-1] == (Reason.PYTHON_SINK, "sink 'counts' is written from Python")


def test_each_node_kind_gives_its_own_reason():
    lines = _source("lines", 0)
    grouped = GroupStage("dedupe", (lines,), ("word",), WORDS, fn=len, keys=("word",))
    tee_a = Transform("a", (grouped,), ("word",), WORDS, fn=lambda df: df)
    tee_b = Transform("b", (grouped,), ("word",), WORDS, fn=lambda df: df)
    unread = Transform("c", (lines,), ("word",), WORDS, fn=lambda df: df)
    caps = SinkCapabilities(native=True)
    sink = NativeSinkNode("out", (tee_a,), ("word",), WORDS, sink=None, caps=caps)
    plan = Plan((lines, grouped, tee_a, tee_b, unread, sink), (lines,))
    scope = plan.scope(0)
    assert lines.blocker(scope) is None  # a branch point Spark computes alike per reader
    assert grouped.blocker(scope) == (Reason.GROUPED_STAGE, "apply_in_pandas stage 'dedupe'")
    assert unread.blocker(scope) == (Reason.UNREAD, "the rows of 'c' reach no sink")
    assert tee_a.blocker(scope) is None
    assert sink.blocker(scope) is None


def test_a_branch_point_after_a_python_stage_or_a_transform_is_refused():
    """An optimistic round computes a branch point once per reader: a Python stage before it
    would send its events twice, an untracked transform could give other rows."""
    caps = SinkCapabilities(native=True)
    for kind in (PandasStage, Transform):
        lines = _source("lines", 0)
        fn = (lambda pdf: pdf) if kind is PandasStage else (lambda df: df)
        step = kind("step", (lines,), ("word",), WORDS, fn=fn)
        a = NativeSinkNode("a", (step,), ("word",), WORDS, sink=None, caps=caps)
        b = NativeSinkNode("b", (step,), ("word",), WORDS, sink=None, caps=caps)
        plan = Plan((lines, step, a, b), (lines,))
        reason, detail = step.blocker(plan.scope(0))
        assert reason is Reason.BRANCH_POINT
        assert detail.startswith("'step' is a branch point: the ")
        assert "'step' would run once per reader" in detail


def test_a_barrier_meeting_rows_of_two_phases_and_a_sink_fed_by_two():
    plan, (_lines, split, _agg, counts, _) = _wordcount()
    join = TrackedJoin("join", (counts, split), ("word", "n"), COUNTS, phase=2, spec=None)
    joined = Source("join", (), ("word", "n"), COUNTS, index=2, phase=2, derived=join)
    both = Union("union", (split, counts), ("word",), WORDS, phase=1)
    caps = SinkCapabilities(native=True)
    sink = NativeSinkNode("all", (both,), ("word",), WORDS, phase=1, sink=None, caps=caps)
    plan = Plan((*plan.nodes, join, joined, both, sink), (*plan.sources, joined))
    scope = plan.scope(1)
    assert join.blocker(scope) == (Reason.BARRIER_OF_TWO_PHASES, "'join' meets rows of two phases")
    assert sink.blocker(scope) == (Reason.SINK_OF_TWO_PHASES, "sink 'all' gets rows of two phases")


def test_explain_names_phases_nodes_lineage_and_how_each_phase_runs():
    plan, _ = _wordcount(PythonSinkNode)
    heads = {1: "tracked rounds [python_sink] sink 'counts' is written from Python"}
    lines = plan.explain(heads.get).splitlines()
    assert lines[0] == "phase 0"
    assert "phase 1: tracked rounds [python_sink] sink 'counts' is written from Python" in lines
    assert "  map_in_pandas 'split' <- 'lines'" in lines
    assert any("lineage: 1 → 0..n (anchored" in line for line in lines)
    assert any("lineage: n → 1" in line for line in lines)
    assert "  aggregate 'aggregate': groupBy(word).agg() <- 'split'" in lines
    assert plan.explain().splitlines()[0] == "phase 0"  # without heads


def test_a_tracked_join_describes_itself():
    _plan, (_, split, *_rest) = _wordcount()
    join = TrackedJoin("j", (split, split), ("word",), WORDS, spec=JoinSpec(("word",), "inner"))
    assert join.describe() == "join 'j': join(['word'], 'inner')"
    assert join.lineage.startswith("2 → 1")


# ---- sink capabilities ----------------------------------------------------------------------


class _OldNativeSink:  # a sink of one's own, written before capabilities existed
    native = True

    def create(self, columns):
        pass

    def write(self, df):
        return None


class _OldPythonSink:
    round_writes = True

    def create(self, columns, schema=None):
        pass

    def open_writer(self, partition):
        raise NotImplementedError

    def retract(self, src_ids):
        return 0


def test_sinks_declare_their_capabilities(tmp_path):
    sqlite = capabilities_of(SQLiteSink(str(tmp_path / "x.db")))
    assert sqlite == SinkCapabilities(
        idempotent=True, retractable=True, round_writable=True, typed=True, counts=True
    )
    parquet = capabilities_of(ParquetSink(str(tmp_path / "p")))
    assert parquet.native
    assert parquet.adopts
    assert not parquet.retractable


def test_a_sink_of_ones_own_gets_capabilities_from_its_protocol():
    assert capabilities_of(_OldNativeSink()) == SinkCapabilities(native=True)
    old = capabilities_of(_OldPythonSink())
    assert (old.native, old.retractable, old.round_writable, old.typed, old.counts) == (
        False,
        True,
        True,
        True,
        False,  # no count()
    )


def test_a_subclass_that_says_otherwise_the_older_way_is_heard(tmp_path):
    class NoRoundWrites(SQLiteSink):
        round_writes = False

    class Untyped(SQLiteSink):
        def create(self, columns):
            return super().create(columns)

    caps = capabilities_of(NoRoundWrites(str(tmp_path / "a.db")))
    assert not caps.round_writable
    assert caps.retractable
    assert not capabilities_of(Untyped(str(tmp_path / "b.db"))).typed


def test_what_is_not_a_sink_is_refused_with_what_a_sink_needs():
    with pytest.raises(TypeError, match=r"create, open_writer"):
        capabilities_of(object())

    class HalfNative:
        native = True

        def create(self, columns):
            pass

    with pytest.raises(TypeError, match=r"create, write"):
        capabilities_of(HalfNative())


# ---- typed reasons in the report --------------------------------------------------------------


def test_a_report_notes_typed_reasons_and_survives_json():
    report = RunReport()
    report.note(PhaseNote(0, Reason.UNBALANCED, "the events do not cancel"))
    report.note(PhaseNote(1, Reason.PYTHON_SINK, "sink 'w' is written from Python"))
    assert report.optimistic_fallbacks == ["phase 0: the events do not cancel"]
    assert report.tracked_phases == ["phase 1: sink 'w' is written from Python"]
    assert report.phase_reasons == {0: Reason.UNBALANCED, 1: Reason.PYTHON_SINK}
    back = RunReport.from_dict(json.loads(json.dumps(report.as_dict())))
    assert back == report
    assert RunReport.from_dict({"lost": 0, "a_key_of_another_version": 1}).lost == 0


def test_fallback_reasons_are_told_apart_from_blocking_ones():
    fell_back = {r for r in Reason if r.fell_back}
    assert fell_back == {
        Reason.ROW_FAILED,
        Reason.NATIVE_ROW_ERROR,
        Reason.TASK_FAILED,
        Reason.METRICS_MISSING,
        Reason.UNBALANCED,
    }
