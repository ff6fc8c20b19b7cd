#!/usr/bin/env bash
# Builds the examples (with feature `python`, for numpy_allreduce) and runs each one under
# mpirun at 1, 2, 3 and 4 ranks. Also builds the benchmarks of benches/ (not run: they are
# measurements; benches/README.md), so that they keep building.
#
# Usage: scripts/examples.sh [--release]
# The MPI library is DLPACK_MPI_IMPL (openmpi, the default, or mpich; see
# scripts/mpi-env.sh, which also picks the launcher, its flags and the target directory).
# RANKS (default: "1 2 3 4") and TIMEOUT (seconds per run, default: 60) may be set in the
# environment.
# Prints one PASS/FAIL line per (example, ranks) and ends with "N passed, N failed";
# exits non-zero if any run failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

profile=debug
cargo_flags=()
for arg in "$@"; do
    case "$arg" in
        --release) profile=release; cargo_flags+=(--release) ;;
        *) echo "usage: $0 [--release]" >&2; exit 2 ;;
    esac
done

examples=(ring allreduce allgatherv nonblocking overlap training_step numpy_allreduce)
ranks=(${RANKS:-1 2 3 4})
timeout_s=${TIMEOUT:-60}
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh

# numpy_allreduce embeds Python (feature `python`): pyo3 builds against PYO3_PYTHON, the
# interpreter setup.sh installed NumPy into. Built with `cli` too (the examples do not need
# it), so test.sh's Python stages and this one share one build of the library.
# shellcheck source=scripts/python-env.sh
source scripts/python-env.sh
cargo build --examples --benches --features cli,python "${cargo_flags[@]}"

passed=0
failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for example in "${examples[@]}"; do
    binary="$TARGET_DIR/$profile/examples/$example"
    for n in "${ranks[@]}"; do
        if timeout "$timeout_s" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$binary" >"$log" 2>&1; then
            echo "PASS $example -n $n: $(tail -n 1 "$log")"
            passed=$((passed + 1))
        else
            rc=$?
            echo "FAIL $example -n $n (exit $rc); output:"
            sed 's/^/    /' "$log" | tail -n 20
            failed=$((failed + 1))
        fi
    done
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
