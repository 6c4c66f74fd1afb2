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
