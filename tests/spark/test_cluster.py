"""xorack on a real multi-process Spark cluster: ``local-cluster[2,1,1024]``, two executor JVMs
(each with its own Python workers) started by the driver on this machine.

What local mode cannot show: executors reaching the acker over the network stack (with the
token, over TLS on a non-loopback address), everything a task needs being serialized to another
JVM, and an executor JVM killed with SIGKILL in the middle of a round — or between the map and
the reduce stage of an aggregation, with its shuffle files.

A JVM hosts one SparkContext, and the other test modules share a ``local[2]`` one, so this
group runs in a pytest process of its own: ``python -m pytest -m cluster`` (any run whose
``-m`` does not name ``cluster`` leaves it out: see ``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import test_topology as topology

from conftest import own_address
from xorack import ServiceError, demo
from xorack.spark import ParquetSink, Pipeline, SQLiteSink, current_round

pytest.importorskip("pyspark", reason="pyspark is not installed: install xorack[test]")
from pyspark import cloudpickle

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not sys.platform.startswith("linux"),
        reason="finds the executor JVMs through /proc (Linux only)",
    ),
]

# Spark's Python workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MASTER = "local-cluster[2,1,1024]"
EXECUTORS = 2
EXECUTOR_MAIN = "CoarseGrainedExecutorBackend"
N = 2000
SERVE = (sys.executable, "-m", "xorack", "serve", "--port", "0", "--rotate-interval", "0")
PARTITIONS = 4


# ---- the cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cluster():
    """One local-cluster session for the whole group (it takes ~15-20 s to start)."""
    from pyspark import SparkContext

    from xorack.spark.session import get_or_create_session

    active = SparkContext._active_spark_context
    if active is not None and not active.master.startswith("local-cluster"):
        pytest.fail(
            f"a {active.master} SparkContext already runs in this process (one per JVM): run "
            "the cluster group in its own pytest process: python -m pytest -m cluster"
        )
    session = get_or_create_session(
        MASTER, app_name="xorack-cluster-tests", shuffle_partitions=PARTITIONS
    )
    yield session
    session.stop()


@pytest.fixture
def spark(cluster):
    """The cluster session, once both executors are registered (also after one was killed:
    the standalone master replaces a lost executor)."""
    _wait_for_executors(cluster, EXECUTORS)
    return cluster


def _wait_for_executors(spark, n: int, timeout: float = 120.0) -> None:
    status = spark.sparkContext._jsc.sc().getExecutorMemoryStatus
    deadline = time.monotonic() + timeout
    while status().size() < n + 1:  # the driver's block manager counts too
        if time.monotonic() > deadline:
            pytest.fail(f"{MASTER}: {n} executors not registered after {timeout:.0f} s")
        time.sleep(0.5)


def _executor_jvms() -> list[int]:
    """The pids of the executor JVMs this process (the driver) started: its descendants whose
    command line runs CoarseGrainedExecutorBackend (never another test run's executors)."""
    parents: dict[int, int] = {}
    executors = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited meanwhile
        pid = int(entry.name)
        parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        if EXECUTOR_MAIN.encode() in cmdline:
            executors.append(pid)
    me = os.getpid()

    def mine(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == me:
                return True
        return False

    return sorted(p for p in executors if mine(p))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


# ---- a small pipeline: numbers → (number, square) → SQLite ----------------------------------


def _numbers(spark):
    return spark.range(N, numPartitions=PARTITIONS).selectExpr("id AS n")


def _square(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(sq=pdf["n"] * pdf["n"])


def _run_squares(spark, tmp_path, fn=_square, **pipeline_kw):
    sink = SQLiteSink(str(tmp_path / "squares.db"), "squares")
    p = Pipeline(spark, **pipeline_kw)
    p.source(_numbers(spark), name="numbers").map_in_pandas(
        fn, "n long, sq long", name="square"
    ).sink(sink, name="squares")
    rounds = []
    report = p.run(on_round=rounds.append)
    return report, sink, rounds


def _assert_exact(report, sink) -> None:
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.completed == report.source_records
    rows = sink.read()
    assert len(rows) == N  # exactly once: no duplicate, nothing missing
    assert sorted(rows["n"].tolist()) == list(range(N))
    assert (rows["sq"] == rows["n"] * rows["n"]).all()


def _executor_jvm_of_this_worker() -> int:
    """The executor JVM running this Python worker (worker → daemon → JVM)."""
    pid = os.getpid()
    for _ in range(6):
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if EXECUTOR_MAIN.encode() in f.read():
                return pid
    raise RuntimeError("no executor JVM among this worker's ancestors")


@dataclass(frozen=True)
class SlowSquareThatSignals:
    """Round 0: tells the driver which executor JVM runs it (once, through ``marker``), then
    works slowly, so that the round is still in flight when that executor is killed."""

    marker: str
    pause: float = 0.3

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        if current_round() == 0:
            try:
                jvm = _executor_jvm_of_this_worker()
            except (RuntimeError, OSError):  # a worker whose JVM is gone: another one signals
                jvm = None
            if jvm is not None:
                try:
                    fd = os.open(self.marker + ".tmp", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.write(fd, str(jvm).encode())
                    os.close(fd)
                    os.rename(self.marker + ".tmp", self.marker)
            time.sleep(self.pause)
        return _square(pdf)


def _kill_when_signalled(marker: str, killed: list[int]) -> threading.Thread:
    """A started thread that SIGKILLs the executor JVM named in ``marker`` once a worker writes
    it (see :class:`SlowSquareThatSignals`), appending its pid to ``killed``; it gives up after
    120 s."""

    def kill_when_running() -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        victim = int(Path(marker).read_text())
        if victim in _executor_jvms():  # one of ours, never another process
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    return killer


# ---- the tests -------------------------------------------------------------------------------


def test_the_demo_on_a_cluster_accounts_for_every_record(spark, capsys):
    code = demo.main(
        [
            "--master", MASTER,  # the running cluster session is reused
            "--records", "3000",
            "--partitions", str(PARTITIONS),
            "--fail-rate", "0.05",
            "--poison-rate", "0.01",
            "--drop-rate", "0.05",
            "--max-attempts", "3",
            "--json",
            "--no-progress",
        ]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    assert report["lost"] == 0
    assert report["results_match"] is True
    assert report["source_records"] == 3000
    assert report["failed"] > 0
    assert report["timed_out"] > 0
    assert report["dead_lettered"] > 0


def test_an_executor_killed_mid_round_loses_nothing(spark, tmp_path):
    """SIGKILL to an executor JVM while it runs a task of the first round: Spark reschedules
    its tasks on the other executor; the run ends with lost 0 and an exact sink."""
    before = _executor_jvms()
    assert len(before) == EXECUTORS, before
    marker = str(tmp_path / "running-on")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")  # many slow batches
    killed: list[int] = []
    killer = _kill_when_signalled(marker, killed)
    try:
        report, sink, _ = _run_squares(spark, tmp_path, fn=SlowSquareThatSignals(marker))
    finally:
        killer.join(timeout=130)
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert killed, "the executor was not killed: the test proved nothing"
    assert killed[0] in before
    assert not _alive(killed[0])
    _assert_exact(report, sink)
    # the records the dead executor's task had persisted never completed there: the rerun
    # task persisted them again under the same ids (repeats: one record each, acked by the
    # rerun), or — when the dead attempt had acked some of their rows, or the acker timed them
    # out first — they timed out and were replayed (the sink absorbed what was written twice)
    assert report.repeats + report.timed_out > 0
    assert report.replayed >= report.timed_out


def _run_squares_to_parquet(spark, tmp_path, fn=_square):
    sink = ParquetSink(str(tmp_path / "squares"))
    p = Pipeline(spark)
    p.source(_numbers(spark), name="numbers").map_in_pandas(
        fn, "n long, sq long", name="square"
    ).sink(sink, name="squares")
    return p.run(), sink


def _assert_exact_parquet(spark, report, sink) -> None:
    assert report.lost == 0
    assert report.completed == report.source_records == N
    rows = sink.read(spark).toPandas()
    assert sorted(rows["n"].tolist()) == list(range(N))  # exactly once
    assert (rows["sq"] == rows["n"] * rows["n"]).all()


def test_an_optimistic_round_completes_on_a_cluster(spark, tmp_path):
    """Births observed, the stage's events in an accumulator, a Parquet sink published by a
    rename: across two executor JVMs, a round that fails nothing completes optimistically."""
    report, sink = _run_squares_to_parquet(spark, tmp_path)
    assert report.optimistic_rounds == 1, report.optimistic_fallbacks
    assert report.optimistic_fallbacks == []
    _assert_exact_parquet(spark, report, sink)


def test_an_executor_killed_in_an_optimistic_round_falls_back(spark, tmp_path):
    """SIGKILL to an executor JVM during an optimistic round: Spark reruns its tasks elsewhere.
    The lost attempts counted nothing, but the shuffle output of the stages that finished on
    that executor went with it, and a later job of a round computes it again under a new stage
    id with no failed task to show (the review of the retried-task change measured a side
    counted twice so): a round that lost an executor falls back to tracked rounds, exact."""
    before = _executor_jvms()
    assert len(before) == EXECUTORS, before
    marker = str(tmp_path / "running-on")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")  # slow batches
    killed: list[int] = []
    killer = _kill_when_signalled(marker, killed)
    try:
        fn = SlowSquareThatSignals(marker, pause=0.1)
        report, sink = _run_squares_to_parquet(spark, tmp_path, fn=fn)
    finally:
        killer.join(timeout=130)
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert killed, "the executor was not killed: the test proved nothing"
    assert report.optimistic_rounds == 0
    assert "task accounting" in report.optimistic_fallbacks[0]
    why = report.optimistic_fallbacks[0]
    assert "lost during the round" in why or "ExecutorLostFailure" in why, why
    _assert_exact_parquet(spark, report, sink)


def test_the_topology_on_a_cluster(spark, tmp_path):
    """The seed's FaultToleranceWithTopologyTest (two sources, branches, a union, failures and
    losses injected), its tasks spread over the two executor JVMs."""
    topology.test_fault_tolerance_with_topology(spark, tmp_path)


@pytest.fixture
def standalone_tls_acker(tls_files):
    """``xorack serve`` on every interface with a token and TLS; its location at this machine's
    own address."""
    cert, key = tls_files
    env = {**os.environ, "XORACK_TOKEN": "cluster-s3cret"}
    proc = subprocess.Popen(
        [*SERVE, "--host", "0.0.0.0", "--tls-cert", cert, "--tls-key", key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        assert "listening on grpc+tls://" in line, line
        port = line.split("listening on ")[1].split()[0].rsplit(":", 1)[1]
        yield f"grpc+tls://{own_address()}:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


@pytest.mark.skipif(own_address() is None, reason="no non-loopback IPv4 address to bind")
@pytest.mark.parametrize("acker", ["embedded", "standalone"])
def test_executors_reach_a_tls_acker_on_a_non_loopback_address(
    spark, tmp_path, tls_files, acker, request
):
    """The acker binds every interface (token + TLS required there) and is reached at this
    machine's own address: the embedded one (bind, advertise, certificate and key given to the
    pipeline) or a standalone ``xorack serve`` (the pipeline trusts its certificate)."""
    cert, key = tls_files
    address = own_address()
    if acker == "embedded":
        where = {"acker_host": "0.0.0.0", "acker_advertise": address, "tls_key": key}
    else:
        where = {"service": request.getfixturevalue("standalone_tls_acker")}
    report, sink, rounds = _run_squares(
        spark, tmp_path, token="cluster-s3cret", tls_cert=cert, **where
    )
    _assert_exact(report, sink)
    service = rounds[0].stats["service"]
    assert service["location"].startswith(
        f"grpc+tls://{address}:" if acker == "embedded" else "grpc+tls://"
    )
    # persists and events come only from the executors' tasks, never from the driver
    assert service["calls"]["persist"] > 0
    assert service["calls"]["xor"] > 0
    assert service["rejected"] == 0


@dataclass(frozen=True)
class PingFromExecutor:
    """``mapInPandas``: each task pings the acker with the given token and reports the answer
    (and the executor JVM it ran in)."""

    location: str
    token: str | None
    roots: bytes

    def __call__(self, batches):
        from xorack.service import AckerClient

        for pdf in batches:
            # the default retries, as a pipeline's tasks have them (a refusal is not retried)
            client = AckerClient.get(self.location, token=self.token, tls_root_certs=self.roots)
            try:
                answer = "pong" if client.ping() else "no"
            except ServiceError as exc:
                answer = f"refused: {exc}"
            yield pd.DataFrame(
                {"answer": [answer] * len(pdf), "jvm": [_executor_jvm_of_this_worker()] * len(pdf)}
            )


@pytest.mark.skipif(own_address() is None, reason="no non-loopback IPv4 address to bind")
def test_executors_with_a_wrong_or_missing_token_are_refused(spark, tls_files):
    from xorack import FTLayer
    from xorack.service import AckerService

    cert, key = tls_files
    roots = Path(cert).read_bytes()
    with (
        FTLayer() as ft,
        AckerService.embedded(
            ft, token="right", host="0.0.0.0", advertise=own_address(), tls_cert=cert, tls_key=key
        ) as svc,
    ):
        answers = {}
        for token in ("right", "wrong", None):
            rows = (
                spark.range(8, numPartitions=EXECUTORS * 2)
                .mapInPandas(
                    PingFromExecutor(svc.location, token, roots), "answer string, jvm long"
                )
                .toPandas()
            )
            assert set(rows["jvm"]) <= set(_executor_jvms())  # asked from the executors
            answers[token] = Counter(rows["answer"])
        assert answers["right"] == Counter({"pong": 8})
        for token in ("wrong", None):
            refused = answers[token]
            assert sum(refused.values()) == 8
            assert all("refused ping: unauthenticated" in answer for answer in refused), refused


# ---- an executor lost between the map and the reduce stage of an aggregation -----------------

GROUPS = 64  # the aggregation's output rows, in batches of 4 through the Python stages after it
FAIL_EVERY = 16  # the groups k % FAIL_EVERY == 0 fail on their first attempt (tracked rounds)


def _sales(spark):
    return spark.range(N, numPartitions=PARTITIONS).selectExpr("id AS n", f"id % {GROUPS} AS k")


def _per_group(t):
    """The aggregation of the test, on a tracked or a plain DataFrame alike."""
    from pyspark.sql import functions as F

    return t.groupBy("k").agg(F.count("n").alias("rows"), F.sum("n").alias("total"))


def _in_optimistic_round() -> bool:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    group = ctx.getLocalProperty("spark.jobGroup.id") if ctx is not None else None
    return bool(group) and group.startswith("xorack-optimistic-")


def fail_some_groups_once(pdf: pd.DataFrame) -> pd.DataFrame:
    """The groups ``k % FAIL_EVERY == 0`` fail on their first attempt in a tracked round (their
    records are replayed under new ids); an optimistic round fails nothing."""
    from xorack import FailRecord

    bad = (pdf["k"] % FAIL_EVERY == 0).to_numpy()
    if bad.any() and current_round() == 0 and not _in_optimistic_round():
        raise FailRecord("first attempt", rows=bad)
    return pdf


@dataclass
class KillOwnExecutorAfterOneBatch:
    """A Python stage after an aggregation (its reduce side): the first task that claims
    ``marker`` passes its first batch on, waits for the sink to take it, then SIGKILLs the
    executor JVM it runs in. That executor's map outputs (its shuffle files) go with it: the
    reduce tasks still to run cannot fetch them (``FetchFailed``), Spark runs the lost map tasks
    again, and runs the killed task again — whose source tagger (the aggregation's output is
    the next phase's source) re-creates the records of its first attempt, among them those the
    stage before this one had failed (replayed under new ids since). Every other call passes
    its rows on unchanged."""

    marker: str
    settle: float = 2.0  # seconds for the rows passed on to reach the sink
    claimed: bool = False  # in the worker that claimed the marker

    def __call__(self, pdf: pd.DataFrame) -> pd.DataFrame:
        if self.claimed:  # the second batch of the claiming task
            time.sleep(self.settle)
            os.kill(int(Path(self.marker).read_text()), signal.SIGKILL)
            time.sleep(60)  # the worker goes down with its JVM
        if not os.path.exists(self.marker):
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(_executor_jvm_of_this_worker()).encode())
                os.close(fd)
                self.claimed = True
        return pdf


def _stage_attempts(spark) -> list[tuple[int, int, str]]:
    """Every stage attempt in Spark's status store: (stage id, attempt, failure reason)."""
    jvm = spark.sparkContext._jvm
    no_quantiles = jvm.PythonUtils.toSeq(jvm.java.util.ArrayList()).toArray(
        jvm.scala.reflect.ClassTag.Double()
    )
    stages = (
        spark.sparkContext._jsc.sc()
        .statusStore()
        .stageList(None, False, False, no_quantiles, jvm.java.util.ArrayList())
    )
    out = []
    it = stages.iterator()
    while it.hasNext():
        s = it.next()
        reason = s.failureReason()
        out.append((s.stageId(), s.attemptId(), reason.get() if reason.isDefined() else ""))
    return out


def _fetch_failures(spark, before: set[tuple[int, int]], timeout: float = 20.0):
    """The stage attempts since ``before`` once one failed to fetch (Spark's status store is
    updated from its listener bus, asynchronously), or all of them after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        new = [x for x in _stage_attempts(spark) if (x[0], x[1]) not in before]
        if any("FetchFailed" in r for _, _, r in new) or time.monotonic() > deadline:
            return new
        time.sleep(0.2)


def _plus_one(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.assign(total=pdf["total"] + 1)


def test_a_fused_round_completes_on_a_cluster(spark, tmp_path):
    """An aggregation and the Python stage after it in one optimistic round (fused: the
    aggregate's output is not written between them), across two executor JVMs: the births of
    both phases observed, the stage's events in the accumulator, exact."""
    sink = ParquetSink(str(tmp_path / "groups"))
    p = Pipeline(spark)
    _per_group(p.source(_sales(spark), name="sales")).map_in_pandas(
        _plus_one, "k long, rows long, total long", name="plus"
    ).sink(sink, name="groups")
    report = p.run()
    assert report.fused_phases == 1, report
    assert report.optimistic_rounds == 2, report.optimistic_fallbacks
    assert report.lost == 0
    assert report.completed == report.source_records == N
    want = _per_group(_sales(spark)).toPandas().astype("int64")
    got = sink.read(spark).toPandas().astype("int64")
    pd.testing.assert_frame_equal(
        got.sort_values("k").reset_index(drop=True),
        want.assign(total=want["total"] + 1)[list(got.columns)]
        .sort_values("k")
        .reset_index(drop=True),
    )


@pytest.mark.parametrize(
    ("optimistic", "combine", "sink_kind"),
    [
        (False, True, "parquet"),
        (False, False, "sqlite"),
        (True, True, "sqlite"),
        (True, False, "parquet"),
    ],
)
def test_an_executor_lost_between_the_map_and_reduce_stage_of_an_aggregation(
    spark, tmp_path, optimistic, combine, sink_kind
):
    """An executor JVM killed after the map stage of an aggregation finished, from inside a
    reduce-side task (the first attempt of a Python stage after the groupBy): the reduce stage
    fails to fetch the lost map outputs, Spark runs the map tasks again, and runs the killed
    task again — whose source tagger re-creates the records of its first attempt: those still
    pending are one record each, those failed before the kill (replayed under new ids) count
    nowhere. An optimistic round that loses an executor so falls back. The sink equals plain
    Spark's, lost 0.

    Two defenses keep a failed record's re-created first attempt from counting twice: the
    tagger drops it (the FT layer knows every id it persisted: ``repeats_settled``), and a
    second copy of a record waiting for the same replay round completes as a duplicate. With
    both turned off, the failed groups of the killed task come out twice in either sink."""
    before = _executor_jvms()
    assert len(before) == EXECUTORS, before
    attempts_before = {(s, a) for s, a, _ in _stage_attempts(spark)}
    marker = str(tmp_path / "killed")
    if sink_kind == "sqlite":
        sink = SQLiteSink(str(tmp_path / "groups.db"), "groups")
    else:
        sink = ParquetSink(str(tmp_path / "groups"))
    # every stage of 4 tasks (no coalescing of small partitions or files): the map outputs of
    # the aggregation are on both executors (one core each), the killed one's are lost
    settings = {
        "spark.sql.execution.arrow.maxRecordsPerBatch": "4",
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
        "spark.sql.files.openCostInBytes": str(1 << 30),
    }
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        p = Pipeline(spark, optimistic=optimistic, combine=combine)
        schema = "k long, rows long, total long"
        (
            _per_group(p.source(_sales(spark), name="sales"))
            .map_in_pandas(fail_some_groups_once, schema, name="flaky")
            .map_in_pandas(KillOwnExecutorAfterOneBatch(marker), schema, name="kill")
            .sink(sink, name="groups")
        )
        report = p.run()
    finally:
        for k in settings:
            spark.conf.unset(k)
    # the scenario happened: the executor was killed, the reduce stage failed to fetch its map
    # outputs, and the map stage ran again
    assert os.path.exists(marker), "no task claimed the kill: the test proved nothing"
    victim = int(Path(marker).read_text())
    assert victim in before
    assert not _alive(victim)
    new = _fetch_failures(spark, attempts_before)
    failed = {s for s, _, r in new if "FetchFailed" in r}
    assert failed, f"no stage failed to fetch: {new}"
    assert any(a > 0 and s not in failed for s, a, _ in new), f"no map stage ran again: {new}"
    # exact: plain Spark's groups, each once; every record accounted for
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.completed == report.source_records
    want = _per_group(_sales(spark)).toPandas()
    got = sink.read() if sink_kind == "sqlite" else sink.read(spark).toPandas()
    key = ["k", "rows", "total"]
    assert len(got) == GROUPS, report
    pd.testing.assert_frame_equal(
        got[key].sort_values("k").reset_index(drop=True).astype("int64"),
        want[key].sort_values("k").reset_index(drop=True).astype("int64"),
    )
    if optimistic and sink_kind == "parquet":  # the round of the aggregation and the stages
        # after it (one round, fused) lost its executor, its map stage ran again: it falls
        # back, and each phase then completes in a round of its own (no row fails in one)
        assert report.fused_fallbacks == 1, report
        assert report.optimistic_rounds == 2, report.optimistic_fallbacks
        assert report.fused_phases == 0
    else:  # the killed task's tagger re-created records: pending ones, and failed ones
        assert report.repeats > 0
        assert report.repeats_settled > 0


def test_an_executor_lost_after_a_branch_point_loses_nothing(spark, tmp_path):
    """A branch point (one tracked DataFrame, two sinks) is materialized once, as a local
    checkpoint whose blocks cannot be computed again; a branch's task then SIGKILLs its own
    executor JVM. The other executor holds a copy of the lost blocks: the run ends with lost 0
    and both sinks exact (with one copy, Spark failed the round's job with
    ``CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND``)."""
    before = _executor_jvms()
    assert len(before) == EXECUTORS, before
    marker = str(tmp_path / "killed")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
    try:
        p = Pipeline(spark, optimistic=False)
        squares = p.source(_numbers(spark), name="numbers").map_in_pandas(
            _square, "n long, sq long", name="square"
        )
        kill = KillOwnExecutorAfterOneBatch(marker)
        sqlite = SQLiteSink(str(tmp_path / "squares.db"), "squares")
        squares.sink(sqlite, name="sqlite")
        parquet = ParquetSink(str(tmp_path / "squares"))
        squares.map_in_pandas(kill, "n long, sq long", name="kill").sink(parquet, name="parquet")
        report = p.run()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert os.path.exists(marker), "no task claimed the kill: the test proved nothing"
    victim = int(Path(marker).read_text())
    assert victim in before
    assert not _alive(victim)
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.completed == report.source_records == N
    for rows in (sqlite.read(), parquet.read(spark).toPandas()):
        assert sorted(rows["n"].tolist()) == list(range(N))  # exactly once
        assert (rows["sq"] == rows["n"] * rows["n"]).all()
