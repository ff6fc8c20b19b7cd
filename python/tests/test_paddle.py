"""Paddle tensors: writable, so send and receive arrays alike; strided views (a transposed
tensor, a step slice) exported as such and sent in logical order."""

import numpy as np
import pytest

from helpers import MODES, need, run


def mine(rank, n, dtype=np.float64, salt=0):
    return (np.arange(n) * 7 + 100 * rank + salt).astype(dtype)


@pytest.mark.parametrize("mode", MODES)
def test_paddle_collectives(comm, rank, size, mode, paddle):
    every = np.stack([mine(r, 3 * size) for r in range(size)])
    inplace = paddle.to_tensor(mine(rank, 3 * size))
    run(comm, mode, "allreduce", inplace)
    into = paddle.zeros([3 * size], dtype="float64")
    run(comm, mode, "allreduce", paddle.to_tensor(mine(rank, 3 * size)), into, op="max")
    b = paddle.to_tensor(mine(0, 4, np.int64)) if rank == 0 else paddle.zeros([4], "int64")
    run(comm, mode, "bcast", b)
    g = paddle.zeros([size, 3 * size], dtype="float64")
    run(comm, mode, "allgather", paddle.to_tensor(mine(rank, 3 * size)), g)
    rs = paddle.zeros([3], dtype="float64")
    run(comm, mode, "reduce_scatter_block", paddle.to_tensor(mine(rank, 3 * size)), rs)
    lst = [paddle.to_tensor(mine(rank, 2, np.float32)), paddle.to_tensor(mine(rank, 3, np.int32))]
    run(comm, mode, "allreduce", lst)

    assert np.array_equal(inplace.numpy(), every.sum(axis=0))
    assert np.array_equal(into.numpy(), every.max(axis=0))
    assert np.array_equal(b.numpy(), mine(0, 4, np.int64))
    assert np.array_equal(g.numpy(), every)
    assert np.array_equal(rs.numpy(), every.sum(axis=0)[3 * rank:3 * rank + 3])
    assert np.array_equal(lst[0].numpy(), sum(mine(r, 2, np.float32) for r in range(size)))
    assert np.array_equal(lst[1].numpy(), sum(mine(r, 3, np.int32) for r in range(size)))


def test_paddle_point_to_point_strided(comm, rank, size, paddle):
    """A transposed Paddle tensor and a step slice, sent to a NumPy receive array and into
    a Paddle tensor."""
    need(2)
    if rank == 0:
        t = paddle.arange(12, dtype="float32").reshape([3, 4]).transpose([1, 0])
        assert not t.is_contiguous()
        comm.send(t, 1, tag=1)
        comm.send(paddle.arange(20, dtype="int64")[::2], 1, tag=2)
        back = paddle.zeros([4, 3], dtype="float32")
        comm.recv(back, 1, tag=3)
        assert np.array_equal(back.numpy(), np.arange(12.0).reshape(3, 4).T * 2)
    elif rank == 1:
        got = np.zeros((4, 3), np.float32)
        comm.recv(got, 0, tag=1)
        got2 = paddle.zeros([10], dtype="int64")
        comm.recv(got2, 0, tag=2)
        comm.send(paddle.to_tensor(got * 2), 0, tag=3)
        assert np.array_equal(got, np.arange(12.0).reshape(3, 4).T)
        assert np.array_equal(got2.numpy(), np.arange(0, 20, 2))


def test_paddle_strided_in_place(comm, rank, size, paddle):
    base = paddle.full([4, 6], -1.0, dtype="float64")
    view = base.transpose([1, 0])[::2]  # 3 x 4: transposed, then every other row
    if not hasattr(view, "is_contiguous") or view.is_contiguous():
        pytest.skip("this Paddle copies strided views")
    contrib = np.arange(12.0).reshape(3, 4) + rank
    # write through the view (Paddle: set_value on the strided tensor)
    view[:] = paddle.to_tensor(contrib)
    comm.allreduce(view)
    want = np.full((4, 6), -1.0)
    want.T[::2] = size * np.arange(12.0).reshape(3, 4) + sum(range(size))
    assert np.array_equal(base.numpy(), want)
