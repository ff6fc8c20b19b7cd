#!/usr/bin/env bash
# Memory errors and leaks under valgrind (memcheck) for the single-rank test binaries:
# tests/cases, tests/hostile (no MPI) and the suite canaries of tests/mpi at 1 rank (MPI
# initialized). A definite or indirect leak, an invalid read or write, or a use of
# uninitialised memory fails the run. MPI's own allocations at MPI_Init are suppressed by
# scripts/valgrind-mpi.supp (frames inside the MPI libraries only).
#
# The resident-memory check over 100 000 cycles at 2 ranks is tests/leaks.rs, run by
# scripts/test.sh.
#
# Usage: scripts/leaks.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v valgrind >/dev/null 2>&1; then
    sudo=()
    [[ $(id -u) -ne 0 ]] && sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends valgrind >/dev/null
fi

# shellcheck source=scripts/test-binary.sh
source scripts/test-binary.sh

status=0
for t in cases hostile canaries; do
    if [[ $t == canaries ]]; then
        bin=$(test_binary mpi)
        args=(--suite canaries)
    else
        bin=$(test_binary "$t")
        # libtest: one thread, so reports are in order; the hostile tests' child processes
        # (tests that isolate an abort) are not traced.
        args=(--test-threads=1)
    fi
    log=$(mktemp)
    echo "== valgrind $t"
    # A small free-list quarantine: tests that assert flat resident memory (C09) would
    # otherwise see valgrind's default 20 MB of freed-but-held blocks as growth.
    if timeout 900 valgrind --tool=memcheck --freelist-vol=1000000 \
        --leak-check=full --show-leak-kinds=definite,indirect \
        --errors-for-leak-kinds=definite,indirect --error-exitcode=99 \
        --suppressions=scripts/valgrind-mpi.supp --num-callers=30 \
        "$bin" "${args[@]}" >"$log" 2>&1; then
        grep -E "test result|ERROR SUMMARY|definitely lost|indirectly lost|possibly lost|suppressed:" "$log" || true
    else
        echo "== FAILED: valgrind $t (log below)"
        tail -120 "$log"
        status=1
    fi
    rm -f "$log"
done
exit $status
