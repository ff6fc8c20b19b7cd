"""The mpi4py side of tests/mpi4py_interop.rs: one MPMD job, this script as rank 0 and
dlpack-mpi ranks after it,

    mpirun -n 1 python3 tests/python/mpi4py_peer.py : -n 1 target/debug/deps/mpi4py_interop-*

For every dtype NumPy exports, in the same order as the Rust side: point-to-point both
ways, broadcast from either side, all-reduce (sum; logical or for bool; float16 through a
user-defined operation on its 16-bit pattern, as dlpack-mpi does) and all-gatherv with
counts 1..P. Each side checks exactly what it received against values both compute with
the formula of producers.make. Exits 1 if any check failed on any rank.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from producers import DTYPES, expected_sum, make  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert rank == 0, "the mpi4py peer must be rank 0 (list it first in the MPMD command)"
failures = 0
checks = 0


def check(what, got, want):
    global failures, checks
    checks += 1
    if got.shape != want.shape or not np.array_equal(got, want):
        failures += 1
        print(f"FAIL {what}: got {got!r}, want {want!r}", flush=True)


class DLPackOnly:
    """Hides the buffer protocol so that mpi4py takes its DLPack path (asdlpack)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def msg(array):
    """mpi4py message for an array; float16 goes as its bits (MPI has no half type in Open
    MPI 4.1, and dlpack-mpi sends float16 as MPI_UINT16_T)."""
    if array.dtype == np.float16:
        return [array.view(np.uint16), MPI.UINT16_T]
    return array


def f16_sum(inbuf, inoutbuf, datatype):
    a = np.frombuffer(inbuf, dtype=np.float16)
    b = np.frombuffer(inoutbuf, dtype=np.float16)
    b[:] = (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16)


F16_SUM = MPI.Op.Create(f16_sum, commute=True)
# mpi4py's DLPack import (asdlpack) accepts these as message buffers.
DLPACK_PATH = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float32", "float64", "complex64", "complex128", "bool"}

for dt in DTYPES:
    n = 5
    # point-to-point: rank 0 -> every dlpack-mpi rank, then back
    for r in range(1, size):
        mine = make(dt, (n,), 0)
        comm.Send(msg(mine), dest=r, tag=1)
    for r in range(1, size):
        got = np.zeros(n, dtype=dt)
        comm.Recv(msg(got), source=r, tag=2)
        check(f"recv {dt} from rank {r}", got, make(dt, (n,), r))
    # the same through mpi4py's DLPack path (send side), where it takes the dtype
    if dt in DLPACK_PATH:
        for r in range(1, size):
            comm.Send(DLPackOnly(make(dt, (n,), 0)), dest=r, tag=3)
    # broadcast from mpi4py, then from the last dlpack-mpi rank
    b = make(dt, (2, 3), 0)
    comm.Bcast(msg(b), root=0)
    b = np.zeros((2, 3), dtype=dt)
    comm.Bcast(msg(b), root=size - 1)
    check(f"bcast {dt} from rank {size - 1}", b, make(dt, (2, 3), size - 1))
    # all-reduce
    m = make(dt, (7,), 0)
    out = np.zeros(7, dtype=dt)
    if dt == "bool":
        comm.Allreduce(msg(m), msg(out), op=MPI.LOR)
        want = np.logical_or.reduce([make(dt, (7,), r) for r in range(size)])
    elif dt == "float16":
        comm.Allreduce(msg(m), msg(out), op=F16_SUM)
        want = expected_sum(dt, (7,), size)
    else:
        comm.Allreduce(msg(m), msg(out), op=MPI.SUM)
        want = expected_sum(dt, (7,), size)
    check(f"allreduce {dt}", out, want)
    # all-gatherv with counts 1..P
    counts = [r + 1 for r in range(size)]
    displs = [sum(counts[:r]) for r in range(size)]
    g = make(dt, (1,), 0)
    everything = np.zeros(sum(counts), dtype=dt)
    if dt == "float16":
        comm.Allgatherv([g.view(np.uint16), MPI.UINT16_T],
                        [everything.view(np.uint16), counts, displs, MPI.UINT16_T])
    else:
        comm.Allgatherv(g, [everything, (counts, displs)])
    check(f"allgatherv {dt}", everything,
          np.concatenate([make(dt, (r + 1,), r) for r in range(size)]))

# Strided dlpack-mpi tensors on the wire (the Rust side runs this under the packing
# policies auto, copy and derived in turn, each with the blocking and then the nonblocking
# operations): a Fortran-order 3 x 4 and a transposed 4 x 5 float32 tensor arrive as their
# elements in logical row-major order, and contiguous messages from here land in such
# tensors element by element.
for policy in (f"{p}, {form}" for p in ("auto", "copy", "derived")
               for form in ("blocking", "nonblocking")):
    for r in range(1, size):
        got = np.zeros((3, 4), dtype=np.float32)
        comm.Recv(got, source=r, tag=10)
        check(f"recv Fortran-order 3x4 from rank {r} ({policy})", got,
              np.arange(12, dtype=np.float32).reshape(4, 3).T + 100 * r)
        got = np.zeros((5, 4), dtype=np.float32)
        comm.Recv(got, source=r, tag=11)
        check(f"recv transposed 5x4 from rank {r} ({policy})", got,
              np.arange(20, dtype=np.float32).reshape(4, 5).T + 100 * r)
        comm.Send(np.arange(12, dtype=np.float32).reshape(3, 4), dest=r, tag=12)
        comm.Send(np.arange(20, dtype=np.float32).reshape(5, 4), dest=r, tag=13)

F16_SUM.Free()
# Buffer form (the Rust side sums one u64): the lowercase, pickle-based allreduce would
# not match it.
total_buf = np.zeros(1, dtype=np.uint64)
comm.Allreduce(np.array([failures], dtype=np.uint64), total_buf, op=MPI.SUM)
total = int(total_buf[0])
print(f"mpi4py peer ({MPI.Get_library_version().splitlines()[0].strip()}, mpi4py "
      f"{__import__('mpi4py').__version__}): {checks - failures} checks passed, {failures} failed; "
      f"{total} failed on all ranks", flush=True)
sys.exit(1 if total else 0)
