"""float16 and bfloat16 sums, correctly rounded (to nearest, ties to even).

Ranks 0 and 1 contribute x0 and x1; every other rank contributes +0, so that whatever order
MPI reduces in, the one inexact step is x0 + x1 (adding +0 is exact). x0 and x1 are chosen
so that x0 + x1 is exact in float32: the correctly rounded half is then float32's sum
rounded once (NumPy's float32 -> float16 and ml_dtypes' float32 -> bfloat16 round to
nearest even). The data include ties of both parities and sums that truncation (or
rounding half away) would get wrong; the test checks that they do.

NumPy exports float16 through DLPack; bfloat16 comes from Paddle (writable: in place and as
a receive array) and JAX (a send array); NumPy arrays of ml_dtypes' bfloat16 do not export
(NumPy's __dlpack__ refuses them).
"""

import numpy as np
import pytest

from helpers import MODES, need, run

N = 256


def operands(fmt, ml_dtypes=None):
    """(x0, x1, expected) as float32 arrays whose values are representable in `fmt`."""
    rng = np.random.default_rng(2024)
    mant = 8 if fmt == "bfloat16" else 11  # significand bits, the implicit one included
    # x0 in [1, 4) with every significand bit used; x1 of exponents -mant..-mant+2 (from
    # half an ulp of x0 to a few ulps)
    x0 = (1 + rng.integers(0, 2 ** (mant - 1), N) / 2 ** (mant - 1)) * 2.0 ** rng.integers(0, 2, N)
    e1 = rng.integers(-mant, -mant + 3, N)
    x1 = (1 + rng.integers(0, 2 ** (mant - 1), N) / 2 ** (mant - 1)) * 2.0 ** e1
    x1 *= np.where(rng.random(N) < 0.3, -1, 1)
    # explicit ties: 1 + half an ulp (to even: down) and 1 + ulp + half an ulp (up)
    ulp = 2.0 ** -(mant - 1)
    x0[:4] = [1.0, 1.0 + ulp, 2.0, 3.0]
    x1[:4] = [ulp / 2, ulp / 2, ulp, -ulp / 2]
    x0, x1 = x0.astype(np.float32), x1.astype(np.float32)
    exact = x0 + x1  # exact in float32 (at most 23 significant bits)
    assert np.array_equal(exact.astype(np.float64), x0.astype(np.float64) + x1)
    if fmt == "float16":
        rounded = exact.astype(np.float16).astype(np.float32)
        for x in (x0, x1):
            assert np.array_equal(x.astype(np.float16).astype(np.float32), x)
    else:
        bf16 = ml_dtypes.bfloat16
        rounded = exact.astype(bf16).astype(np.float32)
        for x in (x0, x1):
            assert np.array_equal(x.astype(bf16).astype(np.float32), x)
    # the data tell correct rounding from truncation toward zero and from ties away
    bits = exact.view(np.uint32)
    drop = 23 - (mant - 1)
    truncated = (bits >> drop << drop).view(np.float32)
    assert np.count_nonzero(truncated != rounded) > N // 8
    assert rounded[0] == 1.0 and rounded[1] == 1.0 + 2 * ulp  # the ties went to even
    return x0, x1, rounded


def contribution(rank, x0, x1):
    if rank == 0:
        return x0
    if rank == 1:
        return x1
    return np.zeros_like(x0)  # +0


@pytest.mark.parametrize("mode", MODES)
def test_float16_sum_numpy(comm, rank, size, mode):
    need(2)
    x0, x1, want = operands("float16")
    buf = contribution(rank, x0, x1).astype(np.float16)
    run(comm, mode, "allreduce", buf)
    out = np.zeros(N, np.float16)
    run(comm, mode, "allreduce", contribution(rank, x0, x1).astype(np.float16), out)
    assert np.array_equal(buf.astype(np.float32), want)
    assert np.array_equal(out.astype(np.float32), want)


def test_float16_fused_and_reduce_scatter(comm, rank, size):
    need(2)
    x0, x1, want = operands("float16")
    mine = contribution(rank, x0, x1)
    lst = [mine[:100].astype(np.float16), mine[100:].astype(np.float32),
           mine[100:].astype(np.float16)]
    comm.allreduce(lst)
    k = N // size
    rs = np.zeros(k, np.float16)
    comm.reduce_scatter_block(mine[:k * size].astype(np.float16), rs)
    assert np.array_equal(lst[0].astype(np.float32), want[:100])
    assert np.array_equal(lst[1], x0[100:] + x1[100:])  # float32: exact
    assert np.array_equal(lst[2].astype(np.float32), want[100:])
    assert np.array_equal(rs.astype(np.float32), want[rank * k:(rank + 1) * k])


@pytest.mark.parametrize("mode", ["blocking", "wait"])
def test_bfloat16_sum_paddle_in_place(comm, rank, size, mode, paddle, ml_dtypes):
    need(2)
    x0, x1, want = operands("bfloat16", ml_dtypes)
    buf = paddle.to_tensor(contribution(rank, x0, x1)).astype("bfloat16")
    run(comm, mode, "allreduce", buf)
    assert str(buf.dtype).endswith("bfloat16")
    assert np.array_equal(buf.astype("float32").numpy(), want)


@pytest.mark.parametrize("mode", ["blocking", "wait"])
def test_bfloat16_sum_jax_into_paddle(comm, rank, size, mode, jnp, paddle, ml_dtypes):
    need(2)
    x0, x1, want = operands("bfloat16", ml_dtypes)
    send = jnp.asarray(contribution(rank, x0, x1).astype(ml_dtypes.bfloat16))
    assert send.dtype == jnp.bfloat16
    recv = paddle.zeros([N], dtype="bfloat16")
    run(comm, mode, "allreduce", send, recv)
    assert np.array_equal(recv.astype("float32").numpy(), want)
    # the send array is as it was
    assert np.array_equal(np.asarray(send).astype(np.float32), contribution(rank, x0, x1))


def test_bfloat16_max_min_and_fused(comm, rank, size, paddle, ml_dtypes):
    need(2)
    x0, x1, want = operands("bfloat16", ml_dtypes)
    mine = contribution(rank, x0, x1)
    hi = paddle.to_tensor(mine).astype("bfloat16")
    lo = paddle.to_tensor(mine).astype("bfloat16")
    comm.allreduce(hi, op="max")
    comm.allreduce(lo, op="min")
    fused = [paddle.to_tensor(mine[:50]).astype("bfloat16"),
             paddle.to_tensor(mine[50:]).astype("float32"),
             paddle.to_tensor(mine[50:]).astype("bfloat16")]
    comm.iallreduce(fused).wait()
    every = np.stack([contribution(r, x0, x1) for r in range(size)])
    assert np.array_equal(hi.astype("float32").numpy(), every.max(axis=0))
    assert np.array_equal(lo.astype("float32").numpy(), every.min(axis=0))
    assert np.array_equal(fused[0].astype("float32").numpy(), want[:50])
    assert np.array_equal(fused[1].numpy(), x0[50:] + x1[50:])
    assert np.array_equal(fused[2].astype("float32").numpy(), want[50:])
