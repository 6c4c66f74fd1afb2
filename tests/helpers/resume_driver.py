"""A resumable xorack job run as a driver process of its own (tests/spark/test_resume.py).

    python resume_driver.py WORKDIR RECORDS [CRASH]

The job: generated sentences -> split into words (2 % fail their first attempt, sentence ids
divisible by 97 always fail: dead letters) -> drop stop words -> count per word (a barrier) ->
label the counts (a tracked stage after the barrier) -> a SQLite sink; the words also go to a
Parquet sink (a native sink, published at the end). FT storage, staged rows and both sinks live
under WORKDIR, so a second run with the same arguments resumes the job.

CRASH names where the driver is killed with SIGKILL on this run (nothing is closed, no atexit):

- ``persist``: from the source, while round 0 reads and persists the sentences (the third
  partition of four, so some partitions are persisted and others not);
- ``stage``: from the split stage in round 0;
- ``round``: in the driver, right after round 0 (between rounds, before the replays);
- ``replay``: from the split stage in a replay round;
- ``phase1``: from the stage after the barrier (the counts are being tracked).

At the end it prints one JSON line: the report, the dead-lettered sentence ids, the counts in
the SQLite sink and the words in the Parquet sink.

    python resume_driver.py stream WORKDIR RECORDS [CRASH]

The streaming variant: the sentences, with an event time, are JSON files (four, written on
the first run), read one file per micro-batch with a Spark checkpoint under WORKDIR and the
default settings (the FT state inside the checkpoint); split, drop stop words, every word into
a SQLite sink and a count per 10-second window and word (5 s watermark) into a Parquet sink.
CRASH ``batch`` kills the driver from the split stage in micro-batch 2. A restart uses the same
checkpoint, with ``trigger(availableNow=True)``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pandas as pd

STOP = ["the", "a", "of"]
WORDS = ["the", "a", "of", "river", "stone", "light", "cloud", "wind", "fire", "sea", "sky"]


def sentence_words(sid: int) -> list[str]:
    n = 3 + sid % 5
    return [WORDS[(sid * 7 + 3 * k + k * k) % len(WORDS)] for k in range(n)]


def poisoned(sid: int) -> bool:
    return sid % 97 == 0


def fails_first(sid: int) -> bool:
    return (sid * 2654435761) % 100 < 2


#: The streaming variant's event times: file k holds [10 k, 10 k + 10) seconds after T0.
T0 = "2026-11-26T12:00:00"
WINDOW = 10  # seconds, tumbling
DELAY = 5  # seconds behind the largest event time


def event_time(sid: int, records: int) -> str:
    import datetime as dt

    per = records // 4
    k, j = divmod(sid, per)
    at = dt.datetime.fromisoformat(T0) + dt.timedelta(seconds=10 * k + 10 * j / per)
    return at.isoformat()


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def resumable(spark, workdir: str, **options):
    """The job's pipeline: its FT storage and staging under ``workdir``, resumable."""
    from xorack.spark import Pipeline

    storage = "sqlite:///" + os.path.join(workdir, "ft.db")
    work = os.path.join(workdir, "work")
    return Pipeline(
        spark,
        storage=storage,
        workdir=work,
        max_attempts=3,
        resume=True,
        chunk_records=16,
        **options,
    )


def main() -> None:
    workdir, records = sys.argv[1], int(sys.argv[2])
    crash = sys.argv[3] if len(sys.argv) > 3 else "none"
    me = os.getpid()

    from pyspark.sql import functions as F

    from xorack import FailRecord
    from xorack.spark import ParquetSink, SQLiteSink, current_round
    from xorack.spark.session import get_or_create_session

    spark = get_or_create_session(app_name="xorack-resume-test", shuffle_partitions=4)

    def generate(batches):
        from pyspark import TaskContext

        for b in batches:
            if crash == "persist" and TaskContext.get().partitionId() == 2:
                kill(me)
            yield pd.DataFrame(
                {"sid": b["id"], "text": [" ".join(sentence_words(i)) for i in b["id"]]}
            )

    def split(pdf: pd.DataFrame) -> pd.DataFrame:
        r = current_round()
        if crash == "stage" and r == 0 and (pdf["sid"] % 4 == 3).any():
            kill(me)
        if crash == "replay" and r >= 1:
            kill(me)
        bad = pdf["sid"].map(poisoned) | ((r == 0) & pdf["sid"].map(fails_first))
        if bad.any():
            raise FailRecord("injected", rows=bad.to_numpy())
        out = pdf.assign(word=pdf["text"].str.split()).explode("word")
        return out.drop(columns=["text"])  # the lineage columns stay

    def label(pdf: pd.DataFrame) -> pd.DataFrame:
        if crash == "phase1":
            kill(me)
        return pdf.assign(label=pdf["word"].str.upper())

    sentences = spark.range(records, numPartitions=4).mapInPandas(generate, "sid long, text string")
    # RESUME_COMBINE=1: the count stages partial aggregates per chunk of 16 sentences
    p = resumable(spark, workdir, combine=os.environ.get("RESUME_COMBINE") == "1")
    words = p.source(sentences, name="sentences").map_in_pandas(
        split, "sid long, word string", name="split"
    )
    content = words.where(~F.col("word").isin(STOP))
    content.select("sid", "word").sink(ParquetSink(os.path.join(workdir, "words")), name="words")
    counts = content.groupBy("word").agg(F.count("*").alias("n"))
    counts.map_in_pandas(label, "word string, n long, label string", name="label").sink(
        SQLiteSink(os.path.join(workdir, "counts.db"), "counts"), name="counts"
    )

    def on_round(info) -> None:
        if crash == "round" and info.round == 0:
            kill(me)

    report = p.run(on_round=on_round)
    letters = p.dead_letters()
    dead = (
        sorted(letters.column("sid").to_pylist())
        if letters is not None and letters.num_rows
        else []
    )
    stored = SQLiteSink(os.path.join(workdir, "counts.db"), "counts").read()
    words_rows = spark.read.parquet(os.path.join(workdir, "words")).collect()
    out = {
        "report": report.as_dict(),
        "dead": dead,
        "counts": {w: int(n) for w, n in zip(stored["word"], stored["n"], strict=True)},
        "labels_ok": bool((stored["label"] == stored["word"].str.upper()).all()),
        "count_rows": len(stored),
        "words": sorted([r.sid, r.word] for r in words_rows),
    }
    print(json.dumps(out))
    spark.stop()


def main_stream() -> None:
    workdir, records = sys.argv[2], int(sys.argv[3])
    crash = sys.argv[4] if len(sys.argv) > 4 else "none"
    me = os.getpid()

    from pyspark.sql import functions as F

    from xorack import FailRecord
    from xorack.spark import ParquetSink, Pipeline, SQLiteSink, current_attempt, current_round
    from xorack.spark.session import get_or_create_session

    inbox = os.path.join(workdir, "inbox")
    if not os.path.isdir(inbox):
        os.makedirs(inbox + ".tmp")
        for k in range(4):
            sids = range(k * records // 4, (k + 1) * records // 4)
            part = pd.DataFrame(
                {
                    "sid": sids,
                    "ts": [event_time(i, records) for i in sids],
                    "text": [" ".join(sentence_words(i)) for i in sids],
                }
            )
            path = os.path.join(inbox + ".tmp", f"part{k}.json")
            part.to_json(path, orient="records", lines=True)
            at = time.time() - 3600 + k  # read oldest first: one file per micro-batch, in order
            os.utime(path, (at, at))
        os.rename(inbox + ".tmp", inbox)
    spark = get_or_create_session(app_name="xorack-resume-stream-test", shuffle_partitions=4)

    def split(pdf: pd.DataFrame) -> pd.DataFrame:
        if crash == "batch" and current_round() == 2:
            kill(me)
        first = current_attempt(pdf) == 1
        bad = pdf["sid"].map(poisoned) | (first & pdf["sid"].map(fails_first))
        if bad.any():
            raise FailRecord("injected", rows=bad.to_numpy())
        out = pdf.assign(word=pdf["text"].str.split()).explode("word")
        return out.drop(columns=["text"])

    stream = (
        spark.readStream.schema("sid long, ts timestamp, text string")
        .option("maxFilesPerTrigger", 1)
        .json(inbox)
    )
    # the default settings: the FT state lives inside the Spark checkpoint
    p = Pipeline(spark, max_attempts=3)
    sentences = p.source(stream, name="sentences").withWatermark("ts", f"{DELAY} seconds")
    words = sentences.map_in_pandas(split, "sid long, ts timestamp, word string", name="split")
    sink = SQLiteSink(os.path.join(workdir, "words.db"), "words")
    kept = words.where(~F.col("word").isin(STOP))
    kept.select("sid", "word").sink(sink, name="words")
    windows = os.path.join(workdir, "windows.parquet")
    per_window = kept.groupBy(F.window("ts", f"{WINDOW} seconds"), "word").count()
    per_window.sink(ParquetSink(windows), name="windows")
    run = p.start_stream(
        timeout=120.0,  # no timeout on a loaded machine: the drain at the end expires the rest
        checkpoint_location=os.path.join(workdir, "checkpoint"),
        available_now=True,
    )
    report = run.wait(timeout=600)
    letters = p.dead_letters()
    dead = (
        sorted(letters.column("sid").to_pylist())
        if letters is not None and letters.num_rows
        else []
    )
    stored = sink.read()
    reasons = letters.column("_ft_reason").to_pylist() if letters is not None else []
    out = {
        "report": report.as_dict(),
        "dead": dead,
        "reasons": sorted(set(reasons)),
        "words": sorted([int(a), b] for a, b in zip(stored["sid"], stored["word"], strict=True)),
        "windows": sorted(
            [r.window.start.isoformat(), r.word, int(r["count"])]
            for r in spark.read.parquet(windows).collect()
        ),
        "ft_state": os.path.isdir(os.path.join(workdir, "checkpoint", "xorack")),
    }
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        main_stream()
    else:
        main()
