#!/usr/bin/env bash
# The main job: installs what is missing, builds in release, and checks at 4 ranks that this
# machine's MPI moves every dtype × operation × length of DLPack tensors correctly.
#
# Usage: scripts/run.sh [extra `dlpack-mpi check` arguments]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh

cargo build --release --bin dlpack-mpi
mpirun "${MPIRUN_FLAGS[@]}" -n 4 target/release/dlpack-mpi info
exec mpirun "${MPIRUN_FLAGS[@]}" -n 4 target/release/dlpack-mpi check "$@"
