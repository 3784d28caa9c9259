#!/usr/bin/env bash
# Size of what `graph!` generates for one graph of an example, and of the whole expanded
# example: lines and bytes of `rustc -Zunpretty=expanded` (nightly).
#
#   scripts/expand-size.sh readme Bucketed    # the README's example
#   scripts/expand-size.sh minimal Echo       # the smallest graph: one group, one method
#
# The graph's expansion is the expanded file from the line that declares the graph's struct
# (`struct <Graph>`) up to the next `fn main`: `graph!` expands in place, after the
# `#[actor]` block, and the examples put `main` right after it. "code" is that part without
# its doc attributes (the generated methods' docs, the same for every graph). The expanded
# text is kept in target/expand/<example>.rs to look at.
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
# `-Zunpretty` prints a doc attribute as `#[doc = r"..."]`, breaking a long one after `=`.
code=$(printf '%s\n' "$part" | grep -v -e '#\[doc' -e '^ *r"' || true)
count() { printf '%s\n' "$1" | wc -"$2"; }
printf '%-8s %-9s graph: %4d lines %6d bytes; its code: %4d lines %6d bytes; file: %4d lines %6d bytes\n' \
    "$example" "$graph" "$(count "$part" l)" "$(count "$part" c)" \
    "$(count "$code" l)" "$(count "$code" c)" "$(wc -l <"$out")" "$(wc -c <"$out")"
