"""Helpers of the dlpack_mpi tests (imported by them: `from helpers import ...`)."""

import pytest
from mpi4py import MPI

import dlpack_mpi

WORLD = MPI.COMM_WORLD


def need(n):
    """Skips the test (on every rank: the size is the same everywhere) below `n` ranks."""
    if WORLD.Get_size() < n:
        pytest.skip(f"needs {n} ranks, the job has {WORLD.Get_size()}")


class Settings:
    """`with Settings(packing="copy"):` configures and restores the previous settings."""

    def __init__(self, **kw):
        self.kw = kw

    def __enter__(self):
        self.before = dlpack_mpi.settings()
        dlpack_mpi.configure(**self.kw)
        return self

    def __exit__(self, *exc):
        dlpack_mpi.configure(**self.before)
        return False


def complete(req, how):
    """Completes request `req` by `how`: "wait", "test" (polling Request.test) or
    "waitall"; returns what wait() returns."""
    assert isinstance(req, dlpack_mpi.Request)
    if how == "wait":
        out = req.wait()
    elif how == "test":
        while not req.test():
            pass
        out = req.wait()  # waiting again returns the same
    elif how == "waitall":
        (out,) = dlpack_mpi.waitall([req])
    else:
        raise ValueError(how)
    assert req.done
    assert req.test() is True
    return out


# The ways an operation runs: blocking, or its `i…` form completed by wait, test or
# waitall. Tests parametrized by `mode` call `run(comm, mode, "allreduce", ...)`.
MODES = ["blocking", "wait", "test", "waitall"]


def run(comm, mode, name, *args, **kwargs):
    if mode == "blocking":
        return getattr(comm, name)(*args, **kwargs)
    return complete(getattr(comm, "i" + name)(*args, **kwargs), mode)
