#!/usr/bin/env bash
# Builds the examples (with feature `python`, for numpy_allreduce) and runs each one under
# mpirun at 1, 2, 3 and 4 ranks; under Open MPI, also examples/train_step_mpi4py.py (the
# same training step as train_step, in mpi4py and NumPy) and examples/train_step.py (the same
# with the Python module dlpack_mpi); each skipped, and said so, where the interpreter lacks
# the module. Checks that README.md's training steps are examples/train_step.rs and the two
# Python files.
# Also builds the benchmarks of benches/ (not run: they are measurements; benches/README.md),
# so that they keep building.
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

examples=(ring allreduce allgatherv nonblocking overlap training_step train_step planned_step halo numpy_allreduce)
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
# Runs `NAME COMMAND...` under the launcher at every rank count, one PASS or FAIL line each.
run_at_ranks() {
    local name=$1 n rc
    shift
    for n in "${ranks[@]}"; do
        if timeout "$timeout_s" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$@" >"$log" 2>&1; then
            echo "PASS $name -n $n: $(tail -n 1 "$log")"
            passed=$((passed + 1))
        else
            rc=$?
            echo "FAIL $name -n $n (exit $rc); output:"
            sed 's/^/    /' "$log" | tail -n 20
            failed=$((failed + 1))
        fi
    done
}

for example in "${examples[@]}"; do
    run_at_ranks "$example" "$TARGET_DIR/$profile/examples/$example"
done

# The same training step in mpi4py, and with the Python module dlpack_mpi (setup.sh installs
# mpi4py for Open MPI only, and the module against the MPI of that mpi4py).
for py_example in examples/train_step_mpi4py.py examples/train_step.py; do
    module=mpi4py
    [[ $py_example == examples/train_step.py ]] && module=dlpack_mpi
    if [[ $DLPACK_MPI_IMPL != openmpi ]]; then
        echo "SKIP $py_example: mpi4py is installed for Open MPI only (this is $DLPACK_MPI_IMPL)"
    elif ! "$PYO3_PYTHON" -c "import $module, numpy" >/dev/null 2>&1; then
        echo "SKIP $py_example: $PYO3_PYTHON has no $module or NumPy (scripts/setup.sh installs them)"
    else
        run_at_ranks "$py_example" "$PYO3_PYTHON" "$py_example"
    fi
done

# readme_shows LANG MARKER FILE FIRST WHAT: README.md's first ```LANG block containing MARKER
# must be FILE from its first line matching FIRST (the two must not drift).
readme_shows() {
    local lang=$1 marker=$2 file=$3 first=$4 what=$5 shown from_file
    shown=$(awk -v lang="$lang" -v marker="$marker" '$0 ~ "^```" lang { block = ""; inside = 1; next }
        /^```/ && inside { if (index(block, marker)) { printf "%s", block; exit } inside = 0; next }
        inside { block = block $0 "\n" }' README.md)
    from_file=$(sed -n "/$first/,\$p" "$file")
    if [[ "$shown" == "$from_file" ]]; then
        echo "PASS README.md's $what is $file"
        passed=$((passed + 1))
    else
        echo "FAIL README.md's $what differs from $file:"
        diff <(printf '%s\n' "$shown") <(printf '%s\n' "$from_file") | sed 's/^/    /' | head -n 20
        failed=$((failed + 1))
    fi
}

readme_shows rust acquire_all examples/train_step.rs '^use ' "training step"
readme_shows rust plan_all_reduce_tensors_in_place examples/planned_step.rs '^use ' "planned step"
# README.md's Python section shows both Python steps from their `import numpy` line.
readme_shows python "dlpack_mpi.Comm()" examples/train_step.py '^import numpy' "Python step"
readme_shows python "comm.Iallreduce" examples/train_step_mpi4py.py '^import numpy' "Python step"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
