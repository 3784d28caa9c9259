#!/usr/bin/env python3
"""Draws a Chrome trace of actorgraph's spans (feature `tracing`) as an SVG timeline.

One row per actor (`group[rank]`, from the spans' fields, whichever thread ran the step:
the driver runs worker 0's step itself when it may) and one for the driver's `execute`
calls; in a row, the steps, and inside each the methods and fused stages as bars, the
collective (waiting for the peers, moving the data) inside its stage.

    cargo run --release --features tracing --example timeline -- --out target/timeline.json
    python3 scripts/timeline-svg.py target/timeline.json docs/timeline.svg

Standard library only.
"""

import json
import sys
from html import escape

LEVEL_H = 18  # one nesting level of a row
LABEL_W = 130  # the rows' names
PLOT_W = 1000
TOP = 58  # title and axis
METHOD_COLOURS = ["#4e79a7", "#59a14f", "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]


def plain(value):
    """A field as tracing-chrome writes it (with `Debug`: strings quoted) as text."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return "" if value is None else str(value)


def bars_of(events):
    """(row, depth, start, end, name, kind, args) per span, from B/E pairs per thread."""
    stacks, bars = {}, []
    for e in events:
        ph, tid = e.get("ph"), e.get("tid")
        if ph == "B":
            args = {k: plain(v) for k, v in e.get("args", {}).items()}
            stack = stacks.setdefault(tid, [])
            if "group" in args and "rank" in args:
                row = f"{args['group']}[{args['rank']}]"
            else:
                # A span without an actor (a stage's collective) is in its parent's row.
                row = stack[-1][0] if stack else "driver"
            depth = sum(1 for s in stack if s[0] == row)
            stack.append((row, depth, e["ts"], e["name"], args))
        elif ph == "E" and stacks.get(tid):
            row, depth, start, name, args = stacks[tid].pop()
            # Fields recorded after the span began (a stage's bytes) come with its end.
            args.update({k: plain(v) for k, v in e.get("args", {}).items()})
            if "method" in args:
                kind = "method"
            elif "stage" in args:
                kind = "stage"
            elif "collective" in args and "stage" not in args:
                kind = "collective"
            else:
                kind = e["name"] if e["name"] in ("step", "execute") else "other"
            bars.append((row, depth, start, e["ts"], name, kind, args))
    return bars


def row_key(row):
    if row == "driver":
        return (0, "", 0)
    group, rank = row[:-1].split("[")
    return (1, group, int(rank))


def nice_step(span_us):
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
                 100000, 200000, 500000, 1000000):
        if span_us / step <= 10:
            return step
    return 1000000


def tip(name, kind, args, start, end):
    keep = [f"{k}={v}" for k, v in args.items() if k not in ("group", "rank") and v != ""]
    return f"{name} ({kind}) {end - start:.0f} µs " + " ".join(keep)


def draw(bars, title):
    rows = sorted({b[0] for b in bars}, key=row_key)
    levels = {r: 1 + max(b[1] for b in bars if b[0] == r) for r in rows}
    t0 = min(b[2] for b in bars)
    t1 = max(b[3] for b in bars)
    scale = PLOT_W / max(t1 - t0, 1e-9)
    x = lambda t: LABEL_W + (t - t0) * scale  # noqa: E731
    methods = sorted({b[4] for b in bars if b[5] == "method"})
    colour = {m: METHOD_COLOURS[i % len(METHOD_COLOURS)] for i, m in enumerate(methods)}
    y, row_y = TOP, {}
    for r in rows:
        row_y[r] = y
        y += levels[r] * LEVEL_H + 10
    legend_y = y + 8
    height = legend_y + 30
    width = LABEL_W + PLOT_W + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{LABEL_W}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    step = nice_step(t1 - t0)
    unit, div = ("ms", 1000.0) if step >= 1000 else ("µs", 1.0)
    tick = 0.0
    while tick <= t1 - t0 + 1e-9:
        tx = x(t0 + tick)
        out.append(f'<line x1="{tx:.1f}" y1="{TOP - 8}" x2="{tx:.1f}" y2="{y - 6}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{tx:.1f}" y="{TOP - 12}" text-anchor="middle" fill="#555">'
                   f'{tick / div:g} {unit}</text>')
        tick += step
    for r in rows:
        ry = row_y[r]
        label = "driver (execute)" if r == "driver" else r
        out.append(f'<text x="{LABEL_W - 8}" y="{ry + LEVEL_H - 5}" text-anchor="end" '
                   f'font-weight="bold">{escape(label)}</text>')
        out.append(f'<line x1="{LABEL_W}" y1="{ry + levels[r] * LEVEL_H + 4}" x2="{LABEL_W + PLOT_W}" '
                   f'y2="{ry + levels[r] * LEVEL_H + 4}" stroke="#cccccc"/>')
    style = {
        "execute": ("#d9d9d9", "#999999"),
        "step": ("#f0f0f0", "#aaaaaa"),
        "stage": ("#8e6bbf", "#5b3f86"),
        "collective": ("#d4c4ea", "#5b3f86"),
        "other": ("#cccccc", "#888888"),
    }
    for row, depth, start, end, name, kind, args in sorted(bars, key=lambda b: b[1]):
        bx, bw = x(start), max((end - start) * scale, 0.8)
        by = row_y[row] + depth * LEVEL_H
        fill, stroke = (colour[name], "#333333") if kind == "method" else style[kind]
        label = {"step": f"step {args.get('execution', '')}",
                 "execute": f"execute {args.get('execution', '')}",
                 "collective": "wait + reduce"}.get(kind, name)
        out.append(f'<rect x="{bx:.2f}" y="{by + 1}" width="{bw:.2f}" height="{LEVEL_H - 2}" '
                   f'fill="{fill}" stroke="{stroke}" stroke-width="0.5">'
                   f'<title>{escape(tip(name, kind, args, start, end))}</title></rect>')
        text = label if len(label) * 6.2 < bw - 4 else (label.split("(")[0] if len(label.split("(")[0]) * 6.2 < bw - 4 else "")
        if text:
            ink = "#ffffff" if kind in ("method", "stage") else "#222222"
            out.append(f'<text x="{bx + 3:.2f}" y="{by + LEVEL_H - 5}" fill="{ink}">{escape(text)}</text>')
    lx = LABEL_W
    entries = [(m, colour[m], "#333333") for m in methods]
    entries += [("fused stage (pack, collective, unpack)", *style["stage"]),
                ("collective: waiting for peers + reduce", *style["collective"]),
                ("actor step", *style["step"])]
    for name, fill, stroke in entries:
        out.append(f'<rect x="{lx}" y="{legend_y}" width="14" height="12" fill="{fill}" stroke="{stroke}"/>')
        out.append(f'<text x="{lx + 18}" y="{legend_y + 10}">{escape(name)}</text>')
        lx += 18 + len(name) * 6.2 + 18
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: timeline-svg.py TRACE.json OUT.svg")
    with open(sys.argv[1]) as f:
        events = json.load(f)
    bars = bars_of(events)
    if not bars:
        sys.exit(f"{sys.argv[1]}: no spans")
    graphs = sorted({b[6].get("graph", "") for b in bars if b[5] == "execute"} - {""})
    steps = len([b for b in bars if b[5] == "execute"])
    title = f"actorgraph timeline: {', '.join(graphs) or 'graph'}, {steps} executions"
    with open(sys.argv[2], "w") as f:
        f.write(draw(bars, title))


if __name__ == "__main__":
    main()
