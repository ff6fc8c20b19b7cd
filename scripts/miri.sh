#!/usr/bin/env bash
# Miri (undefined-behaviour checker) over the unit tests of the pure layers: `dlpack` (the
# import guard, its unsafe accessors and the built-in exporters), `dtype`, `layout` and
# `spec` (contiguous specs; derived datatypes need MPI and are not built here). Nothing in
# these tests calls MPI or other C code, which Miri cannot run; a test that does gets
# `#[cfg_attr(miri, ignore)]`.
#
# Usage: scripts/miri.sh        (installs the nightly toolchain's miri component if missing)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri.sh: installing the nightly miri component"
    rustup toolchain install nightly --profile minimal --component miri,rust-src >/dev/null 2>&1 ||
        rustup +nightly component add miri rust-src
fi
# Strict provenance: every pointer the guard hands out must come from the producer's
# pointer, never from an integer.
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-strict-provenance}"
cargo +nightly miri setup >/dev/null
# Also the half-precision reduction functions at unaligned addresses (MPI hands them the
# user's buffers, which DLPack lets start at any byte).
cargo +nightly miri test --lib -- dlpack:: dtype:: layout:: spec:: \
    comm::engine::halfops::tests::half_ops_at_any_address
