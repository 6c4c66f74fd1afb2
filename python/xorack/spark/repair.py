"""Repairing dead letters: fix the code, run again only the dead-lettered source records of a
finished job, merge what they produce into the sinks the job already wrote, exactly once.

A job is its durable storage (a SQLite file, whose dead-letter table keeps every dead-lettered
source record's payload) and its work directory: ``Pipeline(storage="sqlite:///…",
workdir=…, resume=True)``, run to the end. :meth:`Pipeline.repair` of the same declaration (the
stages may be fixed) then:

1. reads the dead letters not repaired yet, and refuses, before anything is written, what it
   cannot merge (see :func:`merge_plan`) and a declaration whose plan fingerprint is not the
   job's run's (:mod:`xorack.spark.fingerprint`: the stages may differ, nothing else);
2. runs the declared plan over those records only (a *delta run*: its own rounds, replays and
   ``max_attempts``, an in-memory acker), every sink replaced by a Parquet file under
   ``workdir/repair/<id>/``: nothing reaches the job's sinks while it runs; an inner join of
   tracked frames meets the other side's rows the job completed, computed again
   (:mod:`xorack.spark.repair_join`);
3. notes the repair as under way in the job's storage (mark ``repairing``), then merges each
   sink, each step idempotent: the rows of a row sink are added (a ``ParquetSink`` gets files
   named by the repair, moved in; a Python sink gets rows keyed by ids derived from the repair,
   which it absorbs if written twice); the groups of an aggregate's sink are updated — the
   stored value and the delta combined (``count``/``sum`` added, ``min``/``max`` kept), new
   groups added — in one transaction or directory swap that carries the repair's marker;
4. settles: one transaction of the job's storage records each repaired dead letter (when, by
   which repair, ``repaired`` or ``failed again``), adds the new dead letters of the records
   that failed again (their new reason), and clears the ``repairing`` mark.

A crash before 3 leaves the job as it was (the next repair starts afresh); one after it is
finished by the next ``repair()`` from the staged outputs (the merges already done are
recognized by their markers): never counted twice. A repair with nothing left to repair
changes nothing.

>>> # report = p.repair(); report.repaired, report.failed_again, report.sinks
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..storage import DEAD_LETTER_COLUMNS, SQLiteStorage, storage_path
from .barrier import combining_plan
from .batch import BatchRun
from .context import PipelineConfig, RunContext
from .fingerprint import MARK as PLAN_MARK
from .fingerprint import difference, fingerprint
from .node import Node
from .outputs import (
    Aggregate,
    Barrier,
    NativeSinkNode,
    PythonSinkNode,
    Sink,
    TrackedJoin,
    WindowAggregate,
)
from .plan import Plan
from .repair_join import RepairRefused, check_join, completed_sides, repair_join
from .rows import Source
from .sinks import ParquetSink, SQLiteSink, capabilities_of

#: How a merged value combines the stored one and the repair's, per aggregate function.
MERGEABLE = ("count", "sum", "min", "max")
#: The groups a report names per sink (the count is always there).
NAMED_GROUPS = 20


@dataclass
class RepairReport:
    """What a repair did: dead letters ``repaired`` and ``failed_again`` (dead-lettered again,
    with the new reason), ``still_dead`` (the job's dead letters not repaired after it), per
    sink what changed (``rows_added``; for an aggregate's sink ``groups_changed`` and up to 20
    of those ``groups``), the delta run's own report, and whether it finished a repair a crash
    had cut short (``resumed``)."""

    repair: str = ""
    repaired: int = 0
    failed_again: int = 0
    still_dead: int = 0
    sinks: dict[str, dict[str, Any]] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    wall_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SinkMerge:
    """How one sink takes a repair's output: ``rows`` added, or the groups of an aggregate
    (``keys``, and the function of each value column) merged."""

    node: Sink
    keys: tuple[str, ...] | None = None  # None: a row sink
    functions: tuple[tuple[str, str], ...] = ()  # (column, count|sum|min|max)


# ---- what can be repaired ------------------------------------------------------------------


def check_job(config: PipelineConfig) -> str:
    """The path of the job's SQLite storage; refuses a pipeline that kept no durable job."""
    path = None
    if isinstance(config.storage, SQLiteStorage):
        path = config.storage.path
    elif isinstance(config.storage, (str, os.PathLike)):
        path = storage_path(config.storage)
    if not config.ft or path is None or not config.resume or config.workdir is None:
        raise RepairRefused(
            "repair() needs the job's durable state: Pipeline(storage='sqlite:///...', "
            "workdir=..., resume=True), the same as the run it repairs (a memory storage kept "
            "no dead letters)"
        )
    return path


def merge_plan(plan: Plan) -> list[SinkMerge]:
    """How each sink of ``plan`` takes a repair's output, or :class:`RepairRefused` naming the
    first thing that cannot be merged exactly."""
    if any(s.df is not None and s.df.isStreaming for s in plan.sources if s.derived is None):
        raise RepairRefused(
            "repair() runs batch jobs only: a stream's dead letters would reopen closed windows"
        )
    merges = []
    for barrier in plan.barriers():
        _check_barrier(plan, barrier)
    for node in plan.sinks():
        parent = node.parents[0]
        caps = capabilities_of(node.sink)
        if isinstance(node, PythonSinkNode) and not caps.idempotent:
            raise RepairRefused(
                f"sink {node.name!r} does not absorb a row written twice (not idempotent): a "
                "repair cannot add rows to it exactly once"
            )
        if (
            isinstance(node.sink, ParquetSink)
            and "://" in node.sink.path
            and not (node.sink.path.startswith("file:"))
        ):
            raise RepairRefused(f"sink {node.name!r}: a repair merges local Parquet paths only")
        if isinstance(parent, Source) and isinstance(parent.derived, Aggregate):
            merges.append(_group_merge(plan, node, parent.derived))
        elif all(isinstance(b, TrackedJoin) for b in upstream_barriers(node)):
            merges.append(SinkMerge(node))  # its rows only added (an inner join's included)
        else:
            raise RepairRefused(
                f"sink {node.name!r} reads an aggregate's output through other operations: a "
                "repair merges only sinks that take the aggregate's rows as they are"
            )
    return merges


def upstream_barriers(node: Node) -> list[Barrier]:
    """The barriers whose output reaches ``node``, through any number of phases."""
    found: dict[int, Barrier] = {}
    stack, seen = list(node.parents), set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, Source) and n.derived is not None:
            found[id(n.derived)] = n.derived
            stack.append(n.derived)
        stack.extend(n.parents)
    return list(found.values())


def _check_barrier(plan: Plan, barrier: Barrier) -> None:
    if isinstance(barrier, TrackedJoin):
        check_join(barrier)
        return
    if not isinstance(barrier, Aggregate) or isinstance(barrier, WindowAggregate):
        raise RepairRefused(
            f"{barrier.label} {barrier.name!r}: a repair does not merge time windows or "
            "limits (a repaired record would change which rows the job's windows or limit "
            "kept)"
        )
    if not all(isinstance(b, TrackedJoin) for b in upstream_barriers(barrier)):
        raise RepairRefused(
            f"aggregate {barrier.name!r} reads another aggregate's (or a limit's) output: only "
            "one level of aggregation can be merged"
        )
    source = plan.derived_source(barrier)
    if not all(isinstance(r, Sink) for r in plan.readers(source)):
        raise RepairRefused(
            f"aggregate {barrier.name!r}: its output goes through other operations before its "
            "sinks; a repair merges only sinks that take the aggregate's rows as they are"
        )


def _group_merge(plan: Plan, node: Sink, barrier: Barrier) -> SinkMerge:
    spec = barrier.spec
    if not isinstance(node.sink, (ParquetSink, SQLiteSink)):
        raise RepairRefused(
            f"sink {node.name!r} ({type(node.sink).__name__}) holds an aggregate's groups: a "
            "repair updates groups in a ParquetSink or a SQLiteSink only"
        )
    partials = combining_plan(spec, barrier.parents[0].schema, barrier.schema, global_ok=True)
    bad = None if partials is not None else "functions that do not combine"
    for p in partials or ():
        if p.function not in MERGEABLE:
            bad = f"{p.function}({p.name})"
    if bad is not None:
        raise RepairRefused(
            f"aggregate {barrier.name!r} has {bad}: a repair merges count/sum/min/max into the "
            "stored groups; holistic functions (and avg, stored without its count) would need "
            "the groups recomputed from the input rows, which a finished job does not keep "
            "(its staged rows, ~12 bytes per row on disk, are removed): rerun the job"
        )
    functions = tuple((p.name, p.function) for p in partials or ())
    return SinkMerge(node, keys=tuple(spec.keys), functions=functions)


# ---- the delta plan: the declared plan over the dead letters, every sink staged -------------


def delta_plan(
    plan: Plan,
    inputs: dict[int, Any],
    staged: dict[str, str],
    done: dict[int, tuple[Any, Any]] | None = None,
) -> Plan:
    """``plan`` with each input source reading ``inputs[index]``, each sink written as
    Parquet to ``staged[name]``, and each tracked join meeting the job's completed rows
    ``done[id(join)]`` (:mod:`xorack.spark.repair_join`)."""
    new: dict[int, Node] = {}
    for node in plan.nodes:
        parents = tuple(new[id(p)] for p in node.parents)
        clone: Node
        if isinstance(node, Sink):
            clone = NativeSinkNode(
                node.name,
                parents,
                node.columns,
                node.schema,
                phase=node.phase,
                sink=ParquetSink(staged[node.name]),
                caps=ParquetSink.capabilities,
            )
        elif isinstance(node, Source) and node.derived is None:
            keep = node.keys or node.repartition
            fixed = node.fixed_partitions if keep else 0
            clone = dataclasses.replace(
                node, parents=parents, df=inputs[node.index], fixed_partitions=fixed
            )
        elif isinstance(node, Source):
            clone = dataclasses.replace(node, parents=parents, derived=new[id(node.derived)])
        elif isinstance(node, TrackedJoin):
            clone = repair_join(node, parents, (done or {})[id(node)])
        else:
            clone = dataclasses.replace(node, parents=parents)
        new[id(node)] = clone
    sources = tuple(_as_source(new[id(s)]) for s in plan.sources)
    return Plan(tuple(new[id(n)] for n in plan.nodes), sources, plan.watermark)


def _as_source(node: Node) -> Source:
    assert isinstance(node, Source)
    return node


def _payload(table: pa.Table) -> pa.Table:
    return table.drop_columns([c for c in DEAD_LETTER_COLUMNS if c in table.schema.names])


def _input_frame(spark: Any, source: Source, letters: pa.Table, where: str) -> Any:
    """The dead-lettered rows of ``source`` as a DataFrame of its payload schema, read from a
    Parquet file at ``where`` (a file source: read in the same order by every task attempt)."""
    payload = _payload(letters)
    if payload.num_columns == len(source.columns):
        payload = payload.rename_columns(list(source.columns))
    if not payload.num_rows:
        return spark.createDataFrame([], source.schema)
    os.makedirs(where, exist_ok=True)
    pq.write_table(payload, os.path.join(where, "part-00000.parquet"))
    return spark.read.schema(source.schema).parquet(where)


def _row_keys(table: pa.Table) -> list[Any]:
    """A hashable key per row of a payload table (rows equal in value, equal keys)."""
    return [json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist()]


def pair_again(pending: pa.Table, again: pa.Table) -> dict[int, int]:
    """Which of the ``pending`` dead letters failed again in the delta run: their origin id ->
    the origin id of the new dead letter (``again``), paired by source and payload (rows equal
    in value are interchangeable)."""
    waiting: dict[tuple[int, Any], list[int]] = {}
    sources = pending.column("_ft_source").to_pylist()
    origins = pending.column("_ft_origin").to_pylist()
    for s, o, k in zip(sources, origins, _row_keys(_payload(pending)), strict=True):
        waiting.setdefault((s, k), []).append(o)
    out = {}
    a_src = again.column("_ft_source").to_pylist()
    a_org = again.column("_ft_origin").to_pylist()
    for s, o, k in zip(a_src, a_org, _row_keys(_payload(again)), strict=True):
        left = waiting.get((s, k))
        if left:
            out[left.pop()] = o
    return out


# ---- merging into the sinks ------------------------------------------------------------------


def _stable_ids(repair: str, sink: str, n: int) -> np.ndarray:
    """``n`` record ids for a repair's rows of a sink, the same every time (a merge done again
    is absorbed), nonzero."""
    seed = int.from_bytes(
        hashlib.blake2b(f"{repair}/{sink}".encode(), digest_size=8).digest(), "little"
    )
    with np.errstate(over="ignore"):
        x = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)
        x ^= x >> np.uint64(31)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(29)
    x[x == 0] = 1
    return x


def _combine(function: str, old: Any, new: Any) -> Any:
    if new is None or (isinstance(new, float) and math.isnan(new) and function != "sum"):
        return old
    if old is None:
        return new
    if function in ("count", "sum"):
        return old + new
    return min(old, new) if function == "min" else max(old, new)


def _group_key(row: dict[str, Any], keys: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(
        "\0nan" if isinstance(row[k], float) and math.isnan(row[k]) else row[k] for k in keys
    )


def merge_groups(
    old: list[dict[str, Any]], delta: list[dict[str, Any]], merge: SinkMerge
) -> tuple[list[int], list[dict[str, Any]]]:
    """The stored groups ``old`` updated by the repair's ``delta`` (in place): returns the
    positions in ``old`` that changed and the new groups."""
    assert merge.keys is not None
    where = {_group_key(r, merge.keys): i for i, r in enumerate(old)}
    changed: list[int] = []
    added: list[dict[str, Any]] = []
    for row in delta:
        i = where.get(_group_key(row, merge.keys))
        if i is None:
            added.append(row)
            continue
        before = dict(old[i])
        for column, function in merge.functions:
            old[i][column] = _combine(function, old[i][column], row[column])
        if old[i] != before:
            changed.append(i)
    return changed, added


def _named(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[Any]:
    return [list(_group_key(r, keys)) for r in rows[:NAMED_GROUPS]]


class SinkMerger:
    """Merges one repair's staged outputs into the job's sinks; every step idempotent."""

    def __init__(self, spark: Any, repair: str, root: str) -> None:
        self.spark = spark
        self.repair = repair
        self.root = root

    def staged(self, name: str) -> str:
        return os.path.join(self.root, "sinks", _safe(name))

    def read_staged(self, name: str) -> pa.Table:
        path = self.staged(name)
        if not os.path.isdir(path):
            return pa.table({})
        files = sorted(
            os.path.join(path, f)
            for f in os.listdir(path)
            if f.endswith(".parquet") and not f.startswith(("_", "."))
        )
        if not files:
            return pa.table({})
        return pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")

    def merge(self, merge: SinkMerge) -> dict[str, Any]:
        if merge.keys is None:
            return self._rows(merge)
        return self._groups(merge)

    def _rows(self, merge: SinkMerge) -> dict[str, Any]:
        node, sink = merge.node, merge.node.sink
        if isinstance(sink, ParquetSink):
            name = f"repair-{self.repair}"
            sink.remove_named(self.spark, name)  # a crash's partial move: done again whole
            staged = self.spark.read.schema(node.schema).parquet(self.staged(node.name))
            n = sink.append(staged, name=name)
            return {"rows_added": n}
        table = self.read_staged(node.name)
        if not table.num_rows:
            return {"rows_added": 0}
        rows = table.select(list(node.columns)).to_pandas()
        writer = sink.open_writer(0)
        try:
            dup = writer.write(rows, _stable_ids(self.repair, node.name, len(rows)))
        finally:
            writer.close()
        return {"rows_added": len(rows) - int(dup or 0)}

    def _groups(self, merge: SinkMerge) -> dict[str, Any]:
        node, sink = merge.node, merge.node.sink
        assert merge.keys is not None
        delta = self.read_staged(node.name).to_pylist()
        if isinstance(sink, SQLiteSink):
            rec, frame = sink.read_keyed()
            old = [{str(k): _plain(v) for k, v in r.items()} for r in frame.to_dict("records")]
            changed, added = merge_groups(old, delta, merge)
            rows = pd.DataFrame([old[i] for i in changed] + added, columns=list(node.columns))
            ids = np.concatenate(
                [rec[changed], _stable_ids(self.repair, node.name, len(added))]
            ).astype(np.uint64)
            if not sink.merge_once(f"{self.repair}:{sink.table}", rows, ids):
                changed, added = [], []  # merged before (a repair a crash cut short)
        else:
            changed, added, old = self._parquet_groups(sink, merge, delta)
        touched = [old[i] for i in changed] + added
        return {"groups_changed": len(touched), "groups": _named(touched, merge.keys)}

    def _parquet_groups(
        self, sink: ParquetSink, merge: SinkMerge, delta: list[dict[str, Any]]
    ) -> tuple[list[int], list[dict[str, Any]], list[dict[str, Any]]]:
        """Rewrite the sink's directory with the merged groups, swapped in whole; the new one
        carries the repair's marker (``_xorack-repair-<id>``, which Spark's reader skips)."""
        path = sink.path[len("file:") :] if sink.path.startswith("file:") else sink.path
        path = path.rstrip("/")
        marker = f"_xorack-repair-{self.repair}"
        fresh, stale = f"{path}.xorack-repair-{self.repair}", f"{path}.xorack-was-{self.repair}"
        if not os.path.isdir(path) and os.path.exists(os.path.join(fresh, marker)):
            os.rename(fresh, path)  # a crash between the two renames
        table = pq.read_table(path)
        old = table.to_pylist()
        if os.path.exists(os.path.join(path, marker)):  # merged before: report it again
            shutil.rmtree(stale, ignore_errors=True)
            return [], [], old
        changed, added = merge_groups(old, delta, merge)
        shutil.rmtree(fresh, ignore_errors=True)
        os.makedirs(fresh)
        schema = table.schema
        merged = pa.Table.from_pylist(old + added, schema=schema)
        pq.write_table(merged, os.path.join(fresh, "part-00000-repair.parquet"))
        with open(os.path.join(fresh, marker), "w") as f:
            f.write(self.repair)
        os.rename(path, stale)
        os.rename(fresh, path)
        shutil.rmtree(stale, ignore_errors=True)
        return changed, added, old


def _plain(v: Any) -> Any:
    """A pandas cell as a plain Python value (None for a missing one)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


# ---- a repair ----------------------------------------------------------------------------------


class Repair:
    """One ``Pipeline.repair()`` of the job that ``config`` names, with ``plan`` (the
    declaration, stages possibly fixed)."""

    def __init__(self, config: PipelineConfig, plan: Plan) -> None:
        self.config = config
        self.plan = plan
        self.path = check_job(config)
        self.merges = merge_plan(plan)
        assert config.workdir is not None
        self.base = os.path.join(config.workdir, "repair")

    def run(self) -> RepairReport:
        start = time.perf_counter()
        storage = SQLiteStorage(self.path)
        try:
            report = self._run(storage)
        finally:
            storage.close()
        report.wall_seconds = round(time.perf_counter() - start, 3)
        return report

    def _run(self, storage: SQLiteStorage) -> RepairReport:
        marks = storage.marks()
        if "report" not in marks:
            raise RepairRefused(
                "repair(): the job has not finished (run() it to the end first: with "
                "resume=True a crashed run is finished by running it again)"
            )
        self._check_declaration(marks.get(PLAN_MARK))
        under_way = marks.get("repairing")
        if under_way is not None and os.path.exists(self._outcome_file(under_way)):
            report = self._load(under_way)
            report.resumed = True
        else:
            self._clear_stale(keep=None)
            letters, repairs = storage.dead_letters(), storage.repairs()
            pending = _not_repaired(letters, repairs)
            if self._any_derived(pending):
                raise RepairRefused(
                    "repair(): some dead letters are rows of an aggregate's output (a "
                    "failure after the aggregation); a repair merges dead source records only"
                )
            if not pending.num_rows:
                return RepairReport(still_dead=0)
            report = self._delta(pending)
            storage.update_job(marks={"repairing": report.repair})
        merger = SinkMerger(self.config.spark, report.repair, self._dir(report.repair))
        for merge in self.merges:
            report.sinks[merge.node.name] = merger.merge(merge)
        outcomes, again = self._outcomes(report.repair)
        at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        summary = json.dumps({**report.as_dict(), "at": at})
        storage.settle_repair(
            report.repair,
            at,
            outcomes,
            again,
            {"repairing": None, f"repair:{report.repair}": summary},
        )
        report.still_dead = _not_repaired(storage.dead_letters(), storage.repairs()).num_rows
        self._clear_stale(keep=None)
        return report

    def _check_declaration(self, stored: str | None) -> None:
        """Refuses a declaration whose fingerprint is not the job's (:mod:`.fingerprint`)."""
        if stored is None:
            raise RepairRefused(
                "repair(): the job's run kept no fingerprint of its plan (run by an earlier "
                "xorack): its declaration cannot be checked; rerun the job"
            )
        assert self.config.workdir is not None
        differs = difference(fingerprint(self.plan, self.config.workdir), json.loads(stored))
        if differs is not None:
            raise RepairRefused(
                f"repair(): the declaration is not the job's ({differs}); declare the same "
                "sources, operations and sinks (only the stages may change)"
            )

    # ---- the delta run

    def _dir(self, repair: str) -> str:
        return os.path.join(self.base, repair)

    def _outcome_file(self, repair: str) -> str:
        return os.path.join(self._dir(repair), "outcome.json")

    def _any_derived(self, letters: pa.Table) -> bool:
        """Whether some of ``letters`` (dead-letter rows) are rows of a barrier's output, not
        source records."""
        derived = self.plan.derived_indexes()
        if not letters.num_rows or not derived:
            return False
        src = letters.column("_ft_source").to_numpy(zero_copy_only=False)
        return bool(np.isin(src, list(derived)).any())

    def _delta(self, pending: pa.Table) -> RepairReport:
        """Run the plan over the ``pending`` dead letters, sinks staged; note the outcome."""
        repair = f"{time.time_ns():020d}"
        root = self._dir(repair)
        spark = self.config.spark
        inputs = {}
        for source in self.plan.sources:
            if source.derived is None:
                mine = pending.filter(pa.compute.equal(pending.column("_ft_source"), source.index))
                where = os.path.join(root, "input", str(source.index))
                inputs[source.index] = _input_frame(spark, source, mine, where)
        staged = {n.name: os.path.join(root, "sinks", _safe(n.name)) for n in self.plan.sinks()}
        # a tracked join's other side: the job's completed rows, recomputed (repair_join)
        done = completed_sides(self.config, self.plan, inputs)
        config = dataclasses.replace(
            self.config,
            storage="memory",
            resume=False,
            job=None,
            workdir=os.path.join(root, "work"),
            # an optimistic round joins its own rows only; tracked rounds' join meets `done`
            optimistic=self.config.optimistic and not done,
        )
        ctx = RunContext(config, delta_plan(self.plan, inputs, staged, done))
        run = BatchRun(ctx).run()
        again = ctx.dead_letters if ctx.dead_letters is not None else pa.table({})
        if self._any_derived(again):
            raise RepairRefused(
                "repair(): a row of a join's output failed in the repair (a failure after "
                "the join); a repair merges dead source records only: nothing was merged"
            )
        paired = pair_again(pending, again) if again.num_rows else {}
        origins = pending.column("_ft_origin").to_pylist()
        report = RepairReport(
            repair=repair,
            repaired=len(origins) - len(paired),
            failed_again=len(paired),
            run=run.as_dict(),
        )
        if again.num_rows:
            pq.write_table(again, os.path.join(root, "again.parquet"))
        outcome = {
            "report": report.as_dict(),
            "outcomes": [
                [o, "failed again" if o in paired else "repaired", paired.get(o)] for o in origins
            ],
        }
        tmp = self._outcome_file(repair) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(outcome, f)
        os.replace(tmp, self._outcome_file(repair))
        shutil.rmtree(os.path.join(root, "work"), ignore_errors=True)
        return report

    def _load(self, repair: str) -> RepairReport:
        with open(self._outcome_file(repair)) as f:
            got = json.load(f)["report"]
        got["sinks"] = {}
        return RepairReport(**got)

    def _outcomes(self, repair: str) -> tuple[list[tuple[int, str, int | None]], pa.Table | None]:
        with open(self._outcome_file(repair)) as f:
            outcomes = [
                (int(o), str(w), None if n is None else int(n))
                for o, w, n in json.load(f)["outcomes"]
            ]
        path = os.path.join(self._dir(repair), "again.parquet")
        again = pq.read_table(path) if os.path.exists(path) else None
        return outcomes, again

    def _clear_stale(self, keep: str | None) -> None:
        """Remove what repairs that were settled, or cut short before merging, left."""
        if not os.path.isdir(self.base):
            return
        for name in os.listdir(self.base):
            if name != keep:
                shutil.rmtree(os.path.join(self.base, name), ignore_errors=True)


def _not_repaired(letters: pa.Table, repairs: pa.Table) -> pa.Table:
    """The dead letters that no repair has taken."""
    if not letters.num_rows or not repairs.num_rows:
        return letters
    done = pa.compute.is_in(letters.column("_ft_origin"), value_set=repairs.column("origin"))
    return letters.filter(pa.compute.invert(done))


_STAGE = re.compile(r"^(?:stage|sink) (.+?): |^native '(.+?)': ")


def dead_letter_view(config: PipelineConfig) -> pd.DataFrame:
    """The job's dead-letter table as a pandas DataFrame: ``stage`` (parsed from the reason),
    ``error``, ``attempts``, ``source``, ``origin``, the payload columns, and its repair status:
    ``status`` (``dead``, ``repaired``, ``failed again``), ``repaired_at``, ``repair``."""
    storage = SQLiteStorage(check_job(config))
    try:
        letters, repairs = storage.dead_letters(), storage.repairs()
    finally:
        storage.close()
    df = _payload(letters).to_pandas()
    reasons = letters.column("_ft_reason").to_pylist()
    stages = []
    for r in reasons:
        m = _STAGE.match(r or "")
        stages.append(None if m is None else (m.group(1) or m.group(2)))
    columns = [repairs.column(c).to_pylist() for c in ("origin", "repair", "at", "outcome")]
    by = {o: (w, r, a) for o, r, a, w in zip(*columns, strict=True)}
    origins = letters.column("_ft_origin").to_pylist()
    head = pd.DataFrame(
        {
            "stage": stages,
            "error": reasons,
            "attempts": letters.column("_ft_attempts").to_pylist(),
            "source": letters.column("_ft_source").to_pylist(),
            "origin": origins,
            "status": [by.get(o, ("dead",))[0] for o in origins],
            "repair": [by.get(o, (None, None))[1] for o in origins],
            "repaired_at": [by.get(o, (None, None, None))[2] for o in origins],
        }
    )
    return pd.concat([head, df.reset_index(drop=True)], axis=1)


__all__ = [
    "RepairRefused",
    "RepairReport",
    "SinkMerge",
    "dead_letter_view",
    "delta_plan",
    "merge_groups",
    "merge_plan",
]
