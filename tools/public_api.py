#!/usr/bin/env python3
"""The public API of a crate, one item per line, from its rustdoc JSON.

    RUSTC_BOOTSTRAP=1 RUSTDOCFLAGS="-Z unstable-options --output-format json" \
        cargo doc -p cairn-engine --no-deps --lib
    python3 tools/public_api.py target/doc/cairn.json > api/cairn.txt

Every public path (modules, types, functions, constants, re-exports), the fields and
variants of public types, the methods of their inherent impls, the traits they implement
(not the auto and blanket ones), and every function's signature. `.ci/run` compares the
list with `api/cairn.txt`, so that a change of the public API is always deliberate: a
change that means it updates the file in the same commit.
"""

import json
import sys


def main(path):
    doc = json.load(open(path))
    index = doc["index"]
    lines = set()

    def item(i):
        return index.get(str(i))

    def ty(t):
        """A type, written roughly as Rust does."""
        if t is None:
            return "()"
        (kind, v), = t.items()
        if kind == "resolved_path":
            return v["path"] + args(v.get("args"))
        if kind == "primitive":
            return v
        if kind == "generic":
            return v
        if kind == "borrowed_ref":
            lifetime = (v["lifetime"] + " ") if v.get("lifetime") else ""
            mutable = "mut " if v["is_mutable"] else ""
            return f"&{lifetime}{mutable}{ty(v['type'])}"
        if kind == "tuple":
            return "(" + ", ".join(ty(x) for x in v) + ")"
        if kind == "slice":
            return f"[{ty(v)}]"
        if kind == "array":
            return f"[{ty(v['type'])}; {v['len']}]"
        if kind == "impl_trait":
            return "impl " + " + ".join(bound(b) for b in v)
        if kind == "dyn_trait":
            return "dyn " + " + ".join(
                p["trait"]["path"] + args(p["trait"].get("args")) for p in v["traits"]
            )
        if kind == "qualified_path":
            return f"<{ty(v['self_type'])}>::{v['name']}"
        if kind == "raw_pointer":
            return ("*mut " if v["is_mutable"] else "*const ") + ty(v["type"])
        if kind == "function_pointer":
            return "fn(" + ", ".join(ty(x[1]) for x in v["sig"]["inputs"]) + ")"
        return json.dumps(t, sort_keys=True)

    def args(a):
        if not a:
            return ""
        if "angle_bracketed" in a:
            parts = []
            for x in a["angle_bracketed"]["args"]:
                if "type" in x:
                    parts.append(ty(x["type"]))
                elif "lifetime" in x:
                    parts.append(x["lifetime"])
                else:
                    parts.append(json.dumps(x, sort_keys=True))
            for c in a["angle_bracketed"].get("constraints", []):
                binding = c.get("binding", {})
                if "equality" in binding and "type" in binding["equality"]:
                    parts.append(f"{c['name']} = {ty(binding['equality']['type'])}")
                else:
                    parts.append(c["name"])
            return "<" + ", ".join(parts) + ">" if parts else ""
        if "parenthesized" in a:
            p = a["parenthesized"]
            out = ty(p["output"]) if p.get("output") else "()"
            return "(" + ", ".join(ty(x) for x in p["inputs"]) + ") -> " + out
        return ""

    def bound(b):
        if "trait_bound" in b:
            t = b["trait_bound"]["trait"]
            return t["path"] + args(t.get("args"))
        if "outlives" in b:
            return b["outlives"]
        return json.dumps(b, sort_keys=True)

    def generics(g):
        names = []
        for p in g.get("params", []):
            kind = p["kind"]
            if "type" in kind and kind["type"].get("is_synthetic"):
                continue
            bounds = kind.get("type", {}).get("bounds", [])
            names.append(p["name"] + (": " + " + ".join(bound(b) for b in bounds) if bounds else ""))
        return "<" + ", ".join(names) + ">" if names else ""

    def signature(f):
        sig = f["sig"]
        inputs = ", ".join(f"{name}: {ty(t)}" for name, t in sig["inputs"])
        header = f["header"]
        prefix = ("async " if header.get("is_async") else "") + ("unsafe " if header.get("is_unsafe") else "")
        out = f" -> {ty(sig['output'])}" if sig.get("output") else ""
        return prefix, f"{generics(f['generics'])}({inputs}){out}"

    def public(i):
        return i.get("visibility") == "public"

    def describe(path, i, seen):
        kind, v = next(iter(i["inner"].items()))
        if kind == "module":
            lines.add(f"mod {path}")
            for child in v["items"]:
                c = item(child)
                if c is not None and public(c):
                    name = c["name"]
                    if "use" in c["inner"]:
                        walk_use(path, c, seen)
                    elif name:
                        describe(f"{path}::{name}", c, seen)
        elif kind == "function":
            prefix, sig = signature(v)
            lines.add(f"pub {prefix}fn {path}{sig}")
        elif kind in ("struct", "enum", "union", "trait", "type_alias", "constant", "static", "macro", "proc_macro"):
            # Described once, under its shortest path, after the walk; the other paths
            # are listed as aliases of it.
            seen.setdefault(i["id"], set()).add(path)

    def detail(path, i):
        kind, v = next(iter(i["inner"].items()))
        if True:
            extra = ""
            if kind == "constant":
                extra = ": " + ty(v["type"])
            elif kind == "type_alias":
                extra = " = " + ty(v["type"])
            elif kind in ("struct", "enum", "trait"):
                extra = generics(v.get("generics", {}))
            lines.add(f"pub {kind} {path}{extra}")
            if kind == "struct":
                sk = v["kind"]
                fields = sk.get("plain", {}).get("fields", []) if isinstance(sk, dict) else []
                for f in fields:
                    fi = item(f)
                    if fi and public(fi):
                        lines.add(f"pub field {path}::{fi['name']}: {ty(fi['inner']['struct_field'])}")
                if isinstance(sk, dict) and sk.get("plain", {}).get("has_stripped_fields"):
                    lines.add(f"struct {path} has private fields")
            if kind == "enum":
                for var in v["variants"]:
                    vi = item(var)
                    if vi:
                        lines.add(f"pub variant {path}::{vi['name']}")
            if kind == "trait":
                for t in v["items"]:
                    ti = item(t)
                    if ti and "function" in ti["inner"]:
                        prefix, sig = signature(ti["inner"]["function"])
                        lines.add(f"pub trait fn {path}::{ti['name']}{sig}")
                    elif ti:
                        lines.add(f"pub trait item {path}::{ti['name']}")
            for impl_id in v.get("impls", []):
                impl = item(impl_id)
                if impl is None:
                    continue
                im = impl["inner"]["impl"]
                if im.get("is_synthetic") or im.get("blanket_impl"):
                    continue
                if im.get("trait"):
                    t = im["trait"]
                    lines.add(f"impl {t['path']}{args(t.get('args'))} for {path}")
                    continue
                for m in im["items"]:
                    mi = item(m)
                    if mi and public(mi):
                        if "function" in mi["inner"]:
                            prefix, sig = signature(mi["inner"]["function"])
                            lines.add(f"pub {prefix}fn {path}::{mi['name']}{sig}")
                        else:
                            lines.add(f"pub item {path}::{mi['name']}")

    def walk_use(path, u, seen):
        use = u["inner"]["use"]
        target = item(use["id"]) if use.get("id") is not None else None
        name = use["name"]
        if use.get("is_glob"):
            lines.add(f"pub use {path}::* from {use['source']}")
            if target is not None and "module" in target["inner"]:
                for child in target["inner"]["module"]["items"]:
                    c = item(child)
                    if c is not None and public(c) and c.get("name"):
                        describe(f"{path}::{c['name']}", c, seen)
            return
        if target is None:
            # From another crate (--no-deps): its source path is what users see.
            lines.add(f"pub use {path}::{name} = {use['source']}")
        else:
            describe(f"{path}::{name}", target, seen)

    root = item(doc["root"])
    seen = {}
    describe(root["name"], root, seen)
    for item_id, paths in seen.items():
        best = min(paths, key=lambda p: (p.count("::"), p))
        detail(best, item(item_id))
        for other in paths - {best}:
            lines.add(f"pub use {other} = {best}")
    for line in sorted(lines):
        print(line)


if __name__ == "__main__":
    main(sys.argv[1])
