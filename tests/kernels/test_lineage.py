"""Ids and lineage: new_ids (fork safety), anchor, parent_index, xor_reduce, derive_ids."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import xorack
from xorack.acker import anchor, derive_ids, new_ids, parent_index, xor_reduce

# --- new_ids --------------------------------------------------------------------------------------


def test_new_ids_are_nonzero_and_unique(backend):
    ids = new_ids(200_000, backend=backend)
    assert ids.dtype == np.uint64
    assert ids.shape == (200_000,)
    assert ids.all()
    assert np.unique(ids).size == ids.size
    assert np.unique(np.concatenate([ids, new_ids(1000, backend=backend)])).size == ids.size + 1000
    # Spread over the whole 64-bit range, not a counter.
    assert ids.max() > np.uint64(2**63)
    assert ids.min() < np.uint64(2**62)


def test_new_ids_edge_and_bad_sizes(backend):
    empty = new_ids(0, backend=backend)
    assert empty.dtype == np.uint64
    assert empty.size == 0
    assert new_ids(np.int64(2), backend=backend).size == 2
    with pytest.raises(ValueError, match="n must be >= 0"):
        new_ids(-1, backend=backend)
    with pytest.raises(TypeError, match="n must be an int"):
        new_ids(2.0, backend=backend)
    with pytest.raises(TypeError, match="n must be an int"):
        new_ids(True, backend=backend)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only (PySpark's daemon too)")
def test_new_ids_differ_across_forked_children(backend):
    new_ids(10, backend=backend)  # the generator exists before the fork, as in PySpark's daemon
    children = []
    for _ in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: draw ids, send them, exit without running pytest's teardown
            try:
                os.close(r)
                os.write(w, new_ids(1000, backend=backend).tobytes())
            finally:
                os._exit(0)
        os.close(w)
        children.append((pid, r))
    drawn = [new_ids(1000, backend=backend)]
    for pid, r in children:
        data = b""
        while chunk := os.read(r, 1 << 16):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        drawn.append(np.frombuffer(data, dtype=np.uint64))
    assert [d.size for d in drawn] == [1000, 1000, 1000]
    all_ids = np.concatenate(drawn)
    assert np.unique(all_ids).size == all_ids.size


# --- anchor ---------------------------------------------------------------------------------------


def test_anchor_one_event_per_input_reduced_per_source(backend):
    in_src = [7, 7, 8, 9]
    in_rec = [1, 2, 3, 4]
    out_src, out_rec, ev_src, ev_xor = anchor(in_src, in_rec, [0, 0, 2], [10, 11, 12], backend)
    assert out_src.tolist() == [7, 7, 8]
    assert out_rec.tolist() == [10, 11, 12]
    # Rows 1 and 3 have no outputs: their own ids are the whole event (they are acked).
    assert ev_src.tolist() == [7, 8, 9]
    assert ev_xor.tolist() == [1 ^ 10 ^ 11 ^ 2, 3 ^ 12, 4]


def test_anchor_draws_fresh_ids_and_keeps_zero_events(backend):
    out_src, out_rec, ev_src, ev_xor = anchor([5, 5], [3, 3 ^ 1], [0, 0, 1], backend=backend)
    assert out_src.tolist() == [5, 5, 5]
    assert out_rec.all()
    assert np.unique(out_rec).size == 3
    assert ev_src.tolist() == [5]
    assert int(ev_xor[0]) == 1 ^ int(np.bitwise_xor.reduce(out_rec))
    # A source whose events cancel still gets its (zero) entry.
    _, _, s, x = anchor([4, 4], [6, 6], [], backend=backend)
    assert s.tolist() == [4]
    assert x.tolist() == [0]


def test_anchor_of_an_empty_batch(backend):
    out = anchor([], [], [], backend=backend)
    assert [a.size for a in out] == [0, 0, 0, 0]
    assert all(a.dtype == np.uint64 for a in out)


def test_anchor_bad_input(backend):
    with pytest.raises(ValueError, match="parent_index must be in \\[0, 2\\)"):
        anchor([1, 2], [3, 4], [0, 2], backend=backend)
    with pytest.raises(ValueError, match="parent_index must be in"):
        anchor([1, 2], [3, 4], [-1], backend=backend)
    with pytest.raises(TypeError, match="parent_index must be an integer array"):
        anchor([1, 2], [3, 4], [0.0], backend=backend)
    with pytest.raises(ValueError, match="length mismatch"):
        anchor([1, 2], [3], [0], backend=backend)
    with pytest.raises(ValueError, match="length mismatch"):
        anchor([1, 2], [3, 4], [0, 1], [5], backend=backend)
    with pytest.raises(ValueError, match="out_rec contains id 0"):
        anchor([1, 2], [3, 4], [0], [0], backend=backend)
    with pytest.raises(ValueError, match="in_rec contains id 0"):
        anchor([1, 2], [3, 0], [0], backend=backend)


# --- parent_index ---------------------------------------------------------------------------------


def test_parent_index(backend):
    idx = parent_index([10, 20, 30], [30, 10, 10, 20], backend=backend)
    assert idx.dtype == np.int64
    assert idx.tolist() == [2, 0, 0, 1]
    assert parent_index([5], [], backend=backend).tolist() == []


def test_parent_index_names_the_first_bad_output(backend):
    with pytest.raises(xorack.LineageError, match="output row 2 has lineage id 99"):
        parent_index([10, 20], [10, 20, 99, 98], backend=backend)
    with pytest.raises(xorack.LineageError, match="output row 1 has lineage id 0"):
        parent_index([10, 20], [10, 0], backend=backend)
    with pytest.raises(xorack.LineageError, match="output row 0"):
        parent_index([], [5], backend=backend)


def test_parent_index_rejects_repeated_input_ids(backend):
    with pytest.raises(ValueError, match="position 3 repeats"):
        parent_index([10, 20, 30, 20, 10], [10], backend=backend)


# --- xor_reduce -----------------------------------------------------------------------------------


def test_xor_reduce_first_appearance_order(backend):
    s, x = xor_reduce([4, 9, 4, 2, 9], [1, 2, 3, 8, 2], backend=backend)
    assert s.tolist() == [4, 9, 2]
    assert x.tolist() == [1 ^ 3, 0, 8]
    s, x = xor_reduce([], [], backend=backend)
    assert s.size == 0
    assert x.dtype == np.uint64
    with pytest.raises(ValueError, match="src contains id 0"):
        xor_reduce([0], [1], backend=backend)
    with pytest.raises(ValueError, match="length mismatch"):
        xor_reduce([1], [1, 2], backend=backend)


# --- derive_ids -----------------------------------------------------------------------------------


def test_derive_ids_deterministic_distinct_nonzero(backend):
    n = 10_000
    origin = np.full(n, 123, dtype=np.uint64)
    parent = np.repeat(np.arange(1, 101, dtype=np.uint64), 100)
    ordinal = np.tile(np.arange(100, dtype=np.uint64), 100)
    a = derive_ids(origin, parent, ordinal, 7, backend=backend)
    assert a.all()
    assert np.unique(a).size == n
    assert (a == derive_ids(origin, parent, ordinal, 7, backend=backend)).all()
    b = derive_ids(origin, parent, ordinal, 8, backend=backend)
    assert not (a == b).any()
    assert (
        derive_ids([1], [2], [3], -1, backend=backend)
        == derive_ids([1], [2], [3], 2**64 - 1, backend=backend)
    ).all()


def test_derive_ids_are_the_same_in_another_process(backend):
    here = derive_ids([1, 2**64 - 1], [5, 6], [0, 9], 42, backend=backend).tolist()
    code = (
        "from xorack.acker import derive_ids;"
        f"print(derive_ids([1, 2**64 - 1], [5, 6], [0, 9], 42, backend={backend!r}).tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.stdout.strip() == str(here)


def test_derive_ids_bad_input(backend):
    with pytest.raises(TypeError, match="salt must be an int"):
        derive_ids([1], [2], [3], 1.5, backend=backend)
    with pytest.raises(ValueError, match="salt must be in"):
        derive_ids([1], [2], [3], 2**64, backend=backend)
    with pytest.raises(ValueError, match="origin contains id 0"):
        derive_ids([0], [2], [3], 1, backend=backend)
    with pytest.raises(ValueError, match="length mismatch"):
        derive_ids([1], [2], [3, 4], 1, backend=backend)
