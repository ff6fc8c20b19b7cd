#!/usr/bin/env bash
# Prints one SHA-256 over the sources a build of .gpu depends on (Cargo.toml, Cargo.lock,
# build.rs, src/, tests/), computed the same way with or without .git, so that
# scripts/gpu-check.sh can tell on a copy of the working tree (the GPU machine gets no .git)
# whether .gpu was built from these sources. scripts/gpu-pack.sh records it in .gpu/BUILD.
set -euo pipefail
cd "$(dirname "$0")/.."
find Cargo.toml Cargo.lock build.rs src tests -type f \
    -not -path '*/__pycache__/*' -not -name '*.pyc' -not -name '*.png.tmp' -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1
