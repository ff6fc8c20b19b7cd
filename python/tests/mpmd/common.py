"""Values both sides of the MPMD interop job compute."""

import numpy as np


def mine(rank, n, salt=0):
    return (np.arange(n) * 3 + 100 * rank + salt).astype(np.float64)


def expected_sum(size, n):
    return sum(mine(r, n) for r in range(size))


def transposed(rank):
    """What dlpack_mpi rank `rank` sends: a transposed (strided) 4 x 3 view."""
    return (np.arange(12.0) + 10 * rank).reshape(3, 4).T
