"""The runaway guard: a systematic error (a typo, a schema error, an unsupported type in a sink)
fails every record it meets, attempt after attempt; replaying and dead-lettering the whole input
helps nobody. The stages and sinks count, per round, the source records they saw and the records
each error failed (a Spark accumulator: only successful task attempts count); after each round
the run loop asks :meth:`FailureTally.add_round` whether one error failed at least ``share`` of a
stage's records in two consecutive attempts, and stops the run with :class:`RunawayFailure`.
Poison records (a few) and transient failures (gone on the next attempt) never trip it.

Shares need records to mean something: from ``min_records`` (20) failed records of a stage that
saw at least as many. A smaller stage trips the guard only when one error failed *every* one of
its records (at least two) on two consecutive attempts; a stage of a single record cannot be
judged (a poison record and a typo look alike): :meth:`FailureTally.undecided` says so, and the
run loop logs it.

>>> t = FailureTally(share=0.5, min_records=2)
>>> t.add_round({("split", ""): 10, ("split", "KeyError: 'x'"): 10})
>>> t.add_round({("split", ""): 10, ("split", "KeyError: 'x'"): 9}) is not None
True
>>> small = FailureTally()  # 3 records, all failed by the same error twice: a typo
>>> small.add_round({("split", ""): 3, ("split", "KeyError: 'x'"): 3})
>>> small.add_round({("split", "KeyError: 'x'"): 3}) is not None
True
"""

from __future__ import annotations

from typing import Any

from ..errors import XorackError

SEEN = ""  # the key of a stage's records seen (reasons are never empty)
#: The fewest records of a stage below ``min_records`` that the guard judges: all of them must
#: fail with one error (one record failing is a poison record as much as a typo).
SMALL_INPUT_RECORDS = 2


class RunawayFailure(XorackError, RuntimeError):
    """One error failed most of a stage's records in consecutive attempts: the run stopped."""


def tally_param() -> Any:
    """A Spark ``AccumulatorParam`` adding ``{(stage, reason): records}`` dicts."""
    from pyspark.accumulators import AccumulatorParam

    class _DictSum(AccumulatorParam):
        def zero(self, value: dict) -> dict:
            return {}

        def addInPlace(self, a: dict, b: dict) -> dict:
            for k, v in b.items():
                a[k] = a.get(k, 0) + v
            return a

    return _DictSum()


def reason_key(reason: str) -> str:
    """The part of a failure reason that identifies the error (its first 200 characters)."""
    return reason.strip()[:200] or "unknown error"


class FailureTally:
    """The per-round failure counts of a run and the decision to stop it."""

    def __init__(self, share: float | None = 0.5, min_records: int = 20) -> None:
        if share is not None and not 0.0 < share <= 1.0:
            raise ValueError(f"runaway_share must be in (0, 1] or None, got {share!r}")
        self.share = share
        self.min_records = int(min_records)
        self._previous: dict[tuple[str, str], float] = {}
        self._first: dict[str, int] = {}  # records a stage saw in its first round (its input)
        self._undecided: dict[str, str] = {}  # stage -> the error that failed its one record

    def add_round(self, counts: dict[tuple[str, str], int]) -> str | None:
        """Record one round's counts; the message of a runaway error, or None. Shares are of
        the records a stage saw in its first round (a replay round sees only the replays: the
        few poison records left in the last rounds are all of what it sees)."""
        if self.share is None:
            return None
        for (stage, reason), n in counts.items():
            if reason == SEEN and stage not in self._first:
                self._first[stage] = n
        current: dict[tuple[str, str], float] = {}
        message = None
        for (stage, reason), n in counts.items():
            seen = self._first.get(stage, 0)
            if reason == SEEN or not self._judged(seen, n):
                if reason != SEEN and 0 < n == seen:  # a single record, failed: no judgement
                    current[(stage, reason)] = 1.0
                    if self._previous.get((stage, reason)) == 1.0:
                        self._undecided[stage] = reason
                continue
            current[(stage, reason)] = n / seen
            before = self._previous.get((stage, reason))
            if before is not None and before >= self.share and n / seen >= self.share:
                message = (
                    f"{stage}: the same error failed {before:.0%} of its source records on one "
                    f"attempt and {n:,} of {seen:,} ({n / seen:.0%}) on the next: {reason}. "
                    "The run stopped instead of dead-lettering the input (a systematic error, "
                    "not a poison record); fix it and run again. Pipeline(runaway_share=...) "
                    f"sets the threshold ({self.share:.0%}; None disables the guard)."
                )
        self._previous = current
        return message

    def _judged(self, seen: int, failed: int) -> bool:
        """Whether ``failed`` of a stage's ``seen`` records are enough to judge: a share of at
        least ``min_records``, or, on a smaller input, every one of them (two at least)."""
        if seen >= self.min_records:
            return failed >= self.min_records
        return failed == seen >= SMALL_INPUT_RECORDS

    def undecided(self) -> list[str]:
        """What the guard could not judge: a stage of a single source record that one error
        failed on two consecutive attempts (it goes on to the dead letters, as a poison record
        would). One line per stage, for the run's log."""
        return [
            f"{stage}: its only source record failed twice with the same error ({reason}); with "
            "one record the runaway guard cannot tell a systematic error from a poison record, "
            "so the record goes on to the dead letters: check report.dead_lettered and "
            "p.dead_letters()"
            for stage, reason in self._undecided.items()
        ]


class StreamTally:
    """The runaway guard of a stream. A stream has no first round whose input is the whole
    input: each micro-batch brings its own. So a stage is judged on the records the rounds of
    its micro-batches saw (their fresh rows and the replays that came with them), ``min_records``
    at least at a time: a micro-batch that large alone, smaller consecutive ones pooled until
    they are (with few records a poison record and a systematic error look alike). The stream
    stops when one error failed at least ``share`` of a stage's records in two consecutive
    judgements. Replay rounds run while the stream is idle see only the replays (a few poison
    records, all failing): they are not judged and do not break the chain.

    >>> t = StreamTally(share=0.5, min_records=2)
    >>> t.add_round({("split", ""): 10, ("split", "KeyError: 'x'"): 10}, fresh=True)
    >>> t.add_round({("split", ""): 10, ("split", "KeyError: 'x'"): 10}, fresh=False)
    >>> t.add_round({("split", ""): 12, ("split", "KeyError: 'x'"): 12}, fresh=True) is not None
    True
    >>> small = StreamTally(share=0.5, min_records=4)  # micro-batches of 2 records, pooled
    >>> [small.add_round({("s", ""): 2, ("s", "typo"): 2}, fresh=True) is None for _ in range(4)]
    [True, True, True, False]
    """

    def __init__(self, share: float | None = 0.5, min_records: int = 20) -> None:
        self.share = FailureTally(share).share  # its check of the share
        self.min_records = int(min_records)
        self._previous: dict[str, dict[str, float]] = {}  # stage -> error -> share
        # stage -> {reason: records} of its micro-batches since its last judgement, and how
        # many micro-batches that is; the micro-batches of its last judgement
        self._pool: dict[str, dict[str, int]] = {}
        self._span: dict[str, int] = {}
        self._spans: dict[str, int] = {}

    def add_round(self, counts: dict[tuple[str, str], int], fresh: bool) -> str | None:
        """Record one round's counts (``fresh``: a micro-batch's round, with input of its own);
        the message of a runaway error, or None."""
        if self.share is None or not fresh:
            return None
        for (stage, reason), n in counts.items():
            pool = self._pool.setdefault(stage, {})
            pool[reason] = pool.get(reason, 0) + n
        for stage in {stage for stage, _ in counts}:
            self._span[stage] = self._span.get(stage, 0) + 1
        message = None
        for stage in list(self._pool):
            pool = self._pool[stage]
            n_seen = pool.get(SEEN, 0)
            if n_seen < self.min_records:
                continue  # not judged yet: the stage keeps its last judgement
            del self._pool[stage]
            span, last = self._span.pop(stage, 1), self._spans.get(stage, 1)
            shares = {
                reason: n / n_seen
                for reason, n in pool.items()
                if reason != SEEN and n >= self.min_records
            }
            for reason, now in shares.items():
                before = self._previous.get(stage, {}).get(reason)
                if before is not None and before >= self.share and now >= self.share:
                    n = pool[reason]
                    one = "one micro-batch" if last == 1 else f"{last} micro-batches"
                    nxt = "the next" if span == 1 else f"the next {span}"
                    pooled = (
                        ""
                        if span == last == 1
                        else f" (micro-batches under {self.min_records} records are judged "
                        "together: records of the first of them may have used up their "
                        "attempts and been dead-lettered before)"
                    )
                    message = (
                        f"{stage}: the same error failed {before:.0%} of its records in {one} "
                        f"and {n:,} of {n_seen:,} ({now:.0%}) in {nxt}: {reason}. "
                        "The stream stopped instead of dead-lettering its input (a systematic "
                        "error, not a poison record); the failed records were not "
                        f"dead-lettered{pooled}: with a checkpoint location they wait in its FT "
                        "state, and a restart on it after the fix replays them. "
                        f"Pipeline(runaway_share=...) sets the threshold ({self.share:.0%}; "
                        "None disables the guard)."
                    )
            self._previous[stage] = shares
            self._spans[stage] = span
        return message


__all__ = ["FailureTally", "RunawayFailure", "StreamTally", "reason_key", "tally_param"]
