#!/usr/bin/env python3
"""The layer rule of crates/cairn/src: a module may use only modules of its own layer or
of the layers below it (ARCHITECTURE.md, "Code map"), and no two files import each other
in a circle. Exit 1 with the offending imports otherwise.

Usage: layers.py [crates/cairn/src]
"""
import os, re, sys

# Lowest first. A folder is one layer; each vocabulary file is its own.
LAYERS = [
    "telemetry", "failure", "panic", "clock", "error", "context", "config", "hooks", "env",
    "lifetime", "ops", "workflow", "engine", "client", "testing",
]

def modules(src):
    mods = {}
    for dp, _, fns in os.walk(src):
        for f in fns:
            if f.endswith(".rs"):
                rel = os.path.relpath(os.path.join(dp, f), src)[:-3].split(os.sep)
                if rel[-1] == "mod":
                    rel = rel[:-1]
                mods["::".join(rel) if rel != ["lib"] else ""] = os.path.join(dp, f)
    return mods

def strip_comments(text):
    return re.sub(r"//[^\n]*", "", text)

def reexports(lib_text):
    """Names re-exported at the crate root, mapped to the module they come from."""
    names = {}
    for m in re.finditer(r"pub use (\w+)(?:::(\w+))*::\{([^}]*)\}|pub use (\w+)::(?:\w+::)*(\w+);", lib_text):
        if m.group(3) is not None:
            for n in m.group(3).split(","):
                n = n.strip().split(" as ")[-1].strip()
                if n and m.group(1) != "crate":
                    names.setdefault(n, m.group(1))
        elif m.group(4) != "crate":
            names.setdefault(m.group(5), m.group(4))
    return names

def imports(text, root_names):
    found = set()
    for g in re.finditer(r"crate::\{([^}]*)\}", text):
        for part in g.group(1).split(","):
            part = part.strip()
            if part:
                found.add(part.split("::")[0].split(" as ")[0].strip())
    for p in re.finditer(r"crate::(\w+)", text):
        found.add(p.group(1))
    return {root_names.get(n, n) for n in found}

def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "crates/cairn/src"
    mods = modules(src)
    root_names = reexports(strip_comments(open(mods[""]).read()))
    top = {m: m.split("::")[0] for m in mods if m}
    unknown = sorted({t for t in top.values() if t not in LAYERS})
    if unknown:
        print(f"modules with no layer in .ci/layers.py: {unknown}")
        return 1
    bad, edges = [], {m: set() for m in mods if m}
    for m, path in mods.items():
        if not m:
            continue
        rank = LAYERS.index(top[m])
        for used in imports(strip_comments(open(path).read()), root_names):
            if used not in LAYERS:
                continue
            if LAYERS.index(used) > rank:
                bad.append(f"{path}: `{top[m]}` uses `{used}`, a higher layer")
        for p in re.finditer(r"crate::((?:\w+::)*\w+)", strip_comments(open(path).read())):
            segs = p.group(1).split("::")
            for k in range(len(segs), 0, -1):
                cand = "::".join(segs[:k])
                if cand in edges and cand != m and not cand.startswith(m + "::"):
                    edges[m].add(cand)
                    break
    # Circles between files (Tarjan).
    index, low, stack, on, circles = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)
    def visit(v):
        index[v] = low[v] = counter[0]; counter[0] += 1
        stack.append(v); on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))
    for v in edges:
        if v not in index:
            visit(v)
    for c in circles:
        bad.append("import circle: " + ", ".join(c))
    for b in bad:
        print(b)
    if not bad:
        print(f"{len(edges)} modules in {len(LAYERS)} layers; no upward import, no circle")
    return 1 if bad else 0

sys.exit(main())
