"""Shared fixtures of the dlpack_mpi test suite.

Every rank of the job runs the same tests in the same order:

    mpirun -n N python3 -m pytest -q -p no:cacheprovider python/tests

(N = 1, 2, 3, 4; scripts/test.sh runs each under `timeout`, so a hang fails the stage).
Tests that need more ranks than the job has skip on every rank alike (`need`). Before each
test the ranks compare the test's id on a communicator of their own (`_in_step`), so a rank
that ran another test (or skipped one the others ran) fails there, naming both, instead of
pairing its messages with another test's.

Tests check exact values, computed from the ranks' numbers with NumPy; they put their
assertions after their last communication where they can, so that a failing check on one
rank does not leave the others waiting inside a collective.
"""

import os
import sys
import warnings
import zlib

import numpy as np
import pytest
from mpi4py import MPI

import dlpack_mpi

# JAX: the CPU backend only (no probing for accelerators at import); the JAX and Paddle
# modules are imported by the tests that use them (`jax` and `paddle` fixtures), not here.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Paddle warns at import that ccache is missing (a compiler cache for its C++ extensions).
warnings.filterwarnings("ignore", message=".*ccache.*")

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="session")
def comm():
    """dlpack_mpi.Comm on MPI.COMM_WORLD itself (its messages match mpi4py's on it)."""
    return dlpack_mpi.Comm()


@pytest.fixture(scope="session")
def rank():
    return WORLD.Get_rank()


@pytest.fixture(scope="session")
def size():
    return WORLD.Get_size()


# The ranks' step check runs on a duplicate of COMM_WORLD: none of the tests' messages or
# collectives can match it.
_STEP = dlpack_mpi.Comm(dup=True)


@pytest.fixture(autouse=True)
def _in_step(request):
    nodeid = request.node.nodeid
    mine = np.array([zlib.crc32(nodeid.encode())], dtype=np.uint32)
    every = np.zeros(_STEP.size, dtype=np.uint32)
    _STEP.allgather(mine, every)
    if not np.all(every == mine[0]):
        pytest.fail(f"ranks out of step: rank {_STEP.rank} runs {nodeid}, the ranks' test ids "
                    f"(crc32) are {every.tolist()}")
    yield


@pytest.fixture(scope="session")
def jax():
    jax = pytest.importorskip("jax")
    return jax


@pytest.fixture(scope="session")
def jnp(jax):
    import jax.numpy as jnp

    return jnp


@pytest.fixture(scope="session")
def paddle():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paddle = pytest.importorskip("paddle")
    paddle.set_device("cpu")
    return paddle


@pytest.fixture(scope="session")
def ml_dtypes():
    return pytest.importorskip("ml_dtypes")


def pytest_report_header(config):
    return (f"dlpack_mpi {dlpack_mpi.__version__}, rank {WORLD.Get_rank()} of "
            f"{WORLD.Get_size()}, {MPI.Get_library_version().splitlines()[0]}, "
            f"Python {sys.version.split()[0]}")
