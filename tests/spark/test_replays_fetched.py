"""Replays without the driver: the FT layer prepares a round's replays (routed, first ids fixed,
atomically with the take), executors fetch their partition's rows, the round's rows are freed
when it is over; and in a batch run the replays never pass through the driver."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import xorack
from xorack import FTLayer
from xorack.service import AckerClient, AckerService


def _layer(storage: str, tmp_path) -> FTLayer:
    spec = storage if storage == "memory" else f"sqlite:///{tmp_path / 'ft.db'}"
    return FTLayer(storage=spec, max_attempts=3)


@pytest.fixture(params=["memory", "sqlite"])
def layer(request, tmp_path):
    ft = _layer(request.param, tmp_path)
    yield ft
    ft.close()


def _failed(ft: FTLayer, n: int, partition=None) -> np.ndarray:
    """Persist n records (key hash i, births = first ids i + 1) and fail them all."""
    src = ft.persist(
        pa.table({"v": pa.array(np.arange(n, dtype=np.int64))}),
        key_hash=np.arange(n, dtype=np.int32),
        births=np.arange(1, n + 1, dtype=np.uint64),
        partition=partition,
    )
    return ft.fail(src)


def _fetch_all(ft: FTLayer, tag: str, counts: dict[int, int]) -> dict[int, pa.Table]:
    return {p: ft.fetch_replays(0, tag, p) for p in counts}


def test_prepare_routes_by_key_hash_like_spark(layer, backend):
    _failed(layer, 200)
    counts = layer.prepare_replays(0, "hash:7", tag="r1")
    assert sum(counts.values()) == 200
    for p, t in _fetch_all(layer, "r1", counts).items():
        kh = t.column("_ft_key_hash").to_numpy()
        assert t.num_rows == counts[p]
        assert (t.column("_ft_partition").to_numpy() == p).all()
        # the partition Spark's repartition(7, key) picks for a key of that hash
        expected = xorack.HashReplayPartitioner(7).assign(kh, np.full(len(kh), -1), backend)[1]
        assert (expected == p).all()
    assert layer.stats().replays_waiting == 0
    assert layer.pending == 200


def test_prepare_forward_sends_replays_to_their_first_partition(layer):
    _failed(layer, 30, partition=np.arange(30, dtype=np.int32) % 3)
    counts = layer.prepare_replays(0, "forward:3", tag="r1")
    assert counts == {0: 10, 1: 10, 2: 10}
    for p, t in _fetch_all(layer, "r1", counts).items():
        assert sorted(v % 3 for v in t.column("v").to_pylist()) == [p] * 10


def test_replays_are_born_with_their_first_ids_and_complete_with_them(layer):
    _failed(layer, 50)
    counts = layer.prepare_replays(0, "hash:4", tag="r1", first_ids=True)
    for t in _fetch_all(layer, "r1", counts).values():
        rec = t.column("_ft_rec").to_numpy()
        det = t.column("_ft_origin_rec").to_numpy()
        assert (rec == det).all()
        assert sorted(det.tolist()) == sorted((t.column("v").to_numpy() + 1).tolist())
        # the replay's outputs carry the first attempt's ids: acking them completes it
        done = layer.xor(t.column("_ft_src").to_numpy(), det)
        assert len(done) == t.num_rows
    assert layer.pending == 0
    assert layer.stats().completed == 50


def test_two_copies_of_one_row_in_one_round_replay_once(layer):
    # a retried source task persisted the same row twice: same first id, same key. Replaying
    # both would write its outputs twice (the second copy cannot have the first id's outputs)
    for _ in range(2):
        src = layer.persist(pa.table({"v": [7]}), key_hash=[5], births=[99])
        layer.fail(src)
    other = layer.persist(pa.table({"v": [8]}), key_hash=[5], births=[98])
    layer.fail(other)
    counts = layer.prepare_replays(0, "hash:2", tag="r1", first_ids=True)
    (t,) = _fetch_all(layer, "r1", counts).values()
    assert sorted(t.column("v").to_pylist()) == [7, 8]
    rec = t.column("_ft_rec").to_numpy()
    assert sorted(rec.tolist()) == [98, 99]
    stats = layer.stats()
    assert (stats.duplicates, stats.completed, layer.pending) == (1, 1, 2)
    assert len(layer.xor(t.column("_ft_src").to_numpy(), rec)) == 2  # each completes
    assert layer.pending == 0
    # the next round has nothing of them
    assert layer.prepare_replays(0, "hash:2", tag="r2", first_ids=True) == {}


def test_a_copy_in_a_later_round_is_replayed_with_the_first_id_again(layer):
    # the second copy waits for a later round: it re-creates the first attempt's outputs
    # (an idempotent sink absorbs them), it is not dropped
    for tag in ("r1", "r2"):
        src = layer.persist(pa.table({"v": [7]}), key_hash=[5], births=[99])
        layer.fail(src)
        counts = layer.prepare_replays(0, "hash:2", tag=tag, first_ids=True)
        (t,) = _fetch_all(layer, tag, counts).values()
        assert t.column("_ft_rec").to_pylist() == [99]
        assert len(layer.xor(t.column("_ft_src").to_numpy(), [99])) == 1
    assert layer.stats().duplicates == 0
    assert layer.pending == 0


def test_a_persist_retried_after_a_restart_replays_its_record_once(tmp_path):
    # a shard stored a persist, died before answering; restarted, it recovered the record (a
    # replay under a new id); the client's retry then stored the same record again under the
    # id it drew, and that copy failed in the round. One replay, not two.
    spec = f"sqlite:///{tmp_path / 'ft.db'}"
    batch = pa.table({"v": [7, 8]})
    ids = np.array([1111, 2222], dtype=np.uint64)
    ft = FTLayer(storage=spec, max_attempts=3)
    ft.persist(batch, key_hash=[5, 6], births=[99, 98], src_ids=ids)
    ft._storage.close()  # the process died: nothing else of it runs
    ft = FTLayer(storage=spec, max_attempts=3)
    try:
        assert ft.stats().recovered == 2
        ft.persist(batch, key_hash=[5, 6], births=[99, 98], src_ids=ids)  # the client's retry
        ft.fail(ids)
        counts = ft.prepare_replays(0, "hash:2", tag="r1", first_ids=True)
        t = pa.concat_tables(_fetch_all(ft, "r1", counts).values())
        assert sorted(t.column("v").to_pylist()) == [7, 8]
        assert sorted(t.column("_ft_rec").to_pylist()) == [98, 99]
        assert ft.stats().duplicates == 2
        assert len(ft.xor(t.column("_ft_src").to_numpy(), t.column("_ft_rec").to_numpy())) == 2
        assert ft.pending == 0
    finally:
        ft.close()


def test_a_fetch_repeats_until_the_round_is_released(layer):
    _failed(layer, 20)
    counts = layer.prepare_replays(0, "hash:2", tag="r1")
    first = layer.fetch_replays(0, "r1", 0)
    again = layer.fetch_replays(0, "r1", 0)  # a retried Spark task
    assert first.equals(again)
    assert first.num_rows == counts[0]
    assert layer.fetch_replays(0, "r1", 9).num_rows == 0  # a partition with none
    # a retried prepare (same tag) prepares nothing new
    assert layer.prepare_replays(0, "hash:2", tag="r1") == counts
    # the next round's prepare frees this round's rows
    assert layer.prepare_replays(0, "hash:2", tag="r2") == {}
    with pytest.raises(ValueError, match="no replays of source 0 prepared under 'r1'"):
        layer.fetch_replays(0, "r1", 0)
    layer.release_replays(0)
    with pytest.raises(ValueError, match="prepared now: none"):
        layer.fetch_replays(0, "r2", 0)


def test_a_failed_prepare_takes_nothing(layer):
    _failed(layer, 10, partition=np.full(10, 5, np.int32))
    with pytest.raises(ValueError, match=r"outside \[0, 3\)|partition must be in|expected in"):
        layer.prepare_replays(0, "forward:3", tag="r1")
    assert layer.stats().replays_waiting == 10
    assert sum(layer.prepare_replays(0, "forward:6", tag="r1").values()) == 10


def test_replays_failed_again_before_the_prepare_are_superseded(layer):
    new = _failed(layer, 10)
    newer = layer.fail(new[:4])  # failed again (e.g. timed out) before being handed out
    counts = layer.prepare_replays(0, "hash:3", tag="r1")
    got = np.concatenate(
        [t.column("_ft_src").to_numpy() for t in _fetch_all(layer, "r1", counts).values()]
    )
    assert sorted(got.tolist()) == sorted(new[4:].tolist() + newer.tolist())


def test_broadcast_routing_is_refused(layer):
    _failed(layer, 2)
    with pytest.raises(ValueError, match="broadcast"):
        layer.prepare_replays(0, "broadcast:2", tag="r1")
    assert layer.stats().replays_waiting == 2


def test_the_client_takes_replays_with_their_first_ids_through_the_service(ft):
    with AckerService.embedded(ft) as svc:
        client = AckerClient.get(svc.location)
        _failed(ft, 20, partition=np.arange(20, dtype=np.int32) % 4)
        t = pa.concat_tables(client.take_replays(0, first_ids=True).values())
        rec = t.column("_ft_rec").to_numpy()
        assert (rec == t.column("_ft_origin_rec").to_numpy()).all()
        assert (t.column("_ft_origin_partition").to_numpy() == t.column("v").to_numpy() % 4).all()
        assert "_xorack_det" not in t.column_names
        assert len(client.xor(t.column("_ft_src").to_numpy(), rec)) == 20
        assert ft.pending == 0


def test_the_client_prepares_fetches_and_releases_through_the_service(ft):
    with AckerService.embedded(ft) as svc:
        client = AckerClient.get(svc.location)
        _failed(ft, 40)
        counts = client.prepare_replays(0, "hash:3", "p0-r1", first_ids=True)
        assert counts == ft.prepare_replays(0, "hash:3", tag="p0-r1")  # same tag: same round
        rows = 0
        for p, n in counts.items():
            t = client.fetch_replays(0, "p0-r1", p)
            assert t.num_rows == n
            ids = client.fetch_replays(0, "p0-r1", p, columns=["_ft_src", "_ft_attempt"])
            assert ids.column_names == ["_ft_src", "_ft_attempt"]  # no payload
            assert ids.column("_ft_src").equals(t.column("_ft_src"))
            assert set(t.column("_ft_partition").to_pylist()) == {p}
            rows += n
            client.xor(t.column("_ft_src").to_numpy(), t.column("_ft_rec").to_numpy())
        assert rows == 40
        assert ft.pending == 0
        with pytest.raises(xorack.ServiceError, match="no column 'nope'"):
            client.fetch_replays(0, "p0-r1", 0, columns=["nope"])
        client.release_replays(0, "p0-r1")
        with pytest.raises(xorack.ServiceError, match="prepared now: none"):
            client.fetch_replays(0, "p0-r1", 0)


# ---- Spark: the executors fetch, the driver does not ------------------------------------------


def test_fetched_replays_land_on_their_partition_without_a_shuffle(spark):
    from pyspark.sql import functions as F

    from xorack.spark.replays import ReplayFetcher, replays_frame

    n = 5
    keys = list(range(40))
    with FTLayer() as ft, AckerService.embedded(ft) as svc:
        from xorack import murmur3_hash

        kh = murmur3_hash([pa.array(keys, pa.int64())])
        src = ft.persist(pa.table({"k": pa.array(keys, pa.int64())}), key_hash=kh)
        ft.fail(src)
        counts = ft.prepare_replays(0, f"hash:{n}", tag="t")
        fetcher = ReplayFetcher(svc.location, source=0, tag="t", columns=("k",))
        df = replays_frame(spark, n, fetcher, "k long, _ft_src long, _ft_rec long")
        got = df.select("k", F.spark_partition_id().alias("pid"))
        plan = got._jdf.queryExecution().executedPlan().toString()
        rows = got.collect()
    assert "Exchange" not in plan
    assert len(rows) == len(keys)
    assert sum(counts.values()) == len(keys)
    # the partition Spark's own repartition(n, k) gives each key
    oracle = {
        r.k: r.pid
        for r in spark.createDataFrame([(k,) for k in keys], "k long")
        .repartition(n, "k")
        .select("k", F.spark_partition_id().alias("pid"))
        .collect()
    }
    assert {r.k: r.pid for r in rows} == oracle


def test_a_batch_run_never_takes_replays_on_the_driver(spark, tmp_path, monkeypatch):
    from xorack.spark import Pipeline, SQLiteSink, current_round

    def take_on_driver(self, *args, **kwargs):
        raise AssertionError("the driver took the replays (collect + createDataFrame)")

    # the driver's client only: executors are other processes
    monkeypatch.setattr(AckerClient, "take_replays", take_on_driver)

    def fail_odd_first(pdf):
        if current_round() == 0 and (pdf["v"] % 2 == 1).any():
            raise xorack.FailRecord("odd on the first attempt", rows=(pdf["v"] % 2 == 1).to_numpy())
        return pdf

    sink = SQLiteSink(str(tmp_path / "out.db"), "out")
    p = Pipeline(spark, max_attempts=3)
    df = spark.createDataFrame([(v % 4, v) for v in range(300)], "k int, v long")
    p.source(df, name="s", keys=["k"], partitions=3).map_in_pandas(
        fail_odd_first, "k int, v long", name="f"
    ).sink(sink, name="out")
    report = p.run()
    assert report.lost == 0
    assert report.dead_lettered == 0
    assert report.replayed == 150
    assert report.completed == report.source_records == 300
    assert sorted(sink.read()["v"].tolist()) == list(range(300))


def test_a_prepare_in_chunks_gives_each_first_id_once(layer, monkeypatch):
    import xorack.ftlayer as ftlayer

    monkeypatch.setattr(ftlayer, "_PREPARE_CHUNK", 3)  # many chunks; copies in different ones
    for _ in range(2):  # every row persisted twice (a retried source task)
        src = layer.persist(
            pa.table({"v": np.arange(10)}),
            key_hash=np.arange(10, dtype=np.int32),
            births=np.arange(1, 11, dtype=np.uint64),
        )
        for one in src:  # one fail call each: a queue of many small pieces
            layer.fail([one])
    counts = layer.prepare_replays(0, "hash:3", tag="r1", first_ids=True)
    tables = _fetch_all(layer, "r1", counts).values()
    rec = np.concatenate([t.column("_ft_rec").to_numpy() for t in tables])
    assert sorted(rec.tolist()) == list(range(1, 11))  # each record once, with its first id
    assert layer.stats().duplicates == 10
    for t in tables:
        layer.xor(t.column("_ft_src").to_numpy(), t.column("_ft_rec").to_numpy())
    assert layer.pending == 0


def test_prepared_pieces_of_different_payload_schemas_are_fetched_together():
    from xorack.replay import PreparedReplays

    p = PreparedReplays("r")
    try:
        p.add(pa.table({"v": pa.array([1, 2], pa.int32())}), np.array([0, 1], np.int32))
        p.add(pa.table({"v": pa.array([3], pa.int64())}), np.array([0], np.int32))
        assert p.fetch(0).column("v").to_pylist() == [1, 3]
        assert p.fetch(0).schema.field("v").type == pa.int64()
        assert p.fetch(1).num_rows == 1
    finally:
        p.close()
    with pytest.raises(RuntimeError, match="released"):
        p.fetch(0)


def test_a_fetcher_whose_round_the_acker_lost_yields_nothing(ft, caplog):
    """An acker restarted from its storage mid-round no longer has the round's prepared rows:
    it replays those records itself in a later round, so the task yields none (no job
    failure); any other error is raised."""
    from xorack.spark.replays import ReplayFetcher

    with AckerService.embedded(ft) as svc:
        _failed(ft, 6)
        fetcher = ReplayFetcher(svc.location, source=0, tag="gone", columns=("v",))
        parts = pa.record_batch({"id": pa.array([0, 1], pa.int64())})
        assert list(fetcher(iter([parts]))) == []
        assert "replayed in a later round" in caplog.text
        ft.prepare_replays(0, "hash:2", tag="here")
        here = ReplayFetcher(svc.location, source=0, tag="here", columns=("v",))
        rows = pa.Table.from_batches(list(here(iter([parts]))))
        assert sorted(rows.column("v").to_pylist()) == list(range(6))
        assert rows.column_names == ["v", "_ft_src", "_ft_rec"]
        bad = ReplayFetcher(svc.location, source=-1, tag="here", columns=("v",))
        with pytest.raises(xorack.ServiceError, match="source"):
            list(bad(iter([parts])))
