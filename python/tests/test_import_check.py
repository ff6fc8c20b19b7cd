"""`import dlpack_mpi` refuses an mpi4py that runs on another MPI library than the module's:
an ImportError naming both (python/src/lib.rs, import_check). The other libraries are the
Open MPI 5 and MPICH 5 wheels' (scripts/wheel-mpi-test.sh makes their environments); the
child process gets a clean environment (no launcher variables) and the wheel's library first
on the loader's path, so mpi4py loads it and the module finds it loaded."""
import os
import pathlib
import subprocess
import sys

import pytest
from mpi4py import MPI

VENVS = pathlib.Path.home() / ".cache" / "dlpack-mpi"
CODE = "from mpi4py import MPI\nimport dlpack_mpi\n"


def run_with(venv):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "HYDRA", "PMI_", "MPI_"))}
    env["LD_LIBRARY_PATH"] = str(venv / "lib")
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    env.pop("DLPACK_MPI_ALLOW_MPI_MISMATCH", None)
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "venv, theirs, words",
    [
        ("venv-openmpi5", "Open MPI v5.0", "was built against Open MPI 4.1"),
        ("venv-mpich5", "MPICH Version", "two MPI libraries in one process"),
    ],
)
def test_another_mpi_is_an_import_error(venv, theirs, words):
    if MPI.COMM_WORLD.Get_size() > 1 or MPI.COMM_WORLD.Get_rank() != 0:
        pytest.skip("one process is enough")
    if not MPI.Get_library_version().startswith("Open MPI v4.1"):
        pytest.skip("the module under test is built against Debian's Open MPI 4.1")
    path = VENVS / venv
    if not (path / "lib").is_dir():
        pytest.skip(f"{path} is not there (scripts/wheel-mpi-test.sh makes it)")
    out = run_with(path)
    assert out.returncode != 0, out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), out.stderr[-2000:]
    assert words in last and theirs in last and "pip install" in last, last
