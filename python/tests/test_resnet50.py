"""The fused all-reduce of ResNet-50's gradients (benches/data/gradients-resnet50.txt: 161
float32 tensors, 25 557 032 elements, about 102 MB a rank), blocking in place and
nonblocking into a second list, every element of every tensor checked.

Rank r's tensor t holds (base_t + 1) * (r + 1) with base_t = (i + 7 t) mod 1021 over its
elements i: the sum over the ranks, (base_t + 1) * n (n + 1) / 2, is exact in float32 and
differs for a missing, doubled or misplaced rank, tensor or element."""

import os

import numpy as np
import pytest

from helpers import Settings

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "benches", "data",
                    "gradients-resnet50.txt")


def shapes():
    """The file's shapes: `#` lines are comments, then one tensor a line (name, then its
    dimensions)."""
    out = []
    with open(DATA) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, *dims = line.split()
            out.append((name, tuple(int(d) for d in dims)))
    return out


SHAPES = shapes()


def base(t, shape):
    n = int(np.prod(shape))
    return ((np.arange(n, dtype=np.int64) + 7 * t) % 1021 + 1).astype(np.float32).reshape(shape)


def test_the_file():
    assert len(SHAPES) == 161
    assert sum(int(np.prod(s)) for _, s in SHAPES) == 25_557_032
    assert SHAPES[0] == ("conv1.weight", (64, 3, 7, 7))
    assert SHAPES[-1][1] == (1000,)


@pytest.mark.parametrize("mode", ["blocking", "nonblocking"])
def test_resnet50_fused_allreduce(comm, rank, size, mode):
    grads = [base(t, s) * (rank + 1) for t, (_, s) in enumerate(SHAPES)]
    factor = np.float32(size * (size + 1) // 2)
    if mode == "blocking":
        comm.allreduce(grads)  # in place
        out = grads
    else:
        out = [np.empty_like(g) for g in grads]
        req = comm.iallreduce(grads, out)
        assert not req.done
        req.wait()
    bad = [name for t, ((name, s), g) in enumerate(zip(SHAPES, out))
           if g.shape != s or not np.array_equal(g, base(t, s) * factor)]
    assert bad == []
    if mode == "nonblocking":  # the send list is as it was
        assert all(np.array_equal(g, base(t, s) * (rank + 1))
                   for t, ((_, s), g) in enumerate(zip(SHAPES, grads)))


def test_resnet50_small_buckets(comm, rank, size):
    """The first 20 tensors in buckets of 64 KiB (many messages), nonblocking."""
    with Settings(bucket_bytes=1 << 16, first_bucket_bytes=1 << 12):
        grads = [base(t, s) + rank for t, (_, s) in enumerate(SHAPES[:20])]
        comm.iallreduce(grads).wait()
    ranks = sum(range(size))
    assert all(np.array_equal(g, base(t, s) * size + ranks)
               for t, ((_, s), g) in enumerate(zip(SHAPES[:20], grads)))

