"""Rank 0 of the MPMD interop job, plain mpi4py (no dlpack_mpi); the other ranks run
dlpack_rank.py (scripts/test.sh's `python` tier runs both modes):

    mpirun -n 1 python3 peer_mpi4py.py MODE : -n K python3 dlpack_rank.py MODE

MODE `local` (any K): the dlpack_mpi ranks configure(agreement="local"); point-to-point
both ways (a strided view from dlpack_mpi arrives here in logical order), an all-reduce
that every rank shares (mpi4py's Allreduce here, dlpack_mpi's allreduce there), a
broadcast from here into the dlpack_mpi ranks' strided views, and a nonblocking
all-reduce (Iallreduce here, iallreduce there).

MODE `collective` (K = 1 only): the dlpack_mpi rank keeps the default agreement, whose
all-reduce meets this rank's Allreduce: Open MPI 4.1 reports MPI_ERR_TRUNCATE on the
dlpack_mpi rank, which raises OutOfStep naming DLPACK_MPI_AGREEMENT; this rank's Allreduce
returns without an error and with wrong values (printed, not checked: MPI does not see
it). With K >= 2 under Open MPI 4.1.4 the last dlpack_mpi rank never returns from the
agreement's all-reduce (the job hangs), so that case is left out.

Exits 1 if a check failed."""

import sys

import numpy as np
from mpi4py import MPI

from common import expected_sum, mine, transposed

mode = sys.argv[1]
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
assert rank == 0, "the mpi4py peer must be rank 0 (first in the MPMD command)"
failures = []


def check(what, ok):
    if not ok:
        failures.append(what)
        print(f"rank 0 (mpi4py): FAIL {what}", flush=True)


if mode == "local":
    for r in range(1, size):
        comm.Send(mine(0, 6), dest=r, tag=1)
    for r in range(1, size):
        got = np.zeros(12)
        comm.Recv([got, MPI.DOUBLE], source=r, tag=2)
        check(f"strided view from rank {r} in logical order",
              np.array_equal(got, transposed(r).ravel()))
    # the same MPI_Comm, the same collective: mpi4py's Allreduce with dlpack_mpi's allreduce
    buf = mine(0, 5)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    check("allreduce", np.array_equal(buf, expected_sum(size, 5)))
    # and a broadcast from here into the dlpack_mpi ranks' strided views
    comm.Bcast(mine(0, 8, salt=3), root=0)
    # a nonblocking all-reduce (matches only nonblocking ones: dlpack_mpi's iallreduce)
    buf = mine(0, 4, salt=1)
    comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.MAX).Wait()
    check("iallreduce max", np.array_equal(buf, mine(size - 1, 4, salt=1)))
elif mode == "collective":
    buf = mine(0, 5)
    try:
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        print(f"rank 0 (mpi4py): Allreduce returned {buf.tolist()}", flush=True)
    except MPI.Exception as e:
        print(f"rank 0 (mpi4py): Allreduce raised {e.Get_error_string()}", flush=True)
else:
    sys.exit(f"unknown mode {mode}")

print(f"rank 0 (mpi4py): {mode}: {'FAILED ' + str(failures) if failures else 'ok'}", flush=True)
sys.exit(1 if failures else 0)
