#!/usr/bin/env bash
# Tests setup.sh's prerequisite detection (scripts/prereqs.sh) against trees laid out like real
# machines: one with libclang-cpp only (Debian's libclang-cpp14 without libclang1-14: bindgen
# finds nothing there, so setup.sh must install libclang), and complete ones.
# Prints "setup-test: N passed, N failed"; exits non-zero on a failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/prereqs.sh
source scripts/prereqs.sh
unset LIBCLANG_PATH LD_LIBRARY_PATH LIBRARY_PATH

passed=0
failed=0
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

# expect NAME yes|no FILE... : a fresh tree holding FILEs; have_libclang must answer as expected.
expect() {
    local name=$1 want=$2 tree="$root/$1" got f
    shift 2
    mkdir -p "$tree"
    for f in "$@"; do
        mkdir -p "$tree$(dirname "$f")"
        : >"$tree$f"
    done
    if have_libclang "$tree"; then got=yes; else got=no; fi
    if [[ $got == "$want" ]]; then
        passed=$((passed + 1))
        echo "PASS  $name (libclang found: $got)"
    else
        failed=$((failed + 1))
        echo "FAIL  $name (libclang found: $got, expected $want)"
    fi
}

expect empty-machine no
expect libclang-cpp-only no /usr/lib/llvm-14/lib/libclang-cpp.so.14 \
    /usr/lib/x86_64-linux-gnu/libclang-cpp.so.14
expect libclang1-14 yes /usr/lib/llvm-14/lib/libclang-cpp.so.14 /usr/lib/llvm-14/lib/libclang.so.1 \
    /usr/lib/x86_64-linux-gnu/libclang-14.so.1
expect libclang-dev yes /usr/lib/llvm-14/lib/libclang.so /usr/lib/llvm-14/lib/libclang-14.so
expect multiarch-versioned yes /usr/lib/x86_64-linux-gnu/libclang-16.so.16.0.6
expect usr-local yes /usr/local/lib/libclang.so.18
expect static-archives-only no /usr/lib/llvm-14/lib/libclangAST.a /usr/lib/llvm-14/lib/libclangBasic.a

# LIBCLANG_PATH set: only that directory counts.
LIBCLANG_PATH=/opt/llvm/lib expect libclang-path-elsewhere no /usr/lib/llvm-14/lib/libclang.so.1
LIBCLANG_PATH=/opt/llvm/lib expect libclang-path-there yes /opt/llvm/lib/libclang.so

echo "setup-test: $passed passed, $failed failed"
((failed == 0))
