"""Point-to-point: send/recv, sendrecv, isend/irecv; Status; Unfit and its held message;
strided views as one message in logical order, against mpi4py's own Send/Recv too."""

import numpy as np
import pytest
from mpi4py import MPI

import dlpack_mpi
from helpers import WORLD, Settings, complete, need


def values(src, n, dtype=np.float64, salt=0):
    """What rank `src` sends: n elements, distinct per rank and salt."""
    return (np.arange(n) * 3 + 1000 * src + salt).astype(dtype)


def partner(rank, size):
    """Pairs (0, 1), (2, 3), …; None for the last rank of an odd size."""
    p = rank ^ 1
    return p if p < size else None


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint8, np.complex64, np.bool_])
def test_send_recv_pairs(comm, rank, size, dtype):
    need(2)
    p = partner(rank, size)
    got = np.zeros(7, dtype)
    status = None
    if p is not None:
        if rank % 2 == 0:
            comm.send(values(rank, 7, dtype), p, tag=11)
            status = comm.recv(got, p, tag=12)
        else:
            status = comm.recv(got, p, tag=11)
            comm.send(values(rank, 7, dtype), p, tag=12)
    if p is not None:
        assert np.array_equal(got, values(p, 7, dtype))
        assert isinstance(status, dlpack_mpi.Status)
        assert (status.source, status.tag, status.count) == (p, 12 if rank % 2 == 0 else 11, 7)
        assert repr(status) == f"Status(source={p}, tag={status.tag}, count=7)"


def test_recv_default_tag_and_2d(comm, rank, size):
    need(2)
    if rank == 0:
        comm.send(values(0, 12).reshape(3, 4), 1)
    elif rank == 1:
        got = np.zeros((3, 4))
        status = comm.recv(got, 0)
        assert status.tag == 0 and status.count == 12
        assert np.array_equal(got, values(0, 12).reshape(3, 4))


@pytest.mark.parametrize("how", ["wait", "test", "waitall"])
def test_isend_irecv_ring(comm, rank, size, how):
    # Runs at every size: at 1 rank a rank sends to itself.
    dest, source = (rank + 1) % size, (rank - 1) % size
    got = np.full(9, -1, np.int64)
    rreq = comm.irecv(got, source, tag=21)
    sreq = comm.isend(values(rank, 9, np.int64), dest, tag=21)
    assert repr(sreq) in ("<dlpack_mpi.Request isend pending>", "<dlpack_mpi.Request isend done>")
    assert complete(sreq, how) is None
    status = complete(rreq, how)
    assert np.array_equal(got, values(source, 9, np.int64))
    assert (status.source, status.tag, status.count) == (source, 21, 9)
    assert repr(rreq) == "<dlpack_mpi.Request irecv done>"
    again = rreq.wait()  # waiting again returns the same status
    assert (again.source, again.tag, again.count) == (source, 21, 9)


def test_irecv_pending_until_sent(comm, rank, size):
    # A receive from this rank itself stays pending until this rank sends.
    got = np.zeros(4, np.float32)
    req = comm.irecv(got, rank, tag=31)
    assert req.test() is False
    assert not req.done
    assert "pending" in repr(req)
    comm.send(np.arange(4, dtype=np.float32) + rank, rank, tag=31)  # its receive is posted
    status = req.wait()
    assert np.array_equal(got, np.arange(4, dtype=np.float32) + rank)
    assert status.source == rank and status.tag == 31


def test_sendrecv_ring(comm, rank, size):
    dest, source = (rank + 1) % size, (rank - 1) % size
    got = np.zeros((2, 5), np.float32)
    status = comm.sendrecv(values(rank, 10, np.float32).reshape(2, 5), dest, got, source,
                           sendtag=40 + rank, recvtag=40 + source)
    assert np.array_equal(got, values(source, 10, np.float32).reshape(2, 5))
    assert (status.source, status.tag, status.count) == (source, 40 + source, 10)


def test_many_requests_waitall(comm, rank, size):
    """isend/irecv to every rank at once, completed by one waitall, in any order."""
    recvs = [np.zeros(3, np.int32) for _ in range(size)]
    reqs = [comm.irecv(recvs[src], src, tag=50) for src in range(size)]
    reqs += [comm.isend(np.array([rank, dst, 7], np.int32), dst, tag=50) for dst in range(size)]
    out = dlpack_mpi.waitall(reqs[::-1])
    assert out[:size] == [None] * size
    statuses = out[size:][::-1]
    for src in range(size):
        assert np.array_equal(recvs[src], [src, rank, 7])
        assert statuses[src].source == src and statuses[src].count == 3
    assert all(r.done for r in reqs)


@pytest.mark.parametrize("packing", ["auto", "copy", "derived"])
def test_strided_views_as_one_message(comm, rank, size, packing):
    """A transposed array and a step-2 slice travel as one message each, in logical order:
    received into a contiguous array, into strided views (whose gaps stay as they were), and
    by mpi4py's plain Recv of a contiguous buffer."""
    need(2)
    t = np.arange(12.0).reshape(3, 4).T  # 4 x 3, strides (8, 32)
    s = (np.arange(40, dtype=np.int32) * 5)[::2]  # 20 elements, stride 8 bytes
    with Settings(packing=packing):
        if rank == 0:
            for tag in (1, 2, 3):
                comm.send(t, 1, tag=tag)
                comm.send(s, 1, tag=10 + tag)
            # and into dlpack_mpi's strided receive from mpi4py's contiguous Send
            WORLD.Send(np.ascontiguousarray(t), 1, tag=4)
        elif rank == 1:
            a = np.zeros((4, 3))
            comm.recv(a, 0, tag=1)
            b = np.zeros(20, np.int32)
            comm.recv(b, 0, tag=11)
            # strided receive views: a transposed one and a step-2 one
            big = np.full((3, 4), -1.0)
            st = comm.recv(big.T, 0, tag=2)
            holes = np.full(40, -9, np.int32)
            comm.recv(holes[::2], 0, tag=12)
            # mpi4py's plain Recv of contiguous buffers
            c = np.zeros(12)
            WORLD.Recv([c, MPI.DOUBLE], source=0, tag=3)
            d = np.zeros(20, np.int32)
            WORLD.Recv([d, MPI.INT32_T], source=0, tag=13)
            e = np.full((3, 4), -1.0)
            comm.recv(e.T, 0, tag=4)

            assert np.array_equal(a, t)
            assert np.array_equal(b, s)
            assert np.array_equal(big.T, t) and np.array_equal(big, np.arange(12.0).reshape(3, 4))
            assert st.count == 12
            assert np.array_equal(holes[::2], s) and np.all(holes[1::2] == -9)
            assert np.array_equal(c, t.ravel())  # logical (row-major) order
            assert np.array_equal(d, s)
            assert np.array_equal(e, np.arange(12.0).reshape(3, 4))


def test_negative_stride_and_offset_views(comm, rank, size):
    need(2)
    base = np.arange(30, dtype=np.float32).reshape(5, 6)
    view = base[::-2, 1:5:3]  # rows 4, 2, 0; columns 1, 4: negative and step strides
    if rank == 0:
        comm.send(view, 1, tag=60)
    elif rank == 1:
        got = np.zeros((3, 2), np.float32)
        comm.recv(got, 0, tag=60)
        assert np.array_equal(got, [[25, 28], [13, 16], [1, 4]])


def test_unfit_too_small_then_recv_into(comm, rank, size):
    need(2)
    if rank == 0:
        comm.send(values(0, 8), 1, tag=70)
        comm.send(values(0, 3, salt=1), 1, tag=71)
        comm.send(values(0, 5, salt=2), 1, tag=72)
    elif rank == 1:
        small = np.zeros(4)
        with pytest.raises(dlpack_mpi.Unfit) as info:
            comm.recv(small, 0, tag=70)
        e = info.value
        assert isinstance(e, dlpack_mpi.Error)
        m = e.message
        assert isinstance(m, dlpack_mpi.Unreceived)
        assert (m.nbytes, m.source, m.tag, m.held) == (64, 0, 70, True)
        assert "expected 4 elements, got 8" in str(e)
        assert np.all(small == 0)  # nothing written
        # still too small: Unfit again, the message still held
        with pytest.raises(dlpack_mpi.Unfit):
            m.recv_into(np.zeros(7))
        assert m.held
        bigger = np.zeros(8)
        status = m.recv_into(bigger)
        assert np.array_equal(bigger, values(0, 8))
        assert (status.source, status.tag, status.count) == (0, 70, 8)
        assert not m.held and "received" in repr(m)
        with pytest.raises(dlpack_mpi.AlreadyReceived):
            m.recv_into(np.zeros(8))
        # too big is Unfit as well; a 2-D array of the message's bytes receives it
        with pytest.raises(dlpack_mpi.Unfit) as info:
            comm.recv(np.zeros(10), 0, tag=71)
        two_d = np.zeros((3, 1))
        info.value.message.recv_into(two_d)
        assert np.array_equal(two_d.ravel(), values(0, 3, salt=1))
        # the messages after it are unaffected
        last = np.zeros(5)
        comm.recv(last, 0, tag=72)
        assert np.array_equal(last, values(0, 5, salt=2))


def test_unfit_discard_and_drop(comm, rank, size):
    need(2)
    if rank == 0:
        for tag in (80, 81, 82):
            comm.send(values(0, 6, salt=tag), 1, tag=tag)
    elif rank == 1:
        with pytest.raises(dlpack_mpi.Unfit) as info:
            comm.recv(np.zeros(2), 0, tag=80)
        info.value.message.discard()
        assert not info.value.message.held
        # dropping the exception (the last reference) discards its message too
        try:
            comm.recv(np.zeros(2), 0, tag=81)
        except dlpack_mpi.Unfit:
            pass
        got = np.zeros(6)
        comm.recv(got, 0, tag=82)
        assert np.array_equal(got, values(0, 6, salt=82))
        # nothing of tags 80 and 81 is left to receive
        assert not WORLD.Iprobe(source=0, tag=80) and not WORLD.Iprobe(source=0, tag=81)


@pytest.mark.parametrize("how", ["wait", "waitall"])
def test_irecv_shorter_message_count_mismatch(comm, rank, size, how):
    """irecv posts MPI_Irecv before the message's size is known: a shorter message is
    CountMismatch at completion (not Unfit: the message is received by then), and every
    request of a waitall is still completed."""
    need(2)
    if rank == 0:
        comm.send(values(0, 4), 1, tag=90)
        comm.send(values(0, 2), 1, tag=91)
    elif rank == 1:
        req = comm.irecv(np.zeros(5), 0, tag=90)
        good_buf = np.zeros(2)
        good = comm.irecv(good_buf, 0, tag=91)
        with pytest.raises(dlpack_mpi.CountMismatch) as info:
            if how == "wait":
                req.wait()
            else:
                dlpack_mpi.waitall([req, good])
        assert "nonblocking receive" in str(info.value)
        assert "expected 5 elements, got 4" in str(info.value)
        assert req.done
        good.wait()
        assert np.array_equal(good_buf, values(0, 2))


def test_mpi4py_send_dlpack_recv_and_back(comm, rank, size):
    """The same MPI_Comm: plain mpi4py Send matches dlpack_mpi's recv and vice versa."""
    need(2)
    if rank == 0:
        WORLD.Send(values(0, 5, np.int64), dest=1, tag=95)
        back = np.zeros(5, np.int64)
        WORLD.Recv(back, source=1, tag=96)
        assert np.array_equal(back, values(1, 5, np.int64))
    elif rank == 1:
        got = np.zeros(5, np.int64)
        comm.recv(got, 0, tag=95)
        comm.send(values(1, 5, np.int64), 0, tag=96)
        assert np.array_equal(got, values(0, 5, np.int64))


def test_send_argument_errors(comm, rank, size):
    with pytest.raises(dlpack_mpi.NotAProducer):
        comm.send([1.0, 2.0], rank)
    with pytest.raises(dlpack_mpi.InvalidRank):
        comm.send(np.zeros(2), size + 3)
    with pytest.raises(TypeError):
        comm.send(np.zeros(2))  # no dest
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(dlpack_mpi.ReadOnly):
        comm.recv(ro, rank, tag=99)


def test_wildcard_source_and_tag(comm, rank, size):
    """dlpack_mpi.ANY_SOURCE / ANY_TAG (mpi4py's MPI.ANY_SOURCE / MPI.ANY_TAG): rank 0 takes
    one message from every other rank in arrival order, each status naming its sender."""
    need(2)
    assert (dlpack_mpi.ANY_SOURCE, dlpack_mpi.ANY_TAG) == (MPI.ANY_SOURCE, MPI.ANY_TAG)
    if rank == 0:
        seen = []
        for _ in range(size - 1):
            got = np.zeros(5)
            st = comm.recv(got, dlpack_mpi.ANY_SOURCE, MPI.ANY_TAG)
            assert st.tag == 40 + st.source and np.array_equal(got, values(st.source, 5))
            seen.append(st.source)
        assert sorted(seen) == list(range(1, size))
    else:
        comm.send(values(rank, 5), 0, tag=40 + rank)
    # Nonblocking, in a ring; after a barrier, so that rank 0's wildcard receives above take
    # no ring message.
    comm.mpi4py.Barrier()
    dest, source = (rank + 1) % size, (rank - 1) % size
    got = np.zeros(5)
    rreq = comm.irecv(got, MPI.ANY_SOURCE, MPI.ANY_TAG)
    comm.isend(values(rank, 5, salt=1), dest, tag=41).wait()
    st = rreq.wait()
    assert (st.source, st.tag) == (source, 41) and np.array_equal(got, values(source, 5, salt=1))
    with pytest.raises(dlpack_mpi.InvalidRank):
        comm.recv(np.zeros(5), -5)
