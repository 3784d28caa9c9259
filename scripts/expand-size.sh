#!/usr/bin/env bash
# Size of what `graph!` generates for one graph of an example, and of the whole expanded
# example: lines and bytes of `rustc -Zunpretty=expanded` (nightly).
#
#   scripts/expand-size.sh readme Bucketed    # the README's example
#   scripts/expand-size.sh minimal Echo       # the smallest graph: one group, one method
#
# The graph's expansion is the expanded file from the line that declares the graph's struct
# (`struct <Graph>`) up to the next `fn main`: `graph!` expands in place, after the
# `#[actor]` block, and the examples put `main` right after it. The expanded text is kept
# in target/expand/<example>.rs to look at.
set -euo pipefail
cd "$(dirname "$0")/.."
example=${1:?usage: scripts/expand-size.sh <example> <GraphName>}
graph=${2:?usage: scripts/expand-size.sh <example> <GraphName>}
out=target/expand/$example.rs
mkdir -p target/expand
# Its own target dir: nightly artifacts do not evict the stable ones.
cargo +nightly rustc --quiet --target-dir target/expand/build --example "$example" -- \
    -Zunpretty=expanded >"$out"
part=$(awk -v g="$graph" '
    $0 ~ ("struct " g "[ {]") { on = 1 }
    on && /^fn main/ { exit }
    on { print }
' "$out")
[ -n "$part" ] || { echo "no \`struct $graph\` in $out" >&2; exit 1; }
printf '%-10s graph %-10s %6d lines %8d bytes   whole file %6d lines %8d bytes\n' \
    "$example" "$graph" "$(printf '%s\n' "$part" | wc -l)" "$(printf '%s\n' "$part" | wc -c)" \
    "$(wc -l <"$out")" "$(wc -c <"$out")"
