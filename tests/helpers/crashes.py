"""A driver crash simulated inside a stream's query (the restart tests of the streams)."""

from __future__ import annotations

from typing import Any


def crash_after_dedup_write(monkeypatch: Any, at: int = 2) -> list[str]:
    """Make the ``at``-th emission of a stream's deduplication raise once its rows are in the
    sink and before its keys are kept, and every FT-state note raise from then on (a dead
    driver notes nothing). Returns the names of the emissions seen; ``monkeypatch.undo()``
    brings the driver back."""
    from xorack.spark import stream_dedup, stream_state

    real_note, real_record = stream_state.StreamState._note, stream_dedup.DedupState.record
    records: list[str] = []

    def note(self: Any, marks: Any) -> Any:
        if len(records) >= at:  # dead from the crash on: nothing noted
            raise RuntimeError("simulated driver crash (dead)")
        return real_note(self, marks)

    def record(self: Any, new: Any, name: str) -> Any:  # the emission's rows are in the sink
        records.append(name)
        if len(records) >= at:
            raise RuntimeError("simulated driver crash after a write, before its keys were kept")
        return real_record(self, new, name)

    monkeypatch.setattr(stream_state.StreamState, "_note", note)
    monkeypatch.setattr(stream_dedup.DedupState, "record", record)
    return records


def crash_after_window_write(monkeypatch: Any, in_stop: bool) -> list[tuple[str, int]]:
    """Make a stream's window emission raise once its rows are in the sink and before its
    watermark is noted, and every FT-state note raise from then on (a dead driver notes
    nothing). ``in_stop``: the emission of ``stop()``'s drain; else the first emission that
    writes rows, and the dead driver then drains nothing. Returns each crashed write's name
    and rows; ``monkeypatch.undo()`` brings the driver back."""
    from xorack.spark import ParquetSink, stream_state, streaming

    real_write, real_note = stream_state.write_emitted, stream_state.StreamState._note
    real_finish = streaming.StreamingRun._finish
    finishing: list[bool] = []
    written: list[tuple[str, int]] = []

    def finish(self: Any, drain: bool) -> Any:
        if not in_stop:
            raise RuntimeError("simulated driver crash (dead: no drain)")
        finishing.append(True)
        return real_finish(self, drain)

    def write(*args: Any, **kwargs: Any) -> int:
        rows = real_write(*args, **kwargs)
        if finishing if in_stop else rows:
            written.append((kwargs["name"], rows))
            raise RuntimeError("simulated driver crash after an emission's write")
        return int(rows)

    def note(self: Any, marks: Any) -> Any:
        if written:  # dead from the crash on: nothing noted
            raise RuntimeError("simulated driver crash (dead)")
        return real_note(self, marks)

    real_remove = ParquetSink.remove_named

    def remove_named(self: Any, spark: Any, name: str) -> int:
        if written:  # nor a write taken back (the restart does it)
            raise RuntimeError("simulated driver crash (dead)")
        return int(real_remove(self, spark, name))

    monkeypatch.setattr(ParquetSink, "remove_named", remove_named)
    monkeypatch.setattr(streaming.StreamingRun, "_finish", finish)
    monkeypatch.setattr(stream_state, "write_emitted", write)
    monkeypatch.setattr(stream_state.StreamState, "_note", note)
    return written
