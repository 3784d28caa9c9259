#!/usr/bin/env bash
# Finds import circles between sibling files of a module: two files of one module (or more,
# around a ring) that each import from the other. Within a module the files should form
# layers that a reader can read bottom-up, each depending only on the ones below it.
#
#   scripts/check-cycles.sh              graph-runtime/src and graph-macros/src
#   scripts/check-cycles.sh DIR...       other crates' src directories
#   scripts/check-cycles.sh --reexports  count also the names that the module file takes
#                                        from a sibling (`pub use region::Region` there,
#                                        `super::Region` here): a stricter view, which
#                                        finds a trait and the types its methods take in
#                                        two files, or a type whose impl is split over two
#   scripts/check-cycles.sh --edges      also print every edge of every module
#
# For each module that is a directory (`m/mod.rs`, or `m.rs` beside `m/`), a file depends
# on a sibling when its code names it by `super::sibling` or `crate::path::to::m::sibling`
# (with --reexports, also by a name that the module file imports from that sibling).
# Comments, doc links and inline `#[cfg(test)] mod` blocks are left out: they are not the
# layering. A module declared with `#[path = ".."]` under a cfg (e.g. `device` as
# `no_device.rs`) answers for all its files. Paths spelled through the crate root's
# re-exports (`crate::Error`) do not count: they are the crate's layering, not a module's.
#
# Prints each circle with the lines that make its edges; exits 1 if it found any.
# Needs python3.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import os, re, sys

args = sys.argv[1:]
reexports = "--reexports" in args
show_edges = "--edges" in args
roots = [a for a in args if not a.startswith("--")] or ["graph-runtime/src", "graph-macros/src"]

def strip(text):
    """The code without comments, string contents and inline `#[cfg(test)] mod x { .. }`."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            out.append("\n" * text.count("\n", i, n if j < 0 else j))
            i = n if j < 0 else j + 2
        elif c == '"' or text.startswith('r"', i) or text.startswith('r#"', i):
            # A string: keep its newlines only.
            m = re.match(r'r(#*)"', text[i:])
            if m:
                end = '"' + m.group(1)
                j = text.find(end, i + len(m.group(0)))
                j = n if j < 0 else j + len(end)
            else:
                j = i + 1
                while j < n and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                j += 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4] + "  "):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            out.append("' '")
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # Inline test modules: from `#[cfg(test)]` (or `#[cfg(all(test, ..))]`) before
    # `mod name {` to its closing brace.
    res, pos = [], 0
    for m in re.finditer(r"#\[cfg\([^\]]*\btest\b[^\]]*\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
        if m.start() < pos:
            continue
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        res.append(code[pos:m.start()])
        res.append("\n" * code.count("\n", m.start(), j))
        pos = j
    res.append(code[pos:])
    return "".join(res)

def use_paths(tree):
    """The paths of a use tree (`a::{b, c::{d as e}}` -> a::b, a::c::d@e): a renamed
    import ends in `@` and its new name."""
    tree = re.sub(r"\s+as\s+(\w+)", r"@\1", tree)
    tree = re.sub(r"\s+", "", tree)
    def expand(prefix, t):
        paths, depth, start = [], 0, 0
        parts = []
        for k, ch in enumerate(t):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(t[start:k])
                start = k + 1
        parts.append(t[start:])
        for p in parts:
            if not p:
                continue
            b = p.find("{")
            if b >= 0 and p.endswith("}"):
                head = p[:b].rstrip(":")
                paths += expand(prefix + ([head] if head else []), p[b + 1:-1])
            else:
                paths.append("::".join(prefix + [p]))
        return paths
    return expand([], tree)

def uses(code):
    """(line, path) for every `use` path and every other `super::`/`crate::` path."""
    found = []
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        line = code.count("\n", 0, m.start()) + 1
        found += [(line, p) for p in use_paths(m.group(1))]
    rest = re.sub(r"\buse\s+[^;]+;", lambda m: "\n" * m.group(0).count("\n"), code)
    for m in re.finditer(r"\b(?:super|crate|self)(?:::\w+)+", rest):
        found.append((rest.count("\n", 0, m.start()) + 1, m.group(0)))
    return found

def modules(root):
    """(module path, module file, {child name: [files]}) for each directory module."""
    out = []
    for d, _, files in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel == ".":
            continue
        mod_file = os.path.join(d, "mod.rs")
        if not os.path.exists(mod_file):
            mod_file = d + ".rs"
            if not os.path.exists(mod_file):
                continue
        text = strip(open(mod_file).read())
        children = {}
        for m in re.finditer(r"((?:#\[[^\]]*\]\s*)*)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text):
            attrs, name = m.group(1), m.group(2)
            files_of = [os.path.join(d, name + ".rs"), os.path.join(d, name, "mod.rs")]
            files_of += [os.path.join(d, p) for p in re.findall(r'path\s*=\s*"([^"]+)"', attrs)]
            children[name] = [f for f in files_of if os.path.exists(f)]
        out.append((rel.replace(os.sep, "::"), mod_file, children, text))
    return out

cycles = 0
for root in roots:
    crate = root.rstrip("/")
    for modpath, mod_file, children, mod_text in sorted(modules(root)):
        # Names the module file takes from a child: `use child::Name` / `pub use child::{..}`.
        reexport = {}
        for line, path in uses(mod_text):
            segs = path.split("::")
            if segs[0] == "self":
                segs = segs[1:]
            name = segs[-1].split("@")[-1]
            if len(segs) >= 2 and segs[0] in children and name not in ("*", "self"):
                reexport.setdefault(name, segs[0])
        prefix = ["crate"] + modpath.split("::")
        edges = {}  # (from, to) -> [evidence]
        for child, files in children.items():
            for f in files:
                for line, path in uses(strip(open(f).read())):
                    segs = path.split("@")[0].split("::")
                    if segs[0] == "super":
                        rest = segs[1:]
                    elif segs[:len(prefix)] == prefix:
                        rest = segs[len(prefix):]
                    else:
                        continue
                    if not rest or rest[0] in ("super", "*", "self"):
                        continue
                    if rest[0] in children:
                        to = rest[0]
                    elif reexports and rest[0] in reexport:
                        to = reexport[rest[0]]
                    else:
                        continue
                    if to != child:
                        edges.setdefault((child, to), []).append(f"{f}:{line}: {path}")
        graph = {c: sorted({t for (s, t) in edges if s == c}) for c in children}
        if show_edges and edges:
            print(f"{crate} {modpath}:")
            for (s, t), ev in sorted(edges.items()):
                print(f"  {s} -> {t}    ({ev[0]}{', ...' if len(ev) > 1 else ''})")
        # Tarjan's strongly connected components.
        index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in graph[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                sccs.append(sorted(comp))
        for v in sorted(graph):
            if v not in index:
                visit(v)
        for comp in sccs:
            if len(comp) < 2:
                continue
            cycles += 1
            print(f"circle in {crate} `{modpath}`: {' <-> '.join(comp)}")
            for (s, t), ev in sorted(edges.items()):
                if s in comp and t in comp:
                    for e in ev:
                        print(f"  {s} -> {t}: {e}")
if cycles:
    print(f"{cycles} circle(s)")
    sys.exit(1)
print("no circles")
PY
