# One data-parallel training step with dlpack_mpi (python/): the same step as
# train_step_mpi4py.py, with the gradients all-reduced in place as one fused list (no
# concatenate, no split). README.md shows this file.
#
#   mpirun -n 4 python3 examples/train_step.py
import numpy as np
import dlpack_mpi

comm = dlpack_mpi.Comm()
rank, size = comm.rank, comm.size
# A model of four parameters (a 512 x 1000 weight, three biases), equal on every rank.
sizes = [512 * 1000, 1000, 4096, 4096]
params = [np.full(n, 0.5, np.float32) for n in sizes]
# This rank's backward pass: its gradients (rank + 1 everywhere).
grads = [np.full(n, rank + 1, np.float32) for n in sizes]
# Every gradient summed over the ranks, as few messages, while computing:
request = comm.iallreduce(grads)
while not request.test():
    pass  # ... computation that does not touch the gradients ...
# The averaged gradients' SGD update (learning rate 1/8), the same on every rank.
for p, g in zip(params, grads):
    p -= 0.125 * g / size
expected = 0.5 - 0.125 * (size + 1) / 2
assert all((p == expected).all() for p in params)
if rank == 0:
    print(f"train_step: OK on {size} ranks")
