#!/usr/bin/env bash
# Every test: setup.sh's libclang detection, formatting, lints (the library alone and with
# features cli, python, cuda), rustdoc with warnings denied, unit and doc tests, the behaviour
# cases, the multi-rank cases under mpirun at 1-4 ranks, the nonblocking/window/broadcast cases
# (tests/immediate.rs) at 2 ranks, agreement before collectives (one refusing rank, every
# rooted and vector collective) at 2-4 ranks, the checked protocol at 2 ranks, held messages
# at MPI_Finalize and on other threads (tests/held_finalize.rs) at 2 ranks, the
# fault cases at 2 ranks (aborted/forged pipelined messages, lying checked headers), the
# GPU transport on a simulated device at 2-3 ranks, the `cuda` feature's GPU cases (which skip
# without a GPU) and gpu-check.sh against fake CUDA drivers, the Python-producer cases (NumPy,
# JAX, Paddle, the C exchange API) at 1-3 ranks, wire interop with mpi4py (MPMD jobs), the
# canary bounds harness at 2-3 ranks under every packing policy, threads under
# MPI_THREAD_MULTIPLE, the 100 000-cycle leak run, valgrind, miri beside a 60 s fuzz run (two targets), every
# example at 1-4 ranks, the check matrix at 1-4 ranks (NumPy arrays and Rust-made tensors; Rust
# again under DLPACK_MPI_PACKING=derived at 1-4; JAX and Paddle at 2 and 4, auto at 4;
# simulated CUDA memory at 2), a rank killed mid-check at 2
# and 4 ranks (scripts/kill-rank-test.sh: the job ends within 30 s, non-zero, naming the
# rank), a two-host run over TCP between two network namespaces (scripts/netns-test.sh;
# SKIP where namespaces cannot be made), a user's crate outside the package
# (scripts/downstream-test.sh) and `cargo package`.
# Installs what is missing first. Ends with "test.sh: N passed, N failed" (stages).
#
# Usage: scripts/test.sh [--mpi openmpi|mpich]
#   --mpi openmpi (the default, what CI runs): Open MPI, built in target/.
#   --mpi mpich: MPICH (installed if missing), built in target/mpich/, run with mpiexec.mpich;
#     the mpi4py stages are skipped (setup.sh installs mpi4py for Open MPI only).
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
# shellcheck source=scripts/python-env.sh
source scripts/python-env.sh
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

# shellcheck source=scripts/test-binary.sh
source scripts/test-binary.sh

# Runs the harness=false test binary $1 under mpirun at $2 ranks (cargo flags after).
test_binary_at() {
    local bin name=$1 n=$2
    shift 2
    bin=$(test_binary "$name" "$@")
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$bin"
}

# One MPMD job: the mpi4py peer as rank 0, then $1 dlpack-mpi ranks.
mpi4py_interop_at() {
    local bin
    bin=$(test_binary mpi4py_interop)
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 1 "$PYO3_PYTHON" tests/python/mpi4py_peer.py \
        : -n "$1" "$bin"
}

# A short fuzz run (60 s in all: 30 s for each of fuzz/'s targets, import_layout_spec and
# checked_header) from the committed corpora; new inputs go to a scratch directory, so the run
# leaves the tree as it was. Installs cargo-fuzz and the nightly toolchain if missing.
fuzz_smoke() {
    if ! cargo +nightly --version >/dev/null 2>&1; then
        rustup toolchain install nightly --profile minimal
    fi
    if ! command -v cargo-fuzz >/dev/null 2>&1; then
        cargo install cargo-fuzz --locked
    fi
    local scratch target rc=0
    for target in import_layout_spec checked_header; do
        scratch=$(mktemp -d)
        # Debian's MPICH loads UCX, whose libucm patches mmap at load time and jumps into the
        # sanitizer's interceptor (a SEGV before the first input); the fuzz targets make no
        # MPI call, so UCX's memory hooks can be off.
        UCX_MEM_MMAP_HOOK_MODE=none timeout 900 cargo +nightly fuzz run "$target" "$scratch" "fuzz/corpus/$target" \
            -- -max_total_time=30 -timeout=10 -print_final_stats=1 2>&1 | tail -n 12
        [[ ${PIPESTATUS[0]} -eq 0 ]] || rc=1
        rm -rf "$scratch"
    done
    return "$rc"
}

leaks_at() {
    local DLPACK_MPI_LEAK_CYCLES=100000
    export DLPACK_MPI_LEAK_CYCLES
    test_binary_at leaks "$1"
}

# The check matrix at $1 ranks; further arguments go to `check`.
check_at() {
    local n=$1
    shift
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$TARGET_DIR"/release/dlpack-mpi check -q "$@"
}

# The Rust check matrix at 1-4 ranks under DLPACK_MPI_PACKING=derived.
check_derived() {
    local DLPACK_MPI_PACKING=derived n
    export DLPACK_MPI_PACKING
    for n in 1 2 3 4; do
        check_at "$n" --producer rust || return 1
    done
}

# The GPU routes on simulated CUDA memory: direct (MPI declared CUDA-aware; the "device"
# memory is host memory, so MPI can read it) and managed.
check_direct_and_managed() {
    local DLPACK_MPI_CUDA_AWARE=1
    export DLPACK_MPI_CUDA_AWARE
    check_at 2 --device cuda --simulate-device --transport direct &&
        check_at 2 --device cuda-managed --simulate-device
}

netns_stage() {
    MPI_CASES_BIN=$(test_binary mpi_cases) CHECKED_BIN=$(test_binary checked) \
        timeout 600 scripts/netns-test.sh
}

stage "setup.sh detects libclang as bindgen does (libclang-cpp is not libclang)" scripts/setup-test.sh
stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy -D warnings (the library alone, default features)" cargo clippy --all-targets -- -D warnings
stage "cargo clippy --features cli -D warnings" cargo clippy --all-targets --features cli -- -D warnings
stage "cargo clippy --features cli,python -D warnings" cargo clippy --all-targets --features cli,python -- -D warnings
doc_stage() {
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --features cli,cuda,python
}
stage "cargo doc --no-deps, warnings denied (features cli, cuda, python)" doc_stage
stage "cargo test (the library alone: unit, doc, cases, multi-rank cases at 1 rank)" timeout 900 cargo test
stage "a user's crate outside the package (tests/downstream): default-features = false, and python with the libpython check" \
    scripts/downstream-test.sh
stage "cargo package: the packaged crate (C shims included) builds" timeout 900 cargo package --allow-dirty --quiet
for n in 2 3 4; do
    stage "multi-rank cases at $n ranks" test_binary_at mpi_cases "$n"
done
stage "nonblocking tensor operations, windows, shared-root broadcast at 2 ranks (tests/immediate.rs)" \
    test_binary_at immediate 2
# Agreement before collectives (tests/agreement.rs): one refusing rank per case; broken
# agreement hangs, so a short timeout (the run takes seconds) fails the stage.
agreement_at() {
    local bin
    bin=$(test_binary agreement)
    timeout 120 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$1" "$bin"
}
for n in 2 3 4; do
    stage "agreement: every collective with one refusing rank at $n ranks" agreement_at "$n"
done
stage "checked protocol at 2 ranks" test_binary_at checked 2
# A held message left unreceived at MPI_Finalize would block rank 0 forever: a short
# timeout (the run takes under a second) fails the stage.
held_finalize_at() {
    local bin
    bin=$(test_binary held_finalize)
    timeout 120 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$1" "$bin"
}
stage "held messages at MPI_Finalize and dropped on another thread at 2 ranks" held_finalize_at 2
stage "faults at 2 ranks: aborted, forged and mismatched pipelined messages; lying checked headers, allocation bounded" \
    test_binary_at faults 2
for n in 2 3; do
    stage "GPU transport on a simulated device (C51, C53, C60-C65, staging) at $n ranks" \
        test_binary_at device_cases "$n"
done
stage "cuda: clippy -D warnings with features cuda and python (cudarc loads the driver at run time)" \
    cargo clippy --all-targets --features cli,cuda,python -- -D warnings
stage "cuda: GPU cases build, and skip without a GPU" test_binary_at gpu 1 --features cli,cuda
stage "cuda: gpu-check.sh end to end against fake CUDA drivers (stub, one-rank failure, no driver, budget)" \
    timeout 300 scripts/gpu-check-test.sh
stage "cli, python: unit tests, Python-producer cases at 1 rank, the DLPack C exchange API (hostile tables, Paddle), the CLI (tests/cli.rs) with NumPy" \
    timeout 600 cargo test --features cli,python --lib --test python_cases --test python_exchange --test cli
stage "python: doc tests of the python module" timeout 600 cargo test --features cli,python --doc python
for n in 2 3; do
    stage "python: Python-producer cases at $n ranks" test_binary_at python_cases "$n" --features cli,python
done
if [[ $DLPACK_MPI_IMPL == openmpi ]]; then
    for n in 1 2; do
        stage "mpi4py wire interop: mpi4py rank + $n dlpack-mpi rank(s)" mpi4py_interop_at "$n"
    done
else
    echo "== SKIP: mpi4py wire interop (setup.sh installs mpi4py for Open MPI only)"
fi
stage "transfers above 2^31 bytes (contiguous; strided packed and split) at 2 ranks" test_binary_at large_transfer 2
for n in 2 3; do
    stage "canaries (guard bytes, every operation x layout) at $n ranks" test_binary_at canaries "$n"
done
stage "threads under MPI_THREAD_MULTIPLE at 2 ranks" test_binary_at threads 2
stage "100 000 acquire/send/release cycles, flat RSS, at 2 ranks" leaks_at 2
stage "valgrind: no leak or memory error (cases, hostile, canaries)" scripts/leaks.sh
# Miri and the fuzz run are each one single-threaded process with its own target directory
# (target/miri, fuzz/target): they run side by side on the two cores, which saves about a
# minute (two minutes from a clean clone, where both build first). Miri's output follows.
miri_and_fuzz() {
    local miri_log pid rc_miri=0 rc_fuzz=0
    # One toolchain install at a time: the nightly with miri first (both use it).
    if ! cargo +nightly miri --version >/dev/null 2>&1; then
        rustup toolchain install nightly --profile minimal --component miri,rust-src >/dev/null 2>&1 ||
            rustup +nightly component add miri rust-src
    fi
    miri_log=$(mktemp)
    scripts/miri.sh >"$miri_log" 2>&1 &
    pid=$!
    fuzz_smoke || rc_fuzz=$?
    wait "$pid" || rc_miri=$?
    cat "$miri_log"
    rm -f "$miri_log"
    echo "miri: exit $rc_miri; fuzz: exit $rc_fuzz"
    ((rc_miri == 0 && rc_fuzz == 0))
}
stage "miri over the pure layers' unit tests, beside the fuzz run of import/layout/spec and the checked header (30 s each)" \
    miri_and_fuzz
stage "examples at 1-4 ranks" scripts/examples.sh
# The check matrix (about 13 000 cases per run) in release: minutes faster than debug. Built
# with Python support, its default producer is NumPy; the Rust producer also covers the
# dtypes NumPy has not.
cargo build --release --features cli,python --bin dlpack-mpi
for n in 1 2 3 4; do
    stage "dlpack-mpi check at $n ranks (NumPy arrays)" check_at "$n" --producer numpy
done
for n in 2 3 4; do
    stage "dlpack-mpi check at $n ranks (Rust-made tensors)" check_at "$n" --producer rust
done
# The same Rust matrix with every strided tensor as a derived datatype (not the default
# Packing::Auto), at 1-4 ranks: the counts equal those of the default stages above.
stage "dlpack-mpi check at 1-4 ranks (Rust-made tensors), DLPACK_MPI_PACKING=derived" \
    check_derived
# The ML producers (setup.sh installs them; a package that did not install is a SKIP line):
# each pinned at 2 and 4 ranks, and `auto` (each dtype from NumPy, JAX, Paddle, then Rust) at 4.
for p in jax paddle; do
    if "$PYO3_PYTHON" -c "import $p" >/dev/null 2>&1; then
        for n in 2 4; do
            stage "dlpack-mpi check at $n ranks ($p tensors)" check_at "$n" --producer "$p"
        done
    else
        echo "== SKIP: dlpack-mpi check --producer $p (Python package $p is not installed)"
    fi
done
stage "dlpack-mpi check at 4 ranks (--producer auto: NumPy, JAX, Paddle, then Rust)" check_at 4 --producer auto
stage "dlpack-mpi check at 2 ranks, simulated CUDA memory, staged" \
    check_at 2 --device cuda --simulate-device --transport staged
stage "dlpack-mpi check at 2 ranks, simulated CUDA memory, direct (DLPACK_MPI_CUDA_AWARE=1), and managed" \
    check_direct_and_managed
stage "a rank killed (SIGKILL) mid-check at 2 and 4 ranks: the job ends within 30 s, non-zero, naming the rank" \
    timeout 900 scripts/kill-rank-test.sh 2 4
stage "two hosts (network namespaces, TCP): check matrix and multi-rank cases" netns_stage

echo
echo "stages ($DLPACK_MPI_IMPL, $SECONDS s):"
printf '  %s\n' "${summary[@]}"
echo "test.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
