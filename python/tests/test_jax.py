"""JAX arrays: a jax.Array is a send array everywhere (point-to-point, the root of a
broadcast, every collective's send side); as a receive array it is refused (JAX arrays are
immutable): Immutable on the ranks that pass one, PeerRefused on the others."""

import numpy as np
import pytest

import dlpack_mpi
from helpers import need, run


def mine(rank, n, salt=0):
    return (np.arange(n) * 3 + 100 * rank + salt).astype(np.float32)


@pytest.mark.parametrize("mode", ["blocking", "wait"])
def test_jax_send_side_of_every_collective(comm, rank, size, mode, jnp):
    j = jnp.asarray(mine(rank, 2 * size))
    every = np.stack([mine(r, 2 * size) for r in range(size)])
    red = np.zeros(2 * size, np.float32)
    run(comm, mode, "allreduce", j, red)
    gat = np.zeros((size, 2 * size), np.float32)
    run(comm, mode, "allgather", j, gat)
    a2a = np.zeros(2 * size, np.float32)
    run(comm, mode, "alltoall", j, a2a)
    rsb = np.zeros(2, np.float32)
    run(comm, mode, "reduce_scatter_block", j, rsb, op="max")
    root = size - 1
    g = np.zeros((size, 2 * size), np.float32) if rank == root else None
    run(comm, mode, "gather", j, g, root=root)
    r = np.zeros(2 * size, np.float32) if rank == 0 else None
    run(comm, mode, "reduce", j, r, op="min", root=0)
    # broadcast from a JAX root: read only there
    b = jnp.asarray(mine(root, 5, salt=1)) if rank == root else np.zeros(5, np.float32)
    run(comm, mode, "bcast", b, root=root)
    sc = np.zeros(2, np.float32)
    run(comm, mode, "scatter", jnp.asarray(every[0]) if rank == 0 else None, sc, root=0)

    assert np.array_equal(red, every.sum(axis=0))
    assert np.array_equal(gat, every)
    assert np.array_equal(a2a, every[:, 2 * rank:2 * rank + 2].ravel())
    assert np.array_equal(rsb, every.max(axis=0)[2 * rank:2 * rank + 2])
    if rank == root:
        assert np.array_equal(g, every)
    if rank == 0:
        assert np.array_equal(r, every.min(axis=0))
    assert np.array_equal(np.asarray(b), mine(root, 5, salt=1))
    assert np.array_equal(sc, every[0][2 * rank:2 * rank + 2])
    assert np.array_equal(np.asarray(j), mine(rank, 2 * size))  # unchanged


def test_jax_point_to_point(comm, rank, size, jnp):
    dest, source = (rank + 1) % size, (rank - 1) % size
    got = np.zeros((2, 3), np.int32)
    req = comm.isend(jnp.arange(6, dtype=jnp.int32).reshape(2, 3) + rank, dest, tag=4)
    comm.recv(got, source, tag=4)
    req.wait()
    got2 = np.zeros(4, np.float32)
    comm.sendrecv(jnp.asarray(mine(rank, 4)), dest, got2, source)
    assert np.array_equal(got, np.arange(6).reshape(2, 3) + source)
    assert np.array_equal(got2, mine(source, 4))


def test_jax_receive_refused_point_to_point(comm, rank, size, jnp):
    """Refused before the message is matched: it is still there for the next receive."""
    need(2)
    if rank == 0:
        comm.send(mine(0, 3), 1, tag=9)
    elif rank == 1:
        with pytest.raises(dlpack_mpi.Immutable):
            comm.recv(jnp.zeros(3, jnp.float32), 0, tag=9)
        with pytest.raises(dlpack_mpi.Immutable):
            comm.irecv(jnp.zeros(3, jnp.float32), 0, tag=9)
        got = np.zeros(3, np.float32)
        comm.recv(got, 0, tag=9)
        assert np.array_equal(got, mine(0, 3))


@pytest.mark.parametrize("mode", ["blocking", "wait", "waitall"])
@pytest.mark.parametrize("op", ["allreduce", "allgather", "bcast", "gather", "alltoall",
                                "reduce_scatter_block"])
def test_jax_receive_refused_in_collectives(comm, rank, size, mode, op, jnp):
    """One rank (the last) passes a JAX receive array: Immutable there, PeerRefused on the
    others; nothing is received anywhere, and the communicator works afterwards."""
    need(2)
    odd = size - 1
    n = 2 * size

    def recv(shape_n, fill=-1.0):
        if rank == odd:
            return jnp.full(shape_n, fill, jnp.float32)
        return np.full(shape_n, fill, np.float32)

    send = mine(rank, n)
    if op == "allreduce":
        r = recv(n)
        call = lambda: run(comm, mode, "allreduce", send, r)  # noqa: E731
    elif op == "allgather":
        r = recv(n * size)
        call = lambda: run(comm, mode, "allgather", send, r)  # noqa: E731
    elif op == "bcast":
        r = recv(n)  # the root is rank 0: the last rank receives
        call = lambda: run(comm, mode, "bcast", r, root=0)  # noqa: E731
    elif op == "gather":
        r = recv(n * size)
        call = lambda: run(comm, mode, "gather", send, r, root=odd)  # noqa: E731
    elif op == "alltoall":
        r = recv(n)
        call = lambda: run(comm, mode, "alltoall", send, r)  # noqa: E731
    else:
        r = recv(2)
        call = lambda: run(comm, mode, "reduce_scatter_block", send, r)  # noqa: E731
    expected = dlpack_mpi.Immutable if rank == odd else dlpack_mpi.PeerRefused
    with pytest.raises(expected) as info:
        call()
    after = np.array([1.0])
    comm.allreduce(after)
    if rank != odd:
        assert f"rank {odd} refused" in str(info.value) and "immutable" in str(info.value)
        assert np.all(np.asarray(r) == -1.0)
    assert after[0] == size


def test_jax_in_place_refused_on_every_rank(comm, rank, size, jnp):
    """Every rank passes a JAX array in place: each raises its own Immutable (a list's
    member: Member naming it); never a hang."""
    with pytest.raises(dlpack_mpi.Immutable):
        comm.allreduce(jnp.ones(4, jnp.float32))
    with pytest.raises(dlpack_mpi.Immutable):
        comm.iallreduce(jnp.ones(4, jnp.float32)).wait()
    with pytest.raises(dlpack_mpi.Member) as info:
        comm.iallreduce([np.ones(2), jnp.ones(2, jnp.float32)]).wait()
    assert "member 1" in str(info.value) and "immutable" in str(info.value)
    after = np.array([2])
    comm.allreduce(after)
    assert after[0] == 2 * size
