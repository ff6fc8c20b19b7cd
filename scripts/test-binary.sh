# Sourced by test.sh and leaks.sh: test_binary NAME [cargo flags] prints the path of the
# test binary NAME, building it first if needed.
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
