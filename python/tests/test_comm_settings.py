"""Communicators (Comm(comm) on a Split sub-communicator, Comm(dup=True)) and the
process-wide settings (configure / settings)."""

import numpy as np
import pytest
from mpi4py import MPI

import dlpack_mpi
from helpers import WORLD, Settings

KEYS = {"agreement", "packing", "pack_threshold_bytes", "half_ops", "bucket_bytes",
        "first_bucket_bytes"}


def test_comm_world(comm, rank, size):
    assert (comm.rank, comm.size) == (rank, size)
    assert comm.mpi4py is WORLD or MPI.Comm.Compare(comm.mpi4py, WORLD) == MPI.IDENT
    assert repr(comm) == f"<dlpack_mpi.Comm rank {rank} of {size}>"
    assert dlpack_mpi.Comm(WORLD).rank == rank


def test_comm_split(rank, size):
    """A sub-communicator of the ranks of one parity, in reverse order (key = -rank)."""
    sub = WORLD.Split(color=rank % 2, key=-rank)
    try:
        c = dlpack_mpi.Comm(sub)
        members = [r for r in range(size) if r % 2 == rank % 2][::-1]
        assert c.size == len(members) == sub.Get_size()
        assert c.rank == members.index(rank) == sub.Get_rank()
        assert MPI.Comm.Compare(c.mpi4py, sub) == MPI.IDENT
        # all-reduce of the world ranks: the sum of this parity's
        buf = np.array([rank, 1], np.int64)
        c.allreduce(buf)
        # broadcast from sub-rank 0 (the highest world rank of this parity)
        b = np.array([rank * 10.0])
        c.bcast(b, root=0)
        # a ring of sendrecvs in the sub-communicator (ranks are the sub's)
        got = np.zeros(1, np.int32)
        st = c.sendrecv(np.array([rank], np.int32), (c.rank + 1) % c.size, got,
                        (c.rank - 1) % c.size, sendtag=3, recvtag=3)
        # nonblocking all-gather in it
        g = np.zeros(c.size, np.int32)
        c.iallgather(np.array([rank], np.int32), g).wait()
        del c
    finally:
        sub.Free()
    assert np.array_equal(buf, [sum(members), len(members)])
    assert b[0] == members[0] * 10.0
    assert got[0] == members[(members.index(rank) - 1) % len(members)]
    assert st.source == (members.index(rank) - 1) % len(members)
    assert g.tolist() == members


def test_comm_dup(comm, rank, size):
    """Comm(dup=True): a duplicate of COMM_WORLD, whose messages match only its own."""
    d = dlpack_mpi.Comm(dup=True)
    try:
        assert MPI.Comm.Compare(d.mpi4py, WORLD) == MPI.CONGRUENT
        assert (d.rank, d.size) == (rank, size)
        # a receive posted on COMM_WORLD is not matched by a send on the duplicate
        on_world = np.zeros(2)
        wreq = comm.irecv(on_world, rank, tag=5)
        sreq = d.isend(np.array([1.0, 2.0]), rank, tag=5)  # to itself
        on_dup = np.zeros(2)
        d.recv(on_dup, rank, tag=5)
        sreq.wait()
        still_pending = not wreq.test()
        comm.send(np.array([3.0, 4.0]), rank, tag=5)  # its receive is posted
        wreq.wait()
        buf = np.array([rank + 1])
        d.allreduce(buf)
        dd = dlpack_mpi.Comm(d.mpi4py, dup=True)  # a duplicate of a duplicate
        x = np.zeros(1)
        if rank == 0:
            x[0] = 42
        dd.bcast(x)
        dd.mpi4py.Free()
    finally:
        d.mpi4py.Free()
    assert still_pending
    assert on_dup.tolist() == [1.0, 2.0] and on_world.tolist() == [3.0, 4.0]
    assert buf[0] == size * (size + 1) // 2
    assert x[0] == 42


def test_comm_self_and_bad_arguments(rank):
    s = dlpack_mpi.Comm(MPI.COMM_SELF)
    assert (s.rank, s.size) == (0, 1)
    buf = np.array([rank + 0.5])
    s.allreduce(buf)
    assert buf[0] == rank + 0.5
    with pytest.raises(TypeError):
        dlpack_mpi.Comm("world")
    with pytest.raises(TypeError):
        dlpack_mpi.Comm(MPI.COMM_NULL)


def test_settings_defaults_and_round_trip():
    before = dlpack_mpi.settings()
    assert set(before) == KEYS
    assert before["agreement"] == "collective"
    assert before["packing"] in ("auto", "copy", "derived")
    assert before["half_ops"] in ("auto", "library", "mpi")
    try:
        dlpack_mpi.configure(packing="COPY", pack_threshold_bytes=64, half_ops="library",
                             bucket_bytes=4096, first_bucket_bytes=1024)
        now = dlpack_mpi.settings()
        assert now == dict(before, packing="copy", pack_threshold_bytes=64,
                           half_ops="library", bucket_bytes=4096, first_bucket_bytes=1024)
        dlpack_mpi.configure(packing="derived")  # the others stay
        assert dlpack_mpi.settings() == dict(now, packing="derived")
    finally:
        dlpack_mpi.configure(**before)  # settings()'s keys are configure's keywords
    assert dlpack_mpi.settings() == before


@pytest.mark.parametrize("bad, error, named", [
    ({"agreement": "maybe"}, ValueError, "agreement"),
    ({"packing": "zip"}, ValueError, "packing"),
    ({"half_ops": "fast"}, ValueError, "half_ops"),
    ({"bucket_bytes": 0}, ValueError, "bucket_bytes"),
    ({"first_bucket_bytes": 0}, ValueError, "first_bucket_bytes"),
    ({"packing": "copy", "agreement": "nope"}, ValueError, "agreement"),  # beside a good one
    ({"half_ops": "mpi", "bucket_bytes": 0}, ValueError, "bucket_bytes"),
    ({"bucket_bytes": -1}, OverflowError, None),
    ({"pack_threshold_bytes": "big"}, TypeError, "pack_threshold_bytes"),
    ({"agreement": 1}, TypeError, "agreement"),
    ({"unknown": 1}, TypeError, "unknown"),
])
def test_configure_bad_values_change_nothing(bad, error, named):
    before = dlpack_mpi.settings()
    with pytest.raises(error) as info:
        dlpack_mpi.configure(**bad)
    assert dlpack_mpi.settings() == before
    if named:
        assert named in str(info.value)


def test_configure_positional_refused():
    with pytest.raises(TypeError):
        dlpack_mpi.configure("collective")


@pytest.mark.parametrize("kw", [
    {"packing": "copy"}, {"packing": "derived"}, {"pack_threshold_bytes": 1 << 20},
    {"bucket_bytes": 24, "first_bucket_bytes": 8}, {"half_ops": "library"},
])
def test_settings_take_effect_and_stay_correct(comm, rank, size, kw):
    """Each setting changes how data travels, not what arrives: a strided all-reduce, a
    fused list in tiny buckets and a strided all-gather give the same exact values."""
    with Settings(**kw):
        base = np.full((6, 4), -1.0)
        v = base[::2, ::3]  # 3 x 2, both dimensions strided
        v[:] = np.arange(6.0).reshape(3, 2) + rank
        comm.allreduce(v)
        lst = [np.full(k + 1, rank + k, np.float32) for k in range(5)]
        comm.iallreduce(lst).wait()
        t = (np.arange(6) + 10 * rank).reshape(2, 3).T
        g = np.zeros((size, 3, 2), np.int64)
        comm.allgather(t, g)
        halves = np.array([rank + 0.5] * 3, np.float16)
        comm.allreduce(halves)
    ranks = sum(range(size))
    assert np.array_equal(base[::2, ::3], size * np.arange(6.0).reshape(3, 2) + ranks)
    base[::2, ::3] = -1.0
    assert np.all(base == -1.0)
    for k, m in enumerate(lst):
        assert np.array_equal(m, np.full(k + 1, ranks + size * k, np.float32))
    for r in range(size):
        assert np.array_equal(g[r], ((np.arange(6) + 10 * r).reshape(2, 3).T))
    assert np.all(halves == np.float16(ranks + 0.5 * size))


def test_freed_communicator_is_an_error_not_a_crash(comm, rank, size):
    """After the mpi4py communicator's Free(), the Comm raises ValueError (it handed MPI the
    freed handle: a segfault); rank and size stay readable."""
    c = dlpack_mpi.Comm(comm.mpi4py, dup=True)
    x = np.ones(3)
    c.allreduce(x)
    assert (x == size).all()
    c.mpi4py.Free()
    with pytest.raises(ValueError, match="was freed"):
        c.allreduce(np.ones(3))
    with pytest.raises(ValueError, match="was freed"):
        c.iallreduce(np.ones(3))
    with pytest.raises(ValueError, match="was freed"):
        c.send(np.ones(3), rank)
    assert (c.rank, c.size) == (rank, size)

