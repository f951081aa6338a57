#!/bin/bash
# Builds `mono` and every GPU bench for a GPU machine without Rust, and puts stripped copies in DIR
# (default .gpu, which git ignores) under the names tools/bench/run.sh runs. From the repository root:
#
#     bash tools/bench/stage.sh [DIR]
set -euo pipefail
dir=${1:-.gpu}
mkdir -p "$dir"

# The executable cargo built for one target, from its JSON messages (the file name carries a hash).
executable() {
  python3 -c '
import json, sys
kind, name = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    m = json.loads(line)
    t = m.get("target") or {}
    if m.get("reason") == "compiler-artifact" and kind in t.get("kind", []) and t.get("name") == name and m.get("executable"):
        print(m["executable"])
' "$1" "$2"
}

echo "mono"
exe=$(cargo build --release --bin mono --message-format=json-render-diagnostics | executable bin mono)
cp "$exe" "$dir/mono"
for b in device:probes device:pages indexer:gpu select:gpu linear:gpu mla:gpu \
         executor:front executor:moe executor:half executor:head executor:chain; do
  crate=${b%%:*} name=${b#*:}
  echo "bench $name of $crate"
  exe=$(cargo bench --no-run -p "$crate" --bench "$name" --message-format=json-render-diagnostics |
    executable bench "$name")
  cp "$exe" "$dir/bench-$crate-$name"
done
echo "mailbox's GPU test (the hand-off figures)"
exe=$(cargo test --release --no-run -p mailbox --test gpu --message-format=json-render-diagnostics |
  executable test gpu)
cp "$exe" "$dir/test-mailbox-gpu"
strip "$dir/mono" "$dir"/bench-* "$dir/test-mailbox-gpu"
du -sh "$dir"
