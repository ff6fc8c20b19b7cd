# Sourced by setup.sh (and scripts/setup-test.sh): how the prerequisites are detected.
#
# have_libclang [ROOT]: succeeds when bindgen (rsmpi's mpi-sys build script, through clang-sys
# 1.x) would find a libclang under ROOT (default /), by the rules it applies:
# - if LIBCLANG_PATH is set, only that directory is searched;
# - otherwise `llvm-config --libdir`, the directories of LD_LIBRARY_PATH and LIBRARY_PATH,
#   and the globs /usr/local/llvm*/lib*, /usr/local/lib*/*/*, /usr/local/lib*/*,
#   /usr/local/lib*, /usr/lib*/*/*, /usr/lib*/*, /usr/lib*;
# - a file counts when its name matches libclang.so, libclang-*.so, libclang.so.* or
#   libclang-*.so.*, except libclang-cpp (a different library: a machine can have
#   libclang-cpp.so.14 from libclang-cpp14 and still no libclang, which is libclang1-14).
have_libclang() {
    local root=${1:-}
    local dirs=() d f name
    if [[ -n ${LIBCLANG_PATH:-} ]]; then
        dirs=("$root$LIBCLANG_PATH")
    else
        if [[ -z $root ]] && command -v llvm-config >/dev/null 2>&1; then
            dirs+=("$(llvm-config --libdir 2>/dev/null)")
        fi
        local IFS=:
        for d in ${LD_LIBRARY_PATH:-} ${LIBRARY_PATH:-}; do
            [[ -n $d ]] && dirs+=("$root$d")
        done
        unset IFS
        local pattern
        for pattern in /usr/local/llvm*/lib* /usr/local/lib*/*/* /usr/local/lib*/* /usr/local/lib* \
            /usr/lib*/*/* /usr/lib*/* /usr/lib*; do
            for d in "$root"$pattern; do
                [[ -d $d ]] && dirs+=("$d")
            done
        done
    fi
    for d in "${dirs[@]}"; do
        for f in "$d"/libclang.so "$d"/libclang-*.so "$d"/libclang.so.* "$d"/libclang-*.so.*; do
            [[ -e $f ]] || continue
            name=${f##*/}
            [[ $name == *-cpp.* ]] && continue
            return 0
        done
    done
    return 1
}
