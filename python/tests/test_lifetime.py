"""Each array is released once MPI is done with it: NumPy's DLPack capsule holds one
reference to the array until its deleter runs, so sys.getrefcount tells whether the deleter
ran (back to the value before the call), did not (one more) or ran twice (one fewer)."""

import sys

import numpy as np
import pytest

import dlpack_mpi
from helpers import MODES, need, run


def refs(arrays):
    """The reference counts of the arrays of the list `arrays` (a list literal, so that
    every call counts alike), less the list's and this function's own references. Called
    in a statement of its own, never inside an assert (pytest's rewriting keeps some
    operands alive meanwhile)."""
    return [sys.getrefcount(a) - 2 for a in arrays]


@pytest.mark.parametrize("mode", MODES)
def test_collectives_release_every_array(comm, rank, size, mode):
    send = np.arange(2 * size, dtype=np.float64) + rank
    recv = np.zeros(2 * size)
    small = np.zeros(2)
    view = send[::2]
    lst = [np.ones(3), np.ones(2, np.int32)]
    lst_recv = [np.zeros(3), np.zeros(2, np.int32)]
    before = refs([send, recv, small, view, *lst, *lst_recv])
    run(comm, mode, "allreduce", send, recv)
    run(comm, mode, "allreduce", view)  # strided, in place
    run(comm, mode, "allreduce", lst, lst_recv)
    run(comm, mode, "bcast", recv)
    run(comm, mode, "reduce_scatter_block", send, small)
    run(comm, mode, "alltoall", send, recv)
    run(comm, mode, "allgather", small, recv)
    run(comm, mode, "gather", small, recv if rank == 0 else None)
    run(comm, mode, "scatter", send if rank == 0 else None, small)
    now = refs([send, recv, small, view, *lst, *lst_recv])
    assert now == before


def test_pending_request_holds_its_arrays(comm, rank, size):
    """While a request is pending it holds one reference to each array; at completion
    (wait, test, waitall, or being dropped) exactly that one is given back."""
    a, b = np.zeros(4), np.arange(4.0)
    lst = [np.ones(2), np.ones(3)]
    before = refs([a, b, *lst])
    # a receive from this rank itself stays pending until this rank sends
    rreq = comm.irecv(a, rank, tag=7)
    assert rreq.test() is False
    now = refs([a])
    assert now == [before[0] + 1]
    sreq = comm.isend(b, rank, tag=7)
    now = refs([b])
    assert now == [before[1] + 1]
    creq = comm.iallreduce(lst)
    now = refs([*lst])
    assert now == [before[2] + 1, before[3] + 1]
    dlpack_mpi.waitall([creq, sreq, rreq])
    now = refs([a, b, *lst])
    assert now == before
    assert np.array_equal(a, np.arange(4.0))
    # completion by test()
    req = comm.iallreduce(a)
    now = refs([a])
    assert now == [before[0] + 1]
    while not req.test():
        pass
    now = refs([a])
    assert now == [before[0]]
    # a request dropped before it completes is waited for, then releases its arrays
    req = comm.iallreduce(lst)
    del req
    now = refs([*lst])
    assert now == before[2:]
    assert np.array_equal(lst[0], np.full(2, size ** 2))


def test_point_to_point_releases(comm, rank, size):
    need(2)
    buf = np.zeros(6)
    t = np.arange(6.0).reshape(2, 3).T
    small, other = np.zeros(4), np.zeros(6)
    before = refs([buf, t, small, other])
    if rank == 0:
        comm.send(t, 1, tag=1)
        comm.send(buf, 1, tag=2)
        comm.sendrecv(t, 1, buf, 1, sendtag=3, recvtag=4)
    elif rank == 1:
        comm.recv(buf, 0, tag=1)
        with pytest.raises(dlpack_mpi.Unfit) as info:
            comm.recv(small, 0, tag=2)
        info.value.message.recv_into(other)
        del info
        comm.sendrecv(buf, 0, t, 0, sendtag=4, recvtag=3)
    now = refs([buf, t, small, other])
    assert now == before


def test_errors_release_the_arrays(comm, rank, size):
    """An operation that raises releases what it acquired: a refused collective, a
    mismatch, a member error in the middle of a list."""
    a = np.ones(3)
    b = np.ones(3 + (rank == size - 1 and size > 1))
    lst = [np.ones(2), np.ones(2), "not an array"]
    before = refs([a, b, lst[0], lst[1]])
    with pytest.raises(ValueError):
        comm.allreduce(a, op="avg")  # every rank: no peer waits
    if size > 1:
        with pytest.raises(dlpack_mpi.CollectiveMismatch):
            comm.allreduce(b)
    with pytest.raises(dlpack_mpi.Member):
        comm.allreduce(lst)
    with pytest.raises(dlpack_mpi.Member):
        comm.iallreduce(lst)
    now = refs([a, b, lst[0], lst[1]])
    assert now == before
