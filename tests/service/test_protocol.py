"""The wire protocol module: one definition the service, its client and the FT layer agree on."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
import pytest

from xorack import FTLayer
from xorack.protocol import (
    EVENT_TIME,
    NO_EVENT_TIME,
    PERSIST_CONTROL,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    REPLAY_COLUMNS,
    Op,
)
from xorack.service import _ACTIONS, _GET_OPS, _PUT_OPS, AckerService


def test_every_op_is_served_by_its_rpc():
    assert set(_PUT_OPS) == {"persist", "xor", "fail", "touch", "release"}
    assert set(_GET_OPS) == {"replays", "fetch_replays", "dead_letters"}
    assert set(_ACTIONS) == {op.value for op in Op.of("action")}
    assert {op.rpc for op in Op} == {"put", "get", "action"}


def test_replay_tables_have_the_protocol_columns():
    with FTLayer(replay_partitioners={0: "single"}) as ft:
        ft.fail(ft.persist(pa.record_batch({"v": [1]}), births=[3]))
        (table,) = ft.take_replays().values()
    extra = table.schema.names[1:]
    assert extra == list(REPLAY_COLUMNS)
    assert [table.schema.field(c).type for c in extra] == list(REPLAY_COLUMNS.values())


def test_prepared_replay_tables_have_the_protocol_columns():
    with FTLayer() as ft:
        ft.fail(ft.persist(pa.record_batch({"v": [1]}), births=[3]))
        ft.prepare_replays(0, "hash:1", tag="r")
        table = ft.fetch_replays(0, "r", 0)
    extra = table.schema.names[1:]
    assert extra == list(REPLAY_COLUMNS)
    assert [table.schema.field(c).type for c in extra] == list(REPLAY_COLUMNS.values())


def test_a_client_of_another_protocol_version_is_refused():
    with FTLayer() as ft, AckerService.embedded(ft) as svc:
        raw = flight.FlightClient(svc.location)
        try:
            current = flight.FlightCallOptions(
                headers=[(PROTOCOL_HEADER.encode(), str(PROTOCOL_VERSION).encode())]
            )
            assert list(raw.do_action(flight.Action("ping", b"{}"), options=current))
            for other in (b"99", b"5"):  # 5: before event times (a column it would refuse)
                options = flight.FlightCallOptions(headers=[(PROTOCOL_HEADER.encode(), other)])
                with pytest.raises(
                    flight.FlightError, match=f"protocol version '{other.decode()}'"
                ):
                    list(raw.do_action(flight.Action("ping", b"{}"), options=options))
            assert ft.pending == 0
        finally:
            raw.close()


def test_event_times_travel_as_an_int64_control_column():
    assert PROTOCOL_VERSION >= 6
    assert (EVENT_TIME, PERSIST_CONTROL[EVENT_TIME]) == ("_ft_event_time", pa.int64())
    assert np.iinfo(np.int64).min == NO_EVENT_TIME
