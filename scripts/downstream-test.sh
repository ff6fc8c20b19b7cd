#!/usr/bin/env bash
# A user's crate outside the package (tests/downstream, depending on dlpack-mpi by path; its
# build script does nothing without its feature `rpath`) builds and runs at 2 ranks:
#   1. with `default-features = false` (the library alone);
#   2. with feature `python`: first as built, with no loader path — it either runs, or
#      fails with dlpack-mpi's PythonLibraryMismatch error, which names the directory to put
#      in LD_LIBRARY_PATH (the case on a machine whose system libpython is not PYO3_PYTHON's);
#      then with that LD_LIBRARY_PATH, where it must run;
#   3. with features `python,rpath` (the README's two-line build script, which gives the
#      binary dlpack-mpi's run paths from DEP_DLPACK_MPI_RPATH, libpython's among them):
#      with no loader path, where it must run.
# (scripts/wheel-mpi-test.sh builds it against the Open MPI 5 wheel, where the run path
# decides which libmpi.so.40 it loads.)
# Expects mpi-env.sh and python-env.sh sourced (test.sh does). Uses the project's Cargo.lock
# (copied), so the dependencies are the versions the project is tested with, and the
# project's target directory, so they are not built twice (the binary is target/debug/downstream).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
dir=$root/tests/downstream
cp Cargo.lock "$dir/Cargo.lock"
target=$root/${TARGET_DIR:-target}
run2() { timeout 120 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$@"; }

echo "downstream: default-features = false"
(cd "$dir" && CARGO_TARGET_DIR=$target timeout 900 cargo build --quiet)
run2 "$target/debug/downstream" | tee "$target/downstream-plain.out"
grep -q "downstream: all parts passed at 2 ranks" "$target/downstream-plain.out"
if cargo tree --manifest-path "$dir/Cargo.toml" -e normal --prefix none 2>/dev/null | grep -Eq '^(clap|pyo3|serde|plotters) '; then
    echo "downstream: the library alone pulled in a CLI or Python crate" >&2
    exit 1
fi

echo "downstream: feature python"
(cd "$dir" && CARGO_TARGET_DIR=$target timeout 900 cargo build --quiet --features python)
libdir=$("$PYO3_PYTHON" -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))")
if run2 "$target/debug/downstream" >"$target/downstream-python.out" 2>&1; then
    echo "downstream: python ran without a loader path (the loader found $libdir's libpython)"
else
    cat "$target/downstream-python.out"
    if ! grep -q "LD_LIBRARY_PATH=$libdir" "$target/downstream-python.out"; then
        echo "downstream: the failure does not name the fix (LD_LIBRARY_PATH=$libdir)" >&2
        exit 1
    fi
    echo "downstream: without a loader path it refused with the fix named, as documented"
fi
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} run2 -x LD_LIBRARY_PATH "$target/debug/downstream" 2>&1 | tee "$target/downstream-python-fixed.out"
grep -q "NumPy all-reduce f32 ok" "$target/downstream-python-fixed.out"
grep -q "downstream: all parts passed at 2 ranks" "$target/downstream-python-fixed.out"

echo "downstream: features python,rpath (the README's build script), no loader path"
(cd "$dir" && CARGO_TARGET_DIR=$target timeout 900 cargo build --quiet --features python,rpath)
readelf -d "$target/debug/downstream" | grep -q "R.*PATH.*$libdir" ||
    { echo "downstream: the build script gave no run path $libdir" >&2; exit 1; }
env -u LD_LIBRARY_PATH timeout 120 "$MPIRUN" "${MPIRUN_FLAGS[@]}" -n 2 "$target/debug/downstream" 2>&1 | tee "$target/downstream-python-rpath.out"
grep -q "downstream: all parts passed at 2 ranks" "$target/downstream-python-rpath.out"
# The build metadata dependents' build scripts read: DEP_DLPACK_MPI_PYTHON_LIBDIR and
# DEP_DLPACK_MPI_RPATH (libpython's directory last).
grep -qx "cargo:python_libdir=$libdir" "$target"/debug/build/dlpack-mpi-*/output
grep -q "^cargo:rpath=\(.*:\)\?$libdir\$" "$target"/debug/build/dlpack-mpi-*/output
echo "downstream: passed (library alone; python with the libpython check and its fix; the README's run-path build script; build metadata)"
