#!/usr/bin/env bash
# The main job: installs what is missing, builds in release, and checks at 4 ranks that this
# machine's MPI moves every dtype × operation × length of DLPack tensors correctly.
#
# Usage: scripts/run.sh [extra `dlpack-mpi check` arguments]
# DLPACK_MPI_IMPL=mpich runs it with MPICH instead of Open MPI (scripts/mpi-env.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh

cargo build --release --bin dlpack-mpi
"$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 4 "$TARGET_DIR"/release/dlpack-mpi info
exec "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 4 "$TARGET_DIR"/release/dlpack-mpi check "$@"
