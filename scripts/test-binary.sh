# Sourced by test.sh and leaks.sh (and by hand for benches/, see benches/README.md):
# test_binary NAME [cargo flags] prints the path of the test binary NAME, building it first
# if needed.
test_binary() {
    local name=$1
    shift
    cargo test "$@" --test "$name" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == name:
        print(m["executable"])' "$name"
}

# bench_binary NAME [cargo flags] prints the path of the benchmark binary NAME (a
# `[[bench]]` of benches/, harness = false), building it first (release, the bench profile).
bench_binary() {
    local name=$1
    shift
    cargo bench "$@" --bench "$name" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
name = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == name:
        print(m["executable"])' "$name"
}
