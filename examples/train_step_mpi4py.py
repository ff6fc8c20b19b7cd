# One data-parallel training step in mpi4py and NumPy: the same step as train_step.rs (see
# there, and docs/GUIDE.md, which compares the two programs' lengths). mpi4py has no list
# collectives, so the gradients go as one concatenated array, split again for the update.
#
#   mpirun -n 4 python3 examples/train_step_mpi4py.py
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
# A model of four parameters (a 512 x 1000 weight, three biases), equal on every rank.
sizes = [512 * 1000, 1000, 4096, 4096]
params = [np.full(n, 0.5, np.float32) for n in sizes]
# This rank's backward pass: its gradients (rank + 1 everywhere).
grads = [np.full(n, rank + 1, np.float32) for n in sizes]
# Every gradient summed over the ranks, as one message, while computing:
flat = np.concatenate(grads)
request = comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
while not request.Test():
    pass  # ... computation that does not touch the gradients ...
# The averaged gradients' SGD update (learning rate 1/8), the same on every rank.
for p, g in zip(params, np.split(flat, np.cumsum(sizes)[:-1])):
    p -= 0.125 * g / size
expected = 0.5 - 0.125 * (size + 1) / 2
assert all((p == expected).all() for p in params)
if rank == 0:
    print(f"train_step_mpi4py: OK on {size} ranks")
