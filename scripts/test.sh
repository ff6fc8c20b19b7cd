#!/usr/bin/env bash
# Every test: formatting and lints, unit and doc tests, the behaviour cases, the multi-rank
# cases under mpirun at 1-4 ranks, the checked protocol at 2 ranks, every example at 1-4
# ranks, the check matrix at 1-4 ranks, and a two-host run over TCP between two network
# namespaces (scripts/netns-test.sh; SKIP where namespaces cannot be made). Installs what is
# missing first. Ends with "test.sh: N passed, N failed" (stages).
#
# Usage: scripts/test.sh [--mpi openmpi|mpich]
#   --mpi openmpi (the default, what CI runs): Open MPI, built in target/.
#   --mpi mpich: MPICH (installed if missing), built in target/mpich/, run with mpiexec.mpich.
# The launcher and compiler wrapper are named explicitly (scripts/mpi-env.sh), so Debian's
# `mpirun`/`mpicc` alternatives do not matter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

while (($#)); do
    case "$1" in
        --mpi)
            [[ $# -ge 2 ]] || { echo "usage: $0 [--mpi openmpi|mpich]" >&2; exit 2; }
            DLPACK_MPI_IMPL=$2
            shift 2
            ;;
        --mpi=*) DLPACK_MPI_IMPL=${1#--mpi=}; shift ;;
        *) echo "usage: $0 [--mpi openmpi|mpich]" >&2; exit 2 ;;
    esac
done
export DLPACK_MPI_IMPL=${DLPACK_MPI_IMPL:-openmpi}

scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
echo "test.sh: MPI library $DLPACK_MPI_IMPL (launcher $MPIRUN, compiler wrapper $MPICC, target $TARGET_DIR)"

passed=0
failed=0
summary=()
stage() {
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    if "$@"; then
        passed=$((passed + 1))
        summary+=("PASS  $name ($((SECONDS - start)) s)")
    else
        echo "== FAILED: $name"
        failed=$((failed + 1))
        summary+=("FAIL  $name ($((SECONDS - start)) s)")
    fi
}

# The path of the harness=false test binary $1 (built if needed).
test_binary() {
    cargo test --test "$1" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == name:
        print(m["executable"])' "$1"
}

# Runs the harness=false test binary $1 under mpirun at $2 ranks.
test_binary_at() {
    local bin
    bin=$(test_binary "$1")
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$2" "$bin"
}

check_at() {
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$1" "$TARGET_DIR"/release/dlpack-mpi check -q
}

netns_stage() {
    MPI_CASES_BIN=$(test_binary mpi_cases) CHECKED_BIN=$(test_binary checked) \
        timeout 600 scripts/netns-test.sh
}

stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy -D warnings" cargo clippy --all-targets -- -D warnings
stage "cargo test (unit, doc, cases, multi-rank cases at 1 rank)" timeout 900 cargo test
for n in 2 3 4; do
    stage "multi-rank cases at $n ranks" test_binary_at mpi_cases "$n"
done
stage "checked protocol at 2 ranks" test_binary_at checked 2
stage "one transfer above 2^31 bytes at 2 ranks" test_binary_at large_transfer 2
stage "examples at 1-4 ranks" scripts/examples.sh
# The check matrix (about 13 000 cases per run) in release: minutes faster than debug.
cargo build --release --bin dlpack-mpi
for n in 1 2 3 4; do
    stage "dlpack-mpi check at $n ranks" check_at "$n"
done
stage "two hosts (network namespaces, TCP): check matrix and multi-rank cases" netns_stage

echo
echo "stages ($DLPACK_MPI_IMPL, $SECONDS s):"
printf '  %s\n' "${summary[@]}"
echo "test.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
