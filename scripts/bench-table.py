#!/usr/bin/env python3
"""Prints min / median / max time per iteration of every criterion benchmark that ran,
from criterion's raw samples (target/criterion/<group>/<bench>/new/sample.json), as the
Markdown rows used in BENCHMARKS.md.

usage: scripts/bench-table.py [TARGET_DIR]   (default: target)
"""
import json
import pathlib
import statistics
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "target") / "criterion"


def fmt(ns):
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


for sample in sorted(root.glob("**/new/sample.json")):
    bench = json.loads((sample.parent / "benchmark.json").read_text())
    data = json.loads(sample.read_text())
    per_iter = [t / n for t, n in zip(data["times"], data["iters"])]
    print(
        f"| {bench['full_id']} | {fmt(min(per_iter))} | {fmt(statistics.median(per_iter))} "
        f"| {fmt(max(per_iter))} | {len(per_iter)} |"
    )
