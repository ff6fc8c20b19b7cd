"""The dlpack_mpi ranks (1..K) of the MPMD interop job; rank 0 is peer_mpi4py.py (plain
mpi4py). See that file for the modes."""

import sys

import numpy as np

import dlpack_mpi
from common import expected_sum, mine, transposed

mode = sys.argv[1]
comm = dlpack_mpi.Comm()  # MPI.COMM_WORLD itself: messages match mpi4py's
rank, size = comm.rank, comm.size
assert rank > 0
failures = []


def check(what, ok):
    if not ok:
        failures.append(what)
        print(f"rank {rank} (dlpack_mpi): FAIL {what}", flush=True)


if mode == "local":
    dlpack_mpi.configure(agreement="local")
    got = np.zeros((2, 3))
    st = comm.recv(got, 0, tag=1)
    check("recv from mpi4py", np.array_equal(got.ravel(), mine(0, 6)))
    check("status", (st.source, st.tag, st.count) == (0, 1, 6))
    comm.send(transposed(rank), 0, tag=2)
    buf = mine(rank, 5)
    comm.allreduce(buf)
    check("allreduce", np.array_equal(buf, expected_sum(size, 5)))
    holder = np.full(16, -1.0)
    comm.bcast(holder[::2], root=0)
    check("bcast into a step-2 view", np.array_equal(holder[::2], mine(0, 8, salt=3))
          and np.all(holder[1::2] == -1.0))
    buf = mine(rank, 4, salt=1)
    req = comm.iallreduce(buf, op="max")
    req.wait()
    check("iallreduce max", np.array_equal(buf, mine(size - 1, 4, salt=1)))
elif mode == "collective":
    # The default agreement: its all-reduce meets rank 0's plain Allreduce, and must end in
    # an error here, not a hang (one dlpack_mpi rank only: peer_mpi4py.py says why).
    assert size == 2, "mode collective runs with one dlpack_mpi rank"
    buf = mine(rank, 5)
    try:
        comm.allreduce(buf)
        check("allreduce without agreement local raised nothing", False)
    except dlpack_mpi.OutOfStep as e:
        text = str(e)
        print(f"rank {rank} (dlpack_mpi): OutOfStep: {text}", flush=True)
        check("OutOfStep names DLPACK_MPI_AGREEMENT and agreement local",
              "DLPACK_MPI_AGREEMENT" in text and "local" in text)
    except dlpack_mpi.Error as e:
        check(f"raised {type(e).__name__}, not OutOfStep: {e}", False)
else:
    sys.exit(f"unknown mode {mode}")

print(f"rank {rank} (dlpack_mpi): {mode}: {'FAILED ' + str(failures) if failures else 'ok'}",
      flush=True)
sys.exit(1 if failures else 0)
