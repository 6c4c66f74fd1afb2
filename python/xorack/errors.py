"""Exceptions raised by xorack and by user functions run under it."""

from __future__ import annotations


class XorackError(Exception):
    """Base class of xorack's own errors."""


class FailRecord(XorackError):  # noqa: N818 - the seed's name for explicit failing (FailException)
    """Raise inside a tracked stage's function to fail the record(s) of the batch being processed.

    The stage wrapper bisects the batch so that only the rows that raise are failed; their source
    records are replayed (up to ``max_attempts``), the rest of the batch goes on.

    >>> import xorack
    >>> try:
    ...     raise xorack.FailRecord("bad row")
    ... except xorack.FailRecord as e:
    ...     print(e)
    bad row
    """


class StorageError(XorackError):
    """The FT layer's storage failed (disk full, locked or corrupt file). Records accepted before
    the error are still stored."""


class ServiceError(XorackError):
    """The acker service could not be reached or rejected a request."""


class LineageError(XorackError, ValueError):
    """A stage's output rows do not carry a valid lineage column (``_ft_rec`` of an input row)."""
