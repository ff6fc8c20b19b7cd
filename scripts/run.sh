#!/usr/bin/env bash
# The main job: installs what is missing, builds in release with Python support, and checks
# at 4 ranks that this machine's MPI moves every dtype × operation × layout × length of DLPack
# tensors correctly. The tensors are NumPy arrays (through `__dlpack__`) when NumPy imports,
# which setup.sh makes sure of; `scripts/run.sh --producer rust` uses Rust-made tensors,
# which also cover the dtypes NumPy has not (bfloat16, float8, multi-lane).
#
# Usage: scripts/run.sh [extra `dlpack-mpi check` arguments]
# DLPACK_MPI_IMPL=mpich runs it with MPICH instead of Open MPI (scripts/mpi-env.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
# shellcheck source=scripts/python-env.sh
source scripts/python-env.sh

cargo build --release --features cli,python --bin dlpack-mpi
"$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 4 "$TARGET_DIR"/release/dlpack-mpi info
exec "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 4 "$TARGET_DIR"/release/dlpack-mpi check "$@"
