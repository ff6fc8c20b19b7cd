"""Every collective, blocking and nonblocking (completed by wait, test and waitall), with
NumPy arrays: the values every rank receives, computed from the ranks' numbers."""

import numpy as np
import pytest
from mpi4py import MPI

from helpers import MODES, run

pytestmark = pytest.mark.parametrize("mode", MODES)


def mine(rank, n, dtype=np.float64, salt=0):
    """Rank `rank`'s contribution: n elements, distinct per rank."""
    return (np.arange(n) * 2 + 100 * rank + salt).astype(dtype)


def every(size, n, dtype=np.float64, salt=0):
    return np.stack([mine(r, n, dtype, salt) for r in range(size)])


def last(size):
    """The root of the rooted collectives: the last rank (not always 0)."""
    return size - 1


def test_bcast(comm, rank, size, mode):
    root = last(size)
    buf = mine(rank, 6, np.int32).reshape(2, 3) if rank == root else np.zeros((2, 3), np.int32)
    assert run(comm, mode, "bcast", buf, root=root) is None
    assert np.array_equal(buf, mine(root, 6, np.int32).reshape(2, 3))


def test_bcast_read_only_root(comm, rank, size, mode):
    """The root's array is only read: a read-only one is fine there."""
    buf = mine(0, 5) if rank == 0 else np.zeros(5)
    if rank == 0:
        buf.flags.writeable = False
    run(comm, mode, "bcast", buf)
    assert np.array_equal(buf, mine(0, 5))


def test_bcast_list(comm, rank, size, mode):
    root = last(size)
    bufs = [mine(rank, 3, np.float32), mine(rank, 4, np.int64, salt=1).reshape(2, 2),
            np.zeros(0), mine(rank, 2, np.complex128)]
    if rank != root:
        bufs = [np.zeros_like(b) for b in bufs]
    run(comm, mode, "bcast", bufs, root=root)
    want = [mine(root, 3, np.float32), mine(root, 4, np.int64, salt=1).reshape(2, 2),
            np.zeros(0), mine(root, 2, np.complex128)]
    for got, w in zip(bufs, want):
        assert got.dtype == w.dtype and np.array_equal(got, w)


def test_reduce(comm, rank, size, mode):
    root = last(size)
    recv = np.full(5, -1.0) if rank == root else None
    run(comm, mode, "reduce", mine(rank, 5), recv, op="sum", root=root)
    if rank == root:
        assert np.array_equal(recv, every(size, 5).sum(axis=0))


def test_reduce_max_elsewhere_untouched(comm, rank, size, mode):
    """recvbuf is ignored off the root: an array passed there stays as it was."""
    recv = np.full(4, -1, np.int32)
    run(comm, mode, "reduce", mine(rank, 4, np.int32)[::-1].copy(), recv, op=MPI.MAX, root=0)
    if rank == 0:
        assert np.array_equal(recv, mine(size - 1, 4, np.int32)[::-1])
    else:
        assert np.all(recv == -1)


def test_allreduce_in_place(comm, rank, size, mode):
    buf = mine(rank, 7, np.float32)
    run(comm, mode, "allreduce", buf)
    assert np.array_equal(buf, every(size, 7, np.float32).sum(axis=0))


def test_allreduce_into(comm, rank, size, mode):
    send = mine(rank, 6, np.int64).reshape(3, 2)
    recv = np.zeros((3, 2), np.int64)
    run(comm, mode, "allreduce", send, recv)
    assert np.array_equal(recv, every(size, 6, np.int64).sum(axis=0).reshape(3, 2))
    assert np.array_equal(send, mine(rank, 6, np.int64).reshape(3, 2))  # send untouched


OPS = {
    "sum": lambda s: s.sum(axis=0),
    "prod": lambda s: s.prod(axis=0),
    "min": lambda s: s.min(axis=0),
    "max": lambda s: s.max(axis=0),
    "land": lambda s: np.logical_and.reduce(s != 0).astype(s.dtype),
    "lor": lambda s: np.logical_or.reduce(s != 0).astype(s.dtype),
    "lxor": lambda s: np.logical_xor.reduce(s != 0).astype(s.dtype),
    "band": lambda s: np.bitwise_and.reduce(s),
    "bor": lambda s: np.bitwise_or.reduce(s),
    "bxor": lambda s: np.bitwise_xor.reduce(s),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_allreduce_every_op(comm, rank, size, mode, op):
    def contrib(r):
        # small ints with zeros and distinct bits: every op has a non-trivial result
        return np.array([(r * 5 + i * 3) % 7 for i in range(8)], np.int32) - (r == 1) * 2

    buf = contrib(rank)
    name = op.upper() if mode == "test" else op  # names in any case
    run(comm, mode, "allreduce", buf, op=name)
    # MPI applies the op between contributions: one rank's is the result as it is
    want = OPS[op](np.stack([contrib(r) for r in range(size)])) if size > 1 else contrib(0)
    assert np.array_equal(buf, want)


def test_allreduce_mpi4py_op(comm, rank, size, mode):
    buf = np.array([rank, -rank, 3], np.float64)
    run(comm, mode, "allreduce", buf, op=MPI.MIN)
    assert np.array_equal(buf, [0, -(size - 1), 3])


def test_allreduce_list_in_place_and_into(comm, rank, size, mode):
    dtypes = [np.float32, np.float64, np.int32, np.float32, np.uint8]
    sends = [mine(rank, 3 + k, dt, salt=k) % 200 for k, dt in enumerate(dtypes)]
    sends[2] = sends[2].reshape(1, 5)
    recvs = [np.zeros_like(s) for s in sends]
    run(comm, mode, "allreduce", sends, recvs)
    for k, dt in enumerate(dtypes):
        want = (every(size, 3 + k, dt, salt=k) % 200).sum(axis=0).astype(dt)
        assert np.array_equal(recvs[k].ravel(), want)
    run(comm, mode, "allreduce", sends, op="max")  # in place
    for k, dt in enumerate(dtypes):
        assert np.array_equal(sends[k].ravel(), (every(size, 3 + k, dt, salt=k) % 200).max(axis=0))


def test_gather(comm, rank, size, mode):
    root = last(size)
    recv = np.full((size, 3), -1, np.int16) if rank == root else None
    run(comm, mode, "gather", mine(rank, 3, np.int16), recv, root=root)
    if rank == root:
        assert np.array_equal(recv, every(size, 3, np.int16))


def test_gatherv(comm, rank, size, mode):
    root = 0
    counts = [r + 1 for r in range(size)]
    displs = [sum(counts[:r]) + 2 * r for r in range(size)]  # a gap of 2 after each block
    recv = np.full(sum(counts) + 2 * size, -1.0) if rank == root else None
    run(comm, mode, "gatherv", mine(rank, rank + 1), recv,
        counts=counts if rank == root else None, displs=displs if rank == root else None,
        root=root)
    if rank == root:
        want = np.full_like(recv, -1.0)
        for r in range(size):
            want[displs[r]:displs[r] + counts[r]] = mine(r, counts[r])
        assert np.array_equal(recv, want)


def test_gatherv_packed(comm, rank, size, mode):
    counts = [2 * r for r in range(size)]  # rank 0 sends nothing
    recv = np.zeros(sum(counts), np.int64) if rank == 0 else None
    run(comm, mode, "gatherv", mine(rank, 2 * rank, np.int64), recv,
        counts=counts if rank == 0 else None)
    if rank == 0:
        assert np.array_equal(recv, np.concatenate([mine(r, 2 * r, np.int64) for r in range(size)]))


def test_scatter(comm, rank, size, mode):
    root = last(size)
    send = np.arange(4 * size, dtype=np.float32).reshape(size, 4) * 3 if rank == root else None
    recv = np.zeros(4, np.float32)
    run(comm, mode, "scatter", send, recv, root=root)
    assert np.array_equal(recv, np.arange(4 * rank, 4 * rank + 4, dtype=np.float32) * 3)


def test_scatterv(comm, rank, size, mode):
    counts = [size - r for r in range(size)]
    displs = [3 * r for r in range(size)]  # overlapping reads are allowed in a scatter
    send = np.arange(3 * size + size, dtype=np.int32) * 7 if rank == 0 else None
    recv = np.full(size - rank, -1, np.int32)
    run(comm, mode, "scatterv", send, recv, counts=counts if rank == 0 else None,
        displs=displs if rank == 0 else None, root=0)
    assert np.array_equal(recv, np.arange(3 * rank, 3 * rank + size - rank, dtype=np.int32) * 7)


def test_allgather(comm, rank, size, mode):
    recv = np.zeros((size, 2, 2), np.complex64)
    run(comm, mode, "allgather", mine(rank, 4, np.complex64).reshape(2, 2), recv)
    assert np.array_equal(recv, every(size, 4, np.complex64).reshape(size, 2, 2))


def test_allgatherv(comm, rank, size, mode):
    counts = [(r % 3) + 1 for r in range(size)]
    recv = np.full(sum(counts), -1.0)
    run(comm, mode, "allgatherv", mine(rank, counts[rank]), recv, counts)
    assert np.array_equal(recv, np.concatenate([mine(r, counts[r]) for r in range(size)]))


def test_allgatherv_displs(comm, rank, size, mode):
    counts = [2] * size
    displs = [4 * (size - 1 - r) for r in range(size)]  # reversed, with gaps
    recv = np.full(4 * size, -1, np.int32)
    run(comm, mode, "allgatherv", mine(rank, 2, np.int32), recv, counts, displs)
    want = np.full(4 * size, -1, np.int32)
    for r in range(size):
        want[displs[r]:displs[r] + 2] = mine(r, 2, np.int32)
    assert np.array_equal(recv, want)


def block(src, dst, n, dtype=np.int64):
    """What rank src sends rank dst in the all-to-alls."""
    return (np.arange(n) + 100 * src + 10 * dst).astype(dtype)


def test_alltoall(comm, rank, size, mode):
    send = np.stack([block(rank, j, 3) for j in range(size)])
    recv = np.zeros((size, 3), np.int64)
    run(comm, mode, "alltoall", send, recv)
    assert np.array_equal(recv, np.stack([block(i, rank, 3) for i in range(size)]))


def test_alltoallv(comm, rank, size, mode):
    sendcounts = [rank + j + 1 for j in range(size)]
    recvcounts = [i + rank + 1 for i in range(size)]
    send = np.concatenate([block(rank, j, sendcounts[j], np.float64) for j in range(size)])
    recv = np.full(sum(recvcounts), -1.0)
    run(comm, mode, "alltoallv", send, sendcounts, recv, recvcounts)
    want = np.concatenate([block(i, rank, recvcounts[i], np.float64) for i in range(size)])
    assert np.array_equal(recv, want)


def test_alltoallv_displs(comm, rank, size, mode):
    # blocks of 2, sent from the end of the send array backwards, received with gaps of 1
    sendcounts = recvcounts = [2] * size
    sdispls = [2 * (size - 1 - j) for j in range(size)]
    rdispls = [3 * i for i in range(size)]
    send = np.zeros(2 * size, np.int32)
    for j in range(size):
        send[sdispls[j]:sdispls[j] + 2] = block(rank, j, 2, np.int32)
    recv = np.full(3 * size, -1, np.int32)
    run(comm, mode, "alltoallv", send, sendcounts, recv, recvcounts, sdispls, rdispls)
    want = np.full(3 * size, -1, np.int32)
    for i in range(size):
        want[3 * i:3 * i + 2] = block(i, rank, 2, np.int32)
    assert np.array_equal(recv, want)


def test_reduce_scatter_block(comm, rank, size, mode):
    k = 3
    send = mine(rank, size * k, np.int32)
    recv = np.zeros(k, np.int32)
    run(comm, mode, "reduce_scatter_block", send, recv)
    want = every(size, size * k, np.int32).sum(axis=0)[rank * k:(rank + 1) * k]
    assert np.array_equal(recv, want)


def test_reduce_scatter_block_list(comm, rank, size, mode):
    sends = [mine(rank, size * 2, np.float64), mine(rank, size * 3, np.float32, salt=5)]
    recvs = [np.zeros(2), np.zeros(3, np.float32)]
    run(comm, mode, "reduce_scatter_block", sends, recvs, op="min")
    assert np.array_equal(recvs[0], every(size, size * 2).min(axis=0)[2 * rank:2 * rank + 2])
    want = every(size, size * 3, np.float32, salt=5).min(axis=0)[3 * rank:3 * rank + 3]
    assert np.array_equal(recvs[1], want)


def test_strided_collectives(comm, rank, size, mode):
    """Strided views in collectives: in place through a step-2 view (its gaps untouched), a
    transposed send into a step-2 receive view, a broadcast into a transposed view, and a
    reduce-scatter from a reversed view."""
    base = np.full(16, -7.0)
    view = base[::2]
    view[:] = mine(rank, 8)
    run(comm, mode, "allreduce", view)

    t = mine(rank, 6).reshape(2, 3).T  # 3 x 2, strides (8, 24)
    holder = np.full(2 * 6 * size, -1.0)
    gathered = holder[::2].reshape(size, 3, 2)  # a strided view of holder
    run(comm, mode, "allgather", t, gathered)

    target = np.zeros((3, 2), np.float32)
    if rank == 0:
        target.T[:] = mine(0, 6, np.float32).reshape(2, 3)
    run(comm, mode, "bcast", target.T, root=0)

    rs_send = mine(rank, 2 * size, np.int64)[::-1]
    rs_recv = np.zeros(2, np.int64)
    run(comm, mode, "reduce_scatter_block", rs_send, rs_recv)

    assert np.array_equal(base[::2], every(size, 8).sum(axis=0))
    assert np.all(base[1::2] == -7.0)
    want = np.stack([mine(r, 6).reshape(2, 3).T for r in range(size)])
    assert np.array_equal(gathered, want)
    assert np.all(holder[1::2] == -1.0)
    assert np.array_equal(target.T, mine(0, 6, np.float32).reshape(2, 3))
    total = every(size, 2 * size, np.int64).sum(axis=0)[::-1]
    assert np.array_equal(rs_recv, total[2 * rank:2 * rank + 2])
