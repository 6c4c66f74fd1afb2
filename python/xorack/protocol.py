"""The acker service's wire protocol, in one place: the protocol version, the operations, the
headers, the control column names and the Arrow schemas that the service (``AckerService``) and
its client (``AckerClient``) both speak. Plain constants over pyarrow and the
checks of header values: no Flight, no FT layer.

>>> from xorack.protocol import Op, PROTOCOL_VERSION, XOR_SCHEMA
>>> Op.XOR.value, Op("expire_all").rpc, PROTOCOL_VERSION
('xor', 'action', 7)
>>> XOR_SCHEMA.names
['_ft_src', '_ft_xor']

Column names: the service takes ``_ft_src``, ``_ft_rec`` (birth values), ``_ft_key_hash``,
``_ft_partition``, ``_ft_event_time`` (a persist's event times: int64 per row, an ordering key
such as microseconds since the epoch; ``NO_EVENT_TIME``, the int64 minimum, for a row without
one; absent: none) and ``_ft_xor``; a replay table (``take_replays``) has ``_ft_src``,
``_ft_rec``, ``_ft_key_hash``, ``_ft_attempt``, ``_ft_origin``, ``_ft_origin_rec`` (the record
id its first attempt was born with), ``_ft_origin_partition`` (the partition it was first
persisted from) and ``_ft_partition`` (the partition it is routed to); a dead-letter
table ``_ft_origin``, ``_ft_source``, ``_ft_attempts``, ``_ft_reason``. (``_ft_attempt`` of a
replay — the attempt it is — and ``_ft_attempts`` of a dead letter — how many it had — are two
names on purpose-built tables that users and the Spark layer read: they stay as they are.)

Replays without the driver: ``prepare_replays`` (an action, body ``{"source", "partitioner",
"tag", "first_ids": bool}``) routes a source's waiting replays to partitions and answers their
counts (``{"counts": {partition: rows}}``); executors then get one partition's rows each with a
``fetch_replays`` ticket ``{"op", "source", "tag", "partition"}`` (the replay table's columns);
``release_replays`` (``{"source", "tag"}``) frees them once the round is over.

Header values both sides check: a job name (``check_job``) and a token (``check_token``).

Resume after a driver crash: a persist command may carry ``"progress": [partition, end]`` (the
batch is rows ``[end - n, end)`` of that source partition, noted atomically with the batch);
``job_state`` (an action, body ``{"marks"?: {key: value or null}, "clear"?: [...]}``) updates
and answers the job's durable state ``{"progress": {source: {partition: rows}}, "marks": {}}``.
An idempotent persist may carry ``"epoch"`` (a micro-batch) and answers id 0 for a row whose
record this job persisted before and that is no longer pending under that id;
``forget_known`` (``{"epoch"}``) drops the ids of the epochs up to it.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

import pyarrow as pa

__all__ = [
    "ATTEMPT",
    "AUTH_HEADER",
    "BIRTHS",
    "CHUNK_BITS",
    "CONTROL_PREFIX",
    "DEFAULT_JOB",
    "DEFAULT_MAX_ROWS",
    "EVENT_TIME",
    "FAIL_SCHEMA",
    "JOB_HEADER",
    "KEY_HASH",
    "NO_EVENT_TIME",
    "ORIGIN",
    "ORIGIN_PARTITION",
    "ORIGIN_REC",
    "PARTITION",
    "PERSIST_CONTROL",
    "PROTOCOL_HEADER",
    "PROTOCOL_VERSION",
    "RELEASE_SCHEMA",
    "REPLAY_COLUMNS",
    "SRC",
    "TOUCH_SCHEMA",
    "XOR",
    "XOR_SCHEMA",
    "Op",
    "check_job",
    "check_token",
]

#: Bumped when a change would make an older client or service misread a call. Clients send it
#: in ``PROTOCOL_HEADER``; a service refuses a version it does not speak (absent: version 1).
PROTOCOL_VERSION = 7  # 2: held completions, chunk events and release (an acker of version 1
# would complete what a version-2 client asks it to hold); 3: persist's progress note and the
# job_state action (resume after a driver crash: an older acker would drop the notes silently);
# 4: persist's idempotent flag (an older acker would refuse a retried task's persist);
# 5: a record's first id and original partition are FT-layer fields (the persisted births and
# partition), sent with every replay as _ft_origin_rec / _ft_origin_partition instead of payload
# columns the Spark source added; prepare_replays' "first_ids" is a flag (was a payload column
# name) and take_replays has it too (an older acker would not give replays their first ids);
# 6: persist's _ft_event_time column and stats' min_event_time (an older acker would refuse the
# column, and answer no minimum: a watermark held back by nothing); 7: an idempotent persist
# answers id 0 for a row whose record already settled, persist's "epoch" and the forget_known
# action (an older acker would persist such a row again: counted twice)


class Op(str, Enum):
    """The service's operations, with the Flight RPC each one travels by (``Op.X.rpc``)."""

    PERSIST = "persist"
    XOR = "xor"
    FAIL = "fail"
    TOUCH = "touch"
    REPLAYS = "replays"
    DEAD_LETTERS = "dead_letters"
    PING = "ping"
    STATS = "stats"
    ROTATE = "rotate"
    EXPIRE_ALL = "expire_all"
    TAKE_ENDED = "take_ended"
    RELEASE = "release"
    PREPARE_REPLAYS = "prepare_replays"
    FETCH_REPLAYS = "fetch_replays"
    RELEASE_REPLAYS = "release_replays"
    JOB_STATE = "job_state"
    FORGET_KNOWN = "forget_known"

    @property
    def rpc(self) -> str:
        """``"put"`` (DoPut: a command + an Arrow stream), ``"get"`` (DoGet: a ticket) or
        ``"action"`` (DoAction: a JSON body)."""
        return _RPC[self]

    @classmethod
    def of(cls, rpc: str) -> tuple[Op, ...]:
        """The operations that travel by ``rpc``."""
        return tuple(op for op in cls if _RPC[op] == rpc)


_RPC = {
    Op.PERSIST: "put",
    Op.XOR: "put",
    Op.FAIL: "put",
    Op.TOUCH: "put",
    Op.REPLAYS: "get",
    Op.DEAD_LETTERS: "get",
    Op.PING: "action",
    Op.STATS: "action",
    Op.ROTATE: "action",
    Op.EXPIRE_ALL: "action",
    Op.TAKE_ENDED: "action",
    Op.RELEASE: "put",
    Op.PREPARE_REPLAYS: "action",
    Op.FETCH_REPLAYS: "get",
    Op.RELEASE_REPLAYS: "action",
    Op.JOB_STATE: "action",
    Op.FORGET_KNOWN: "action",
}

#: HTTP/2 header carrying the token ("authorization: Bearer <token>").
AUTH_HEADER = "authorization"
#: HTTP/2 header naming the job a call belongs to (absent: the job "default").
JOB_HEADER = "x-xorack-job"
#: HTTP/2 header carrying the client's ``PROTOCOL_VERSION``.
PROTOCOL_HEADER = "x-xorack-protocol"

#: Column names starting with this belong to xorack (a payload may not use them).
CONTROL_PREFIX = "_ft_"
SRC = "_ft_src"
BIRTHS = "_ft_rec"
KEY_HASH = "_ft_key_hash"
PARTITION = "_ft_partition"
XOR = "_ft_xor"
ATTEMPT = "_ft_attempt"  # a replay's attempt number (1 = the first)
ORIGIN = "_ft_origin"  # a record's first source id
ORIGIN_REC = "_ft_origin_rec"  # the record id its first attempt was born with (0 = unknown)
ORIGIN_PARTITION = "_ft_origin_partition"  # the partition it was first persisted from (-1 unknown)
EVENT_TIME = "_ft_event_time"  # a record's event time (int64; NO_EVENT_TIME = none)
#: The event time of a record that has none (the int64 minimum: below every real one).
NO_EVENT_TIME = -(2**63)

#: Events: one row per source id (pre-reduced by the sender), the value to XOR in.
XOR_SCHEMA = pa.schema([pa.field(SRC, pa.uint64(), False), pa.field(XOR, pa.uint64(), False)])
#: Explicit failures: the source ids to fail (the reason travels in the request command).
FAIL_SCHEMA = pa.schema([pa.field(SRC, pa.uint64(), False)])
#: Releasing held completions: the chunks whose held records are replayed as collateral.
RELEASE_SCHEMA = FAIL_SCHEMA
#: Source ids are drawn in aligned blocks of ``2**CHUNK_BITS`` (a *chunk*, ``src >> CHUNK_BITS``)
#: where a Spark barrier combines rows before staging them; a sharded acker routes by chunk, so
#: that a chunk's records live on one shard.
CHUNK_BITS = 10
#: Timeout resets: the source ids to touch.
TOUCH_SCHEMA = FAIL_SCHEMA
#: Optional control columns of a persist stream (the rest of the columns are the payload).
PERSIST_CONTROL = {
    KEY_HASH: pa.int32(),
    BIRTHS: pa.uint64(),
    PARTITION: pa.int32(),
    SRC: pa.uint64(),
    EVENT_TIME: pa.int64(),
}
#: The columns a replay table adds to the payload, in order, with their types.
REPLAY_COLUMNS = {
    SRC: pa.uint64(),
    BIRTHS: pa.uint64(),
    KEY_HASH: pa.int32(),
    ATTEMPT: pa.int32(),
    ORIGIN: pa.uint64(),
    ORIGIN_REC: pa.uint64(),
    ORIGIN_PARTITION: pa.int32(),
    PARTITION: pa.int32(),
}

#: Most rows of one put an acker accepts unless told otherwise: each pending record costs the
#: acker ~150-250 bytes however small its payload (one persist of 4M int64 rows peaked at
#: ~900 MiB), so this bounds what one request can cost (a Spark Arrow batch is 10K rows).
#: The client splits its event calls into requests of this many rows.
DEFAULT_MAX_ROWS = 1 << 20

#: The job of a call whose header names none.
DEFAULT_JOB = "default"
_JOB_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

#: Longest token accepted: it travels in an HTTP/2 header (gRPC's header budget is 8 KiB).
TOKEN_MAX = 4096


def check_token(token: Any) -> str | None:
    """``token`` if a client can send it (None/empty = no token): 1-4096 visible ASCII
    characters (``!`` to ``~``, no space, tab, newline or non-ASCII: an HTTP/2 header value);
    ``ValueError`` saying what is wrong otherwise.

    >>> check_token("s3cret-token"), check_token(None)
    ('s3cret-token', None)
    """
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise ValueError(f"the token must be a string, got {type(token).__name__}")
    if len(token) > TOKEN_MAX:
        raise ValueError(
            f"the token is {len(token)} characters long; at most {TOKEN_MAX} fit in the header "
            "every call carries: use a shorter secret"
        )
    bad = next((c for c in token if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"the token contains {bad!r} at position {token.index(bad)}: only visible ASCII "
            "characters ('!' to '~') can travel in a call's header (no spaces, tabs, newlines "
            "or non-ASCII)"
        )
    return token


def check_job(job: Any) -> str:
    """The job name ``job`` stands for: None is the job ``"default"``; otherwise 1-64 of
    ``A-Z a-z 0-9 _ . -`` (``ValueError`` saying so). A job is one pipeline run: its sources,
    rounds, replays, dead letters, stats and ended attempts are its own on a shared acker.

    >>> check_job(None), check_job("run-2024.06_01")
    ('default', 'run-2024.06_01')
    """
    if job is None:
        return DEFAULT_JOB
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job):
        raise ValueError(
            f"job must be 1-64 characters among A-Z a-z 0-9 _ . - (one pipeline run's name), "
            f"got {job!r:.80}"
        )
    return job
