#!/usr/bin/env bash
# The "slow mode" of the 2-actor benchmarks, forced: runs a criterion benchmark binary and,
# 0.3 s in (once the runtime has counted the cores it may use and its threads are
# running), moves every thread of it onto CPU 0, so that the driver and the actors share
# one CPU while the runtime still believes it has more. A benchmark, not a test: CI does
# not run it.
#
# usage: scripts/one-cpu.sh BENCH_BINARY FILTER [CRITERION_ARGS...]
#   e.g. scripts/one-cpu.sh target/release/deps/execute-<hash> '^echo/2 actors$'
# (`cargo bench --no-run --bench execute` prints the binary's path.)
set -euo pipefail
bin=$1
filter=$2
shift 2
out=$(mktemp)
"$bin" --bench --warm-up-time 1 --measurement-time 3 "$@" "$filter" >"$out" 2>&1 &
pid=$!
sleep 0.3
taskset -a -p -c 0 "$pid" >/dev/null
wait "$pid"
grep -E "time:" "$out"
rm -f "$out"
