"""Exceptions raised by xorack and by user functions run under it."""

from __future__ import annotations


class XorackError(Exception):
    """Base class of xorack's own errors."""


class FailRecord(XorackError):  # the seed's name for explicit failing (FailException)
    """Raise inside a tracked stage's function to fail the record(s) of the batch being processed.

    Without ``rows`` the stage wrapper bisects the batch so that only the rows that raise are
    failed; their source records are replayed (up to ``max_attempts``), the rest of the batch
    goes on.

    With ``rows`` the function says itself which rows of the frame it was called on fail, and
    nothing is bisected: ``rows`` is a boolean mask (one entry per row of that frame) or the
    0-based positions of the failing rows (as ``df.iloc`` takes them; not index labels). The
    wrapper fails exactly those rows' source records and calls the function once more on the
    remaining rows (whose output is kept; if it raises again, the same rules apply). In grouped
    stages (``apply_in_pandas``) the group is one unit: ``rows`` is ignored and the whole group
    fails.

    With ``output`` beside ``rows``, the function hands over what it computed for the other rows
    of that frame, as it would return it (a frame or batch, or a list of them, their lineage as
    any output's), and is not called again: a function that costs as much per call as per row
    (a model's batch inference) pays once for a batch with a bad row. Rows of ``output`` that
    come from the failing rows are dropped. ``output`` without ``rows`` is refused.

    >>> import xorack
    >>> try:
    ...     raise xorack.FailRecord("bad row")
    ... except xorack.FailRecord as e:
    ...     print(e, e.rows, e.output)
    bad row None None
    >>> xorack.FailRecord("bad rows", rows=[False, True]).rows
    [False, True]
    """

    def __init__(self, *args: object, rows: object = None, output: object = None) -> None:
        super().__init__(*args)
        self.rows = rows
        self.output = output

    def __reduce__(self):  # keep ``rows`` when pickled (keyword arguments are not in ``args``)
        return (_make_fail_record, (self.args, self.rows, self.output))


def _make_fail_record(args: tuple, rows: object, output: object = None) -> FailRecord:
    return FailRecord(*args, rows=rows, output=output)


class StorageError(XorackError):
    """The FT layer's storage failed (disk full, locked or corrupt file). Records accepted before
    the error are still stored."""


class ServiceError(XorackError):
    """The acker service could not be reached or rejected a request."""


class LineageError(XorackError, ValueError):
    """A stage's output rows do not carry a valid lineage column (``_ft_rec`` of an input row)."""
