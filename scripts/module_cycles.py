#!/usr/bin/env python3
"""Import cycles between the modules of a crate.

Usage: scripts/module_cycles.py [SRC_DIR] [--depth N] [--edges]

A node is a module path cut to N components (default 2: `consumer::worker`; the files of
`consumer/worker/` belong to it). An edge A -> B means a file of A names `crate::B…`,
`super::…` or `self::…` resolving into B (in `use` declarations or in code; comments and
string literals are ignored). Prints each strongly connected component of more than one node
(an import circle) with the edges inside it; exits 1 when there is one.
"""
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
src = args[0] if args else "client/src"
depth = 2
if "--depth" in sys.argv:
    depth = int(sys.argv[sys.argv.index("--depth") + 1])
    args = [a for a in args if a != str(depth)]
    src = args[0] if args else "client/src"
show_edges = "--edges" in sys.argv

# Module path of every file.
modules = {}
for root, _, files in os.walk(src):
    for f in files:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
        if rel[-1] in ("lib", "main", "mod"):
            rel = rel[:-1]
        modules[tuple(rel)] = os.path.join(root, f)
known = set(modules)


def strip(text):
    """Removes comments, string and char literals (roughly, enough for paths)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'r#+"[^"]*"#+', '""', text)
    text = re.sub(r'b?"(\\.|[^"\\])*"', '""', text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return text


def paths(text):
    """Every path starting with crate/super/self, brace groups expanded."""
    out = []
    for m in re.finditer(r"\b(crate|super|self)\s*::", text):
        if m.start() > 0 and text[m.start() - 1] in ":_":
            continue  # e.g. `super::super` handled by the first match
        out.extend((m.start(), segs) for segs in expand(text, m.start()))
    return out


def expand(text, i):
    """Paths of the (possibly grouped) path starting at text[i]."""
    segs = []
    while True:
        m = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*").match(text, i)
        if m:
            segs.append(m.group(1))
            i = m.end()
            if text.startswith("::", i):
                i += 2
                continue
            return [segs]
        m = re.compile(r"\s*\{").match(text, i)
        if not m:
            return [segs]
        i = m.end()
        result, depth_, start = [], 0, i
        while i < len(text):
            c = text[i]
            if c == "{":
                depth_ += 1
            elif c == "}":
                if depth_ == 0:
                    result.extend(split_group(text[start:i], segs))
                    return result
                depth_ -= 1
            i += 1
        return [segs]


def split_group(inner, prefix):
    parts, depth_, cur = [], 0, ""
    for c in inner:
        if c == "{":
            depth_ += 1
        elif c == "}":
            depth_ -= 1
        if c == "," and depth_ == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        for sub in expand(p + " ", 0):
            out.append(prefix + sub)
    return out


def root_reexports():
    """Names the crate root re-exports (`pub use a::b::{C, D};`), to the module they are in."""
    root = modules.get(())
    if not root:
        return {}
    text = strip(open(root).read())
    out = {}
    for m in re.finditer(r"\bpub\s+use\s+", text):
        for segs in expand(text, m.end()):
            if len(segs) >= 2 and segs[0] != "crate":
                out[segs[-1]] = resolve((), segs)
    return out


def resolve(mod, segs):
    """The module a path names (its longest known module prefix), from module `mod`."""
    base = list(mod)
    rest = list(segs)
    if rest[0] == "crate":
        base, rest = [], rest[1:]
    else:
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    path = base + rest
    if len(path) >= 1 and tuple(path[:1]) not in known and path[0] in reexports:
        return reexports[path[0]]
    while path and tuple(path) not in known:
        path = path[:-1]
    return tuple(path)


def inline_modules(text):
    """(start, end, name) of every inline `mod name { … }` block."""
    out = []
    for m in re.finditer(r"\bmod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", text):
        depth_, i = 0, m.end()
        while i < len(text):
            if text[i] == "{":
                depth_ += 1
            elif text[i] == "}":
                if depth_ == 0:
                    break
                depth_ -= 1
            i += 1
        out.append((m.end(), i, m.group(1)))
    return out


def node(mod):
    return "::".join(mod[:depth]) or "crate"


reexports = {}
reexports = root_reexports()
edges = {}
for mod, path in sorted(modules.items()):
    text = strip(open(path).read())
    inline = inline_modules(text)
    for pos, segs in paths(text):
        # Inside `mod tests { … }`, `super` is the file's own module.
        inner = tuple(n for (a, b, n) in inline if a <= pos < b)
        target = resolve(mod + inner, segs)
        a, b = node(mod), node(target)
        if a == b or b == "crate" or a == "crate":
            continue
        edges.setdefault(a, {}).setdefault(b, set()).add("::".join(segs))

# Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
nodes = sorted(set(edges) | {b for d in edges.values() for b in d})


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(edges.get(v, {})):
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


sys.setrecursionlimit(10000)
for v in nodes:
    if v not in index:
        visit(v)

if show_edges:
    for a in sorted(edges):
        print(f"{a} -> {', '.join(sorted(edges[a]))}")
cycles = [c for c in sccs if len(c) > 1]
for comp in cycles:
    print("circle: " + " <-> ".join(comp))
    for a in comp:
        for b in sorted(edges.get(a, {})):
            if b in comp:
                print(f"  {a} -> {b}: {', '.join(sorted(edges[a][b]))}")
print(f"{len(nodes)} modules, {sum(len(d) for d in edges.values())} edges, "
      f"{len(cycles)} circle(s)")
sys.exit(1 if cycles else 0)
