"""Mistakes are exceptions on every rank, never hangs: calls that differ between ranks raise
CollectiveMismatch everywhere; an argument one rank cannot read raises there and
PeerRefused on the others; the communicator works afterwards."""

import numpy as np
import pytest
from mpi4py import MPI

import dlpack_mpi
from helpers import need, run

BLOCKING_AND_NOT = pytest.mark.parametrize("mode", ["blocking", "wait"])


def works_after(comm, rank, size):
    """A collective after the failed one: the communicator is still in step."""
    buf = np.array([rank + 1.0])
    comm.allreduce(buf)
    assert buf[0] == size * (size + 1) / 2


def odd_one_out(rank, size):
    return rank == size - 1


def expect_mismatch(comm, rank, size, call):
    with pytest.raises(dlpack_mpi.CollectiveMismatch) as info:
        call()
    works_after(comm, rank, size)
    return str(info.value)


@BLOCKING_AND_NOT
def test_mismatch_count(comm, rank, size, mode):
    need(2)
    n = 4 if odd_one_out(rank, size) else 3
    text = expect_mismatch(comm, rank, size,
                           lambda: run(comm, mode, "allreduce", np.ones(n, np.float32)))
    assert "float32 × 3" in text and "float32 × 4" in text
    assert f"rank {size - 1}" in text


@BLOCKING_AND_NOT
def test_mismatch_dtype(comm, rank, size, mode):
    need(2)
    dt = np.float64 if odd_one_out(rank, size) else np.float32
    recv = np.zeros(2 * size, dt)
    text = expect_mismatch(comm, rank, size,
                           lambda: run(comm, mode, "allgather", np.ones(2, dt), recv))
    assert "float32" in text and "float64" in text


@BLOCKING_AND_NOT
def test_mismatch_list_length(comm, rank, size, mode):
    need(2)
    k = 3 if odd_one_out(rank, size) else 2
    bufs = [np.ones(5, np.float32) for _ in range(k)]
    expect_mismatch(comm, rank, size, lambda: run(comm, mode, "allreduce", bufs))
    assert all(np.all(b == 1) for b in bufs)  # no rank entered the reduction


@BLOCKING_AND_NOT
def test_mismatch_list_member_dtype(comm, rank, size, mode):
    need(2)
    dt = np.int32 if odd_one_out(rank, size) else np.float32
    bufs = [np.ones(3, np.float32), np.ones(2, dt)]
    expect_mismatch(comm, rank, size, lambda: run(comm, mode, "bcast", bufs))


def test_mismatch_root_and_op(comm, rank, size):
    need(2)
    other = odd_one_out(rank, size)
    buf = np.arange(3.0)
    text = expect_mismatch(comm, rank, size, lambda: comm.bcast(buf, root=1 if other else 0))
    assert "root 0" in text and "root 1" in text
    expect_mismatch(comm, rank, size,
                    lambda: comm.allreduce(buf, op="max" if other else "min"))
    expect_mismatch(comm, rank, size,
                    lambda: comm.reduce(buf, np.zeros(3), root=0 if other else size - 1))


@BLOCKING_AND_NOT
def test_mismatch_reduce_scatter_and_alltoall(comm, rank, size, mode):
    need(2)
    k = 2 if odd_one_out(rank, size) else 1
    expect_mismatch(comm, rank, size, lambda: run(
        comm, mode, "reduce_scatter_block", np.ones(k * size, np.int32), np.zeros(k, np.int32)))
    expect_mismatch(comm, rank, size, lambda: run(
        comm, mode, "alltoall", np.ones(k * size, np.int32), np.zeros(k * size, np.int32)))


@BLOCKING_AND_NOT
def test_mismatch_v_counts(comm, rank, size, mode):
    """All-gatherv: one rank's counts differ from the others'. (A gatherv's send count
    against the root's counts is not in the agreement's fingerprint: signature.rs.)"""
    need(2)
    mine = [1] * size
    if odd_one_out(rank, size):
        mine[0] = 2
    text = expect_mismatch(comm, rank, size, lambda: run(
        comm, mode, "allgatherv", np.ones(mine[rank]), np.zeros(sum(mine)), mine))
    assert "counts [1, 1" in text and "counts [2, 1" in text


def refused(comm, rank, size, call, refuser=0):
    """Runs `call` on every rank: the refusing rank gets its own exception (returned), the
    others PeerRefused naming it."""
    if rank == refuser:
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the caller checks its class
            err = e
        else:
            pytest.fail("the refusing rank raised nothing")
    else:
        with pytest.raises(dlpack_mpi.PeerRefused) as info:
            call()
        err = info.value
        assert f"rank {refuser} refused" in str(err)
    works_after(comm, rank, size)
    return err


@BLOCKING_AND_NOT
def test_refused_unknown_op(comm, rank, size, mode):
    need(2)
    buf = np.ones(3, np.float32)
    err = refused(comm, rank, size,
                  lambda: run(comm, mode, "allreduce", buf, op="avg" if rank == 0 else "sum"))
    if rank == 0:
        assert isinstance(err, ValueError) and "avg" in str(err)
    else:
        assert "avg" in str(err) and "ValueError" in str(err)
    assert np.all(buf == 1)


@BLOCKING_AND_NOT
def test_refused_python_list_of_floats(comm, rank, size, mode):
    need(2)
    # a list is the fused form: its member 0, a float, is no array
    buf = [1.0, 2.0] if rank == 0 else [np.ones(1), np.ones(1)]
    err = refused(comm, rank, size, lambda: run(comm, mode, "allreduce", buf))
    if rank == 0:
        assert isinstance(err, dlpack_mpi.Member) and "__dlpack__" in str(err)
    # a single array's place: NotAProducer
    send = [1.0, 2.0] if rank == size - 1 else np.ones(2)
    recv = np.zeros(2 * size) if rank == 0 else None
    err = refused(comm, rank, size, lambda: run(comm, mode, "gather", send, recv),
                  refuser=size - 1)
    if rank == size - 1:
        assert isinstance(err, dlpack_mpi.NotAProducer)


def test_refused_every_kind_of_argument(comm, rank, size):
    need(2)
    # gatherv without counts at the root
    err = refused(comm, rank, size, lambda: comm.gatherv(np.ones(1), np.zeros(size)))
    if rank == 0:
        assert isinstance(err, ValueError) and "counts" in str(err)
    # counts that are no ints
    err = refused(comm, rank, size, lambda: comm.allgatherv(
        np.ones(1), np.zeros(size), "ab" if rank == 0 else [1] * size))
    if rank == 0:
        assert isinstance(err, TypeError)
    # a list beside a single array
    err = refused(comm, rank, size, lambda: comm.allreduce(
        [np.ones(2)] if rank == 0 else np.ones(2), np.zeros(2)))
    if rank == 0:
        assert isinstance(err, TypeError) and "list" in str(err)
    # op of the wrong type
    err = refused(comm, rank, size, lambda: comm.allreduce(
        np.ones(2), op=42 if rank == 0 else None))
    if rank == 0:
        assert isinstance(err, TypeError)
    # a read-only receive array on one rank
    ro = np.zeros(2)
    ro.flags.writeable = False
    err = refused(comm, rank, size, lambda: comm.allreduce(
        np.ones(2), ro if rank == 0 else np.zeros(2)))
    if rank == 0:
        assert isinstance(err, dlpack_mpi.ReadOnly)
    # an unsupported dtype (NumPy refuses to export a structured array)
    rec = np.zeros(2, dtype=[("a", np.int32), ("b", np.float32)])
    err = refused(comm, rank, size, lambda: comm.bcast(rec if rank == 0 else np.zeros(2)))
    assert isinstance(err, dlpack_mpi.Error)


def test_refused_nonblocking_every_collective(comm, rank, size):
    """Each i-form with one rank's unreadable argument (an object without __dlpack__)."""
    need(2)
    bad = object()

    def arg(good):
        return bad if rank == 0 else good

    n = size
    calls = {
        "ibcast": lambda: comm.ibcast(arg(np.zeros(2))),
        "ireduce": lambda: comm.ireduce(arg(np.ones(2)), np.zeros(2), root=0),
        "iallreduce": lambda: comm.iallreduce(arg(np.ones(2))),
        "igather": lambda: comm.igather(arg(np.ones(1)), np.zeros(n), root=0),
        "igatherv": lambda: comm.igatherv(arg(np.ones(1)), np.zeros(n), counts=[1] * n),
        "iscatter": lambda: comm.iscatter(np.ones(n), arg(np.zeros(1))),
        "iscatterv": lambda: comm.iscatterv(np.ones(n), arg(np.zeros(1)), counts=[1] * n),
        "iallgather": lambda: comm.iallgather(arg(np.ones(1)), np.zeros(n)),
        "iallgatherv": lambda: comm.iallgatherv(arg(np.ones(1)), np.zeros(n), [1] * n),
        "ialltoall": lambda: comm.ialltoall(arg(np.ones(n)), np.zeros(n)),
        "ialltoallv": lambda: comm.ialltoallv(arg(np.ones(n)), [1] * n, np.zeros(n), [1] * n),
        "ireduce_scatter_block": lambda: comm.ireduce_scatter_block(
            arg(np.ones(n)), np.zeros(1)),
    }
    for name, call in calls.items():
        err = refused(comm, rank, size, lambda: call().wait())
        if rank == 0:
            assert isinstance(err, dlpack_mpi.NotAProducer), name


def test_invalid_root_on_every_rank(comm, rank, size):
    with pytest.raises(dlpack_mpi.InvalidRank):
        comm.bcast(np.zeros(2), root=size + 2)
    works_after(comm, rank, size)


def test_mpi4py_op_not_predefined(comm, rank, size):
    need(2)
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        err = refused(comm, rank, size,
                      lambda: comm.allreduce(np.ones(2), op=op if rank == 0 else None))
        if rank == 0:
            assert isinstance(err, TypeError) and "predefined" in str(err)
    finally:
        op.Free()


def test_error_classes():
    assert issubclass(dlpack_mpi.Error, Exception)
    kinds = {k.__name__ for k in dlpack_mpi.Error.__subclasses__()}
    for name in ["CollectiveMismatch", "PeerRefused", "OutOfStep", "Unfit", "ReadOnly",
                 "Immutable", "UnsupportedDtype", "NonContiguous", "CountMismatch"]:
        assert name in kinds
        assert getattr(dlpack_mpi, name).__module__ == "dlpack_mpi"


@BLOCKING_AND_NOT
def test_root_without_its_buffer(comm, rank, size, mode):
    """The root of a reduce, gather or scatter without its array: MissingBuffer there,
    PeerRefused elsewhere (at 1 rank, the root alone)."""
    root = size - 1
    for name, args in [("reduce", (np.ones(2), None)), ("gather", (np.ones(2), None)),
                       ("scatter", (None, np.zeros(2)))]:
        if size == 1:
            with pytest.raises(dlpack_mpi.MissingBuffer):
                run(comm, mode, name, *args, root=root)
            continue
        err = refused(comm, rank, size, lambda: run(comm, mode, name, *args, root=root),
                      refuser=root)
        if rank == root:
            assert isinstance(err, dlpack_mpi.MissingBuffer) and "root" in str(err)


def test_aliased_buffers_on_every_rank(comm, rank, size):
    a = np.arange(4.0)
    with pytest.raises(dlpack_mpi.BuffersAlias):
        comm.allreduce(a, a)
    with pytest.raises(dlpack_mpi.BuffersAlias):
        comm.allreduce(a[:3], a[1:])
    with pytest.raises(dlpack_mpi.UnsupportedReduction):
        comm.allreduce(np.ones(2, np.complex64), op="max")
    works_after(comm, rank, size)
    assert np.array_equal(a, np.arange(4.0))


def test_out_of_step_then_reset(comm, rank, size):
    """A rank that skips a collective: the first one after it is a mismatch on every rank,
    the next one names the rank (OutOfStep), and every later collective raises OutOfStep at
    once until every rank calls comm.reset_out_of_step()."""
    need(2)
    sub = dlpack_mpi.Comm(comm.mpi4py.Dup())
    a, b, c = np.ones(4, np.float32), np.ones(2, np.float64), np.ones(3, np.int32)
    try:
        calls = [a, b] if rank != size - 1 else [b, c]  # the last rank skips `a`
        with pytest.raises(dlpack_mpi.CollectiveMismatch):
            sub.allreduce(calls[0])
        with pytest.raises(dlpack_mpi.OutOfStep) as e:
            sub.allreduce(calls[1])
        assert f"rank {size - 1}" in str(e.value) and "skipped" in str(e.value), str(e.value)
        with pytest.raises(dlpack_mpi.OutOfStep):
            sub.allreduce(np.ones(2))
        assert sub.reset_out_of_step() is True
        y = np.full(3, float(rank))
        sub.allreduce(y)
        assert np.array_equal(y, np.full(3, size * (size - 1) / 2))
    finally:
        sub.mpi4py.Free()


def test_a_failed_request_fails_again(comm, rank, size):
    """wait() after a failed wait(), and test(), raise the same error again."""
    need(2)
    req = comm.iallreduce(np.ones(4 if rank == 0 else 5))
    with pytest.raises(dlpack_mpi.CollectiveMismatch) as first:
        req.wait()
    with pytest.raises(dlpack_mpi.CollectiveMismatch) as again:
        req.wait()
    assert str(again.value) == str(first.value)
    with pytest.raises(dlpack_mpi.CollectiveMismatch):
        req.test()
    assert req.done
